"""Stage: the final summary (markdown), the leaderboard (JSON) and the speedup plot."""
from pathlib import Path

from evo_sdpa.cli import config_arg, parser, setup_logging
from evo_sdpa.config import suite_shapes
from evo_sdpa.errors import run_stage
from evo_sdpa.io import write_json, write_text
from evo_sdpa.report import build_leaderboard, plot_speedups, render


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--results", required=True)
    p.add_argument("--variants", nargs="*", default=[])
    config_arg(p)
    p.add_argument("--md", required=True)
    p.add_argument("--leaderboard", required=True)
    p.add_argument("--plot", required=True)
    args = p.parse_args()
    log = setup_logging()
    cfg = args.config_json
    labels = [s.label for s in suite_shapes(cfg, cfg["bench_suite"])]
    leaderboard = build_leaderboard(Path(args.results), args.variants, cfg, labels)
    plot_speedups(leaderboard, args.plot)
    write_text(args.md, render(leaderboard))
    write_json(args.leaderboard, leaderboard)
    log.info("summary written for %d variants on %s", len(args.variants), leaderboard["device"])


if __name__ == "__main__":
    run_stage(main)
