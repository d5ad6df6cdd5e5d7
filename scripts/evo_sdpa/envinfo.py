"""Environment capture: device properties, software versions, git state, measured ceilings."""
from __future__ import annotations

import platform
import subprocess

from .device import NO_DEVICE_REASON, cuda_available, find_tool
from .provenance import card, git_state

# Matmul size for the ceiling: large enough to reach the card's sustained dense rate.
MATMUL_N = 8192
COPY_BYTES = 1 << 30
# Kernels captured back to back in one CUDA graph to time the fixed cost of one launch.
LAUNCH_KERNELS = 200


def _run(argv: list[str]) -> str | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (subprocess.SubprocessError, OSError):
        return None


def _tool_version(name: str) -> str | None:
    """The last line of `<tool> --version` (where nvcc, ncu and compute-sanitizer put it)."""
    path = find_tool(name)
    out = _run([path, "--version"]) if path else None
    return out.splitlines()[-1] if out else None


def versions() -> dict:
    import importlib.metadata as md

    def pkg(name: str):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    result = {
        "python": platform.python_version(),
        "torch": pkg("torch"),
        "triton": pkg("triton"),
        "snakemake": pkg("snakemake"),
        "nvcc": _tool_version("nvcc"),
        "ncu": _tool_version("ncu"),
        "compute_sanitizer": _tool_version("compute-sanitizer"),
    }
    import torch

    result["torch_cuda"] = torch.version.cuda
    result["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return result


def device_properties() -> dict:
    import torch

    idx = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(idx)
    smi = _run(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit",
                "--format=csv,noheader,nounits"])
    driver = sm_clock = sm_clock_max = mem_clock = power = None
    if smi:
        parts = [p.strip() for p in smi.splitlines()[idx if idx < len(smi.splitlines()) else 0].split(",")]
        driver, sm_clock, sm_clock_max, mem_clock, power = (parts + [None] * 5)[:5]
    return {
        "name": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "l2_bytes": int(props.L2_cache_size),
        "total_memory_bytes": int(props.total_memory),
        "shared_memory_per_block_optin_bytes": int(getattr(props, "shared_memory_per_block_optin", 0)),
        "shared_memory_per_sm_bytes": int(getattr(props, "shared_memory_per_multiprocessor", 0)),
        "registers_per_sm": int(getattr(props, "regs_per_multiprocessor", 0)),
        "driver": driver,
        "sm_clock_mhz": sm_clock,
        "sm_clock_max_mhz": sm_clock_max,
        "mem_clock_mhz": mem_clock,
        "power_limit_w": power,
    }


def measure_ceilings() -> dict:
    """Device-to-device copy bandwidth and dense matmul rate, taken on this card now."""
    import torch

    from .stats import percentile

    def best_of(fn, reps: int) -> float:
        times = []
        for _ in range(reps):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(begin.elapsed_time(end) * 1e-3)
        return percentile(times, 50)

    src = torch.randn(COPY_BYTES // 4, device="cuda")
    dst = torch.empty_like(src)
    dst.copy_(src)
    copy_s = best_of(lambda: dst.copy_(src), 20)
    ceilings = {"copy_gbps": 2 * COPY_BYTES / copy_s / 1e9, "copy_bytes": COPY_BYTES,
                "matmul_tflops": {}, "matmul_n": MATMUL_N}
    del src, dst
    for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        a = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=dtype)
        b = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=dtype)
        for _ in range(3):
            a @ b
        mm_s = best_of(lambda: a @ b, 10)
        ceilings["matmul_tflops"][name] = 2 * MATMUL_N**3 / mm_s / 1e12
    ceilings["launch_us"] = graph_launch_us(best_of)
    ceilings["launch_kernels"] = LAUNCH_KERNELS
    torch.cuda.empty_cache()
    return ceilings


def graph_launch_us(best_of) -> float:
    """The cost of one launch of a kernel that does (almost) nothing, under CUDA-graph replay:
    the floor under any kernel's per-call time, which the bottleneck analysis compares a
    launch-bound kernel's duration with."""
    import torch

    cell = torch.zeros(1, device="cuda")
    cell.add_(1.0)  # warm: the elementwise kernel is loaded before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(LAUNCH_KERNELS):
            cell.add_(1.0)
    graph.replay()
    return best_of(graph.replay, 20) * 1e6 / LAUNCH_KERNELS


def capture() -> dict:
    env = {"host": platform.node(), "platform": platform.platform(), "git": git_state(),
           "versions": versions(), "card": card()}
    if cuda_available():
        env["device"] = device_properties()
        env["ceilings"] = measure_ceilings()
        env["cuda"] = True
    else:
        env["device"] = None
        env["ceilings"] = None
        env["cuda"] = False
        env["not_measured"] = f"device properties and ceilings: {NO_DEVICE_REASON}"
    return env
