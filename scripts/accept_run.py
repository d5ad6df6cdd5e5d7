"""Accept the latest run: mark the history entry the last summary appended (or --entry) accepted,
so the regression gate compares later runs on that card against it.

    python3 scripts/accept_run.py
"""
from pathlib import Path

from evo_sdpa import history
from evo_sdpa.cli import parser
from evo_sdpa.errors import run_stage
from evo_sdpa.io import read_json

POINTER = "results/final/history_entry.json"


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--pointer", default=POINTER, help="the summary's pointer to its history entry")
    p.add_argument("--entry", help="a history entry to accept instead of the latest run's")
    args = p.parse_args()
    entry = Path(args.entry) if args.entry else Path(read_json(args.pointer)["entry"])
    marker = history.accept(entry)
    print(f"accepted {entry} ({marker.name})")


if __name__ == "__main__":
    run_stage(main)
