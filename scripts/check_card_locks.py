"""Check the per-card lock logs (evo_sdpa.cardlock): how many jobs each card ran, and that no
two of them overlapped on one card. Exits 1, one line per overlap, when any did."""
from pathlib import Path

from evo_sdpa.cardlock import check, lock_dir
from evo_sdpa.cli import parser
from evo_sdpa.errors import fail, notice, run_stage


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--lock-dir", type=Path, default=None, help="default: EVO_SDPA_LOCK_DIR or /tmp/evo-sdpa-locks")
    args = p.parse_args()
    counts, problems = check(args.lock_dir or lock_dir())
    for card, jobs in sorted(counts.items()):
        print(f"{card}: {jobs} job{'s' if jobs != 1 else ''}")
    if problems:
        for problem in problems[:-1]:
            notice(problem)
        fail(problems[-1])
    print(f"no two jobs overlapped on one card ({len(counts)} cards)")


if __name__ == "__main__":
    run_stage(main)
