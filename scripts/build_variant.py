"""Stage: build one variant and write its verdict, per-kernel resources and the compiler log."""
from pathlib import Path

from evo_sdpa.build import build_variant
from evo_sdpa.cardlock import hold_card
from evo_sdpa.cli import config_arg, parser, setup_logging
from evo_sdpa.deps import variant_inputs
from evo_sdpa.errors import run_stage
from evo_sdpa.io import write_json, write_text
from evo_sdpa.provenance import stamp
from evo_sdpa.variants import KERNELS_DIR, load_variant


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--variant", required=True)
    p.add_argument("--compute-capability", required=True)
    config_arg(p)
    p.add_argument("--verdict", required=True)
    p.add_argument("--resources", required=True)
    p.add_argument("--compiler-log", required=True)
    p.add_argument("--jobs", type=int, default=1, help="translation units compiled at once (the job's threads)")
    args = p.parse_args()
    log = setup_logging()
    variant = load_variant(KERNELS_DIR / args.variant)
    if variant.kind == "triton":  # Triton compiles by launching: on the card when there is one
        hold_card(f"build_variant {args.variant}", log)
    outdir = Path(args.verdict).parent
    verdict, resources, text = build_variant(variant, args.compute_capability, outdir,
                                             args.config_json["build"].get("cutlass_include"), jobs=args.jobs)
    verdict["compiler_log"] = args.compiler_log
    # Triton compiles by launching (on the card when there is one); nvcc needs no card.
    stamp(verdict, variant_inputs(variant), measured_on_card=variant.kind == "triton" and verdict["status"] != "skipped")
    log.info("build %s: %s %s", variant.name, verdict["status"], "; ".join(verdict["reasons"]))
    write_text(args.compiler_log, text)
    write_json(args.resources, {"variant": variant.name, "kernels": resources})
    write_json(args.verdict, verdict)


if __name__ == "__main__":
    run_stage(main)
