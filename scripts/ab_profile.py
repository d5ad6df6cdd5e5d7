"""Nsight Compute on one shape for several built libraries, side by side (not a pipeline stage).

The pipeline profiles one small shape; this profiles any shape (the big causal one, say) for
several builds, the configurations scripts/ab_sweep.py built or any other CUDA variant
libraries, and prints the metrics the pipeline's analysis reads (its own `key_metrics` and stall
shares), so a regression between two builds can be traced. ncu runs as the profile stage runs it
(the library's profile and export commands: full section set, clocks left alone, one call between
the profiler's start and stop after warm-up calls).

    python3 scripts/ab_profile.py --sweep-dir /tmp/evo_sdpa_ab_sweep/v4_pipelined \\
        --shape 4,16,2048,128,1 --out $OUT/profile.json
    python3 scripts/ab_profile.py --libs v3=/path/libv3_mma.so,/path/libv4_pipelined.so --shape 2,8,512,64,0
    python3 scripts/ab_profile.py --libs /path/libv5_hopper.so --shape 4,16,2048,128,1 --source

--source adds, per library, the instructions and opcodes holding the most warp-stall samples
(ncu's source page, evo_sdpa.hotspots).

--libs takes NAME=PATH or PATH (named by the file's stem); --sweep-dir alone means
scripts/ab_sweep.py's build folder, and names each library by its folder below the one given
(<variant>/<config>).
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ab_sweep import BUILD_DIR as SWEEP_BUILD_DIR  # noqa: E402
from evo_sdpa.bottlenecks import stall_shares  # noqa: E402
from evo_sdpa.device import cuda_bin, find_tool  # noqa: E402
from evo_sdpa.errors import StageError  # noqa: E402
from evo_sdpa.hotspots import format_hotspots, hotspots, parse_source_page, source_export_command  # noqa: E402
from evo_sdpa.ncu import clean_csv_text, export_command, key_metrics, parse_raw_csv, profile_command  # noqa: E402
from evo_sdpa.profiling import NCU_TIMEOUT_S  # noqa: E402

WORK_DIR = Path("/tmp/evo_sdpa_ab_profile")
WARMUP_CALLS = 3
SHOWN = ["duration_us", "issue_active_pct", "tensor_pipe_pct", "fma_pipe_pct", "achieved_occupancy_pct",
         "registers_per_thread", "shared_mem_per_block_bytes", "l2_to_sm_read_bytes", "l2_hit_rate_pct",
         "dram_throughput_pct", "memory_throughput_pct", "shared_wavefronts", "shared_bank_conflicts",
         "sm_active_cycles_max", "sm_active_cycles_avg", "sm_elapsed_cycles_max"]


def target(lib: str, shape: list[int], dtype: str) -> None:
    """The process ncu profiles: warm-up calls, then one call between the profiler's start and stop."""
    import torch

    from evo_sdpa.cuda_abi import CudaVariant
    from evo_sdpa.inputs import make_qkv
    from evo_sdpa.shapes import torch_dtype

    B, H, S, D, causal = shape
    q, k, v = make_qkv(B, H, S, D, torch_dtype(dtype), "cuda", 0)
    out = torch.empty_like(q)
    forward = CudaVariant(lib)
    for _ in range(WARMUP_CALLS):
        forward(q, k, v, out, bool(causal), 1.0 / math.sqrt(D))
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    forward(q, k, v, out, bool(causal), 1.0 / math.sqrt(D))
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def profile(ncu: str, name: str, lib: str, shape: str, dtype: str, workdir: Path, source: bool = False) -> dict:
    base = workdir / name.replace("/", "__")
    target_argv = [sys.executable, str(Path(__file__).resolve()), "--target", lib, "--shape", shape, "--dtype", dtype]
    argv = profile_command(ncu, str(base), target_argv, 1, f"{base}.log")
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=NCU_TIMEOUT_S)
    if proc.returncode != 0:
        return {"name": name, "lib": lib, "error": (proc.stdout + proc.stderr)[-800:]}
    exported = subprocess.run(export_command(ncu, f"{base}.ncu-rep"), capture_output=True, text=True,
                              timeout=NCU_TIMEOUT_S)
    try:
        kernels = parse_raw_csv(clean_csv_text(exported.stdout))
    except ValueError:
        kernels = []
    if not kernels:
        return {"name": name, "lib": lib, "error": f"no kernel profiled (see {base}.log)"}
    metrics = key_metrics(kernels[0])
    result = {"name": name, "lib": lib, "kernel": kernels[0].name, "metrics": {k: metrics.get(k) for k in SHOWN},
              "stalls_per_issue": metrics.get("warp_stalls"),
              "stall_shares": stall_shares(metrics.get("warp_stalls") or {})}
    if source:
        page = subprocess.run(source_export_command(ncu, f"{base}.ncu-rep"), capture_output=True, text=True,
                              timeout=NCU_TIMEOUT_S)
        try:
            result["hotspots"] = hotspots(parse_source_page(page.stdout)[0])
        except ValueError as exc:
            result["hotspots_error"] = f"{exc} ({base}.ncu-rep)"
    return result


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", help=argparse.SUPPRESS)
    libs = parser.add_mutually_exclusive_group()
    libs.add_argument("--libs", help="comma-separated NAME=PATH or PATH of built libraries")
    libs.add_argument("--sweep-dir", nargs="?", const=str(SWEEP_BUILD_DIR), metavar="DIR",
                      help=f"every .so below DIR (default {SWEEP_BUILD_DIR}, where scripts/ab_sweep.py builds)")
    parser.add_argument("--shape", required=True, help="B,H,S,D,causal")
    parser.add_argument("--dtype", default="fp16")
    parser.add_argument("--out")
    parser.add_argument("--source", action="store_true",
                        help="also read the source page: the instructions and opcodes holding the most "
                             "warp-stall samples (evo_sdpa.hotspots)")
    return parser


def resolve_libs(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(name, path) of each library to profile, in order; a missing file or folder, an empty
    folder, or two libraries of one name stop here, before ncu runs."""
    if args.sweep_dir:
        root = Path(args.sweep_dir)
        if not root.is_dir():
            raise StageError(f"--sweep-dir {root}: no such folder (scripts/ab_sweep.py builds into {SWEEP_BUILD_DIR})")
        found = sorted(root.rglob("*.so"))
        if not found:
            raise StageError(f"--sweep-dir {root}: no .so below it (run scripts/ab_sweep.py first, or pass --libs)")
        named = [("/".join(path.parent.relative_to(root).parts) or path.stem, str(path)) for path in found]
    elif args.libs:
        named = []
        for item in filter(None, (part.strip() for part in args.libs.split(","))):
            name, path = item.split("=", 1) if "=" in item else ("", item)
            named.append((name or Path(path).stem, path))
        for name, path in named:
            if not Path(path).is_file():
                raise StageError(f"--libs: {path}: no such file")
    else:
        raise StageError("name the libraries to profile: --libs PATH,PATH or --sweep-dir [DIR]")
    names = [name for name, _ in named]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise StageError(f"two libraries named {twice[0]!r}: name them with --libs NAME=PATH,...")
    return named


def main() -> None:
    args = argument_parser().parse_args()
    if args.target:
        target(args.target, [int(x) for x in args.shape.split(",")], args.dtype)
        return
    if len(args.shape.split(",")) != 5:
        raise StageError(f"--shape {args.shape!r}: give B,H,S,D,causal (five integers)")
    libs = resolve_libs(args)
    ncu = find_tool("ncu")  # PATH, then $CUDA_HOME/bin, as the profile stage looks
    if ncu is None:  # the stage's hint (stages.ncu: false) does not apply to this tool
        raise StageError(f"ncu not found on PATH or in {cuda_bin()}: install Nsight Compute (it ships with the "
                         "CUDA toolkit) and put ncu on PATH")
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    results = [profile(ncu, name, lib, args.shape, args.dtype, WORK_DIR, args.source) for name, lib in libs]
    for r in results:
        if "error" in r:
            print(f"{r['name']}: ERROR {r['error']}")
            continue
        m = {k: (v if v is not None else float("nan")) for k, v in r["metrics"].items()}
        top = sorted(r["stall_shares"].items(), key=lambda kv: -kv[1])[:8]
        print(f"{r['name']}: {m['duration_us']:.1f} us, issue {m['issue_active_pct']:.1f}%, "
              f"tensor {m['tensor_pipe_pct']:.1f}%, occ {m['achieved_occupancy_pct']:.1f}%, "
              f"regs {m['registers_per_thread']}, L2->SM {m['l2_to_sm_read_bytes'] / 1e9:.2f} GB, "
              f"L2 hit {m['l2_hit_rate_pct']:.0f}%, mem {m['memory_throughput_pct']:.0f}%, "
              f"smem wavefronts {m['shared_wavefronts']:.3g}, SM active (busiest / mean / elapsed cycles) "
              f"{m['sm_active_cycles_max']:.0f} / {m['sm_active_cycles_avg']:.0f} / {m['sm_elapsed_cycles_max']:.0f}")
        print("    stalls: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in top))
        if "hotspots" in r:
            print("\n".join(format_hotspots(r["hotspots"])))
        elif "hotspots_error" in r:
            print(f"    source page: {r['hotspots_error']}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    from evo_sdpa.errors import run_stage

    run_stage(main)
