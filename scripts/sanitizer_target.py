"""Run one variant once per supported (dtype, head dim, causal) on a small shape whose length is
not a tile multiple, then on each shape given with --shapes (the caller passes the variant's
sanitizer_shapes, so what it records is what ran): the process compute-sanitizer watches. A CUDA
variant runs without torch (bare.py); Triton needs it."""
import argparse
import itertools
import math
from pathlib import Path

from evo_sdpa.cli import parser
from evo_sdpa.io import read_json
from evo_sdpa.variants import KERNELS_DIR, load_variant


def configurations(variant, B: int, H: int, S: int, extra: list[dict]):
    s = variant.support
    shapes = [{"B": B, "H": H, "S": S}, *extra]
    return itertools.product(shapes, s["dtypes"], s["head_dims"], s["causal"])


def parse_shapes(text: str) -> list[dict]:
    """'B,H,S;B,H,S' (empty: none) as shapes."""
    shapes = []
    for part in filter(None, text.split(";")):
        try:
            B, H, S = (int(x) for x in part.split(","))
        except ValueError:
            raise argparse.ArgumentTypeError(f"--shapes {text!r}: expected B,H,S shapes joined by ';'") from None
        shapes.append({"B": B, "H": H, "S": S})
    return shapes


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
    p.add_argument("--shapes", type=parse_shapes, default=None,
                   help="the further shapes to run, B,H,S joined by ';' (default: the variant's sanitizer_shapes)")
    p.add_argument("--card", help="write the card this process runs on here (the sanitizer stage stamps its "
                                  "record with it)")
    args = p.parse_args()
    variant = load_variant(Path(args.variant_dir) if args.variant_dir else KERNELS_DIR / args.variant)
    run = run_bare if variant.kind == "cuda" else run_torch
    extra = variant.sanitizer_shapes if args.shapes is None else args.shapes
    run(variant, read_json(args.build), configurations(variant, args.B, args.H, args.S, extra), args.card)


if __name__ == "__main__":
    main()
