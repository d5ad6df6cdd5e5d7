"""The verdict the summary opens with: the best variant per shape against SDPA, what changed since
the previous run on the same card, and the roadmap's success criteria one by one. A criterion with
no evidence reads "not checked", never "met"."""
from __future__ import annotations

from .history import compare, describe_change

FASTER_BY = 1.10          # the roadmap: at least 10% faster than SDPA ...
FASTER_ON_SHAPES = 2      # ... on at least two of the three canonical shapes
SM_BUSY_PCT = 70.0        # SM busy (sm__throughput) at least this on one shape


def _parity_result(entry: dict) -> str:
    return next(c["result"] for c in entry["criteria"] if c["criterion"].startswith("correct"))


def best_per_shape(variants: list[dict], labels: list[str]) -> list[dict]:
    """Per bench shape, the variant with the highest p50 speedup (its worst dtype on that shape),
    among variants not shown incorrect; its p90 speedup is the worst over those dtypes too (the
    dtype with the worst p50 need not have the worst tail)."""
    best = []
    for label in labels:
        candidates = []
        for entry in variants:
            if _parity_result(entry) == "not met":
                continue
            rows = [r for r in entry["speedups"] if r["shape"] == label]
            if rows:
                worst = min(rows, key=lambda r: r["speedup_p50"])
                tails = [r for r in rows if r.get("speedup_p90") is not None]
                tail = min(tails, key=lambda r: r["speedup_p90"]) if tails else None
                candidates.append({"shape": label, "variant": entry["name"], "dtype": worst["dtype"],
                                   "speedup_p50": worst["speedup_p50"],
                                   "speedup_p90": tail["speedup_p90"] if tail else None,
                                   "p90_dtype": tail["dtype"] if tail else None})
        if candidates:
            best.append(max(candidates, key=lambda c: c["speedup_p50"]))
        else:
            best.append({"shape": label, "variant": None, "dtype": None, "speedup_p50": None, "speedup_p90": None,
                         "p90_dtype": None})
    return best


def criterion(name: str, result: str, detail: str) -> dict:
    return {"criterion": name, "result": result, "detail": detail}


def correct_everywhere(variants: list[dict]) -> dict:
    name = "correct everywhere claimed"
    results = {e["name"]: _parity_result(e) for e in variants}
    wrong = [n for n, r in results.items() if r == "not met"]
    unchecked = [n for n, r in results.items() if r == "not checked"]
    if not results:
        return criterion(name, "not checked", "no variant selected")
    if wrong:
        return criterion(name, "not met", f"parity failed: {', '.join(wrong)}")
    if unchecked:
        return criterion(name, "not checked", f"whole declared support not checked for {', '.join(unchecked)}")
    return criterion(name, "met", f"every variant passed its GPU parity tier ({len(results)})")


def faster_on_shapes(best: list[dict], labels: list[str]) -> dict:
    name = f"at least {FASTER_BY - 1:.0%} faster than SDPA (p50) on {FASTER_ON_SHAPES} of {len(labels)} bench shapes"
    measured = [b for b in best if b["speedup_p50"] is not None]
    if not measured:
        return criterion(name, "not checked", "no speedup measured")
    fast = [b for b in measured if b["speedup_p50"] >= FASTER_BY]
    detail = f"{len(fast)} of {len(labels)}" + (f" ({', '.join(b['shape'] for b in fast)})" if fast else "")
    if len(fast) >= FASTER_ON_SHAPES:
        return criterion(name, "met", detail)
    if len(measured) < len(labels) and len(fast) + len(labels) - len(measured) >= FASTER_ON_SHAPES:
        return criterion(name, "not checked", detail + f"; {len(labels) - len(measured)} shape(s) not measured")
    return criterion(name, "not met", detail)


def p90_not_worse(best: list[dict]) -> dict:
    name = "p90 not worse than SDPA's (best variant per shape)"
    measured = [b for b in best if b["speedup_p90"] is not None]
    if not measured:
        return criterion(name, "not checked", "no speedup measured")
    worse = [f"{b['shape']} {b['variant']} {b['speedup_p90']:.3f}" for b in measured if b["speedup_p90"] < 1.0]
    if worse:
        return criterion(name, "not met", "p90 speedup below 1: " + "; ".join(worse))
    unmeasured = len(best) - len(measured)
    if unmeasured:
        return criterion(name, "not checked", f"met where measured; {unmeasured} shape(s) not measured")
    return criterion(name, "met", "p90 speedup at least 1 on every shape")


def sm_busy(variants: list[dict]) -> dict:
    name = f"SM busy at least {SM_BUSY_PCT:.0f}% on one shape (ncu sm__throughput, profile shape)"
    values = {e["name"]: e.get("sm_busy_pct") for e in variants if isinstance(e.get("sm_busy_pct"), (int, float))}
    if not values:
        return criterion(name, "not checked", "no Nsight Compute metrics")
    top = max(values, key=values.get)
    result = "met" if values[top] >= SM_BUSY_PCT else "not met"
    return criterion(name, result, f"highest {top} {values[top]:.1f}%")


def changes(current: dict, previous: dict | None, threshold: float, noise_multiple: float) -> dict:
    """What changed since the previous run on the same card, as lines for the verdict."""
    if previous is None:
        return {"previous": None, "lines": ["none in the history"]}
    diff = compare(current, previous, threshold, noise_multiple)
    lines = [f"slower: {describe_change(x)}" for x in diff["regressions"]]
    lines += [f"faster: {describe_change(x)}" for x in diff["speedups"]]
    lines += [f"sources changed: {', '.join(diff['changed_sources'])}"] if diff["changed_sources"] else []
    lines += [f"new: {', '.join(diff['new'])}"] if diff["new"] else []
    lines += [f"timed another way, not compared: {', '.join(diff['retimed'])}"] if diff["retimed"] else []
    lines += [f"no longer correct: {', '.join(diff['no_longer_correct'])}"] if diff["no_longer_correct"] else []
    if diff["sdpa_moved"]:
        top = max(diff["sdpa_moved"], key=lambda x: abs(x["change_pct"]))
        lines.append(f"the card's state moved: SDPA's own p50 changed by more than {threshold:.0%} on "
                     f"{len(diff['sdpa_moved'])} case(s) (largest {top['change_pct']:+.1f}%, {top['variant']} "
                     f"{top['case']}), so the speedups there may not repeat; time them again")
    if not lines:
        lines = ["no change beyond the threshold and the noise"]
    commit = (previous.get("commit") or "unknown")[:12]
    return {"previous": f"{previous['recorded_at']}, git {commit}", "lines": lines}


def build_verdict(leaderboard: dict, labels: list[str], current: dict, previous: dict | None,
                  gates: dict) -> dict:
    variants = leaderboard["variants"]
    best = best_per_shape(variants, labels)
    return {
        "best": best,
        "criteria": [correct_everywhere(variants), faster_on_shapes(best, labels), p90_not_worse(best),
                     sm_busy(variants)],
        "since": changes(current, previous, gates["regression_threshold"], gates["regression_noise_iqr"]),
    }


def device_table(latest: dict[str, dict]) -> dict:
    """Each variant's speedups per card (the newest run of each card; never mixed into one run):
    {"devices": [...], "rows": [{"variant", "case", "by_device": {device: speedup_p50}}]}."""
    names = sorted(latest)
    rows: dict[tuple, dict] = {}
    for device in names:
        for variant, record in latest[device]["variants"].items():
            for case, numbers in record["cases"].items():
                rows.setdefault((variant, case), {})[device] = numbers.get("speedup_p50")
    return {"devices": names,
            "rows": [{"variant": v, "case": c, "by_device": by} for (v, c), by in sorted(rows.items())]}
