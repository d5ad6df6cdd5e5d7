"""Stage: build one variant and write its verdict, per-kernel resources and the compiler log."""
from pathlib import Path

from evo_sdpa.build import below_min_cc, build_cuda, build_triton
from evo_sdpa.cli import config_arg, parser, setup_logging
from evo_sdpa.errors import run_stage
from evo_sdpa.io import write_json, write_text
from evo_sdpa.variants import KERNELS_DIR, load_variant


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--variant", required=True)
    p.add_argument("--compute-capability", required=True)
    config_arg(p)
    p.add_argument("--verdict", required=True)
    p.add_argument("--resources", required=True)
    p.add_argument("--compiler-log", required=True)
    args = p.parse_args()
    log = setup_logging()
    variant = load_variant(KERNELS_DIR / args.variant)
    outdir = Path(args.verdict).parent
    skip = below_min_cc(variant, args.compute_capability)
    if skip:
        verdict, resources, text = {"status": "skipped", "reasons": [skip], "artifact": None}, [], skip
    elif variant.kind == "cuda":
        verdict, resources, text = build_cuda(variant, args.compute_capability, outdir,
                                              args.config_json["build"].get("cutlass_include"))
    else:
        verdict, resources, text = build_triton(variant, variant.meta["build"]["allow_spills"])
    verdict.update(variant=variant.name, kind=variant.kind,
                   compute_capability=args.compute_capability, compiler_log=args.compiler_log)
    log.info("build %s: %s %s", variant.name, verdict["status"], "; ".join(verdict["reasons"]))
    write_text(args.compiler_log, text)
    write_json(args.resources, {"variant": variant.name, "kernels": resources})
    write_json(args.verdict, verdict)


if __name__ == "__main__":
    run_stage(main)
