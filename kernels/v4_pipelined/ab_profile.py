"""Nsight Compute on one shape for libraries built by ab_sweep.py (not a pipeline stage).

The pipeline profiles one small shape; this profiles any shape (the big causal one, say) for
several builds side by side and prints the metrics the pipeline's analysis reads (its own
`key_metrics` and stall shares), so a regression between two builds can be traced.

    python3 kernels/v4_pipelined/ab_profile.py --libs /tmp/v4_ab_sweep/libv3_mma.so,... \
        --shape 4,16,2048,128,1 --out $OUT/profile.json
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from evo_sdpa.bottlenecks import stall_shares  # noqa: E402
from evo_sdpa.ncu import key_metrics, parse_raw_csv  # noqa: E402

NVTX_RANGE = "ab_profile"
SECTIONS = ["SpeedOfLight", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis", "Occupancy", "LaunchStats",
            "SchedulerStats", "WarpStateStats"]
SHOWN = ["duration_us", "issue_active_pct", "tensor_pipe_pct", "fma_pipe_pct", "achieved_occupancy_pct",
         "registers_per_thread", "shared_mem_per_block_bytes", "l2_to_sm_read_bytes", "l2_hit_rate_pct",
         "dram_throughput_pct", "memory_throughput_pct", "shared_wavefronts", "shared_bank_conflicts"]


def target(lib: str, shape: list[int], dtype: str) -> None:
    import torch

    from evo_sdpa.cuda_abi import CudaVariant
    from evo_sdpa.inputs import make_qkv
    from evo_sdpa.shapes import torch_dtype

    B, H, S, D, causal = shape
    q, k, v = make_qkv(B, H, S, D, torch_dtype(dtype), "cuda", 0)
    out = torch.empty_like(q)
    forward = CudaVariant(lib)
    for _ in range(3):
        forward(q, k, v, out, bool(causal), 1.0 / math.sqrt(D))
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push(NVTX_RANGE)
    forward(q, k, v, out, bool(causal), 1.0 / math.sqrt(D))
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()


def profile(lib: str, shape: str, dtype: str, workdir: Path) -> dict:
    ncu = shutil.which("ncu")
    base = workdir / Path(lib).stem
    argv = [ncu, *sum((["--section", s] for s in SECTIONS), []), "--clock-control", "none", "--nvtx",
            "--nvtx-include", f"{NVTX_RANGE}/", "--launch-count", "1", "--export", str(base), "--force-overwrite",
            "--log-file", str(base) + ".log", "--", sys.executable, __file__, "--target", lib, "--shape", shape,
            "--dtype", dtype]
    proc = subprocess.run(argv, capture_output=True, text=True, env={**__import__("os").environ,
                                                                     "PYTHONPATH": str(REPO / "scripts")})
    if proc.returncode != 0:
        return {"lib": lib, "error": (proc.stdout + proc.stderr)[-800:]}
    csv = subprocess.run([ncu, "--import", f"{base}.ncu-rep", "--page", "raw", "--csv"], capture_output=True,
                         text=True).stdout
    kernels = parse_raw_csv(csv)
    if not kernels:
        return {"lib": lib, "error": "no kernel profiled"}
    metrics = key_metrics(kernels[0])
    return {"lib": lib, "kernel": kernels[0].name, "metrics": {k: metrics.get(k) for k in SHOWN},
            "stalls_per_issue": metrics.get("warp_stalls"), "stall_shares": stall_shares(metrics.get("warp_stalls") or {})}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--libs")
    parser.add_argument("--shape", required=True, help="B,H,S,D,causal")
    parser.add_argument("--dtype", default="fp16")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.target:
        target(args.target, [int(x) for x in args.shape.split(",")], args.dtype)
        return 0
    workdir = Path("/tmp/v4_ab_profile")
    workdir.mkdir(parents=True, exist_ok=True)
    results = [profile(lib, args.shape, args.dtype, workdir) for lib in args.libs.split(",")]
    for r in results:
        name = Path(r["lib"]).stem
        if "error" in r:
            print(f"{name}: ERROR {r['error']}")
            continue
        m = {k: (v if v is not None else float("nan")) for k, v in r["metrics"].items()}
        top = sorted(r["stall_shares"].items(), key=lambda kv: -kv[1])[:8]
        print(f"{name}: {m['duration_us']:.1f} us, issue {m['issue_active_pct']:.1f}%, tensor {m['tensor_pipe_pct']:.1f}%, "
              f"occ {m['achieved_occupancy_pct']:.1f}%, regs {m['registers_per_thread']}, "
              f"L2->SM {m['l2_to_sm_read_bytes'] / 1e9:.2f} GB, L2 hit {m['l2_hit_rate_pct']:.0f}%, "
              f"mem {m['memory_throughput_pct']:.0f}%, smem wavefronts {m['shared_wavefronts']:.3g}")
        print("    stalls: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in top))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
