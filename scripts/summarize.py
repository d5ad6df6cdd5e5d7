"""Stage: the final summary (markdown), the leaderboard (JSON), the plots, and this run's entry
appended to the history (results/history/<device>/, a new file per run; the declared output is a
pointer naming it, so Snakemake never owns, nor deletes, the history)."""
import json
from datetime import datetime, timezone
from pathlib import Path

from evo_sdpa import history
from evo_sdpa.cli import config_arg, parser, setup_logging
from evo_sdpa.config import suite_shapes
from evo_sdpa.errors import run_stage
from evo_sdpa.io import read_json, write_json, write_text
from evo_sdpa.plots import evolution_curves, plot_evolution, plot_latency, plot_roofline
from evo_sdpa.report import ResultsLayout, build_leaderboard, plot_speedups, render
from evo_sdpa.verdict import build_verdict, device_table


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--layout", required=True, type=json.loads,
                   help="where the result files live, as the rules declare them (the workflow passes it)")
    p.add_argument("--history", required=True)
    p.add_argument("--variants", nargs="*", default=[])
    config_arg(p)
    for name in ("md", "leaderboard", "plot", "roofline", "latency", "evolution", "history-entry"):
        p.add_argument(f"--{name}", required=True)
    args = p.parse_args()
    log = setup_logging()
    cfg = args.config_json
    layout, history_dir = ResultsLayout.from_json(args.layout), Path(args.history)
    labels = [s.label for s in suite_shapes(cfg, cfg["bench_suite"])]
    leaderboard = build_leaderboard(layout, args.variants, cfg, labels)
    entry = history.make_entry(leaderboard, datetime.now(timezone.utc))
    previous = history.previous(history_dir, entry["device"], None, accepted_only=False)
    leaderboard["verdict"] = build_verdict(leaderboard, labels, entry,
                                           read_json(previous) if previous else None, cfg["gates"])
    latest = {**history.latest_per_device(history_dir), entry["device"]: entry}
    leaderboard["devices"] = device_table(latest) if len(latest) > 1 else None
    plot_speedups(leaderboard, args.plot)
    plot_roofline(leaderboard, args.roofline)
    plot_latency(leaderboard, args.latency)
    plot_evolution(evolution_curves(layout.patterns["evolve_curve"], args.variants), args.evolution)
    write_text(args.md, render(leaderboard))
    write_json(args.leaderboard, leaderboard)
    # Last: a run whose summary failed leaves no history entry behind.
    path = history.append(history_dir, entry)
    history.write_pointer(args.history_entry, path, entry)
    log.info("summary written for %d variants on %s; history entry %s", len(args.variants),
             leaderboard["device"], path)


if __name__ == "__main__":
    run_stage(main)
