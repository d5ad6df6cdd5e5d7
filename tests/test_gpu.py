"""GPU tests: the CUDA and Triton variants, the timing harness and the sanitizer on a real
device. Marked `gpu`; they skip on hosts without one (tests/conftest.py)."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from evo_sdpa.build import build_cuda
from evo_sdpa.parity import ParityCase, run_case
from evo_sdpa.runners import load_forward
from evo_sdpa.stats import StopRule
from evo_sdpa.tolerance import ToleranceRule
from evo_sdpa.variants import KERNELS_DIR, load_variant

pytestmark = pytest.mark.gpu
RULE = ToleranceRule(sdpa_multiple=4.0, atol={"fp16": 1e-3, "bf16": 8e-3})


def compute_capability() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"{major}.{minor}"


@pytest.fixture(scope="module")
def scalar_forward(tmp_path_factory):
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    variant = load_variant(KERNELS_DIR / "v1_scalar")
    verdict, resources, _ = build_cuda(variant, compute_capability(), tmp_path_factory.mktemp("build"))
    assert verdict["status"] == "pass", verdict["reasons"]
    assert all(r["spill_store_bytes"] == 0 and r["stack_frame_bytes"] == 0 for r in resources)
    return load_forward(variant, verdict["artifact"])


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("S", [1, 17, 1000])
def test_v1_scalar_matches_reference(scalar_forward, dtype, D, causal, S):
    case = ParityCase(dtype, 2, 3, S, D, causal, "large", seed=7)
    record = run_case(case, scalar_forward, RULE, "cuda")
    assert record["status"] == "pass", record["reason"]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_triton_flash_matches_reference(dtype, D, causal):
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("TRITON_INTERPRET=1: Triton kernels are interpreted in this process")
    forward = load_forward(load_variant(KERNELS_DIR / "triton_flash"), None)
    record = run_case(ParityCase(dtype, 1, 2, 300, D, causal, "dominant_key", 3), forward, RULE, "cuda")
    assert record["status"] == "pass", record["reason"]


def test_cuda_variant_rejects_unsupported_head_dim(scalar_forward):
    import torch

    q = torch.randn(1, 1, 8, 96, device="cuda", dtype=torch.float16)
    with pytest.raises(RuntimeError, match="returned -1"):
        scalar_forward(q, q, q, torch.empty_like(q), False, 1.0)


def test_eager_timing_measures_a_known_duration():
    """torch.cuda._sleep spins a known number of cycles: the harness must report about that."""
    import torch

    from evo_sdpa.timing import time_eager

    cycles = 2_000_000
    rule = StopRule(min_samples=10, min_time_ms=1, max_time_ms=2000, rel_spread=0.05)
    result = time_eager({"sleep": lambda: torch.cuda._sleep(cycles)}, rule, warmup_ms=5, flush=True)
    p50 = result["sleep"]["stats"]["p50_us"]
    expected_us = cycles / 1980.0  # at the H100/H200 boost clock; slower clocks take longer
    assert 0.8 * expected_us < p50 < 5 * expected_us, (p50, expected_us)
    assert result["sleep"]["ended_by"] in {"converged", "time cap"}
    # a launch of _sleep is a few µs of host time, hidden behind the flush queued before it
    assert 0 < result["sleep"]["host_p50_us"] < result["sleep"]["hidden_us"]


def test_graph_timing_rotates_sets_beyond_l2_unless_told_how_many():
    """By default a graph-timed shape rotates enough input sets to exceed L2; graph_sets=1 (ab_sweep's
    --graph-sets, a diagnosis) keeps one set in L2, and the record says which it was. A call that
    streams its inputs from DRAM is slower than the same call on inputs L2 holds."""
    import torch

    from evo_sdpa.shapes import Shape
    from evo_sdpa.timing import time_shape

    shape = Shape.from_dict({"B": 4, "H": 8, "S": 512, "D": 64, "causal": False, "graph": True})  # 8 MB a set
    timing = {"warmup_ms": 5, "min_samples": 10, "min_time_ms": 5, "max_time_ms": 1000,
              "rel_spread": 0.05, "l2_flush": True, "graph_calls": 8}
    factories = {"sum": lambda q, k, v: (lambda: torch.add(q, k).add_(v))}  # reads all of q, k, v
    rotated = time_shape(factories, shape, "fp16", timing)["graph"]["sum"]
    in_l2 = time_shape(factories, shape, "fp16", timing, graph_sets=1)["graph"]["sum"]
    assert "together larger than L2" in rotated["cache"] and not rotated["cache"].startswith("1 ")
    assert in_l2["cache"].startswith("1 input sets") and "fits in L2" in in_l2["cache"]
    assert in_l2["stats"]["p50_us"] < rotated["stats"]["p50_us"], (in_l2["stats"], rotated["stats"])


def test_host_time_beyond_the_flush_lands_in_the_eager_p50_and_is_flagged():
    """The cause of Triton's run-to-run eager ratios (triton_flash NOTES, run 30): a call that spends
    longer on the host than the GPU spends on the flush before it is timed with the GPU idle."""
    import time

    import torch

    from evo_sdpa.bench import host_flag
    from evo_sdpa.timing import time_eager

    def slow_host_call():
        time.sleep(0.0005)
        torch.cuda._sleep(20_000)

    rule = StopRule(min_samples=20, min_time_ms=1, max_time_ms=2000, rel_spread=0.05)
    result = time_eager({"slow": slow_host_call}, rule, warmup_ms=5, flush=True)["slow"]
    assert result["host_p50_us"] > 500 > result["hidden_us"]
    assert result["stats"]["p50_us"] > 500 - result["hidden_us"]  # the idle GPU is inside the interval
    assert host_flag(result["host_p50_us"], None, result["hidden_us"], result["stats"]["p50_us"], 0.0)


def test_sanitizer_catches_an_out_of_bounds_access(scalar_forward, tmp_path):
    """A planted bug: the kernel is told S=65 for tensors of 64 rows, so it reads and writes one
    row past each buffer. memcheck with padding must report it."""
    from evo_sdpa.device import find_tool
    from evo_sdpa.sanitizer import run_tools

    sanitizer = find_tool("compute-sanitizer")
    if sanitizer is None:
        pytest.skip("needs compute-sanitizer")
    script = tmp_path / "oob.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parents[1] / 'scripts')!r})\n"
        "import torch\n"
        "from evo_sdpa.cuda_abi import CudaVariant\n"
        f"lib = CudaVariant({str(scalar_forward.path)!r})\n"
        "q = torch.randn(1, 1, 64, 64, device='cuda', dtype=torch.float16)\n"
        "o = torch.empty_like(q)\n"
        "stream = torch.cuda.current_stream().cuda_stream\n"
        "lib._forward(q.data_ptr(), q.data_ptr(), q.data_ptr(), o.data_ptr(), 1, 1, 65, 64, 0, 0.125, 0, stream)\n"
        "torch.cuda.synchronize()\n")
    results = run_tools(sanitizer, ["memcheck"], 256, [sys.executable, str(script)], tmp_path)
    assert results[0]["status"] == "fail", results
    assert "Invalid __global__" in results[0]["reason"], results[0]["reason"]
