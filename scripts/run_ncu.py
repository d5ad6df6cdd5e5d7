"""Stage: Nsight Compute (--set full, clocks left alone) on one variant or SDPA's default."""
from pathlib import Path

from evo_sdpa.cardlock import hold_card
from evo_sdpa.cli import bool_arg, config_arg, parser, setup_logging
from evo_sdpa.deps import variant_inputs
from evo_sdpa.device import NO_DEVICE_REASON, TORCH_SEES_NO_DEVICE, gpu_visible, stage_tool
from evo_sdpa.errors import fail, notice, run_stage
from evo_sdpa.gating import blocked_by, cannot_run, skipped
from evo_sdpa.io import write_json, write_text
from evo_sdpa.profiling import profile
from evo_sdpa.provenance import fresh_target_card, stamp, target_card, target_found_no_device
from evo_sdpa.variants import KERNELS_DIR, SDPA_ENTRY, load_variant


def reason_not_to_profile(entry: str, enabled: bool, bench: str | None, shape: dict, dtype: str) -> dict | None:
    """A skipped record when this entry is not to be profiled here, else None."""
    if not enabled:
        return skipped("disabled in the config (stages.ncu: false)", disabled=True)
    cause = None if entry == SDPA_ENTRY else blocked_by(bench=bench)
    if blocked := cannot_run("not profiled", cause, None if gpu_visible() else NO_DEVICE_REASON):
        return blocked
    if entry == SDPA_ENTRY:
        return None
    why = load_variant(KERNELS_DIR / entry).unsupported_reason(dtype, shape["D"], shape["causal"], shape["S"])
    if why:
        return skipped(f"not profiled: the profile shape is outside its support ({why})")
    return None


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--entry", required=True, help="a variant name, or sdpa")
    p.add_argument("--enabled", type=bool_arg, required=True)
    config_arg(p)
    p.add_argument("--csv", required=True)
    p.add_argument("--status", required=True)
    p.add_argument("--build", help="the variant's build verdict (not for sdpa)")
    p.add_argument("--bench", help="the variant's bench record (not for sdpa)")
    args = p.parse_args()
    if args.entry != SDPA_ENTRY and not (args.build and args.bench):
        fail(f"ncu {args.entry}: --build and --bench name the variant's build verdict and bench record "
             "(the ncu rule passes them)")
    log = setup_logging()
    hold_card(f"ncu {args.entry}", log)
    cfg = args.config_json["profile"]
    shape, dtype = cfg["shape"], cfg["dtype"]
    outdir = Path(args.csv).parent
    card = fresh_target_card(outdir)
    skip = reason_not_to_profile(args.entry, args.enabled, args.bench, shape, dtype)
    ncu = None if skip else stage_tool("ncu")
    if not skip and ncu is None:
        skip = skipped(f"not profiled: {TORCH_SEES_NO_DEVICE}")
    if skip:
        status, csv_text = skip, ""
    else:
        status, csv_text = profile(ncu, args.entry, args.build, shape, dtype, cfg["launch_count"], outdir, card)
        if target_found_no_device(card):
            skip = status = skipped(f"not profiled: {TORCH_SEES_NO_DEVICE}")
            csv_text = ""
    status["entry"] = args.entry
    sources = None if args.entry == SDPA_ENTRY else variant_inputs(load_variant(KERNELS_DIR / args.entry))
    stamp(status, sources, measured_on_card=skip is None, card_of=lambda: target_card(card))
    log.info("ncu %s: %s %s", args.entry, status["status"], "; ".join(status["reasons"]))
    if skip:
        notice(f"ncu {args.entry}: {status['reasons'][0]}; {args.csv} is left empty "
               f"(the reason is in {args.status})")
    write_text(args.csv, csv_text)
    write_json(args.status, status)


if __name__ == "__main__":
    run_stage(main)
