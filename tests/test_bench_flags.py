"""The bench's sanity flags: a speedup beyond what the measured ceilings allow is reported as a
broken measurement."""
from evo_sdpa.bench import ceiling_flag

CEILINGS = {"matmul_tflops": {"fp16": 700.0, "bf16": 720.0}, "copy_gbps": 3000.0}


def test_plausible_numbers_raise_no_flag():
    assert ceiling_flag(450.0, 900.0, CEILINGS, "fp16") is None


def test_faster_than_the_matmul_ceiling_is_flagged():
    flag = ceiling_flag(800.0, 100.0, CEILINGS, "fp16")
    assert flag and "matmul ceiling" in flag and "800" in flag


def test_more_bandwidth_than_the_copy_ceiling_is_flagged():
    flag = ceiling_flag(10.0, 5000.0, CEILINGS, "bf16")
    assert flag and "copy bandwidth" in flag


def test_no_ceilings_no_flag():
    assert ceiling_flag(1e6, 1e6, None, "fp16") is None
