"""Gates over the leaderboard: required variants must pass their correctness gates, and their
measured speedups must reach the configured minimum; results from different card models never
pass as one run."""
from __future__ import annotations


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
