"""Gates over the leaderboard: required variants must pass their correctness gates, and their
measured speedups must reach the configured minimum; results from different card models never
pass as one run; no variant may regress against the last accepted run on the same card."""
from __future__ import annotations

from .history import compare, describe_change


def evaluate(leaderboard: dict, gates: dict) -> list[str]:
    by_name = {entry["name"]: entry for entry in leaderboard["variants"]}
    failures = [f"mixed cards: {line}" for line in leaderboard.get("card_mismatches", [])]
    for name in gates["required_variants"]:
        entry = by_name.get(name)
        if entry is None:
            failures.append(f"required variant {name!r} is not in the leaderboard")
            continue
        for stage in ("build", "sanitizer", "parity"):
            if entry["funnel"][stage] != "pass":
                failures.append(f"{name} {stage}: {entry['funnel'][stage]}"
                                + (f" ({entry['reasons'][stage]})" if entry["reasons"].get(stage) else ""))
        minimum = gates["min_speedup"]
        if minimum is not None:
            if not entry["speedups"]:
                failures.append(f"{name}: no speedup measured, min_speedup {minimum} cannot be checked")
            for row in entry["speedups"]:
                if row["speedup_p50"] < minimum:
                    failures.append(f"{name} {row['shape']} {row['dtype']}: speedup "
                                    f"{row['speedup_p50']:.3f} below {minimum}")
    return failures


def regressions(current: dict, accepted: dict | None, gates: dict) -> dict:
    """Failures against the last accepted run on the same card (none without one): a variant
    slower beyond the threshold and the noise, or no longer correct."""
    if accepted is None:
        return {"failures": [], "comparison": None}
    diff = compare(current, accepted, gates["regression_threshold"], gates["regression_noise_iqr"])
    since = f"since the accepted run {accepted['recorded_at']}"
    failures = [f"regression {since}: {describe_change(x)} (threshold {gates['regression_threshold']:.0%}, "
                f"beyond the noise)" for x in diff["regressions"]]
    failures += [f"{name} no longer passes its correctness gates {since}" for name in diff["no_longer_correct"]]
    return {"failures": failures, "comparison": diff}
