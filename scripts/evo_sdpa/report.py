"""The final summary: per-variant funnel, speedups against SDPA, success criteria, bottleneck
highlights beside SDPA's, what could not run and why, the state and card each variant's numbers
were measured at; rendered with jinja2, plotted with matplotlib."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from .device import CPU_DEVICE_ID
from .io import read_env, read_object, read_record
from .provenance import KEY as MEASURED_AT
from .stats import CONVERGED, FIRM_ENDINGS, PINNED
from .variants import SDPA_ENTRY

STAGES = ("build", "sanitizer", "parity", "bench", "ncu", "analysis")
PASSING = {"pass", "measured", "analysed"}
# The stages that stamp where they ran (analysis only reads the profile).
STAMPED = ("build", "sanitizer", "parity", "bench", "ncu")
# The verb a skipped record starts with; what follows is the reason itself.
SKIP_VERBS = ("not run: ", "not measured: ", "not profiled: ", "not analysed: ")
TEMPLATE = Path(__file__).resolve().parent / "templates" / "final_summary.md.j2"
CPU_DEVICE = "cpu (no CUDA device)"  # the leaderboard's device where the env stage found none
TOP_FINDINGS = 3


# The files a layout names per variant: each stage's record, the build's resources, the curve and
# the record of an evolution run (both optional: only a search a user ran leaves them).
LAYOUT_FILES = (*STAGES, "resources", "evolve_curve", "evolve_best")


@dataclass(frozen=True)
class ResultsLayout:
    """Where the files the summary reads live, as the rules declare them (the summarize rule passes
    this as JSON): the environment record, the baseline, and per variant file a pattern holding
    {variant} (SDPA's own profile and analysis are the variant `sdpa`)."""
    env: Path
    baseline: Path
    patterns: dict[str, str]

    @classmethod
    def from_json(cls, data: dict) -> "ResultsLayout":
        missing = [name for name in LAYOUT_FILES if name not in data.get("patterns", {})]
        if missing or "env" not in data or "baseline" not in data:
            raise ValueError(f"a results layout names env, baseline and patterns for {', '.join(LAYOUT_FILES)}; "
                             f"missing: {', '.join(missing) or 'env or baseline'}")
        return cls(Path(data["env"]), Path(data["baseline"]), dict(data["patterns"]))

    def path(self, name: str, variant: str) -> Path:
        return Path(self.patterns[name].format(variant=variant))


def stage_paths(layout: ResultsLayout, variant: str) -> dict[str, Path]:
    return {stage: layout.path(stage, variant) for stage in STAGES}


def _reason(record: dict) -> str:
    return "; ".join(record.get("reasons", [])) or record.get("reason", "")


def bare_reason(reason: str) -> str:
    """A skipped record's reason without its verb: 'not run: no CUDA device' -> 'no CUDA device'."""
    for verb in SKIP_VERBS:
        if reason.startswith(verb):
            return reason[len(verb):]
    return reason


def not_run_because(record: dict) -> str:
    """Why a skipped stage did not run, short: its own reason, or the earlier stage that stopped it."""
    cause = record.get("cause")
    if cause:
        return f"{cause['stage']} {'failed' if cause['status'] == 'fail' else 'did not run'}"
    return bare_reason(_reason(record))


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
            "variant_iqr_us": mode["variant"].get("iqr_us"), "sdpa_iqr_us": mode["sdpa"].get("iqr_us"),
            "variant_p99_us": mode["variant"].get("p99_us"), "sdpa_p99_us": mode["sdpa"].get("p99_us"),
            "variant_tflops": mode["variant_tflops"], "recheck": case["recheck"]["status"],
            "sanity_flag": mode["sanity_flag"], "ended_by": mode["ended_by"],
            "firm": mode["ended_by"] in FIRM_ENDINGS,
            "speedup_p50_ci95": mode.get("speedup_p50_ci95"), "repeat_flag": mode.get("repeat_flag"),
            "host_flag": mode.get("host_flag"),
        })
    return rows


def eager_rows(bench: dict) -> list[dict]:
    """Every measured case's eager timing: the GPU p50s (the stream gated while the host queues a
    call) beside each side's host time per call, which paces calls made back to back from Python."""
    rows = []
    for case in bench.get("cases", []):
        mode = case.get("modes", {}).get("eager") if case["status"] == "measured" else None
        if mode is None:
            continue
        rows.append({
            "shape": case["label"], "dtype": case["dtype"], "primary": case["primary_mode"] == "eager",
            "variant_p50_us": mode["variant"]["p50_us"], "sdpa_p50_us": mode["sdpa"]["p50_us"],
            "speedup_p50": mode["speedup_p50"], "firm": mode["ended_by"] in FIRM_ENDINGS,
            "ended_by": mode["ended_by"], "variant_host_us": mode.get("variant_host_us"),
            "sdpa_host_us": mode.get("sdpa_host_us"), "host_flag": mode.get("host_flag"),
        })
    return rows


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def top_findings(analysis: dict) -> list[dict]:
    return [{"title": f["title"], "metric": f["metric"], "value": f["value"], "lever": f["lever"]}
            for f in analysis.get("findings", [])[:TOP_FINDINGS]]


def build_unchecked(build: dict, kernels: list[dict]) -> str | None:
    """Why a passing build's warnings and spills were not checked (no compiled kernel was
    inspected: Triton imported only, without a GPU), or None when they were."""
    if build["status"] != "pass" or kernels:
        return None
    return build.get("note") or "no compiled kernel's resources were read"


def measured_at(records: dict) -> list[dict]:
    """The git state and sources digest the stages of one variant ran at, grouped: one group
    when the whole chain ran at one state."""
    groups: dict[tuple, list[str]] = {}
    for stage in STAMPED:
        stamp = records[stage].get(MEASURED_AT)
        if stamp:
            git = stamp.get("git") or {}
            groups.setdefault((git.get("commit"), git.get("dirty"), stamp.get("sources")), []).append(stage)
    return [{"commit": commit, "dirty": dirty, "sources": sources, "stages": stages}
            for (commit, dirty, sources), stages in groups.items()]


def stage_cards(records: dict) -> dict[str, dict]:
    """The card each stage that ran on one recorded (name, UUID, and the host it sits in), by stage."""
    return {stage: {**records[stage][MEASURED_AT]["card"], "host": records[stage][MEASURED_AT].get("host")}
            for stage in STAMPED if (records[stage].get(MEASURED_AT) or {}).get("card")}


def where_measured(baseline: dict, entries: list[dict]) -> dict:
    """Per result, the host and card it came from: each distinct (host, card) named once ("card 1",
    ...; a host without a CUDA device is "CPU of <host>"), the baseline and every stage of every
    variant pointing at that name, and whether several are present (a multi-GPU or cluster run
    spreads the stages)."""
    cards: dict[tuple, dict] = {}

    def label(card: dict) -> str:
        key = (card.get("host"), card.get("name"), card.get("uuid"))
        if key not in cards:
            cpu = key[1] == CPU_DEVICE_ID
            gpus = sum(1 for known in cards.values() if not known["cpu"])
            cards[key] = {"label": f"CPU of {key[0] or 'an unknown host'}" if cpu else f"card {gpus + 1}",
                          "host": key[0], "name": key[1], "uuid": key[2], "cpu": cpu}
        return cards[key]["label"]

    stamp = baseline.get(MEASURED_AT) or {}
    baseline_card = label({**stamp["card"], "host": stamp.get("host")}) if stamp.get("card") else None
    rows = [{"name": e["name"], "cells": {stage: label(card) for stage, card in e["cards"].items()}}
            for e in entries]
    return {"cards": list(cards.values()), "baseline": baseline_card, "rows": [r for r in rows if r["cells"]],
            "several": len(cards) > 1}


def variant_entry(layout: ResultsLayout, name: str) -> dict:
    records = {stage: read_record(path) for stage, path in stage_paths(layout, name).items()}
    funnel = {stage: records[stage]["status"] for stage in STAGES}
    fell_out = next((stage for stage in STAGES if funnel[stage] == "fail"), None)
    own_skip = [stage for stage in STAGES if funnel[stage] == "skipped" and not records[stage].get("cause")]
    build = records["build"]
    kernels = read_object(layout.path("resources", name), "a build's resources", {"kernels": list})["kernels"]
    speedups = speedup_rows(records["bench"])
    states = measured_at(records)
    return {
        "name": name,
        "kind": build.get("kind"),
        "funnel": funnel,
        # Only each stage's own reason: a stage skipped because of an earlier one adds nothing.
        "reasons": {stage: _reason(records[stage]) for stage in STAGES
                    if funnel[stage] not in PASSING and not records[stage].get("cause")},
        # Why each skipped stage did not run: its own reason, or the earlier stage that stopped it.
        "not_run_because": {stage: not_run_because(records[stage]) for stage in STAGES
                            if funnel[stage] == "skipped"},
        "fell_out_at": fell_out,  # the first stage that failed: a verdict against the variant
        "not_run_here": [s for s in own_skip if not records[s].get("disabled")],  # nothing failed
        "disabled": [s for s in own_skip if records[s].get("disabled")],
        "build_unchecked": build_unchecked(build, kernels),
        "parity": {k: records["parity"].get(k) for k in ("cases", "passed", "failed", "tier", "gpu_tier",
                                                          "device", "interpreter", "first_failure",
                                                          "worst_passing_max_abs")},
        "sanitizer_tools": records["sanitizer"].get("tools", []),
        "speedups": speedups,
        "eager": eager_rows(records["bench"]),
        "geomean_speedup_p50": geomean([r["speedup_p50"] for r in speedups]),
        "sanity_flags": records["bench"].get("sanity_flags", []),
        "repeat_flags": records["bench"].get("repeat_flags", []),
        "host_flags": records["bench"].get("host_flags", []),
        "bottlenecks": top_findings(records["analysis"]),
        "roofline": records["analysis"].get("roofline"),
        "sm_busy_pct": (records["analysis"].get("key_metrics") or {}).get("sm_throughput_pct"),
        "measured_at": states,
        "measured_at_label": state_label(states),
        "cards": stage_cards(records),
    }


def state_label(states: list[dict]) -> str:
    """The git state and sources digest a variant's numbers were measured at, for the funnel."""
    if not states:
        return "unknown"
    return " / ".join(f"{describe_state(s)} src {s['sources'] or 'n/a'}"
                      + (f" ({', '.join(s['stages'])})" if len(states) > 1 else "") for s in states)


def criteria(entry: dict, suite_labels: list[str]) -> list[dict]:
    """The success criteria of one variant: each met, not met, or not checked, with why (a check
    that did not run, or ran only in part, never reads as met)."""
    f = entry["funnel"]

    def gate(stage: str) -> dict:
        if f[stage] == "skipped":
            return {"result": "not checked", "detail": entry["not_run_because"][stage]}
        return {"result": "met" if f[stage] in PASSING else "not met", "detail": None}

    build = gate("build")
    if entry["build_unchecked"]:
        build = {"result": "not checked", "detail": entry["build_unchecked"]}
    measured = {r["shape"] for r in entry["speedups"]}
    # A shape is faster only where every dtype measured on it is: one dtype's win is not the shape's.
    faster = measured - {r["shape"] for r in entry["speedups"] if r["speedup_p50"] <= 1.0}
    if not measured:
        why = entry["not_run_because"].get("bench") or "no bench shape was measured"
        beat_one = beat_all = {"result": "not checked", "detail": why}
    else:
        beat_one = {"result": "met" if faster else "not met", "detail": None}
        beat_all = {"result": "met" if set(suite_labels) <= faster else "not met", "detail": None}
    return [
        {"criterion": "builds without warnings or spills", **build},
        {"criterion": "memory-safe and race-free (compute-sanitizer)", **gate("sanitizer")},
        {"criterion": "correct on its whole declared support (parity)", **parity_criterion(entry)},
        {"criterion": "faster than SDPA (p50) on at least one bench shape", **beat_one},
        {"criterion": "faster than SDPA (p50) on every bench shape", **beat_all},
    ]


def parity_tier(parity: dict) -> str:
    """Which tier a parity verdict is on and how it ran: "tier quick on cuda"."""
    how = "under the Triton interpreter" if parity.get("interpreter") else f"on {parity.get('device')}"
    return f"tier {parity.get('tier')} {how}"


def parity_criterion(entry: dict) -> dict:
    """Met only on the GPU tier run natively: a pass of the small CPU tier under the Triton
    interpreter says the algorithm is right, not that the compiled kernel is, everywhere."""
    parity, status = entry["parity"], entry["funnel"]["parity"]
    if status == "skipped":
        return {"result": "not checked", "detail": entry["not_run_because"]["parity"]}
    if status != "pass":
        return {"result": "not met", "detail": parity_tier(parity)}
    partial = parity.get("interpreter") or (parity.get("gpu_tier") and parity.get("tier") != parity["gpu_tier"])
    if partial:
        whole = f"tier {parity['gpu_tier']}" if parity.get("gpu_tier") else "the GPU tier"
        return {"result": "not checked", "detail": f"passed {parity_tier(parity)} only; the whole "
                                                   f"declared support is {whole} on a GPU"}
    return {"result": "met", "detail": parity_tier(parity)}


def not_run_here(env: dict, entries: list[dict], baseline: dict) -> list[str]:
    """Which stages could not run on this host and why: each reason once, with the variants and
    stages it stopped (the funnel lists failures; this lists what did not run)."""
    lines = []
    if not env.get("cuda"):
        lines.append(f"Environment: {env.get('not_measured')}.")
    if baseline.get("note"):
        lines.append("Baseline: GPU backends not run (the note under the SDPA baseline table says why).")
    by_reason: dict[str, dict[str, list[str]]] = {}
    for entry in entries:
        for stage, reason in entry["reasons"].items():
            if entry["funnel"][stage] == "skipped":
                by_reason.setdefault(bare_reason(reason), {}).setdefault(entry["name"], []).append(stage)
    for reason, where in by_reason.items():
        names = "; ".join(f"{name} ({', '.join(stages)})" for name, stages in where.items())
        lines.append(f"{reason}: {names}")
    return lines


def sampling_flag(row: dict, bound: float | None) -> str | None:
    """Why a baseline number is less firm than the rest: sampling hit the time cap, or ended with
    a spread above the bound without its p50 pinned. None for a firm row."""
    spread = row.get("rel_spread")
    spread = spread if isinstance(spread, (int, float)) else None
    over = bound is not None and spread is not None and spread > bound
    ended = row.get("ended_by")
    if ended == PINNED or (ended == CONVERGED and not over):
        return None
    parts = [] if ended in FIRM_ENDINGS else [f"sampling ended by {ended}"]
    if spread is not None:
        parts.append(f"spread {spread:.2f}" + ("" if bound is None else
                                               f" above the bound {bound:g}" if over else f" (bound {bound:g})"))
    return ", ".join(parts)


def baseline_rows(baseline: dict) -> list[dict]:
    bound = baseline.get("rel_spread_bound")
    return [{**r, "flag": sampling_flag(r, bound)} for r in baseline.get("rows", [])
            if r.get("status") == "measured"]


def baseline_not_measured(baseline: dict) -> list[str]:
    """The baseline rows that were not timed (too large for the CPU, a backend that cannot run
    the case), each with its reason."""
    return [f"B{r['B']} H{r['H']} S{r['S']} D{r['D']} {'causal' if r['causal'] else 'full'} {r['dtype']} "
            f"{r['backend']}: {r.get('status')}, {r.get('reason', '')}"
            for r in baseline.get("rows", []) if r.get("status") != "measured"]


def env_card(env: dict) -> dict:
    """The card the environment record was taken on (records before cards were stamped: its name)."""
    if env.get("card"):
        return env["card"]
    return {"name": env["device"]["name"] if env.get("device") else CPU_DEVICE_ID, "uuid": None}


def describe_card(card: dict) -> str:
    return card["name"] + (f" ({card['uuid']})" if card.get("uuid") else "")


def card_mismatches(env: dict, baseline: dict, entries: list[dict]) -> list[str]:
    """Results taken on another card model than the environment record's: never compared as one
    run. (Cards of one model on one host may differ by UUID: a multi-GPU run spreads variants.)"""
    reference = env_card(env)
    measured = [("baseline", baseline[MEASURED_AT]["card"])] if (baseline.get(MEASURED_AT) or {}).get("card") else []
    measured += [(f"{e['name']} {stage}", card) for e in entries for stage, card in e["cards"].items()]
    return [f"{where} was measured on {describe_card(card)}, the environment record on "
            f"{describe_card(reference)}" for where, card in measured if card["name"] != reference["name"]]


def state_notes(env: dict, entries: list[dict]) -> list[str]:
    """Where a variant's numbers were measured at another git state than the environment record
    (the header's), or its stages at different sources."""
    git = env.get("git") or {}
    notes = []
    for entry in entries:
        states = entry["measured_at"]
        if len({s["sources"] for s in states}) > 1:
            notes.append(f"{entry['name']}: its stages ran on different sources ("
                         + "; ".join(f"{', '.join(s['stages'])}: {s['sources']}" for s in states)
                         + "): a result older than its sources; rebuild the variant's chain")
        differing = [s for s in states if (s["commit"], s["dirty"]) != (git.get("commit"), git.get("dirty"))]
        if differing:
            notes.append(f"{entry['name']}: measured at " + "; ".join(
                f"{describe_state(s)} ({', '.join(s['stages'])})" for s in differing)
                + f", not at the environment record's {describe_state(git)}")
    return notes


def describe_state(state: dict) -> str:
    commit = (state.get("commit") or "unknown")[:12]
    dirty = {True: " (dirty)", False: " (clean)"}.get(state.get("dirty"), "")
    return f"git {commit}{dirty}"


def lineage_step(step: dict) -> dict:
    lever = step.get("lever") or {}
    return {"id": step["id"], "origin": step["origin"],
            "changed": ", ".join(f"{knob} {values[0]} -> {values[1]}" for knob, values in (step.get("changed") or {}).items()),
            "finding": lever.get("finding"), "fitness": step.get("fitness")}


def evolution_entry(name: str, best: dict) -> dict:
    """One variant's search as the summary shows it: how it ended, what it tried and rejected, and the
    winner with its lineage, the lever values it changed and the command that promotes it."""
    counts = best.get("candidates") or {}
    winner = best.get("winner") or {}
    stamp = best.get(MEASURED_AT) or {}
    return {
        "variant": name, "status": best.get("status"), "reasons": best.get("reasons", []),
        "stop": best.get("stop") or {}, "candidates": counts, "rejected_by": counts.get("rejected_by") or {},
        "not_reached": counts.get("not_reached"),   # records before it was counted have none
        "wall_seconds": best.get("wall_seconds"), "gpu_seconds": best.get("gpu_seconds"),
        "gpu_seconds_by_phase": best.get("gpu_seconds_by_phase") or {},   # records before it was kept have none
        "suite": (best.get("settings") or {}).get("suite"),
        "defaults_fitness": (best.get("defaults") or {}).get("fitness"),
        "winner": {"id": winner["id"], "fitness": winner.get("fitness"), "over_defaults": winner.get("over_defaults"),
                   "changed": winner.get("changed_from_defaults") or {}, "source_dir": winner.get("source_dir"),
                   "lineage": [lineage_step(s) for s in winner.get("lineage", [])]} if winner else None,
        "final_checks": [{"id": c["id"], "status": c["status"], "reasons": c.get("reasons", [])}
                         for c in best.get("final_checks", [])],
        "promote": best.get("promote"),
        "card": (stamp.get("card") or {}).get("name") or best.get("device"),
    }


def evolution_entries(layout: ResultsLayout, variants: list[str]) -> list[dict]:
    """The evolution record of each variant a search has run for (results/evolve/<v>/best.json)."""
    return [evolution_entry(name, read_record(path)) for name in variants
            if (path := layout.path("evolve_best", name)).exists()]


def build_leaderboard(layout: ResultsLayout, variants: list[str], cfg: dict, suite_labels: list[str]) -> dict:
    env = read_env(layout.env)
    baseline = read_object(layout.baseline, "a baseline record", {"rows": list})
    entries = [variant_entry(layout, name) for name in variants]
    for entry in entries:
        entry["criteria"] = criteria(entry, suite_labels)
    sdpa_analysis = read_record(layout.path("analysis", SDPA_ENTRY))
    ranked = sorted(entries, key=lambda e: -(e["geomean_speedup_p50"] or 0.0))
    return {
        "device": env["device"]["name"] if env.get("device") else CPU_DEVICE,
        "git": env.get("git"),
        "versions": env.get("versions"),
        "ceilings": env.get("ceilings"),
        "bench_suite": cfg["bench_suite"],
        "profile": cfg["profile"],
        "variants": ranked,
        "sdpa": {"status": sdpa_analysis["status"], "bottlenecks": top_findings(sdpa_analysis),
                 "roofline": sdpa_analysis.get("roofline"), "reasons": sdpa_analysis.get("reasons", [])},
        "baseline": baseline_rows(baseline),
        "baseline_not_measured": baseline_not_measured(baseline),
        "baseline_note": baseline.get("note"),
        "not_run": not_run_here(env, entries, baseline),
        "state_notes": state_notes(env, entries),
        "card_mismatches": card_mismatches(env, baseline, entries),
        "where": where_measured(baseline, entries),
        "evolution": evolution_entries(layout, variants),
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
    here = "host" if leaderboard["device"] == CPU_DEVICE else "card"
    return env.get_template(TEMPLATE.name).render(lb=leaderboard, stages=STAGES, stamped=STAMPED, here=here)


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
            values = {f"{r['shape']} {r['dtype']}": r for n, r in rows if n == name}
            xs = [j + i * width for j in range(len(labels))]
            p50 = [values[lbl]["speedup_p50"] if lbl in values else float("nan") for lbl in labels]
            p90 = [values[lbl]["speedup_p90"] if lbl in values else float("nan") for lbl in labels]
            ax.bar(xs, p50, width, label=name)
            # The whisker runs from the p50 speedup to the p90 speedup: the tail against SDPA's tail.
            lower = [max(a - b, 0.0) if a == a and b == b else 0.0 for a, b in zip(p50, p90)]
            upper = [max(b - a, 0.0) if a == a and b == b else 0.0 for a, b in zip(p50, p90)]
            ax.errorbar(xs, p50, yerr=[lower, upper], fmt="none", ecolor="black", capsize=2, linewidth=0.8)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_yscale("log")  # rungs of the ladder differ by orders of magnitude
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))], labels, fontsize=7,
                      rotation=30, ha="right")
        ax.set_ylabel("speedup vs SDPA (bar p50, whisker to p90; same run, log)")
        ax.set_title(f"evo-sdpa speedups on {leaderboard['device']}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    partial = f"{path}.partial.png"  # written whole, then renamed: never half a plot on disk
    fig.savefig(partial, dpi=110)
    plt.close(fig)
    os.replace(partial, path)
