"""Stage: the evolution of one variant. A search over its tunables (or, through a proposer
command, its code): each candidate built by the build stage's code, gated (build verdict, the gate
parity tier) and timed against SDPA's default in one process by the bench stage's code; best.json
names the fastest once it has passed the final parity tier and every sanitizer tool. curve.json
holds the best fitness by generation. Without a GPU it checks what it can (the tunables, that
every candidate of the first generation builds) and says the search needs one."""
from pathlib import Path

from evo_sdpa.candidates import (PipelineEvaluator, StageConfig, command_child_maker, fingerprint,
                                 root_insight)
from evo_sdpa.cardlock import hold_card
from evo_sdpa.cli import config_arg, exit_on_sigterm, parser, setup_logging
from evo_sdpa.deps import variant_inputs
from evo_sdpa.device import NO_DEVICE_REASON, cuda_available
from evo_sdpa.errors import notice, run_stage
from evo_sdpa.evolve import (Settings, Store, builtin_proposer, check_first_generation, command_proposer,
                             confirm_leaders, curve, pick_winner, search, space_of, summary)
from evo_sdpa.io import write_json
from evo_sdpa.provenance import stamp
from evo_sdpa.tunables import constraints, declared
from evo_sdpa.variants import KERNELS_DIR, load_variant


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--variant", required=True)
    p.add_argument("--env", required=True)
    p.add_argument("--analysis", required=True, help="the variant's bottlenecks.json (the defaults' profile)")
    p.add_argument("--compute-capability", required=True)
    p.add_argument("--device", required=True, help="the device identity the records are measured on")
    p.add_argument("--jobs", type=int, default=1, help="candidates built at once")
    config_arg(p)
    p.add_argument("--best", required=True)
    p.add_argument("--curve", required=True)
    args = p.parse_args()
    log = setup_logging()
    exit_on_sigterm()   # a killed search still adds its wall time to the store, so a resume's budget counts it
    hold_card(f"evolve {args.variant}", log)
    cfg = args.config_json
    variant = load_variant(KERNELS_DIR / args.variant)
    settings = Settings.from_config(cfg["evolve"])
    space = space_of(declared(variant))
    store = Store(Path(args.best).parent)
    stage = StageConfig(args.compute_capability, cfg)
    fresh = store.open(fingerprint(variant, args.device, stage))
    if fresh:
        log.info(fresh)
    evaluator = PipelineEvaluator(variant, store, stage, args.env, args.jobs, log)
    proposer_cfg = cfg["evolve"]["proposer"]
    if proposer_cfg == "builtin":
        proposer = builtin_proposer(space, settings, constraints(variant))
    else:
        proposer = command_proposer(command_child_maker(proposer_cfg["command"], proposer_cfg.get("timeout_s"),
                                                        variant, store, evaluator.variant_of, log))
    root = root_insight(args.analysis)

    if not cuda_available():
        reason = f"not run: {NO_DEVICE_REASON} (the search gates and times its candidates on a GPU)"
        checked = check_first_generation(space, settings, proposer, evaluator, root)
        write_json(args.best, stamp({"variant": variant.name, "status": "skipped", "reasons": [reason],
                                     "checked": checked, "winner": None, "device": args.device},
                                    variant_inputs(variant)))
        write_json(args.curve, {"variant": variant.name, "sdpa": 1.0, "generations": [], "note": reason})
        log.info("evolve %s: first generation builds: %s", variant.name, checked["builds"])
        notice(f"evolve {variant.name}: {reason}; checked the tunables and that the first generation "
               f"builds ({', '.join(f'{n} {s}' for s, n in checked['builds'].items())})")
        return

    state = search(space, settings, proposer, evaluator, store, root, log=log.info)
    confirmed = confirm_leaders(state, evaluator, store, log=log.info)
    winner, checks = pick_winner(state, evaluator, store, settings.elites, log=log.info, min_gain=settings.min_gain,
                                 confirmed=confirmed)
    best = summary(variant.name, state, winner, checks, store.wall_seconds(), confirmed)
    best.update(device=args.device, settings=cfg["evolve"], analysis=root.source)
    stamp(best, variant_inputs(variant), measured_on_card=True)
    won = best["winner"] or {}
    if won.get("source_dir") is None and won.get("changed_from_defaults"):
        best["promote"] = f"python3 scripts/promote_tunables.py --variant {variant.name} --best {args.best}"
    write_json(args.best, best)
    write_json(args.curve, curve(variant.name, state))
    log.info("evolve %s: %s; stopped by %s", variant.name,
             f"winner {winner} ({won['over_defaults']:.3f}x the defaults)" if won.get("over_defaults")
             else "no winner", (state.stop or {}).get("condition"))


if __name__ == "__main__":
    run_stage(main)
