"""Stage: the correctness matrix of one variant against a float64 reference and SDPA's own error."""
import json
import os
import shlex

from evo_sdpa.cardlock import hold_card
from evo_sdpa.cli import config_arg, parser, setup_logging
from evo_sdpa.deps import variant_inputs
from evo_sdpa.device import NO_DEVICE_REASON, cuda_available
from evo_sdpa.errors import StageError, run_stage
from evo_sdpa.gating import blocked_by, cannot_run, skipped
from evo_sdpa.io import read_json, write_json
from evo_sdpa.oracle import oracle_records
from evo_sdpa.parity import (CASE_LIMIT_S, build_matrix, hung_record, run_case, table_errors, tier_name,
                             verdict)
from evo_sdpa.provenance import card, stamp
from evo_sdpa.tolerance import ToleranceRule
from evo_sdpa.variants import KERNELS_DIR, load_variant
from evo_sdpa.watchdog import StepWatchdog, end_stage


# The hand-computed oracle's cases, which run first, as one step: the watchdog's name for them, and
# the --case that runs only them (what a hang there names as its repro).
ORACLE_STEP = "oracle"


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--variant", required=True)
    p.add_argument("--build", required=True)
    config_arg(p)
    p.add_argument("--out", required=True)
    p.add_argument("--sdpa-errors", help="SDPA's error per case, measured once on this card (run_sdpa_parity.py); "
                                         "without it, or where it does not apply, this job calls SDPA itself")
    p.add_argument("--case", help=f"run only the case with this id (what a failure's repro names; {ORACLE_STEP!r}: "
                                  "only the hand-computed oracle's cases)")
    args = p.parse_args()
    log = setup_logging()
    hold_card(f"parity {args.variant}", log)
    cfg = args.config_json
    variant = load_variant(KERNELS_DIR / args.variant)
    sources = variant_inputs(variant)
    on_gpu = cuda_available()
    tier = tier_name(cfg["parity"], on_gpu)
    no_device = f"{NO_DEVICE_REASON} (a CUDA variant needs one)" if not on_gpu and variant.kind == "cuda" else None
    if blocked := cannot_run("not run", blocked_by(build=args.build), no_device):
        write_json(args.out, stamp({**blocked, "variant": args.variant}, sources))
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
    measured_on = card()  # read now: after a hang only the watchdog's thread still runs
    known_sdpa, table_unused = {}, "no table given"
    if args.sdpa_errors:
        known_sdpa, table_unused = table_errors(read_json(args.sdpa_errors), tier, device, measured_on)
        if table_unused:
            log.info("parity %s: SDPA's errors measured in this job, not read from %s: %s",
                     args.variant, args.sdpa_errors, table_unused)
    records: list[dict] = []
    repro = (f"python scripts/run_parity.py --variant {args.variant} --build {args.build} "
             f"--config-json {shlex.quote(json.dumps(cfg))} --out /tmp/parity_case.json")

    def finish(done: list[dict]) -> None:
        result = verdict(done, repro)
        from_table = sum(1 for r in done if r["id"] in known_sdpa)
        result.update(variant=args.variant, device=device, tier=tier, gpu_tier=cfg["parity"]["tier"],
                      interpreter=(not on_gpu), tolerance=cfg["tolerance"],
                      sdpa_errors={"table": args.sdpa_errors, "from_table": from_table,
                                   "measured_here": sum(1 for r in done if "sdpa_max_abs" in r) - from_table,
                                   "table_unused": table_unused},
                      records=done)
        stamp(result, sources, measured_on_card=True, card_of=lambda: measured_on)
        log.info("parity %s: %s (%d/%d passed, tier %s on %s)", args.variant, result["status"],
                 result["passed"], result["cases"], tier, device)
        write_json(args.out, result)

    def hung(step: str, limit_s: float) -> None:
        log.error("parity %s: %s did not return within %.0f s; the verdict records it as failed and the "
                  "stage ends here (a kernel cannot be interrupted). Rerun it alone: %s --case %s",
                  args.variant, step, limit_s, repro, step)
        finish([*records, hung_record(step, limit_s)])
        end_stage()

    watchdog = StepWatchdog(CASE_LIMIT_S, hung)
    with watchdog.step(ORACLE_STEP):
        oracle = oracle_records(variant, forward, device)
    cases = build_matrix(variant, cfg["parity"]["tiers"][tier])
    if args.case == ORACLE_STEP:
        cases = []
    elif args.case:
        oracle = [r for r in oracle if r["id"] == args.case]
        cases = [c for c in cases if c.case_id == args.case]
        if not cases and not oracle:
            raise StageError(f"no parity case {args.case!r} in tier {tier!r} for {args.variant}")
    records.extend(oracle)
    rule = ToleranceRule.from_config(cfg["tolerance"])
    for case in cases:
        with watchdog.step(case.case_id):
            record = run_case(case, forward, rule, device, known_sdpa.get(case.case_id))
        records.append(record)
        if record["status"] != "pass":
            log.info("FAIL %s: %s", record["id"], record["reason"])
    finish(records)


if __name__ == "__main__":
    run_stage(main)
