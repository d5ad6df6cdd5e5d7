"""The process Nsight Compute profiles: warm-up calls, then exactly one call of the entry (a
variant or SDPA's default) between the profiler's start and stop, the only kernels ncu profiles.
A CUDA variant runs without torch (bare.py); SDPA and Triton variants need it."""
import math

from evo_sdpa.cli import parser
from evo_sdpa.io import read_json
from evo_sdpa.variants import KERNELS_DIR, SDPA_ENTRY, load_variant

WARMUP_CALLS = 3


def profile_bare(variant, build: dict, args) -> None:
    from evo_sdpa.bare import BareCall, open_device
    from evo_sdpa.cuda_abi import CudaVariant

    driver = open_device(args.card)
    call = BareCall(driver, CudaVariant(build["artifact"]), args.B, args.H, args.S, args.D, args.dtype,
                    bool(args.causal))
    for _ in range(WARMUP_CALLS):
        call()
    driver.synchronize()
    driver.profiler_start()
    call()
    driver.synchronize()
    driver.profiler_stop()


def profile_torch(variant, build: dict | None, args) -> None:
    from evo_sdpa.provenance import report_card

    if args.card:
        report_card(args.card)
    import torch

    from evo_sdpa.inputs import make_qkv
    from evo_sdpa.runners import load_built, sdpa_forward
    from evo_sdpa.shapes import torch_dtype

    q, k, v = make_qkv(args.B, args.H, args.S, args.D, torch_dtype(args.dtype), "cuda", 0)
    scale, causal = 1.0 / math.sqrt(args.D), bool(args.causal)
    out = torch.empty_like(q)
    forward = sdpa_forward() if variant is None else load_built(variant, build)
    for _ in range(WARMUP_CALLS):
        forward(q, k, v, out, causal, scale)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    forward(q, k, v, out, causal, scale)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--entry", required=True)
    p.add_argument("--build", help="the variant's build verdict (not for sdpa)")
    p.add_argument("--B", type=int, required=True)
    p.add_argument("--H", type=int, required=True)
    p.add_argument("--S", type=int, required=True)
    p.add_argument("--D", type=int, required=True)
    p.add_argument("--causal", type=int, required=True)
    p.add_argument("--dtype", required=True)
    p.add_argument("--card", help="write the card this process runs on here (the ncu stage stamps its record with it)")
    args = p.parse_args()
    if args.entry == SDPA_ENTRY:
        profile_torch(None, None, args)
        return
    variant = load_variant(KERNELS_DIR / args.entry)
    build = read_json(args.build)
    (profile_bare if variant.kind == "cuda" else profile_torch)(variant, build, args)


if __name__ == "__main__":
    main()
