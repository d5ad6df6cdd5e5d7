"""The workflow as a user drives it: lint, dry-runs, one-line errors, what reruns after an edit,
and one end-to-end run of the whole DAG on a small CPU configuration."""
from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evo_sdpa.runners import interpreter_blocker
from evo_sdpa.variants import discover
from pipeline_helpers import CPU_ENV, REPO, SNAKEMAKE, copy_tree, layout_json, planned_jobs, snakemake

KINDS = {name: v.kind for name, v in discover().items()}
VARIANTS = tuple(sorted(KINDS))
CHAIN = ("build_variant", "sanitizer", "parity", "bench", "ncu", "analysis")


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """The whole DAG run once on the small CPU config in a copy of the repository, committed to a
    git repository of its own (so a kernel edit makes it dirty)."""
    root = copy_tree(tmp_path_factory.mktemp("evo"))
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "-c", "user.email=test@evo-sdpa", "-c", "user.name=test", "commit", "-qm", "the tree under test")
    snakemake(root, "--cores", "2", "results/final/final_summary.md", "--configfile", "config/test.yaml",
              env=NO_BYTECODE_ENV)
    return root


# A host that turns bytecode off (the H100 host does; common.smk gives the jobs a cache of their own).
NO_BYTECODE_ENV = {**{k: v for k, v in CPU_ENV.items() if k != "PYTHONPYCACHEPREFIX"}, "PYTHONDONTWRITEBYTECODE": "1"}


def test_jobs_cache_bytecode_outside_the_tree_on_a_host_without_bytecode(finished_run):
    cached = list((finished_run / ".snakemake" / "pycache").rglob("evo_sdpa/*.pyc"))
    assert cached, "the jobs wrote no bytecode under .snakemake/pycache"


def test_lint_is_clean():
    proc = snakemake(REPO, "--lint", check=False)
    assert proc.returncode == 0, proc.stderr
    assert "Lints for" not in proc.stdout + proc.stderr


def test_dry_run_plans_every_stage_for_every_variant(tmp_path):
    jobs = planned_jobs(copy_tree(tmp_path))
    for variant in VARIANTS:
        for rule in CHAIN:
            assert (rule, variant) in jobs
    assert ("ncu", "sdpa") in jobs and ("analysis", "sdpa") in jobs
    assert {("env_capture", ""), ("sdpa_baseline", ""), ("sdpa_parity", ""), ("final_summary", "")} <= jobs
    assert ("build_variant", "sdpa") not in jobs


def test_the_summary_reads_the_layout_the_rules_declare(tmp_path):
    """The summarize script takes where each result lives from the rule (patterns of the rules'
    own outputs), never from a second copy of the layout; the tests' copy is checked against it."""
    out = snakemake(copy_tree(tmp_path), "-n", "-p", "results/final/final_summary.md", "--configfile",
                    "config/test.yaml").stdout
    match = re.search(r"summarize\.py --layout '([^']+)'", out)
    assert match, out[-2000:]
    assert json.loads(match.group(1)) == layout_json("results")


def test_one_variant_chain_to_its_profile(tmp_path):
    jobs = planned_jobs(copy_tree(tmp_path), "results/nsight/v1_scalar/report.csv")
    assert {rule for rule, variant in jobs if variant == "v1_scalar"} == {
        "build_variant", "sanitizer", "parity", "bench", "ncu"}
    assert not any(variant == "triton_flash" for _, variant in jobs)
    assert ("final_summary", "") not in jobs


def test_a_build_claims_a_thread_per_translation_unit_within_cores(tmp_path):
    """v5_hopper compiles five .cu units at once given the cores, one at a time with --cores 1 or 2
    (one core is left to the GPU jobs); the build never runs more nvcc processes than Snakemake
    gave it threads."""
    repo = copy_tree(tmp_path)
    targets = ["results/build/v5_hopper/verdict.json", "results/build/v1_scalar/verdict.json"]

    def threads(cores: str) -> dict[str, str]:
        out = snakemake(repo, "-n", "-p", "--forceall", "--cores", cores, *targets).stdout
        return dict(re.findall(r"build_variant\.py --variant (\w+) .*?--jobs (\d+)", out))

    assert threads("8") == {"v5_hopper": "5", "v1_scalar": "1"}
    assert threads("1") == {"v5_hopper": "1", "v1_scalar": "1"}
    assert threads("2") == {"v5_hopper": "1", "v1_scalar": "1"}, "a core is left to the card's jobs"
    assert threads("4") == {"v5_hopper": "3", "v1_scalar": "1"}


def test_no_cuda_build_runs_beside_a_timing_job(tmp_path):
    """With --cores N a CUDA build runs beside the sanitizer, parity and profiles, never beside
    the baseline or a bench (evo_sdpa.hostshare): their `quiet_host` shares cannot add up."""
    repo = copy_tree(tmp_path)

    def shares(*args: str) -> dict[tuple[str, str], int]:
        out = snakemake(repo, "-n", "--cores", "4", "results/final/final_summary.md", *args).stdout
        found = {}
        for block in re.split(r"\n(?=(?:local)?rule \w+:)", out):
            rule = re.match(r"(?:local)?rule (\w+):", block.strip())
            share = re.search(r"resources: .*quiet_host=(\d+)", block)
            if rule and share:
                variant = re.search(r"wildcards: variant=(\w+)", block)
                found[(rule.group(1), variant.group(1) if variant else "")] = int(share.group(1))
        return found

    one_card = shares()
    assert one_card[("sdpa_baseline", "")] == 1024 and one_card[("bench", "v1_scalar")] == 1024
    assert one_card[("build_variant", "v5_hopper")] == 1 and one_card[("build_variant", "triton_flash")] == 0
    assert not any(rule in {"parity", "sanitizer", "ncu"} for rule, _ in one_card)
    two_cards = shares("--resources", "gpu=2")
    assert two_cards[("bench", "v1_scalar")] == 512 and two_cards[("build_variant", "v1_scalar")] == 513


def test_evolve_target_runs_after_the_variants_chain(tmp_path):
    jobs = planned_jobs(copy_tree(tmp_path), "results/evolve/v4_pipelined/best.json")
    assert {rule for rule, variant in jobs if variant == "v4_pipelined"} == set(CHAIN) | {"evolve"}
    assert ("env_capture", "") in jobs and ("final_summary", "") not in jobs
    (tmp_path / "all").mkdir()
    assert not any(rule == "evolve" for rule, _ in planned_jobs(copy_tree(tmp_path / "all")))


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.startswith("evo-sdpa:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_bad_config_key_stops_before_any_job(tmp_path):
    root = copy_tree(tmp_path)
    (root / "bad.yaml").write_text("timing:\n  min_sampels: 3\n")
    line = one_line_error(snakemake(root, "-n", "--configfile", "bad.yaml", check=False))
    assert "timing.min_sampels" in line and "min_samples" in line
    assert not (root / "results").exists()


def test_bad_config_value_names_what_is_allowed(tmp_path):
    root = copy_tree(tmp_path)
    (root / "bad.yaml").write_text("dtypes: [fp16, fp32]\n")
    line = one_line_error(snakemake(root, "-n", "--configfile", "bad.yaml", check=False))
    assert "dtypes[1]" in line and "fp16, bf16" in line


def test_unknown_variant_target_lists_known_ones(tmp_path):
    root = copy_tree(tmp_path)
    line = one_line_error(snakemake(root, "-n", "results/nsight/nope/report.csv", check=False))
    assert "'nope'" in line and "triton_flash" in line and "v1_scalar" in line


def test_bad_variant_metadata_names_file_and_field(tmp_path):
    root = copy_tree(tmp_path)
    meta = root / "kernels" / "v1_scalar" / "variant.yaml"
    meta.write_text(meta.read_text().replace("bf16", "bf17"))
    line = one_line_error(snakemake(root, "-n", check=False))
    assert "kernels/v1_scalar/variant.yaml" in line and "support.dtypes" in line and "bf17" in line


def test_end_to_end_cpu_run_reports_what_could_not_run(finished_run):
    final = finished_run / "results" / "final"
    summary = (final / "final_summary.md").read_text()
    leaderboard = json.loads((final / "leaderboard.json").read_text())
    assert (final / "speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "no CUDA device on this host" in summary
    by_name = {v["name"]: v for v in leaderboard["variants"]}
    assert set(by_name) == set(VARIANTS)
    for name, entry in by_name.items():
        assert entry["funnel"]["build"] == "pass", (name, entry["reasons"])
        if KINDS[name] == "triton" and interpreter_blocker():
            assert entry["funnel"]["parity"] == "skipped" and "interpreter" in entry["reasons"]["parity"]
        elif KINDS[name] == "triton":  # parity under the Triton interpreter
            assert entry["funnel"]["parity"] == "pass", (name, entry["reasons"])
            assert entry["parity"]["device"] == "cpu" and entry["parity"]["cases"] > 0
        else:
            assert entry["funnel"]["parity"] == "skipped"
    for entry in by_name.values():
        assert entry["funnel"]["bench"] == "skipped" and entry["speedups"] == []
    resources = json.loads((finished_run / "results/build/v1_scalar/resources.json").read_text())
    assert resources["kernels"] and all(k["spill_store_bytes"] == 0 for k in resources["kernels"])
    baseline = json.loads((finished_run / "results/baseline/sdpa.json").read_text())
    assert {row["device"] for row in baseline["rows"]} == {"cpu"}
    assert "not comparable" in baseline["note"]


@pytest.fixture
def run_copy(finished_run, tmp_path) -> Path:
    """A private copy of the finished run (outputs, mtimes and Snakemake's metadata) to edit."""
    return Path(shutil.copytree(finished_run, tmp_path / "run"))


def test_nothing_reruns_after_a_finished_run(finished_run):
    assert planned_jobs(finished_run) == set()


def edit(path: Path) -> None:
    """A real edit: Snakemake 9 ignores an mtime bump when the content is unchanged."""
    marker = "#" if path.suffix == ".py" else "//"
    path.write_text(path.read_text() + f"\n{marker} edited by the test\n")


def test_kernel_edit_reruns_only_that_variants_chain(run_copy):
    edit(run_copy / "kernels/v1_scalar/kernel.cu")
    jobs = planned_jobs(run_copy)
    assert jobs == {(rule, "v1_scalar") for rule in CHAIN} | {("final_summary", ""), ("all", "")}


def test_library_edit_reruns_the_stages_that_import_it(run_copy):
    edit(run_copy / "scripts/evo_sdpa/report.py")
    assert planned_jobs(run_copy) == {("final_summary", ""), ("all", "")}
    edit(run_copy / "scripts/evo_sdpa/parity.py")
    rules = {rule for rule, _ in planned_jobs(run_copy)}
    assert "parity" in rules and "build_variant" not in rules and "sdpa_baseline" not in rules


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_evolve_without_a_gpu_checks_the_first_generation_and_says_why(run_copy):
    """Only the evolve job runs after the finished chain; it builds the first generation around
    the defaults, writes best.json as not run (no number invented) and an empty curve."""
    proc = snakemake(run_copy, "--cores", "2", "results/evolve/v1_scalar/best.json", "--configfile", "config/test.yaml")
    assert "rule evolve:" in proc.stderr and "rule build_variant:" not in proc.stderr
    assert ("evo-sdpa: evolve v1_scalar: not run: no CUDA device on this host (the search gates and times its "
            "candidates on a GPU); checked the tunables and that the first generation builds (3 pass)") in proc.stderr
    best = json.loads((run_copy / "results/evolve/v1_scalar/best.json").read_text())
    assert best["status"] == "skipped" and best["winner"] is None
    assert best["reasons"] == ["not run: no CUDA device on this host (the search gates and times its candidates on a GPU)"]
    rows = best["checked"]["first_generation"]
    assert len(rows) == 3 and rows[0]["origin"] == "defaults" and best["checked"]["builds"] == {"pass": 3}
    assert all(len(row["changed"]) in (1, 2) for row in rows[1:])
    built = json.loads((run_copy / "results/evolve/v1_scalar/candidates" / rows[1]["id"] / "build/verdict.json").read_text())
    knob, (_, value) = next(iter(rows[1]["changed"].items()))
    assert built["tunables"][knob] == value and f"-DV1_SCALAR_WARPS_PER_BLOCK={value}" in built["command"]
    curve = json.loads((run_copy / "results/evolve/v1_scalar/curve.json").read_text())
    assert curve["sdpa"] == 1.0 and curve["generations"] == []
    assert planned_jobs(run_copy, "results/evolve/v1_scalar/best.json") == set()


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_compile_error_is_a_verdict_with_the_first_error(tmp_path):
    root = copy_tree(tmp_path)
    kernel = root / "kernels/v1_scalar/kernel.cu"
    kernel.write_text(kernel.read_text() + "\nthis_is_not_cuda;\n")
    snakemake(root, "--cores", "1", "results/nsight/v1_scalar/status.json", "--configfile", "config/test.yaml")
    verdict = json.loads((root / "results/build/v1_scalar/verdict.json").read_text())
    assert verdict["status"] == "fail"
    assert "kernel.cu(" in verdict["first_error"] and "error" in verdict["first_error"]
    assert "this_is_not_cuda" in (root / "results/build/v1_scalar/compiler.log").read_text()
    assert verdict["artifact"] is None
    # Every later stage names the failed build, not the host's missing GPU, as why it did not run.
    for stage, path in (("sanitizer", "sanitizer/v1_scalar/verdict.json"), ("parity", "parity/v1_scalar.json"),
                        ("bench", "bench/v1_scalar.json"), ("ncu", "nsight/v1_scalar/status.json")):
        record = json.loads((root / "results" / path).read_text())
        assert record["status"] == "skipped", stage
        assert record["cause"]["stage"] == "build" and record["cause"]["status"] == "fail", stage
        assert "build failed" in record["reasons"][0], (stage, record["reasons"])


def test_missing_nvcc_is_one_line_naming_the_tool(tmp_path):
    root = copy_tree(tmp_path)
    env = {**CPU_ENV, "PATH": str(Path(sys.executable).parent), "CUDA_HOME": str(tmp_path / "none")}
    proc = subprocess.run([sys.executable, "scripts/build_variant.py", "--variant", "v1_scalar",
                           "--compute-capability", "9.0", "--config-json", '{"build": {}}',
                           "--verdict", "out/v.json", "--resources",
                           "out/r.json", "--compiler-log", "out/c.log"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"evo-sdpa: nvcc not found on PATH or in {tmp_path / 'none' / 'bin'}: install the CUDA toolkit (12.4 or "
        "newer) and put its bin/ on PATH"]
    assert not (root / "out").exists()


def test_stage_that_cannot_reach_a_verdict_shows_its_line_and_leaves_nothing(tmp_path):
    root = copy_tree(tmp_path)
    env = {**CPU_ENV, "PATH": f"{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin",
           "CUDA_HOME": str(tmp_path / "none")}
    proc = subprocess.run(SNAKEMAKE + ["--cores", "1", "results/build/v1_scalar/verdict.json"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "evo-sdpa: nvcc not found on PATH or in " in proc.stdout + proc.stderr
    assert not (root / "results/build/v1_scalar").exists()
    assert "nvcc not found" in (root / "results/logs/build/v1_scalar.log").read_text()


# ---------------------------------------------------------------- what a new user hits (issue 12)


def test_every_stage_stamps_where_it_ran(finished_run):
    head = git(finished_run, "rev-parse", "HEAD").strip()
    results = finished_run / "results"
    for variant in VARIANTS:
        records = {stage: json.loads(path.read_text()) for stage, path in {
            "build": results / "build" / variant / "verdict.json",
            "sanitizer": results / "sanitizer" / variant / "verdict.json",
            "parity": results / "parity" / f"{variant}.json",
            "bench": results / "bench" / f"{variant}.json",
            "ncu": results / "nsight" / variant / "status.json"}.items()}
        digests = {stage: record["measured_at"]["sources"] for stage, record in records.items()}
        assert len(set(digests.values())) == 1 and None not in digests.values(), (variant, digests)
        for stage, record in records.items():
            assert record["measured_at"]["git"] == {"commit": head, "dirty": False}, (variant, stage)
            assert record["measured_at"]["host"] == platform.node(), (variant, stage)
            assert record["measured_at"]["lock"] is None, (variant, stage)  # no card, no lock
    env = json.loads((results / "env" / "environment.json").read_text())
    assert env["card"] == {"name": "cpu", "uuid": None, "compute_capability": None}
    baseline = json.loads((results / "baseline" / "sdpa.json").read_text())
    assert baseline["measured_at"]["card"]["name"] == "cpu" and baseline["rel_spread_bound"] == 0.2


def test_parity_takes_sdpas_error_from_the_table_measured_once(finished_run):
    """One job measures SDPA's error on the tier's cases; every parity job bounds its cases by it."""
    table = json.loads((finished_run / "results/baseline/sdpa_parity.json").read_text())
    assert table["measured_at"]["card"]["name"] == "cpu" and table["tier"] == "tiny"
    result = json.loads((finished_run / "results/parity/triton_flash.json").read_text())
    matrix = [r for r in result["records"] if "sdpa_max_abs" in r]
    assert matrix and result["sdpa_errors"]["table_unused"] is None
    assert result["sdpa_errors"]["from_table"] == len(matrix) and result["sdpa_errors"]["measured_here"] == 0
    assert all(r["sdpa_max_abs"] == table["errors"][r["id"]] for r in matrix)


def test_cpu_summary_claims_only_what_was_checked(finished_run):
    leaderboard = json.loads((finished_run / "results/final/leaderboard.json").read_text())
    summary = (finished_run / "results/final/final_summary.md").read_text()
    for entry in leaderboard["variants"]:
        criteria = {c["criterion"]: c["result"] for c in entry["criteria"]}
        assert criteria["correct on its whole declared support (parity)"] == "not checked", entry["name"]
        assert entry["fell_out_at"] is None, "nothing failed on this host"
        assert "sanitizer" in entry["not_run_here"]
        if KINDS[entry["name"]] == "triton":
            assert criteria["builds without warnings or spills"] == "not checked"
    assert "fell out" not in summary and "stopped at" not in summary
    assert len(summary.split("## What could not run here")[1].strip().splitlines()) == len(set(
        summary.split("## What could not run here")[1].strip().splitlines()))


def test_kernel_edit_and_rerun_shows_the_state_it_was_measured_at(run_copy):
    """The environment record (clean) does not rerun for a kernel edit; the summary prints the
    edited variant's own state (dirty) and says it differs."""
    edit(run_copy / "kernels/v1_scalar/kernel.cu")
    snakemake(run_copy, "--cores", "2", "results/final/final_summary.md", "--configfile", "config/test.yaml")
    leaderboard = json.loads((run_copy / "results/final/leaderboard.json").read_text())
    assert leaderboard["git"]["dirty"] is False, "the environment record was not rerun"
    states = {e["name"]: e["measured_at"] for e in leaderboard["variants"]}
    assert [s["dirty"] for s in states["v1_scalar"]] == [True]
    assert all(s["dirty"] is False for s in states["v2_tiled"])
    summary = (run_copy / "results/final/final_summary.md").read_text()
    assert any(line.startswith("- v1_scalar: measured at git ") and "(dirty)" in line and "(clean)" in line
               for line in summary.splitlines())
    v1_row = next(line for line in summary.splitlines() if line.startswith("| v1_scalar |"))
    assert "(dirty)" in v1_row


def test_ncu_that_cannot_run_says_why_on_the_console(run_copy):
    proc = snakemake(run_copy, "--cores", "1", "results/nsight/v1_scalar/report.csv", "--configfile",
                     "config/test.yaml", "--forcerun", "ncu")
    assert proc.returncode == 0
    assert ("evo-sdpa: ncu v1_scalar: not profiled: no CUDA device on this host; "
            "results/nsight/v1_scalar/report.csv is left empty "
            "(the reason is in results/nsight/v1_scalar/status.json)") in proc.stderr
    assert (run_copy / "results/nsight/v1_scalar/report.csv").read_text() == ""


def test_damaged_result_is_one_line_and_the_previous_summary_stays(run_copy):
    summary = run_copy / "results/final/final_summary.md"
    before = summary.read_text()
    parity = run_copy / "results/parity/triton_flash.json"
    parity.write_text(parity.read_text()[:100])
    proc = snakemake(run_copy, "--cores", "1", "results/final/final_summary.md", "--configfile", "config/test.yaml",
                     "--allowed-rules", "final_summary", "--forcerun", "final_summary", check=False)
    assert proc.returncode != 0
    line = one_line_error(proc)
    assert line.startswith("evo-sdpa: results/parity/triton_flash.json: not valid JSON (")
    assert line.endswith("--forcerun results/parity/triton_flash.json")
    assert summary.read_text() == before, "the last good summary is kept"


def test_a_kept_summary_is_made_again_by_the_next_run(run_copy):
    """The summary job fails (a damaged result) in a run where another result changed: the last
    good summary is kept, and the next run still makes it again once the damage is repaired, although
    Snakemake restored it newer than that result and recorded the failed job's inputs as read."""
    summary = run_copy / "results/final/final_summary.md"
    before = summary.read_text()
    bench = run_copy / "results/bench/v1_scalar.json"
    record = json.loads(bench.read_text())
    bench.write_text(json.dumps({**record, "reasons": record["reasons"] + ["changed beside the failure"]}))
    parity = run_copy / "results/parity/triton_flash.json"
    good, stat = parity.read_text(), parity.stat()
    parity.write_text(good[:100])
    proc = snakemake(run_copy, "--cores", "1", "results/final/final_summary.md", "--configfile", "config/test.yaml",
                     check=False)
    assert proc.returncode != 0 and summary.read_text() == before
    parity.write_text(good)
    os.utime(parity, ns=(stat.st_atime_ns, stat.st_mtime_ns))   # repaired as it was, time and all
    assert ("final_summary", "") in planned_jobs(run_copy, "results/final/final_summary.md")
    snakemake(run_copy, "--cores", "1", "results/final/final_summary.md", "--configfile", "config/test.yaml")
    assert "changed beside the failure" in summary.read_text()


def test_deleted_intermediate_warns_with_the_command_that_rebuilds_it(run_copy):
    (run_copy / "results/parity/v1_scalar.json").unlink()
    proc = snakemake(run_copy, "-n", "results/final/final_summary.md", "--configfile", "config/test.yaml")
    assert "Nothing to be done" in proc.stdout + proc.stderr, "Snakemake 9 does not rebuild it by itself"
    hint = [line for line in proc.stderr.splitlines() if line.startswith("evo-sdpa: ")]
    assert hint == ["evo-sdpa: results/parity/v1_scalar.json is missing but results/final/final_summary.md "
                    "exists, so Snakemake will not rebuild it on its own; rebuild it: snakemake --cores 1 "
                    "results/final/final_summary.md --forcerun results/parity/v1_scalar.json"]
    jobs = planned_jobs(run_copy, "results/final/final_summary.md", "--forcerun", "results/parity/v1_scalar.json")
    assert {("parity", "v1_scalar"), ("bench", "v1_scalar"), ("final_summary", "")} <= jobs


def test_a_variant_new_to_the_run_is_not_called_missing(run_copy):
    """Its files do not exist yet and Snakemake makes them: no warning, and its chain is planned."""
    folder = run_copy / "kernels/v1_again"
    shutil.copytree(run_copy / "kernels/v1_scalar", folder)
    meta = folder / "variant.yaml"
    meta.write_text(meta.read_text().replace("name: v1_scalar", "name: v1_again"))
    proc = snakemake(run_copy, "-n", "results/final/final_summary.md", "--configfile", "config/test.yaml")
    assert not [line for line in proc.stderr.splitlines() if line.startswith("evo-sdpa: ")], proc.stderr
    assert ("build_variant", "v1_again") in planned_jobs(run_copy, "results/final/final_summary.md")


def test_a_deleted_file_the_summary_does_not_read_is_named_too(run_copy):
    """sdpa_parity.json feeds every parity job and the ncu table feeds the analysis; the summary reads
    neither, so their loss would otherwise pass without a word."""
    (run_copy / "results/baseline/sdpa_parity.json").unlink()
    (run_copy / "results/nsight/v1_scalar/report.csv").unlink()
    proc = snakemake(run_copy, "-n", "results/final/final_summary.md", "--configfile", "config/test.yaml")
    hint = [line for line in proc.stderr.splitlines() if line.startswith("evo-sdpa: ")]
    assert hint == ["evo-sdpa: results/baseline/sdpa_parity.json (and 1 more) is missing but "
                    "results/final/final_summary.md exists, so Snakemake will not rebuild it on its own; rebuild it: "
                    "snakemake --cores 1 results/final/final_summary.md --forcerun results/baseline/sdpa_parity.json "
                    "results/nsight/v1_scalar/report.csv"]


def decoded_results(html: str) -> list[bytes]:
    """Every file the self-contained report embeds (base64 data URIs)."""
    import base64
    import re

    return [base64.b64decode(m) for m in re.findall(r"data:[^,\"']*;base64,([A-Za-z0-9+/=]+)", html)]


def test_html_report_shows_the_summary_plots_and_bottlenecks(finished_run):
    """`snakemake --report` builds one self-contained HTML file with the summary, the plots and
    each variant's bottlenecks, under the categories of their stages."""
    snakemake(finished_run, "--report", "results/final/report.html", "--configfile", "config/test.yaml")
    html = (finished_run / "results/final/report.html").read_text()
    for name in ("final_summary.md", "speedup.png", "roofline.png", "latency.png", "bottlenecks.md",
                 "1. Summary", "2. Plots", "3. Bottlenecks"):
        assert name in html, name
    files = decoded_results(html)
    assert any(f.startswith(b"# evo-sdpa final summary") and b"## Verdict" in f for f in files)
    assert sum(f.startswith(b"\x89PNG") for f in files) >= 4
    bottlenecks = [f for f in files if f.startswith(b"# Bottlenecks: ")]
    assert {f.splitlines()[0] for f in bottlenecks} >= {b"# Bottlenecks: sdpa", b"# Bottlenecks: v1_scalar"}


def test_history_gate_and_accept_after_a_run(run_copy):
    """The summary appended this run under results/history/<device>/; the gate passes with no
    accepted run; accepting is one command; a rerun appends, never rewrites."""
    pointer = json.loads((run_copy / "results/final/history_entry.json").read_text())
    first = run_copy / pointer["entry"]
    assert first.parent.parent == run_copy / "results/history" and first.exists()
    bare = snakemake(run_copy, "--cores", "1", "results/final/gates.json", "--configfile", "config/test.yaml")
    assert "so only the one-card-model check ran" in bare.stderr   # no gate configured, none accepted: said
    subprocess.run([sys.executable, "scripts/accept_run.py"], cwd=run_copy, check=True, capture_output=True)
    assert first.with_name(first.name + ".accepted").exists()
    before = first.read_text()
    gated = snakemake(run_copy, "--cores", "1", "results/final/gates.json", "--configfile", "config/test.yaml",
                      "--forcerun", "final_summary")
    assert "one-card-model check" not in gated.stderr
    assert json.loads((run_copy / "results/final/gates.json").read_text())["checked"][-1].startswith(
        "no variant slower than in, or no longer correct since, the accepted run")
    entries = sorted(first.parent.glob("*.json"))
    assert len(entries) == 2 and first.read_text() == before
    summary = (run_copy / "results/final/final_summary.md").read_text()
    assert "Since the previous run on this host (" in summary


def test_bundle_target_and_its_rerun_script_say_what_they_can_do_here(run_copy, tmp_path):
    import tarfile

    snakemake(run_copy, "--cores", "1", "results/final/bundle.tar.gz", "--configfile", "config/test.yaml")
    with tarfile.open(run_copy / "results/final/bundle.tar.gz") as tar:
        tar.extractall(tmp_path / "b", filter="data")
    root = tmp_path / "b" / "evo-sdpa-bundle"
    manifest = json.loads((root / "MANIFEST.json").read_text())
    assert {"results/env/environment.json", "config.json", "kernels/triton_flash/variant.yaml",
            "results/bench/triton_flash.json", "results/final/final_summary.md"} <= set(manifest["files"])
    proc = subprocess.run([sys.executable, "rerun_bench.py", "triton_flash"], cwd=root, env=CPU_ENV,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == ("evo-sdpa: rerun: triton_flash not measured: "
                                                    "no CUDA device on this host")
