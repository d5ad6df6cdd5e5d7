"""Target: the reproducibility bundle (environment record, config, kernel sources, stage scripts,
results, a manifest of checksums and rerun_bench.py) as one archive."""
from pathlib import Path

from evo_sdpa.bundle import write
from evo_sdpa.cli import config_arg, parser, setup_logging
from evo_sdpa.deps import REPO
from evo_sdpa.errors import run_stage
from evo_sdpa.io import read_json


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--results", required=True)
    p.add_argument("--leaderboard", required=True)
    p.add_argument("--compute-capability", required=True)
    config_arg(p)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    log = setup_logging()
    leaderboard = read_json(args.leaderboard)
    meta = {"device": leaderboard["device"], "git": leaderboard.get("git"),
            "compute_capability": args.compute_capability,
            "variants": [v["name"] for v in leaderboard["variants"]]}
    listing = write(Path(args.out), REPO, Path(args.results).resolve(), args.config_json, meta)
    log.info("bundle %s: %d files", args.out, len(listing["files"]))


if __name__ == "__main__":
    run_stage(main)
