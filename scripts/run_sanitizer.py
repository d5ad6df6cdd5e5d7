"""Stage: compute-sanitizer's four tools over a small run of one variant; a verdict per tool."""
from pathlib import Path

from evo_sdpa.cardlock import hold_card
from evo_sdpa.cli import bool_arg, config_arg, parser, setup_logging
from evo_sdpa.deps import variant_inputs
from evo_sdpa.device import NO_DEVICE_REASON, TORCH_SEES_NO_DEVICE, gpu_visible, stage_tool
from evo_sdpa.errors import run_stage
from evo_sdpa.gating import blocked_by, cannot_run, skipped
from evo_sdpa.io import write_json
from evo_sdpa.provenance import fresh_target_card, stamp, target_card, target_found_no_device
from evo_sdpa.sanitizer import check_variant
from evo_sdpa.variants import KERNELS_DIR, load_variant


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--variant", required=True)
    p.add_argument("--build", required=True)
    p.add_argument("--enabled", type=bool_arg, required=True)
    config_arg(p)
    p.add_argument("--verdict", required=True)
    args = p.parse_args()
    log = setup_logging()
    hold_card(f"sanitizer {args.variant}", log)
    cfg = args.config_json["sanitizer"]
    variant = load_variant(KERNELS_DIR / args.variant)
    cause = blocked_by(build=args.build)
    card = fresh_target_card(Path(args.verdict).parent)
    if not args.enabled:
        result = skipped("disabled in the config (stages.sanitizer: false)", disabled=True)
    elif blocked := cannot_run("not run", cause, None if gpu_visible() else NO_DEVICE_REASON):
        result = blocked
    elif (sanitizer := stage_tool("compute-sanitizer")) is None:
        result = skipped(f"not run: {TORCH_SEES_NO_DEVICE}")
    else:
        result = check_variant(sanitizer, cfg, variant, Path(args.build), Path(args.verdict).parent, card)
        if target_found_no_device(card):
            result = skipped(f"not run: {TORCH_SEES_NO_DEVICE}")
    stamp(result, variant_inputs(variant), measured_on_card="tools" in result, card_of=lambda: target_card(card))
    result["variant"] = args.variant
    log.info("sanitizer %s: %s %s", args.variant, result["status"], "; ".join(result["reasons"]))
    write_json(args.verdict, result)


if __name__ == "__main__":
    run_stage(main)
