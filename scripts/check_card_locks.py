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
    directory = args.lock_dir or lock_dir()
    counts, problems = check(directory)
    if not counts:
        fail(f"{directory}: no lock logs (*.jsonl) in it, so nothing to check; pass the --lock-dir "
             "(or EVO_SDPA_LOCK_DIR) the GPU jobs ran with")
    for card, jobs in sorted(counts.items()):
        print(f"{card}: {jobs} job{'s' if jobs != 1 else ''}")
    if problems:
        for problem in problems[:-1]:
            notice(problem)
        fail(problems[-1])
    print(f"no two jobs overlapped on one card ({len(counts)} cards)")


if __name__ == "__main__":
    run_stage(main)
