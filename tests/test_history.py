"""The run history, the regression gate on synthetic histories (a regression, a speed-up, noise, a
new variant, a device change), accepting a run, the verdict the summary opens with and its plots."""
from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from evo_sdpa import history, plots, report
from evo_sdpa.gates import regressions
from evo_sdpa.verdict import build_verdict, changes, device_table
from test_gating_report import CFG, PNG_SIGNATURE, SUITE, gpu_leaderboard, gpu_tree  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parents[1]
H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
GATES = {"required_variants": [], "min_speedup": None, "regression_threshold": 0.02, "regression_noise_iqr": 1.0}
T0 = datetime(2026, 11, 1, 8, 0, tzinfo=timezone.utc)
CASE = "B2 H8 S512 D64 fp16"


def entry(device: str = H100, p50: float = 100.0, iqr: float = 0.5, variants: dict | None = None,
          when: datetime = T0, sources: str = "abc", correct: bool = True) -> dict:
    """A history entry with one variant 'v' on one case, unless `variants` is given."""
    case = {"variant_p50_us": p50, "variant_p90_us": p50 * 1.05, "variant_iqr_us": iqr, "sdpa_p50_us": 100.0,
            "sdpa_p90_us": 105.0, "speedup_p50": 100.0 / p50, "speedup_p90": 105.0 / (p50 * 1.05), "mode": "eager"}
    record = {"commit": "c0ffee", "dirty": False, "sources": sources, "funnel": {}, "correct": correct,
              "cases": {CASE: case}}
    return {"recorded_at": when.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), "device": device, "commit": "c0ffee",
            "dirty": False, "bench_suite": "canonical", "variants": variants if variants is not None else {"v": record}}


def gate(base: dict | None, current: dict) -> list[str]:
    return regressions(current, base, GATES)["failures"]


# ---------------------------------------------------------------- the regression gate


def test_a_regression_beyond_threshold_and_noise_fails():
    failures = gate(entry(p50=100.0), entry(p50=105.0))
    assert len(failures) == 1
    assert failures[0].startswith("regression since the accepted run") and "v B2 H8 S512 D64 fp16" in failures[0]
    assert "+5.0%" in failures[0]


def test_a_speed_up_passes_and_is_reported():
    diff = regressions(entry(p50=90.0), entry(p50=100.0), GATES)  # now 90 µs, accepted 100 µs
    assert diff["failures"] == [] and [x["variant"] for x in diff["comparison"]["speedups"]] == ["v"]


def test_a_case_timed_another_way_is_not_compared():
    graph = entry(p50=9.0)
    graph["variants"]["v"]["cases"][CASE]["mode"] = "graph x32"
    now = entry(p50=12.0)   # eager: slower per call, by the launch, not by the kernel
    diff = regressions(now, graph, GATES)
    assert diff["failures"] == [] and diff["comparison"]["regressions"] == []
    assert diff["comparison"]["retimed"] == [f"v {CASE} (graph x32 -> eager)"]
    lines = changes(now, graph, GATES["regression_threshold"], GATES["regression_noise_iqr"])["lines"]
    assert lines == [f"timed another way, not compared: v {CASE} (graph x32 -> eager)"]


def test_a_slowdown_within_the_noise_passes():
    # 5% slower, but each run's IQR is 8 µs: not beyond the noise.
    assert gate(entry(p50=100.0, iqr=8.0), entry(p50=105.0, iqr=1.0)) == []
    assert gate(entry(p50=100.0, iqr=1.0), entry(p50=105.0, iqr=8.0)) == []


def test_a_slowdown_under_the_threshold_passes():
    assert gate(entry(p50=100.0, iqr=0.0), entry(p50=101.5, iqr=0.0)) == []


def test_a_move_of_sdpa_itself_between_runs_is_named():
    # Run to run on one H100 (issue 12): both runs pinned their own ratios, but SDPA's p50 moved 3.9%
    # between them, so the card's state did; the verdict says so instead of reporting a change.
    before, now = entry(p50=90.0), entry(p50=90.0)
    now["variants"]["v"]["cases"][CASE]["sdpa_p50_us"] = 103.9
    diff = history.compare(now, before, 0.02, 1.0)
    assert [(x["variant"], x["case"], round(x["change_pct"], 1)) for x in diff["sdpa_moved"]] == [("v", CASE, 3.9)]
    lines = changes(now, before, 0.02, 1.0)["lines"]
    assert lines == [f"the card's state moved: SDPA's own p50 changed by more than 2% on 1 case(s) (largest +3.9%, "
                     f"v {CASE}), so the speedups there may not repeat; time them again"]
    now["variants"]["v"]["cases"][CASE]["sdpa_p50_us"] = 101.5
    assert history.compare(now, before, 0.02, 1.0)["sdpa_moved"] == []


def test_a_new_variant_passes_and_is_named():
    current = entry(variants={**entry()["variants"], "w": entry(p50=500.0)["variants"]["v"]})
    diff = regressions(current, entry(), GATES)
    assert diff["failures"] == [] and diff["comparison"]["new"] == ["w"]


def test_a_variant_that_stopped_being_correct_fails():
    assert gate(entry(), entry(correct=False)) == ["v no longer passes its correctness gates since the "
                                                   "accepted run 2026-11-01T08:00:00.000000Z"]


def test_no_accepted_run_passes():
    assert gate(None, entry(p50=1000.0)) == []


def test_runs_on_another_card_are_never_compared(tmp_path):
    history.append(tmp_path, entry(device=H200, p50=50.0))
    later = history.append(tmp_path, entry(device=H100, p50=100.0, when=T0 + timedelta(hours=1)))
    history.accept(history.entries(tmp_path, H200)[0])
    assert history.previous(tmp_path, H100, later, accepted_only=True) is None
    with pytest.raises(Exception, match="cannot compare a run on"):
        history.compare(entry(device=H100), entry(device=H200), 0.02, 1.0)


# ---------------------------------------------------------------- the history on disk


def test_entries_are_new_files_never_overwritten(tmp_path):
    first = history.append(tmp_path, entry())
    second = history.append(tmp_path, entry())  # the same microsecond: a numbered name
    assert first != second and first.parent.name == "nvidia-h100-80gb-hbm3"
    assert json.loads(first.read_text()) == json.loads(second.read_text()) == entry()
    assert history.entries(tmp_path, H100) == [first, second]


def test_previous_accepted_skips_unaccepted_and_the_current_run(tmp_path):
    a = history.append(tmp_path, entry(when=T0))
    b = history.append(tmp_path, entry(when=T0 + timedelta(hours=1)))
    c = history.append(tmp_path, entry(when=T0 + timedelta(hours=2)))
    assert history.previous(tmp_path, H100, c, accepted_only=True) is None
    history.accept(a)
    assert history.previous(tmp_path, H100, c, accepted_only=True) == a
    assert history.previous(tmp_path, H100, c, accepted_only=False) == b
    assert history.previous(tmp_path, H100, None, accepted_only=False) == c


def test_accept_run_script_marks_the_pointers_entry(tmp_path):
    path = history.append(tmp_path / "history", entry())
    pointer = tmp_path / "history_entry.json"
    history.write_pointer(pointer, path, entry())
    proc = subprocess.run([sys.executable, "scripts/accept_run.py", "--pointer", str(pointer)], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert history.is_accepted(path) and json.loads(path.read_text()) == entry()


def gate_script(tmp_path: Path, gates: dict = GATES) -> subprocess.CompletedProcess:
    """check_gates.py over tmp_path's lb.json, pointer.json and history/."""
    return subprocess.run([sys.executable, "scripts/check_gates.py", "--leaderboard", str(tmp_path / "lb.json"),
                           "--history-entry", str(tmp_path / "pointer.json"), "--history", str(tmp_path / "history"),
                           "--config-json", json.dumps({"gates": gates}), "--out", str(tmp_path / "gates.json")],
                          cwd=REPO, capture_output=True, text=True)


def gate_run(tmp_path: Path, current: dict, base: dict | None = None) -> None:
    """A history with `base` accepted (when given) and `current` as this run's entry."""
    hist = tmp_path / "history"
    if base is not None:
        history.accept(history.append(hist, base))
    path = history.append(hist, current)
    history.write_pointer(tmp_path / "pointer.json", path, current)
    (tmp_path / "lb.json").write_text(json.dumps({"variants": [], "card_mismatches": []}))


def run_gate_script(tmp_path: Path, base: dict, current: dict) -> subprocess.CompletedProcess:
    gate_run(tmp_path, current, base)
    return gate_script(tmp_path)


def test_gate_script_fails_with_one_line_on_a_regression(tmp_path):
    proc = run_gate_script(tmp_path, entry(p50=100.0), entry(p50=110.0, when=T0 + timedelta(hours=1)))
    assert proc.returncode == 1 and not (tmp_path / "gates.json").exists()
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("evo-sdpa: gate failed: regression since the accepted run")


def test_gate_script_passes_on_a_speed_up(tmp_path):
    proc = run_gate_script(tmp_path, entry(p50=100.0), entry(p50=80.0, when=T0 + timedelta(hours=1)))
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "gates.json").read_text())
    assert record["status"] == "pass" and record["accepted_baseline"].endswith(".json")
    assert record["checked"] == ["every result comes from one card model", "no variant slower than in, or no longer "
                                 f"correct since, the accepted run {Path(record['accepted_baseline']).name}"]
    assert proc.stderr == ""


def test_gate_script_names_the_cases_it_did_not_compare(tmp_path):
    graph = entry(p50=9.0)
    graph["variants"]["v"]["cases"][CASE]["mode"] = "graph x32"
    proc = run_gate_script(tmp_path, graph, entry(p50=12.0, when=T0 + timedelta(hours=1)))
    assert proc.returncode == 0, proc.stderr
    checked = json.loads((tmp_path / "gates.json").read_text())["checked"]
    assert checked[-1].endswith(f" (not compared, timed another way: v {CASE} (graph x32 -> eager))")


def test_gate_script_says_when_its_pass_checked_next_to_nothing(tmp_path):
    gate_run(tmp_path, entry())
    bare = gate_script(tmp_path)
    assert bare.returncode == 0 and bare.stderr.strip() == (
        f"evo-sdpa: {tmp_path / 'gates.json'}: no variant is required (gates.required_variants, which "
        "gates.min_speedup applies to) and no earlier run here is accepted (scripts/accept_run.py), so only the "
        "one-card-model check ran")
    assert json.loads((tmp_path / "gates.json").read_text())["checked"] == ["every result comes from one card model"]
    lb = {"variants": [{"name": "v", "funnel": {"build": "pass", "sanitizer": "pass", "parity": "pass"},
                        "reasons": {}, "speedups": [{"shape": "B2 H8 S512 D64", "dtype": "fp16", "speedup_p50": 1.5}]}],
          "card_mismatches": []}
    (tmp_path / "lb.json").write_text(json.dumps(lb))
    required = gate_script(tmp_path, {**GATES, "required_variants": ["v"], "min_speedup": 1.2})
    assert required.returncode == 0 and required.stderr == ""
    assert json.loads((tmp_path / "gates.json").read_text())["checked"] == [
        "every result comes from one card model", "v pass build, sanitizer and parity",
        "v reach 1.2x SDPA's p50 on every measured shape"]


# ---------------------------------------------------------------- the verdict


def test_verdict_best_per_shape_and_criteria(gpu_leaderboard):
    labels = [s.label for s in SUITE]
    current = history.make_entry(gpu_leaderboard, T0)
    verdict = build_verdict(gpu_leaderboard, labels, current, None, GATES)
    best = {b["shape"]: b for b in verdict["best"]}
    assert best[SUITE[0].label]["variant"] == "good"            # 'bad' failed parity: never best
    assert best[SUITE[2].label]["variant"] is None              # D=256 not supported: none measured
    results = {c["criterion"].split(" (")[0]: c["result"] for c in verdict["criteria"]}
    assert results["correct everywhere claimed"] == "not met"
    assert verdict["since"]["lines"] == ["none in the history"]
    for c in verdict["criteria"]:
        assert c["result"] in {"met", "not met", "not checked"} and c["detail"]


def test_best_per_shape_takes_the_worst_dtype_for_p50_and_for_p90():
    from evo_sdpa.verdict import best_per_shape, p90_not_worse

    rows = [{"shape": "A", "dtype": "fp16", "speedup_p50": 1.20, "speedup_p90": 0.90},
            {"shape": "A", "dtype": "bf16", "speedup_p50": 1.15, "speedup_p90": 1.05}]
    variant = {"name": "v", "speedups": rows, "criteria": [{"criterion": "correct on its whole declared support",
                                                            "result": "met"}]}
    (best,) = best_per_shape([variant], ["A"])
    assert (best["dtype"], best["speedup_p50"], best["p90_dtype"], best["speedup_p90"]) == ("bf16", 1.15, "fp16", 0.90)
    assert p90_not_worse([best])["result"] == "not met"


def test_the_verdict_says_host_where_there_is_no_card(gpu_leaderboard):
    labels = [s.label for s in SUITE]
    current = history.make_entry(gpu_leaderboard, T0)
    gpu_leaderboard["verdict"] = build_verdict(gpu_leaderboard, labels, current, None, GATES)
    on_card = report.render(gpu_leaderboard)
    assert "Since the previous run on this card: none in the history." in on_card
    on_host = report.render({**gpu_leaderboard, "device": report.CPU_DEVICE})
    assert "Since the previous run on this host: none in the history." in on_host


def test_sm_busy_is_not_checked_without_ncu_metrics():
    from evo_sdpa.verdict import sm_busy

    assert sm_busy([{"name": "v", "sm_busy_pct": None}])["result"] == "not checked"
    assert sm_busy([{"name": "v", "sm_busy_pct": 71.0}])["result"] == "met"
    assert sm_busy([{"name": "v", "sm_busy_pct": 40.0}])["result"] == "not met"


def test_rendered_summary_opens_with_the_verdict_and_compares_cards(gpu_leaderboard):
    labels = [s.label for s in SUITE]
    current = history.make_entry(gpu_leaderboard, T0 + timedelta(hours=1))
    before = history.make_entry(gpu_leaderboard, T0)
    good = before["variants"]["good"]
    for case in good["cases"].values():
        case["variant_p50_us"] *= 0.5
        case["variant_iqr_us"] = 0.0
    gpu_leaderboard["verdict"] = build_verdict(gpu_leaderboard, labels, current, before, GATES)
    other = {**before, "device": H200}
    gpu_leaderboard["devices"] = device_table({current["device"]: current, H200: other})
    text = report.render(gpu_leaderboard)
    sections = [line for line in text.splitlines() if line.startswith("## ")]
    assert sections[0] == "## Verdict"
    verdict = text.split("## Verdict")[1].split("## ")[0]
    assert "Best per shape: **good**" in verdict and "slower: good" in verdict
    assert "Success criteria: correct everywhere claimed: **not met**" in verdict
    assert "## Speedup per card" in text and H200 in text
    assert "Since the previous run on this card (" in text


# ---------------------------------------------------------------- plots


def drawn_text(figure) -> list[str]:
    return [t.get_text() for ax in figure.axes for t in ax.texts]


def test_plots_are_written_with_and_without_data(gpu_leaderboard, tmp_path, drawn):
    def draw(plot, data, name):
        path = tmp_path / f"{name}.png"
        plot(data, str(path))
        assert path.read_bytes().startswith(PNG_SIGNATURE), name
        assert not list(tmp_path.glob("*.partial.png"))
        return drawn[-1]

    device = gpu_leaderboard["device"]
    roofline = draw(plots.plot_roofline, gpu_leaderboard, "roofline")
    points = plots.roofline_points(gpu_leaderboard)
    assert points and len(roofline.axes[0].collections) == len(points) and not drawn_text(roofline)
    assert drawn_text(draw(plots.plot_roofline, {**gpu_leaderboard, "ceilings": {}}, "roofline_none")) == [
        f"No roofline on {device}: the environment record has no measured ceilings (they are measured on a CUDA device)."]

    speedups = [r for e in gpu_leaderboard["variants"] for r in e["speedups"]]
    assert len(plots.latency_boxes(gpu_leaderboard)) == 2 * len(speedups)
    latency = draw(plots.plot_latency, gpu_leaderboard, "latency")
    panels = sorted(ax.get_title() for ax in latency.axes if ax.get_title())
    assert panels == sorted({f"{r['shape']} {r['dtype']}" for r in speedups})
    no_rows = {**gpu_leaderboard, "variants": [{**e, "speedups": []} for e in gpu_leaderboard["variants"]]}
    assert drawn_text(draw(plots.plot_latency, no_rows, "latency_none")) == [f"No latency measured on {device}."]

    assert drawn_text(draw(plots.plot_evolution, {}, "none")) == [
        "No evolution ran (results/evolve/<variant>/curve.json holds none)."]
    curve = {"generations": [{"generation": 0, "best_fitness": 0.8}, {"generation": 1, "best_fitness": 1.1}]}
    (line, sdpa) = draw(plots.plot_evolution, {"v": curve}, "evo").axes[0].lines
    assert line.get_label() == "v" and list(line.get_ydata()) == [0.8, 1.1] and sdpa.get_label() == "SDPA"


# ---------------------------------------------------------------- the reproducibility bundle


def unpack(archive: Path, dest: Path) -> Path:
    import tarfile

    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    return dest / "evo-sdpa-bundle"


def test_bundle_holds_everything_with_checksums_and_reruns(gpu_tree, tmp_path):
    from evo_sdpa import bundle

    archive = tmp_path / "bundle.tar.gz"
    listing = bundle.write(archive, REPO, gpu_tree, {"build": {"default_compute_capability": "9.0"}},
                           {"device": H100, "compute_capability": "9.0"})
    root = unpack(archive, tmp_path / "out")
    for name in ("results/env/environment.json", "results/bench/good.json", "kernels/common/evo_sdpa_abi.h",
                 "scripts/run_bench.py", "scripts/evo_sdpa/bench.py", "config.json", "rerun_bench.py"):
        assert name in listing["files"] and (root / name).is_file(), name
    assert bundle.verify(root) == []
    bench = json.loads((root / "results/bench/good.json").read_text())
    assert bundle.compare_bench(bench, bench, 0.05) == []
    slower = json.loads(json.dumps(bench))
    slower["cases"][0]["modes"][slower["cases"][0]["primary_mode"]]["speedup_p50"] *= 0.8
    assert len(bundle.compare_bench(bench, slower, 0.05)) == 1
    (root / "results/bench/good.json").write_text("{}")
    assert bundle.verify(root) == ["results/bench/good.json"]
    proc = subprocess.run([sys.executable, "rerun_bench.py", "good"], cwd=root, capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        "evo-sdpa: rerun: 1 file(s) differ from MANIFEST.json (first: results/bench/good.json); the bundle is damaged"]
