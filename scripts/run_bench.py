"""Stage: time one variant against SDPA in the same process on the bench suite."""
from evo_sdpa.cardlock import hold_card
from evo_sdpa.cli import config_arg, parser, setup_logging
from evo_sdpa.config import suite_shapes
from evo_sdpa.deps import variant_inputs
from evo_sdpa.device import NO_DEVICE_REASON, cuda_available
from evo_sdpa.errors import run_stage
from evo_sdpa.gating import blocked_by, cannot_run
from evo_sdpa.io import CEILINGS, read_env, read_json, write_json
from evo_sdpa.provenance import stamp
from evo_sdpa.variants import KERNELS_DIR, load_variant
from evo_sdpa.watchdog import StepWatchdog, end_stage


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--variant", required=True)
    p.add_argument("--env", required=True)
    p.add_argument("--build", required=True)
    p.add_argument("--sanitizer", required=True)
    p.add_argument("--parity", required=True)
    config_arg(p)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    log = setup_logging()
    hold_card(f"bench {args.variant}", log)
    cfg = args.config_json
    cause = blocked_by(build=args.build, sanitizer=args.sanitizer, parity=args.parity)
    variant = load_variant(KERNELS_DIR / args.variant)

    def finish(result: dict, card_of=None) -> None:
        stamp(result, variant_inputs(variant), measured_on_card=result["status"] != "skipped", card_of=card_of)
        if result["measured_at"]["card"]:  # the card this job timed on, not the environment record's
            result["device"] = result["measured_at"]["card"]["name"]
        result["variant"] = args.variant
        log.info("bench %s: %s %s", args.variant, result["status"], "; ".join(result["reasons"]))
        write_json(args.out, result)

    if blocked := cannot_run("not measured", cause, None if cuda_available() else NO_DEVICE_REASON):
        finish(blocked)
    else:
        from evo_sdpa.bench import CASE_LIMIT_S, run
        from evo_sdpa.provenance import card
        from evo_sdpa.runners import load_built
        from evo_sdpa.tolerance import ToleranceRule

        forward = load_built(variant, read_json(args.build))
        env = read_env(args.env, CEILINGS)
        measured_on = card()  # read now: after a hang only the watchdog's thread still runs

        def hung(step: str, limit_s: float) -> None:
            log.error("bench %s: %s did not return within %.0f s; recorded as failed, the stage ends here "
                      "(a kernel cannot be interrupted)", args.variant, step, limit_s)
            finish({"status": "fail", "cases": [],
                    "reasons": [f"{step} did not return within {limit_s:.0f} s: the kernel hangs or is far too slow"]},
                   card_of=lambda: measured_on)
            end_stage()

        finish(run(variant, forward, suite_shapes(cfg, cfg["bench_suite"]), cfg["dtypes"], cfg["timing"],
                   ToleranceRule.from_config(cfg["tolerance"]), env.get("ceilings"), log,
                   watchdog=StepWatchdog(CASE_LIMIT_S, hung)))


if __name__ == "__main__":
    run_stage(main)
