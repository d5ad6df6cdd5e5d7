"""Gate target: exit non-zero, one line, when a configured gate fails: a required variant fails a
correctness gate or misses the minimum speedup, or a variant is slower than in the last accepted
run on the same card beyond the threshold and the noise (for CI on a GPU host)."""
from pathlib import Path

from evo_sdpa import history
from evo_sdpa.cli import config_arg, parser
from evo_sdpa.errors import fail, notice, run_stage
from evo_sdpa.gates import evaluate, regressions
from evo_sdpa.io import read_json, write_json


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--leaderboard", required=True)
    p.add_argument("--history-entry", required=True)
    p.add_argument("--history", required=True)
    config_arg(p)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    gates = args.config_json["gates"]
    pointer = read_json(args.history_entry)
    current = Path(pointer["entry"])
    base = history.previous(Path(args.history), pointer["device"], current, accepted_only=True)
    against = regressions(read_json(current), read_json(base) if base else None, gates)
    failures = evaluate(read_json(args.leaderboard), gates) + against["failures"]
    if failures:
        fail("gate failed: " + "; ".join(failures))
    checked = checked_gates(gates, base, against["comparison"])
    if len(checked) == 1:
        notice(f"{args.out}: no variant is required (gates.required_variants, which gates.min_speedup applies to) "
               "and no earlier run here is accepted (scripts/accept_run.py), so only the one-card-model check ran")
    write_json(args.out, {"status": "pass", "checked": checked, "gates": gates, "entry": str(current),
                          "accepted_baseline": str(base) if base else None, "comparison": against["comparison"]})


def checked_gates(gates: dict, accepted: Path | None, comparison: dict | None) -> list[str]:
    """What a pass stands for: the checks that ran, so a pass with nothing configured says so, and
    the cases the regression check left out (timed another way than in the accepted run)."""
    checked = ["every result comes from one card model"]
    required = gates["required_variants"]
    if required:
        checked.append(f"{', '.join(required)} pass build, sanitizer and parity")
        if gates["min_speedup"] is not None:
            checked.append(f"{', '.join(required)} reach {gates['min_speedup']}x SDPA's p50 on every measured shape")
    if accepted is not None:
        checked.append(f"no variant slower than in, or no longer correct since, the accepted run {accepted.name}"
                       + (f" (not compared, timed another way: {', '.join(comparison['retimed'])})"
                          if comparison and comparison.get("retimed") else ""))
    return checked


if __name__ == "__main__":
    run_stage(main)
