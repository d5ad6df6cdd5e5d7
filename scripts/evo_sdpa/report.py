"""The final summary: per-variant funnel, speedups against SDPA, success criteria, bottleneck
highlights beside SDPA's, what could not run and why; rendered with jinja2, plotted with matplotlib."""
from __future__ import annotations

import math
import os
from pathlib import Path

from .io import read_json

STAGES = ("build", "sanitizer", "parity", "bench", "ncu", "analysis")
PASSING = {"pass", "measured", "analysed"}
TEMPLATE = Path(__file__).resolve().parent / "templates" / "final_summary.md.j2"
TOP_FINDINGS = 3


def stage_paths(results: Path, variant: str) -> dict[str, Path]:
    return {
        "build": results / "build" / variant / "verdict.json",
        "sanitizer": results / "sanitizer" / variant / "verdict.json",
        "parity": results / "parity" / f"{variant}.json",
        "bench": results / "bench" / f"{variant}.json",
        "ncu": results / "nsight" / variant / "status.json",
        "analysis": results / "analysis" / variant / "bottlenecks.json",
    }


def _reason(record: dict) -> str:
    return "; ".join(record.get("reasons", [])) or record.get("reason", "")


def speedup_rows(bench: dict) -> list[dict]:
    rows = []
    for case in bench.get("cases", []):
        if case["status"] != "measured":
            continue
        mode = case["modes"][case["primary_mode"]]
        rows.append({
            "shape": case["label"], "dtype": case["dtype"], "mode": mode["label"],
            "variant_p50_us": mode["variant"]["p50_us"], "variant_p90_us": mode["variant"]["p90_us"],
            "sdpa_p50_us": mode["sdpa"]["p50_us"], "sdpa_p90_us": mode["sdpa"]["p90_us"],
            "speedup_p50": mode["speedup_p50"], "speedup_p90": mode["speedup_p90"],
            "variant_tflops": mode["variant_tflops"], "recheck": case["recheck"]["status"],
            "sanity_flag": mode["sanity_flag"], "ended_by": mode["ended_by"],
        })
    return rows


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def top_findings(analysis: dict) -> list[dict]:
    return [{"title": f["title"], "metric": f["metric"], "value": f["value"], "lever": f["lever"]}
            for f in analysis.get("findings", [])[:TOP_FINDINGS]]


def variant_entry(results: Path, name: str) -> dict:
    records = {stage: read_json(path) for stage, path in stage_paths(results, name).items()}
    funnel = {stage: records[stage]["status"] for stage in STAGES}
    fell_out = next((stage for stage in STAGES if funnel[stage] == "fail"), None)
    stopped = next((stage for stage in STAGES if funnel[stage] == "skipped"
                    and not records[stage].get("disabled")), None)
    build = records["build"]
    speedups = speedup_rows(records["bench"])
    return {
        "name": name,
        "kind": build.get("kind"),
        "funnel": funnel,
        # Only each stage's own reason: a stage skipped because of an earlier one adds nothing.
        "reasons": {stage: _reason(records[stage]) for stage in STAGES
                    if funnel[stage] not in PASSING and not records[stage].get("cause")},
        "fell_out_at": fell_out,
        "stopped_at": None if fell_out else stopped,
        "parity": {k: records["parity"].get(k) for k in ("cases", "passed", "failed", "tier", "device",
                                                          "first_failure", "worst_passing_max_abs")},
        "sanitizer_tools": records["sanitizer"].get("tools", []),
        "speedups": speedups,
        "geomean_speedup_p50": geomean([r["speedup_p50"] for r in speedups]),
        "sanity_flags": records["bench"].get("sanity_flags", []),
        "bottlenecks": top_findings(records["analysis"]),
        "roofline": records["analysis"].get("roofline"),
    }


def criteria(entry: dict, suite_labels: list[str]) -> list[dict]:
    """The success criteria of one variant, each met, not met, or not measured (with why)."""
    f = entry["funnel"]

    def gate(stage: str) -> str:
        return "met" if f[stage] in PASSING else ("not measured" if f[stage] == "skipped" else "not met")

    faster = {r["shape"] for r in entry["speedups"] if r["speedup_p50"] > 1.0}
    measured = {r["shape"] for r in entry["speedups"]}
    if not measured:
        beat_one = beat_all = "not measured"
    else:
        beat_one = "met" if faster else "not met"
        beat_all = "met" if set(suite_labels) <= faster else "not met"
    return [
        {"criterion": "builds without warnings or spills", "result": gate("build")},
        {"criterion": "memory-safe and race-free (compute-sanitizer)", "result": gate("sanitizer")},
        {"criterion": "correct on its whole declared support (parity)", "result": gate("parity")},
        {"criterion": "faster than SDPA (p50) on at least one bench shape", "result": beat_one},
        {"criterion": "faster than SDPA (p50) on every bench shape", "result": beat_all},
    ]


def not_run_here(env: dict, entries: list[dict], baseline: dict) -> list[str]:
    """Plain statements of which stages could not run on this host and why."""
    lines = []
    if not env.get("cuda"):
        lines.append(f"Environment: {env.get('not_measured')}.")
    if baseline.get("note"):
        lines.append(f"Baseline: {baseline['note']}.")
    for entry in entries:
        for stage, reason in entry["reasons"].items():
            if entry["funnel"][stage] == "skipped":
                lines.append(f"{entry['name']} {stage}: {reason}")
    return lines


def baseline_rows(baseline: dict) -> list[dict]:
    return [r for r in baseline.get("rows", []) if r.get("status") == "measured"]


def build_leaderboard(results: Path, variants: list[str], cfg: dict, suite_labels: list[str]) -> dict:
    env = read_json(results / "env" / "environment.json")
    baseline = read_json(results / "baseline" / "sdpa.json")
    entries = [variant_entry(results, name) for name in variants]
    for entry in entries:
        entry["criteria"] = criteria(entry, suite_labels)
    sdpa_analysis = read_json(results / "analysis" / "sdpa" / "bottlenecks.json")
    ranked = sorted(entries, key=lambda e: -(e["geomean_speedup_p50"] or 0.0))
    return {
        "device": env["device"]["name"] if env.get("device") else "cpu (no CUDA device)",
        "git": env.get("git"),
        "versions": env.get("versions"),
        "ceilings": env.get("ceilings"),
        "bench_suite": cfg["bench_suite"],
        "profile": cfg["profile"],
        "variants": ranked,
        "sdpa": {"status": sdpa_analysis["status"], "bottlenecks": top_findings(sdpa_analysis),
                 "roofline": sdpa_analysis.get("roofline"), "reasons": sdpa_analysis.get("reasons", [])},
        "baseline": baseline_rows(baseline),
        "baseline_note": baseline.get("note"),
        "not_run": not_run_here(env, entries, baseline),
    }


def format_number(value, fmt: str = "{:.2f}") -> str:
    if value is None:
        return "n/a"
    return fmt.format(value) if isinstance(value, (int, float)) else str(value)


def render(leaderboard: dict) -> str:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE.parent)),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = format_number
    return env.get_template(TEMPLATE.name).render(lb=leaderboard, stages=STAGES)


def plot_speedups(leaderboard: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(e["name"], r) for e in leaderboard["variants"] for r in e["speedups"]]
    fig, ax = plt.subplots(figsize=(10, 5))
    if not rows:
        ax.axis("off")
        why = leaderboard["not_run"][0] if leaderboard["not_run"] else "no variant reached the bench"
        ax.text(0.5, 0.5, f"No speedup measured on {leaderboard['device']}.\n{why}",
                ha="center", va="center", wrap=True)
    else:
        labels = sorted({f"{r['shape']} {r['dtype']}" for _, r in rows})
        names = sorted({name for name, _ in rows})
        width = 0.8 / len(names)
        for i, name in enumerate(names):
            values = {f"{r['shape']} {r['dtype']}": r["speedup_p50"] for n, r in rows if n == name}
            xs = [j + i * width for j in range(len(labels))]
            ax.bar(xs, [values.get(lbl, float("nan")) for lbl in labels], width, label=name)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_yscale("log")  # rungs of the ladder differ by orders of magnitude
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))], labels, fontsize=7,
                      rotation=30, ha="right")
        ax.set_ylabel("speedup vs SDPA (p50, same run, log)")
        ax.set_title(f"evo-sdpa speedups on {leaderboard['device']}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    partial = f"{path}.partial.png"  # written whole, then renamed: never half a plot on disk
    fig.savefig(partial, dpi=110)
    plt.close(fig)
    os.replace(partial, path)
