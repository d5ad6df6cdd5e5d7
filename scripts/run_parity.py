"""Stage: the correctness matrix of one variant against a float64 reference and SDPA's own error."""
import json
import os
import shlex

from evo_sdpa.cardlock import hold_card
from evo_sdpa.cli import config_arg, parser, setup_logging
from evo_sdpa.deps import variant_inputs
from evo_sdpa.device import NO_DEVICE_REASON, cuda_available
from evo_sdpa.errors import StageError, run_stage
from evo_sdpa.gating import blocked_by, skipped, skipped_for
from evo_sdpa.io import read_json, write_json
from evo_sdpa.oracle import oracle_records
from evo_sdpa.parity import build_matrix, run_case, verdict
from evo_sdpa.provenance import stamp
from evo_sdpa.tolerance import ToleranceRule
from evo_sdpa.variants import KERNELS_DIR, load_variant


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--variant", required=True)
    p.add_argument("--build", required=True)
    config_arg(p)
    p.add_argument("--out", required=True)
    p.add_argument("--case", help="run only the case with this id (what a failure's repro names)")
    args = p.parse_args()
    log = setup_logging()
    hold_card(f"parity {args.variant}", log)
    cfg = args.config_json
    variant = load_variant(KERNELS_DIR / args.variant)
    sources = variant_inputs(variant)
    on_gpu = cuda_available()
    tier_name = cfg["parity"]["tier"] if on_gpu else cfg["parity"]["cpu_tier"]
    cause = blocked_by(build=args.build)
    if cause:
        write_json(args.out, stamp(skipped_for("not run", cause, variant=args.variant), sources))
        return
    if not on_gpu and variant.kind == "cuda":
        write_json(args.out, stamp(skipped(f"not run: {NO_DEVICE_REASON} (a CUDA variant needs one)",
                                           variant=args.variant), sources))
        return
    from evo_sdpa.runners import interpreter_blocker, load_built

    if not on_gpu:
        blocker = interpreter_blocker()
        if blocker:
            write_json(args.out, stamp(skipped(f"not run: {blocker}", variant=args.variant), sources))
            return
        os.environ["TRITON_INTERPRET"] = "1"  # must be set before the kernel module is imported

    forward = load_built(variant, read_json(args.build))
    device = "cuda" if on_gpu else "cpu"
    records = oracle_records(variant, forward, device)
    cases = build_matrix(variant, cfg["parity"]["tiers"][tier_name])
    if args.case:
        records = [r for r in records if r["id"] == args.case]
        cases = [c for c in cases if c.case_id == args.case]
        if not cases and not records:
            raise StageError(f"no parity case {args.case!r} in tier {tier_name!r} for {args.variant}")
    rule = ToleranceRule.from_config(cfg["tolerance"])
    for case in cases:
        record = run_case(case, forward, rule, device)
        records.append(record)
        if record["status"] != "pass":
            log.info("FAIL %s: %s", record["id"], record["reason"])
    repro = (f"python scripts/run_parity.py --variant {args.variant} --build {args.build} "
             f"--config-json {shlex.quote(json.dumps(cfg))} --out /tmp/parity_case.json")
    result = verdict(records, repro)
    result.update(variant=args.variant, device=device, tier=tier_name, gpu_tier=cfg["parity"]["tier"],
                  interpreter=(not on_gpu), tolerance=cfg["tolerance"], records=records)
    stamp(result, sources, measured_on_card=True)
    log.info("parity %s: %s (%d/%d passed, tier %s on %s)", args.variant, result["status"],
             result["passed"], result["cases"], tier_name, device)
    write_json(args.out, result)


if __name__ == "__main__":
    run_stage(main)
