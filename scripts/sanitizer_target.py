"""Run one variant once per supported (dtype, head dim, causal) on a small shape whose length is
not a tile multiple, then on each of the variant's own sanitizer_shapes: the process
compute-sanitizer watches. A CUDA variant runs without torch (bare.py); Triton needs it."""
import itertools
import math
from pathlib import Path

from evo_sdpa.cli import parser
from evo_sdpa.io import read_json
from evo_sdpa.variants import KERNELS_DIR, load_variant


def configurations(variant, B: int, H: int, S: int):
    s = variant.support
    shapes = [{"B": B, "H": H, "S": S}, *variant.sanitizer_shapes]
    return itertools.product(shapes, s["dtypes"], s["head_dims"], s["causal"])


def run_bare(variant, build: dict, configs, card) -> None:
    from evo_sdpa.bare import BareCall, open_device
    from evo_sdpa.cuda_abi import CudaVariant

    driver = open_device(card)
    library = CudaVariant(build["artifact"])
    for shape, dtype, D, causal in configs:
        call = BareCall(driver, library, shape["B"], shape["H"], shape["S"], D, dtype, causal)
        call()
        print(f"ran {shape} {dtype} D={D} causal={causal}: finite={call.output_finite()}")
        call.free()


def run_torch(variant, build: dict, configs, card) -> None:
    from evo_sdpa.provenance import report_card

    if card:
        report_card(card)
    import torch

    from evo_sdpa.inputs import make_qkv, poisoned_like
    from evo_sdpa.runners import load_built
    from evo_sdpa.shapes import torch_dtype

    forward = load_built(variant, build)
    for shape, dtype, D, causal in configs:
        q, k, v = make_qkv(shape["B"], shape["H"], shape["S"], D, torch_dtype(dtype), "cuda", 0)
        out = poisoned_like(q)
        forward(q, k, v, out, causal, 1.0 / math.sqrt(D))
        torch.cuda.synchronize()
        print(f"ran {shape} {dtype} D={D} causal={causal}: finite={bool(torch.isfinite(out).all())}")


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--variant", required=True)
    p.add_argument("--variant-dir", help="the variant's folder when it is not kernels/<variant> "
                                         "(an evolution candidate written by a proposer)")
    p.add_argument("--build", required=True)
    p.add_argument("--B", type=int, required=True)
    p.add_argument("--H", type=int, required=True)
    p.add_argument("--S", type=int, required=True)
    p.add_argument("--card", help="write the card this process runs on here (the sanitizer stage stamps its "
                                  "record with it)")
    args = p.parse_args()
    variant = load_variant(Path(args.variant_dir) if args.variant_dir else KERNELS_DIR / args.variant)
    run = run_bare if variant.kind == "cuda" else run_torch
    run(variant, read_json(args.build), configurations(variant, args.B, args.H, args.S), args.card)


if __name__ == "__main__":
    main()
