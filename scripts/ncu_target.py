"""The process Nsight Compute profiles: warm-up calls, then exactly one call of the entry (a
variant or SDPA's default) inside the NVTX range ncu filters on."""
import math

from evo_sdpa.cli import parser
from evo_sdpa.inputs import make_qkv
from evo_sdpa.io import read_json
from evo_sdpa.profiling import NVTX_RANGE
from evo_sdpa.provenance import report_card
from evo_sdpa.shapes import torch_dtype
from evo_sdpa.variants import SDPA_ENTRY

WARMUP_CALLS = 3


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
    if args.card:
        report_card(args.card)
    import torch

    q, k, v = make_qkv(args.B, args.H, args.S, args.D, torch_dtype(args.dtype), "cuda", 0)
    scale, causal = 1.0 / math.sqrt(args.D), bool(args.causal)
    out = torch.empty_like(q)
    if args.entry == SDPA_ENTRY:
        from evo_sdpa.runners import sdpa_forward

        forward = sdpa_forward()
    else:
        from evo_sdpa.runners import load_built
        from evo_sdpa.variants import KERNELS_DIR, load_variant

        forward = load_built(load_variant(KERNELS_DIR / args.entry), read_json(args.build))
    for _ in range(WARMUP_CALLS):
        forward(q, k, v, out, causal, scale)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(NVTX_RANGE)
    forward(q, k, v, out, causal, scale)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


if __name__ == "__main__":
    main()
