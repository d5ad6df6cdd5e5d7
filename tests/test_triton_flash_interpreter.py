"""kernels/triton_flash under the Triton interpreter, on CPU tensors: parity against a float64
reference at the level of torch's own SDPA in the same dtype, masking, guards, API errors."""
import os

import pytest
import torch

# Triton chooses interpreter or compiler process-wide (when @triton.jit runs and again in its
# own lazy imports), so interpreted and compiled kernels cannot share one pytest process. On a
# GPU host the compiled kernel is what matters (tests/test_gpu.py); run these there with
# TRITON_INTERPRET=1 set in the environment.
if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("a CUDA device is present: the Triton interpreter tests run on CPU hosts "
                "(or with TRITON_INTERPRET=1)", allow_module_level=True)
os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

import importlib.util
import math
import time
from pathlib import Path

import yaml

from evo_sdpa.inputs import make_qkv, poisoned_like, reference
from evo_sdpa.tolerance import error_stats
from evo_sdpa.tunables import defaults
from evo_sdpa.variants import load_variant

REPO = Path(__file__).resolve().parents[1]
VARIANT_DIR = REPO / "kernels" / "triton_flash"

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
# Half an ulp at 1.0: the floor when SDPA itself is exact (S=1: the output is v).
ULP_FLOOR = {"fp16": 2.0**-11, "bf16": 2.0**-8}
# (B, H, S): S not a tile multiple, below one tile, one row; batch and heads vary.
SHAPES = [(1, 1, 1), (2, 1, 17), (1, 2, 127), (2, 2, 200)]


def _load_kernel():
    spec = importlib.util.spec_from_file_location("triton_flash_kernel", VARIANT_DIR / "kernel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


kernel = _load_kernel()
if not kernel._INTERPRETER:
    pytest.skip("triton was imported before TRITON_INTERPRET=1 could be set", allow_module_level=True)

# The launch configuration the pipeline runs: variant.yaml's tunables, its one home.
TUNABLES = defaults(load_variant(VARIANT_DIR))
POINTER_LOADS = {"TMA_D64": 0, "TMA_D128": 0}
TMA_LOADS = {"TMA_D64": 1, "TMA_D128": 1}


def forward(q, k, v, out, causal, scale, tunables=TUNABLES):
    kernel.forward(q, k, v, out, causal, scale, tunables=tunables)


def _sdpa_err(q, k, v, causal, scale, ref):
    sdpa_out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    return error_stats(sdpa_out, ref)["max_abs"]


@pytest.mark.parametrize("distribution", ["normal", "large", "near_constant"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_parity_with_sdpa_level_error(dtype, head_dim, causal, distribution):
    for case, (B, H, S) in enumerate(SHAPES):
        q, k, v = make_qkv(B, H, S, head_dim, DTYPES[dtype], "cpu", seed=1000 + case,
                           distribution=distribution)
        scale = 1.0 / math.sqrt(head_dim)
        out = poisoned_like(q)
        forward(q, k, v, out, causal, scale)

        ref = reference(q, k, v, causal, scale)
        err = error_stats(out, ref)
        sdpa_err = _sdpa_err(q, k, v, causal, scale, ref)
        where = f"{dtype} D={head_dim} causal={causal} {distribution} B,H,S={B},{H},{S}"
        assert err["nonfinite"] == 0, f"{where}: {err['nonfinite']} NaN/Inf (unwritten or overflow)"
        # measured worst ratio over this matrix: 1.23x SDPA's own error
        assert err["max_abs"] <= 1.5 * sdpa_err + ULP_FLOOR[dtype], (
            f"{where}: max abs err {err['max_abs']:.3e} vs SDPA's {sdpa_err:.3e}")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_deterministic_and_reads_nothing_past_the_inputs(causal):
    """Two runs agree bitwise; rows >= S are neither read from k/v nor written to out."""
    B, H, S, D = 1, 2, 77, 64
    q, k, v = make_qkv(B, H, S, D, torch.bfloat16, "cpu", seed=7)
    numel, guard = q.numel(), 4 * D

    def guarded(t, fill):
        # t followed in memory by `guard` elements of `fill`; the view is contiguous
        storage = torch.full((numel + guard,), fill, dtype=t.dtype)
        storage[:numel] = t.reshape(-1)
        return storage, storage[:numel].view(t.shape)

    _, k_g = guarded(k, float("nan"))  # a read past the end of k or v would spread NaN
    _, v_g = guarded(v, float("nan"))
    out_storage, out = guarded(q, 12345.0)
    out.fill_(float("nan"))
    forward(q, k_g, v_g, out, causal, 0.125)
    assert torch.all(out_storage[numel:] == 12345.0), "wrote past the last row of out"
    assert torch.isfinite(out).all()

    again = poisoned_like(q)
    forward(q, k, v, again, causal, 0.125)
    assert torch.equal(out, again), "two runs on the same input differ"


def test_causal_first_row_is_first_value_row():
    """Query 0 sees only key 0, so its output is v[..., 0, :] exactly (softmax of one score)."""
    q, k, v = make_qkv(2, 2, 130, 128, torch.float16, "cpu", seed=3, distribution="large")
    out = poisoned_like(q)
    forward(q, k, v, out, True, 0.1)
    assert torch.equal(out[:, :, 0, :], v[:, :, 0, :])


@pytest.mark.parametrize("block_m,block_n", [(128, 64), (64, 128), (32, 16)])
def test_other_tile_shapes(block_m, block_n):
    """Other tiles: BLOCK_M > BLOCK_N (rows fully masked in the second diagonal block),
    BLOCK_N > BLOCK_M (the diagonal block starts before the tile), small tiles."""
    tunables = {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": 4, "num_stages": 2, **POINTER_LOADS}
    for causal in (False, True):
        q, k, v = make_qkv(1, 2, 150, 64, torch.float16, "cpu", seed=11)
        out = poisoned_like(q)
        forward(q, k, v, out, causal, 0.125, tunables)
        ref = reference(q, k, v, causal, 0.125)
        err = error_stats(out, ref)["max_abs"]
        assert err <= 1.5 * _sdpa_err(q, k, v, causal, 0.125, ref) + ULP_FLOOR["fp16"]


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_tensor_descriptor_loads(dtype, head_dim):
    """TMA on: Q, K and V come through [B*H, S, D] descriptors. Ragged lengths (a box past S must
    read zeros, not the next head's rows, which hold large values here), both masks, tiles
    wider than the sequence."""
    tunables = {**TUNABLES, **TMA_LOADS}
    for S, (block_m, block_n) in ((77, (64, 64)), (150, (128, 64)), (5, (64, 32))):
        tunables.update(BLOCK_M=block_m, BLOCK_N=block_n)
        q, k, v = make_qkv(2, 3, S, head_dim, DTYPES[dtype], "cpu", seed=21, distribution="large")
        for causal in (False, True):
            out = poisoned_like(q)
            forward(q, k, v, out, causal, 0.125, tunables)
            ref = reference(q, k, v, causal, 0.125)
            err = error_stats(out, ref)
            assert err["nonfinite"] == 0
            assert err["max_abs"] <= 1.5 * _sdpa_err(q, k, v, causal, 0.125, ref) + ULP_FLOOR[dtype], (S, causal)
            pointers = poisoned_like(q)
            forward(q, k, v, pointers, causal, 0.125, {**tunables, **POINTER_LOADS})
            assert torch.equal(out, pointers), (S, causal)   # the same tiles, the same arithmetic


def test_large_sequence_time_under_interpreter():
    """S=1000, D=128: the CPU parity tier's largest case must stay cheap (measured ~2 s on 2 cores)."""
    q, k, v = make_qkv(1, 1, 1000, 128, torch.bfloat16, "cpu", seed=5)
    out = poisoned_like(q)
    start = time.perf_counter()
    forward(q, k, v, out, False, 128**-0.5)
    elapsed_s = time.perf_counter() - start
    ref = reference(q, k, v, False, 128**-0.5)
    assert error_stats(out, ref)["max_abs"] <= 1.5 * _sdpa_err(q, k, v, False, 128**-0.5, ref) + ULP_FLOOR["bf16"]
    assert elapsed_s < 20.0, f"one interpreter call took {elapsed_s:.1f} s"


def _qkv_out(shape=(1, 1, 16, 64), dtype=torch.float16):
    q, k, v = make_qkv(*shape, dtype, "cpu", seed=0)
    return q, k, v, torch.empty_like(q)


@pytest.mark.parametrize("problem", ["fp32", "head_dim_96", "non_contiguous", "key_length",
                                     "mixed_dtype", "three_dims"])
def test_rejects_unsupported_inputs(problem):
    q, k, v, out = _qkv_out()
    if problem == "fp32":
        q, k, v, out = (t.float() for t in (q, k, v, out))
    elif problem == "head_dim_96":
        q, k, v, out = _qkv_out((1, 1, 16, 96))
    elif problem == "non_contiguous":
        q = torch.randn(1, 1, 64, 16, dtype=torch.float16).transpose(-1, -2)
    elif problem == "key_length":
        k = torch.randn(1, 1, 32, 64, dtype=torch.float16)
    elif problem == "mixed_dtype":
        v = v.to(torch.bfloat16)
    elif problem == "three_dims":
        q, k, v, out = (t[0] for t in (q, k, v, out))
    with pytest.raises(ValueError):
        forward(q, k, v, out, False, 0.125)


def test_compiled_resources_empty_under_interpreter():
    q, k, v, out = _qkv_out()
    forward(q, k, v, out, True, 0.125)
    assert kernel.compiled_resources() == []


def test_metadata_declares_the_launch_configuration():
    """variant.yaml's tunables are exactly the launch arguments forward() takes; kernel.py holds
    no default of its own."""
    import re

    variant = load_variant(VARIANT_DIR)
    assert variant.kind == "triton" and variant.name == "triton_flash"
    assert sorted(variant.support["head_dims"]) == sorted(kernel.HEAD_DIMS)
    assert tuple(variant.meta["tunables"]) == kernel.TUNABLES
    assert kernel.launch_config(TUNABLES) == TUNABLES
    assert re.search(variant.kernel_regex, kernel._triton_flash_fwd.fn.__name__)


@pytest.mark.parametrize("tunables,match", [
    (None, "variant.yaml"),
    ({"BLOCK_M": 64}, "exactly BLOCK_M, BLOCK_N, num_warps, num_stages, TMA_D64, TMA_D128"),
    ({"BLOCK_M": 48, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, **POINTER_LOADS}, "BLOCK_M must be a power of two"),
    ({"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "TMA_D64": 0, "TMA_D128": 2},
     "TMA_D128 must be 0 or 1"),
])
def test_forward_needs_a_valid_launch_configuration(tunables, match):
    q, k, v, out = _qkv_out()
    with pytest.raises(ValueError, match=match):
        kernel.forward(q, k, v, out, False, 0.125, tunables=tunables)


def test_tma_is_chosen_per_head_dim_and_a_misaligned_input_takes_the_pointer_loads():
    """The TMA knob of the input's head dim decides the loads; a tensor descriptor's base must be
    16-byte aligned, so a contiguous view two bytes in takes the pointer loads, with the same result."""
    for head_dim in (64, 128):
        q, k, v = make_qkv(1, 2, 40, head_dim, torch.float16, "cpu", seed=3)
        knob = kernel.TMA_KNOB[head_dim]
        assert kernel.takes_tma({**POINTER_LOADS, knob: 1}, q, k, v)
        assert not kernel.takes_tma({**TMA_LOADS, knob: 0}, q, k, v)
        shifted = torch.empty(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape)
        shifted.copy_(q)
        assert not kernel.takes_tma(TMA_LOADS, shifted, k, v)
        out, aligned = poisoned_like(q), poisoned_like(q)
        kernel.forward(shifted, k, v, out, False, 0.125, tunables={**TUNABLES, **TMA_LOADS})
        kernel.forward(q, k, v, aligned, False, 0.125, tunables={**TUNABLES, **POINTER_LOADS})
        assert torch.equal(out, aligned)


def test_the_defaults_take_tma_at_d128_only():
    """variant.yaml's defaults (NOTES.md, run 27): descriptors at D=128, pointer loads at D=64."""
    assert (TUNABLES["TMA_D64"], TUNABLES["TMA_D128"]) == (0, 1)


def test_the_runner_passes_variant_yaml_tunables_and_the_build_records_them():
    """The pipeline's forward is the kernel's with variant.yaml's tunables bound (or a candidate's
    overrides, checked against the declared values); the build verdict records what it built with."""
    from evo_sdpa.build import build_triton
    from evo_sdpa.errors import StageError
    from evo_sdpa.runners import load_built, load_forward

    variant = load_variant(VARIANT_DIR)
    assert load_forward(variant, None).keywords == {"tunables": TUNABLES}
    override = load_forward(variant, None, {"BLOCK_N": 32}).keywords["tunables"]
    assert override == {**TUNABLES, "BLOCK_N": 32}
    with pytest.raises(StageError, match="BLOCK_N=48 is not one of its declared values"):
        load_forward(variant, None, {"BLOCK_N": 48})
    verdict, _, _ = build_triton(variant, allow_spills=False, tunable_values={"num_stages": 2})
    assert verdict["status"] == "pass" and verdict["tunables"] == {**TUNABLES, "num_stages": 2}
    forward = load_built(variant, verdict)
    q, k, v, out = _qkv_out((1, 2, 40, 64))
    forward(q, k, v, out, True, 0.125)
    assert torch.isfinite(out).all()


# ------------------------------------------------------------- the launch past Triton's JIT dispatch


class FakeCompiled:
    """What the JIT returns: a compiled kernel whose launcher records each launch."""

    def __init__(self, name):
        self.hash, self.function, self.packed_metadata, self.runs = name, f"fn-{name}", f"meta-{name}", []

    def launch_metadata(self, grid, stream, *args):
        return None

    def run(self, *launch):
        self.runs.append(launch)


class FakeJit:
    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        def launch(num_warps, num_stages, **kwargs):
            self.launches.append((grid, kwargs))
            return FakeCompiled(f"k{len(self.launches)}")
        return launch


@pytest.fixture
def compiled_path(monkeypatch):
    """kernel.py as on a GPU (not interpreted), with a fake JIT and driver."""
    import types

    jit = FakeJit()
    fake_triton = types.SimpleNamespace(
        cdiv=kernel.triton.cdiv,
        knobs=types.SimpleNamespace(runtime=types.SimpleNamespace(launch_enter_hook=None, launch_exit_hook=None)),
        runtime=types.SimpleNamespace(driver=types.SimpleNamespace(active=types.SimpleNamespace(
            get_current_device=lambda: 0, get_current_stream=lambda device: "stream0"))))
    monkeypatch.setattr(kernel, "triton", fake_triton)
    monkeypatch.setattr(kernel, "_triton_flash_fwd", jit)
    monkeypatch.setattr(kernel, "_INTERPRETER", False)
    monkeypatch.setattr(kernel, "_FAST_LAUNCH", True)
    monkeypatch.setattr(kernel, "_check_inputs", lambda *tensors: None)
    monkeypatch.setattr(kernel, "_compiled", {})
    monkeypatch.setattr(kernel, "_launched", {})
    return jit


def test_the_bound_arguments_follow_the_kernels_parameters():
    import inspect

    function = getattr(kernel._triton_flash_fwd, "fn", kernel._triton_flash_fwd)
    assert tuple(inspect.signature(function).parameters) == kernel.KERNEL_PARAMS


def test_a_launched_specialisation_is_launched_again_past_the_jit(compiled_path):
    q, k, v, out = _qkv_out((1, 2, 40, 64))
    kernel.forward(q, k, v, out, False, 0.125, TUNABLES)
    assert len(compiled_path.launches) == 1
    grid, bound = compiled_path.launches[0]
    assert tuple(bound) == kernel.KERNEL_PARAMS and grid == (1, 2)
    compiled = next(iter(kernel._compiled.values()))
    kernel.forward(q, k, v, out, False, 0.125, TUNABLES)
    assert len(compiled_path.launches) == 1 and len(compiled.runs) == 1
    launch = compiled.runs[0]
    assert launch[:9] == (1, 2, 1, "stream0", compiled.function, compiled.packed_metadata, None, None, None)
    assert len(launch) == 9 + len(bound)
    for sent, first in zip(launch[9:], bound.values()):  # the same tensors, the same values
        assert sent is first if isinstance(first, torch.Tensor) else sent == first
    assert len(kernel._launched) == 1


@pytest.mark.parametrize("causal", [False, True])
def test_causal_grids_start_every_heads_longest_tile_first(compiled_path, causal):
    """Programs start in index order, axis 0 fastest. A causal grid has the heads on axis 0 (the
    kernel reads its query tile from axis 1, longest first), so the first wave holds every head's
    heaviest tiles and the last the lightest (NOTES.md, run 34: 1,8,4096,128 causal 0.59x the
    time of head by head); a non-causal grid keeps a head's tiles together, for L2."""
    q, k, v, out = _qkv_out((2, 3, 200, 64))
    kernel.forward(q, k, v, out, causal, 0.125, TUNABLES)
    grid, _ = compiled_path.launches[0]
    tiles = -(-200 // TUNABLES["BLOCK_M"])
    assert grid == ((6, tiles) if causal else (tiles, 6))


@pytest.mark.parametrize("change", ["seq_len_multiple_of_16", "seq_len_one", "misaligned_out", "misaligned_q",
                                    "causal", "bf16", "head_dim_128", "tma_on", "tiles", "key_tiles", "warps",
                                    "stages"])
def test_anything_triton_specialises_on_goes_through_the_jit(compiled_path, change):
    """A call that differs in anything Triton compiles a separate kernel for (an integer's
    divisibility by 16 or == 1, a pointer's 16-byte alignment, a constexpr, a launch option) is
    never sent to another specialisation's launcher."""
    q, k, v, out = _qkv_out((1, 2, 40, 64))
    kernel.forward(q, k, v, out, False, 0.125, TUNABLES)
    causal, tunables = False, dict(TUNABLES)
    if change == "seq_len_multiple_of_16":
        q, k, v, out = _qkv_out((1, 2, 48, 64))
    elif change == "seq_len_one":
        q, k, v, out = _qkv_out((1, 2, 1, 64))
    elif change == "misaligned_out":
        out = torch.empty(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape)
    elif change == "misaligned_q":  # with TMA on, this also switches the loads to pointers
        tunables["TMA_D64"] = 1
        kernel.forward(q, k, v, out, causal, 0.125, tunables)
        q = torch.empty(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape).copy_(q)
        compiled_path.launches.pop()
    elif change == "head_dim_128":
        q, k, v, out = _qkv_out((1, 2, 40, 128))
    elif change == "tma_on":
        tunables["TMA_D64"] = 1
    elif change == "causal":
        causal = True
    elif change == "bf16":
        q, k, v, out = _qkv_out((1, 2, 40, 64), torch.bfloat16)
    elif change == "tiles":
        tunables["BLOCK_M"] = 128
    elif change == "key_tiles":
        tunables["BLOCK_N"] = 32
    elif change == "warps":
        tunables["num_warps"] = 8
    else:
        tunables["num_stages"] = 2
    kernel.forward(q, k, v, out, causal, 0.125, tunables)
    assert len(compiled_path.launches) == 2
    assert all(not c.runs for c in kernel._compiled.values())


def test_under_the_interpreter_every_call_goes_through_the_jit(monkeypatch):
    interpreted, jit_calls = kernel._triton_flash_fwd, []

    class Counting:
        def __getitem__(self, grid):
            jit_calls.append(grid)
            return interpreted[grid]

    monkeypatch.setattr(kernel, "_triton_flash_fwd", Counting())
    q, k, v, out = _qkv_out()
    for _ in range(2):
        kernel.forward(q, k, v, out, False, 0.125, TUNABLES)
    assert kernel._INTERPRETER and len(jit_calls) == 2 and kernel._compiled == {}


@pytest.mark.parametrize("causal", [False, True])
def test_a_grid_past_cudas_second_dimension_is_refused_in_one_line(compiled_path, monkeypatch, causal):
    """The second grid axis holds B*H (non-causal) or the query tiles (causal): past 65535 the
    launch would fail inside the driver, so forward names the count and the limit first."""
    monkeypatch.setattr(kernel, "GRID_Y_MAX", 3)
    q, k, v, out = _qkv_out((1, 4, 200, 64) if not causal else (1, 1, 200, 64))
    expected = "B\\*H = 4" if not causal else "4 query tiles of 64 rows \\(causal\\)"
    with pytest.raises(ValueError, match=f"{expected} exceed the grid's second dimension \\(3\\)"):
        kernel.forward(q, k, v, out, causal, 0.125, TUNABLES)
    assert not compiled_path.launches
