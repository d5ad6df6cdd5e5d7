"""The torch-free route the ncu and sanitizer targets take for CUDA variants (bare.py, driver.py):
its input bits, its card, and that it never imports torch. Run on a GPU in tests/test_gpu.py."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from evo_sdpa import device, provenance, timing
from evo_sdpa.driver import format_uuid
from evo_sdpa.inputs import NAN_BITS, all_finite_bits, float_bits, host_qkv
from evo_sdpa.shapes import Shape

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_float_bits_round_as_torch_does(dtype):
    import torch

    values = np.random.default_rng(0).standard_normal(20000).astype(np.float32) * np.float32(40)
    # Halfway cases: bf16 keeps 8 bits of mantissa, fp16 11; ties go to even.
    values[:4] = [1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 1.0 + 2.0 ** -11, -(1.0 + 3 * 2.0 ** -11)]
    expected = torch.from_numpy(values).to(getattr(torch, {"fp16": "float16", "bf16": "bfloat16"}[dtype]))
    assert np.array_equal(float_bits(values, dtype), expected.view(torch.int16).numpy().view(np.uint16))


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_finite_check_sees_nan_and_inf_bits(dtype):
    finite = float_bits(np.array([0.0, -2.5, 1e-3], dtype=np.float32), dtype)
    assert all_finite_bits(finite, dtype)
    inf = float_bits(np.array([np.inf], dtype=np.float32), dtype) if dtype == "bf16" else np.array([0x7C00], np.uint16)
    for bad in (np.array([NAN_BITS[dtype]], np.uint16), inf):
        assert not all_finite_bits(np.concatenate([finite, bad]), dtype)


def test_host_inputs_are_seeded_bits_of_the_shape():
    q, k, v = host_qkv(1, 2, 3, 8, "bf16", seed=5)
    assert q.shape == (1, 2, 3, 8) and q.dtype == np.uint16 and q.flags["C_CONTIGUOUS"]
    assert not np.array_equal(q, k)
    assert all(np.array_equal(a, b) for a, b in zip((q, k, v), host_qkv(1, 2, 3, 8, "bf16", seed=5)))


def test_uuid_is_written_as_nvidia_smi_writes_it():
    raw = bytes.fromhex("ea87ee52264f5b6910974b240f34f2b5")
    assert format_uuid(raw) == "GPU-ea87ee52-264f-5b69-1097-4b240f34f2b5"


def run_target(argv: list[str]) -> tuple[int, bool]:
    """Run a target script as its stage does; return its exit code and whether it imported torch."""
    probe = ("import atexit, runpy, sys\n"
             "atexit.register(lambda: print('TORCH_IMPORTED' if 'torch' in sys.modules else 'NO_TORCH'))\n"
             f"sys.argv = {argv!r}\n"
             "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=SCRIPTS, timeout=120)
    return proc.returncode, "TORCH_IMPORTED" in proc.stdout


@pytest.mark.skipif(device.nvidia_driver_present(), reason="this host has an NVIDIA driver")
def test_targets_of_a_cuda_variant_never_import_torch_and_report_no_card_without_a_driver(tmp_path):
    """Without a driver the bare route reports the CPU as its card and exits as a torch target does
    when torch sees no device; torch is never imported on the way."""
    verdict = tmp_path / "verdict.json"
    verdict.write_text(json.dumps({"status": "pass", "artifact": str(tmp_path / "libv1_scalar.so")}))
    card = tmp_path / "card.json"
    targets = [
        [str(SCRIPTS / "sanitizer_target.py"), "--variant", "v1_scalar", "--build", str(verdict),
         "--B", "1", "--H", "2", "--S", "67", "--card", str(card)],
        [str(SCRIPTS / "ncu_target.py"), "--entry", "v1_scalar", "--build", str(verdict), "--B", "2", "--H", "8",
         "--S", "512", "--D", "64", "--causal", "0", "--dtype", "fp16", "--card", str(card)],
    ]
    for argv in targets:
        card.unlink(missing_ok=True)
        code, imported_torch = run_target(argv)
        assert code == provenance.TARGET_NO_DEVICE_EXIT, argv[0]
        assert not imported_torch, f"{argv[0]} imported torch for a CUDA variant"
        assert provenance.target_found_no_device(card)


def test_the_timed_inputs_of_a_shape_are_drawn_once(monkeypatch):
    """The baseline times five backends in turn on one (shape, dtype): the sets are drawn once
    and kept until another shape is asked for."""
    drawn = []

    def fake_make_qkv(B, H, S, D, dtype, where, seed, draw_on_device):
        assert where == "cuda" and draw_on_device, "timing inputs are drawn on the card"
        drawn.append((S, seed))
        return (f"q{S}/{seed}",)

    monkeypatch.setattr("evo_sdpa.inputs.make_qkv", fake_make_qkv)
    timing.drop_input_sets()
    small, other = Shape(1, 8, 512, 64, False), Shape(1, 8, 256, 64, False)
    for _ in range(5):
        assert [timing.input_set(small, "fp16", 0, i) for i in range(3)] == [("q512/0",), ("q512/1",), ("q512/2",)]
    assert drawn == [(512, 0), (512, 1), (512, 2)]
    timing.input_set(other, "fp16")
    timing.input_set(small, "fp16")
    assert drawn[3:] == [(256, 0), (512, 0)]
    timing.drop_input_sets()  # what the bench's recheck does after writing into them
    timing.input_set(small, "fp16")
    assert drawn[5:] == [(512, 0)]
    timing.drop_input_sets()
