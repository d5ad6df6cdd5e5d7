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
    assert 0 < result["sleep"]["host_p50_us"] < p50  # a launch of _sleep: a few µs of host time


def test_graph_timing_rotates_sets_beyond_l2_unless_told_how_many():
    """By default a graph-timed shape rotates enough input sets to exceed twice the L2, in a graph
    grown past graph_calls to read them all; graph_sets=1 (ab_sweep's --graph-sets, a diagnosis)
    keeps one set in L2 in a graph of graph_calls, and the record says which it was. A call that
    streams its inputs from DRAM is slower than the same call on inputs L2 holds."""
    import torch

    from evo_sdpa.shapes import Shape
    from evo_sdpa.timing import l2_bytes, time_shape

    shape = Shape.from_dict({"B": 4, "H": 8, "S": 512, "D": 64, "causal": False, "graph": True})  # 8 MB a set
    timing = {"warmup_ms": 5, "min_samples": 10, "min_time_ms": 5, "max_time_ms": 1000,
              "rel_spread": 0.05, "l2_flush": True, "graph_calls": 8}
    factories = {"sum": lambda q, k, v: (lambda: torch.add(q, k).add_(v))}  # reads all of q, k, v
    rotated = time_shape(factories, shape, "fp16", timing)["graph"]["sum"]
    in_l2 = time_shape(factories, shape, "fp16", timing, graph_sets=1)["graph"]["sum"]
    sets = -(-2 * l2_bytes() // (8 << 20))   # 13 on an H100's 50 MiB
    assert rotated["cache"].startswith(f"{sets} input sets rotated per replay (together {8 * sets:.1f} MiB: larger than")
    assert rotated["mode"] == f"graph x{sets}" and in_l2["mode"] == "graph x8"
    assert in_l2["cache"].startswith("1 input sets rotated per replay (one set 8.0 MiB: fits in the")
    # The timing sets no L2 aside and the call sets none, so the label claims no reset.
    assert all(t["cache"].endswith("; no L2 set aside for persisting lines") for t in (rotated, in_l2))
    assert in_l2["stats"]["p50_us"] < rotated["stats"]["p50_us"], (in_l2["stats"], rotated["stats"])


def test_host_time_stays_out_of_the_gated_eager_p50_and_is_flagged():
    """The cause of Triton's run-to-run eager ratios (triton_flash NOTES, run 30; v5_hopper NOTES,
    run 101): a call slower on the host than the flush before it left the GPU idle inside its
    timed interval. Gated, the p50 is the kernel's own time however slow the host, and the host
    time is reported beside it."""
    import time

    import torch

    from evo_sdpa.bench import host_flag
    from evo_sdpa.timing import time_eager

    def slow_host_call():
        time.sleep(0.0005)
        torch.cuda._sleep(20_000)

    rule = StopRule(min_samples=20, min_time_ms=1, max_time_ms=2000, rel_spread=0.05)
    timed = time_eager({"slow": slow_host_call, "quick": lambda: torch.cuda._sleep(20_000)}, rule,
                       warmup_ms=5, flush=True)
    slow, quick = timed["slow"], timed["quick"]
    assert slow["host_p50_us"] > 500 > 10 * quick["host_p50_us"]
    assert slow["stats"]["p50_us"] < 100  # 20k cycles: about 10 µs at the boost clock
    assert abs(slow["stats"]["p50_us"] - quick["stats"]["p50_us"]) < 0.1 * quick["stats"]["p50_us"] + 1.0
    assert host_flag(slow["host_p50_us"], None, slow["stats"]["p50_us"], 0.0)


def test_persisting_lines_are_undone_before_each_sample_and_none_persist_without_a_set_aside():
    """A call that sets an access-policy window keeps its lines in L2 across the flush when the
    context sets L2 aside for them; the reset before each sample undoes them; and with no L2 set
    aside (as the timing sets its context, and the reset is skipped) the same window keeps nothing."""
    import ctypes
    import struct

    import torch

    from evo_sdpa.timing import FLUSH_FACTOR, L2Flusher, PersistingL2Reset, l2_bytes

    driver = ctypes.CDLL("libcuda.so.1")
    driver.cuCtxSetLimit.argtypes = [ctypes.c_int, ctypes.c_size_t]
    driver.cuCtxGetLimit.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.c_int]
    stream = torch.cuda.current_stream()
    largest = ctypes.c_int()
    driver.cuDeviceGetAttribute(ctypes.byref(largest), 108, 0)  # CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE
    set_aside = min(32 << 20, largest.value)
    buffer = torch.ones(set_aside // 4, device="cuda")
    window = ctypes.create_string_buffer(PersistingL2Reset.ATTR_VALUE_BYTES)
    struct.pack_into("<QQfii", window, 0, buffer.data_ptr(), buffer.numel() * 4, 1.0, 2, 1)  # persisting hits
    flush = L2Flusher(FLUSH_FACTOR * l2_bytes())
    reset = PersistingL2Reset(stream.cuda_stream)

    made_with = ctypes.c_size_t()
    assert driver.cuCtxGetLimit(ctypes.byref(made_with), PersistingL2Reset.PERSISTING_L2_LIMIT) == 0
    assert made_with.value == 0  # the timing's reset sets none aside

    def read_after_flush_us(limit: int, undo, marked: bool = True) -> float:
        assert driver.cuCtxSetLimit(PersistingL2Reset.PERSISTING_L2_LIMIT, limit) == 0
        times = []
        for _ in range(40):
            driver.cuStreamSetAttribute(ctypes.c_void_p(stream.cuda_stream), PersistingL2Reset.ACCESS_POLICY_WINDOW,
                                        window if marked else reset.empty_window)
            buffer.sum()  # the "call": its reads mark the buffer's lines persisting
            undo()
            flush()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            buffer.sum()
            end.record()
            torch.cuda.synchronize()
            times.append(begin.elapsed_time(end) * 1e3)
        return sorted(times)[len(times) // 2]

    try:
        cold = read_after_flush_us(0, lambda: None, marked=False)
        kept = read_after_flush_us(set_aside, lambda: None)
        assert reset.resets == 0
        undone = read_after_flush_us(set_aside, reset)
        assert reset.resets == 40
        unset = read_after_flush_us(0, reset)
        assert reset.resets == 40  # nothing set aside: skipped
        assert reset.describe() == "; a call set L2 aside for persisting lines: reset before 40 samples"
    finally:
        reset()
        driver.cuCtxSetLimit(PersistingL2Reset.PERSISTING_L2_LIMIT, 0)
    # the window works (its lines survive the flush), the reset undoes them, and nothing set aside
    # keeps nothing (run 108, 16 MB: cold 14.1 µs, kept 11.7, undone 15.5, nothing set aside 13.6)
    assert kept < 0.85 * min(cold, undone, unset) and min(undone, unset) > 0.95 * cold, (cold, kept, undone, unset)


def test_the_gate_holds_the_stream_until_the_host_opens_it():
    import time

    import torch

    from evo_sdpa.streamgate import StreamGate

    gate = StreamGate(torch.cuda.current_stream().cuda_stream)
    try:
        done = torch.cuda.Event()
        gate.close()
        done.record()
        time.sleep(0.05)
        assert not done.query()
        gate.open()
        done.synchronize()
        assert done.query()
    finally:
        gate.release()


def test_a_call_that_synchronises_inside_the_gated_timing_is_named_not_hung(monkeypatch):
    import torch

    from evo_sdpa import streamgate
    from evo_sdpa.errors import StageError
    from evo_sdpa.timing import time_eager

    monkeypatch.setattr(streamgate, "FORCE_OPEN_S", 0.2)

    def syncing_call():
        torch.cuda._sleep(1000)
        torch.cuda.synchronize()

    rule = StopRule(min_samples=5, min_time_ms=0, max_time_ms=5000, rel_spread=0.05)
    with pytest.raises(StageError, match="timing syncing: its call waited for the GPU inside itself"):
        time_eager({"syncing": syncing_call}, rule, warmup_ms=1, flush=False)
    torch.cuda.synchronize()  # the stream is free again


# One launch told S=65 for buffers of 64 rows: on torch's allocations (the Triton targets' route,
# caching allocator off) and on the driver's (the CUDA variants' torch-free targets).
OUT_OF_BOUNDS_LAUNCH = {
    "torch": ("import torch\n"
              "q = torch.randn(1, 1, 64, 64, device='cuda', dtype=torch.float16)\n"
              "o = torch.empty_like(q)\n"
              "lib.launch(q.data_ptr(), q.data_ptr(), q.data_ptr(), o.data_ptr(), (1, 1, 65, 64), False, 0.125,\n"
              "           'float16', torch.cuda.current_stream().cuda_stream)\n"
              "torch.cuda.synchronize()\n"),
    "driver": ("from evo_sdpa.driver import CudaDriver\n"
               "driver = CudaDriver()\n"
               "q, o = driver.alloc(64 * 64 * 2), driver.alloc(64 * 64 * 2)\n"
               "lib.launch(q, q, q, o, (1, 1, 65, 64), False, 0.125, 'float16')\n"
               "driver.synchronize()\n"
               "assert 'torch' not in sys.modules\n"),
}


@pytest.mark.parametrize("allocations", sorted(OUT_OF_BOUNDS_LAUNCH))
def test_sanitizer_catches_an_out_of_bounds_access(scalar_forward, tmp_path, allocations):
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
        "from evo_sdpa.cuda_abi import CudaVariant\n"
        f"lib = CudaVariant({str(scalar_forward.path)!r})\n" + OUT_OF_BOUNDS_LAUNCH[allocations])
    results = run_tools(sanitizer, ["memcheck"], 256, [sys.executable, str(script)], tmp_path)
    assert results[0]["status"] == "fail", results
    assert "Invalid __global__" in results[0]["reason"], results[0]["reason"]


# ---------------------------------------------------------------- the torch-free route (bare.py)

def test_bare_route_gives_the_torch_bindings_bits_and_card(scalar_forward):
    """ncu's and the sanitizer's targets run a CUDA variant through the driver alone: on the same
    input bits its output is bit for bit the torch binding's, and it names the card torch names."""
    import numpy as np
    import torch

    from evo_sdpa.bare import BareCall
    from evo_sdpa.driver import CudaDriver
    from evo_sdpa.inputs import host_qkv
    from evo_sdpa.provenance import card

    driver = CudaDriver()
    assert driver.card() == card()
    for dtype, causal in [("fp16", False), ("bf16", True)]:
        call = BareCall(driver, scalar_forward, 1, 2, 67, 64, dtype, causal, seed=3)
        call()
        assert call.output_finite()
        tdtype = torch.float16 if dtype == "fp16" else torch.bfloat16
        q, k, v = (torch.from_numpy(x.view(np.int16)).view(tdtype).cuda() for x in host_qkv(1, 2, 67, 64, dtype, 3))
        out = torch.empty_like(q)
        scalar_forward(q, k, v, out, causal, 0.125)
        torch.cuda.synchronize()
        assert np.array_equal(out.cpu().view(torch.int16).numpy().view(np.uint16), call.host_out)
        call.free()


def test_ncu_profiles_only_the_call_between_the_profilers_start_and_stop(scalar_forward, tmp_path):
    """The profile stage's command on a CUDA variant (torch-free target) and on SDPA (torch target):
    the one profiled call's kernels, never a warm-up's, and the card the target ran on."""
    import json

    from evo_sdpa.device import find_tool
    from evo_sdpa.profiling import profile
    from evo_sdpa.provenance import card, target_card

    ncu = find_tool("ncu")
    if ncu is None:
        pytest.skip("needs ncu")
    verdict = tmp_path / "verdict.json"
    verdict.write_text(json.dumps({"status": "pass", "artifact": str(scalar_forward.path)}))
    shape = {"B": 2, "H": 8, "S": 512, "D": 64, "causal": False}
    status, csv_text = profile(ncu, "v1_scalar", str(verdict), shape, "fp16", 4, tmp_path / "v1",
                               tmp_path / "v1" / "card.json")
    assert status["status"] == "measured", status
    assert len(status["kernels"]) == 1 and "v1_scalar_attention_fwd" in status["kernels"][0], status["kernels"]
    assert target_card(tmp_path / "v1" / "card.json") == card()
    status, _ = profile(ncu, "sdpa", None, shape, "fp16", 4, tmp_path / "sdpa", tmp_path / "sdpa" / "card.json")
    assert status["status"] == "measured" and 1 <= len(status["kernels"]) <= 4, status


def test_timing_inputs_drawn_on_the_card_and_errors_measured_there():
    """The timing inputs' generator runs on the card (deterministic per seed there, the same
    distributions), and error_stats gives the host's answer from the card's tensors."""
    import torch

    from evo_sdpa.inputs import make_qkv
    from evo_sdpa.tolerance import error_stats

    for distribution in ("normal", "large", "near_constant", "dominant_key"):
        fast = make_qkv(2, 3, 257, 64, torch.float16, "cuda", 5, distribution, draw_on_device=True)
        again = make_qkv(2, 3, 257, 64, torch.float16, "cuda", 5, distribution, draw_on_device=True)
        host = make_qkv(2, 3, 257, 64, torch.float16, "cuda", 5, distribution)
        assert all(t.is_cuda and t.shape == (2, 3, 257, 64) and t.dtype == torch.float16 for t in fast)
        assert all(torch.equal(a, b) for a, b in zip(fast, again))
        if distribution in ("normal", "large"):  # 98,688 draws a tensor: their spread agrees within 2%
            for a, b in zip(fast, host):
                assert abs(a.float().std().item() / b.float().std().item() - 1) < 0.02
    out = host[0] + torch.randn_like(host[0]) * 1e-2
    on_card = error_stats(out, host[0].double())
    on_host = error_stats(out.cpu(), host[0].double().cpu())
    assert on_card["max_abs"] == on_host["max_abs"] and on_card["nonfinite"] == 0
    assert abs(on_card["rel_l2"] - on_host["rel_l2"]) < 1e-12
    out[0, 0, 0, 0] = float("nan")
    assert error_stats(out, host[0]).get("nonfinite") == 1


def test_sdpa_table_on_the_card_gives_the_error_the_case_measures_itself():
    """The table a parity job reads holds, case by case, the error SDPA gives in that job."""
    from evo_sdpa.parity import sdpa_table, support_matrix, table_errors
    from evo_sdpa.provenance import card

    tier = {"seq_lens": [17, 128], "batch_heads": [[2, 3]], "seeds": [0], "distributions": ["normal", "large"]}
    support = {"dtypes": ["fp16", "bf16"], "head_dims": [64, 128]}
    table = sdpa_table("t", tier, support, "cuda")
    table["measured_at"] = {"card": card()}
    errors, why = table_errors(table, "t", "cuda", card())
    assert why is None and table["stack"]["cudnn"]
    cases = support_matrix({**support, "causal": [True, False]}, tier)
    assert sorted(errors) == sorted(c.case_id for c in cases)
    for case in cases[::5]:
        assert run_case(case, lambda q, k, v, out, causal, scale: None, RULE, "cuda")["sdpa_max_abs"] == errors[case.case_id]


def test_the_clock_is_read_through_nvml_and_agrees_with_nvidia_smi():
    from evo_sdpa import timing

    if timing.device.find_tool("nvidia-smi") is None:
        pytest.skip("needs nvidia-smi to compare with")
    assert timing._nvml() is not None, "NVML did not open this card"
    assert timing.max_sm_clock_mhz() == timing._smi_clock("clocks.max.sm")
    timing.spin_up_clock()
    assert timing.sm_clock_mhz() >= timing.SPIN_UP_FRACTION * timing.max_sm_clock_mhz() * 0.9
