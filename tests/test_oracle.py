"""The hand-worked oracle: expected values from math.exp alone, a correct forward passes, a
wrong scale, a missing mask or an unwritten row fails."""
import math

import torch
import torch.nn.functional as F

from evo_sdpa.oracle import ORACLE_S, expected, run_oracle, value


def sdpa_forward(q, k, v, out, causal, scale):
    out.copy_(F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale))


def test_expected_values_by_hand():
    rows = expected(D=4, causal=True)
    assert rows[0] == [value(0, d) for d in range(4)]  # row 0 sees key 0 only
    w0, w1 = 1.0, math.e ** 2  # row 1: scores (0, 2)
    assert math.isclose(rows[1][0], (w0 * 1 + w1 * 2) / (w0 + w1))
    full = expected(D=4, causal=False)
    weights = [math.exp(3 * j) for j in range(ORACLE_S)]  # row 2: scores (0, 3, 6)
    assert math.isclose(full[2][3], sum(w * value(j, 3) for j, w in enumerate(weights)) / sum(weights))


def test_correct_forward_passes_in_both_dtypes_and_masks():
    for dtype in ("fp16", "bf16"):
        for causal in (False, True):
            record = run_oracle(sdpa_forward, dtype, 64, causal, "cpu")
            assert record["status"] == "pass", record


def test_wrong_scale_fails():
    def wrong_scale(q, k, v, out, causal, scale):
        sdpa_forward(q, k, v, out, causal, scale / math.sqrt(q.shape[-1]))

    record = run_oracle(wrong_scale, "fp16", 64, False, "cpu")
    assert record["status"] == "fail" and "oracle" in record["reason"]


def test_ignored_mask_fails():
    def no_mask(q, k, v, out, causal, scale):
        sdpa_forward(q, k, v, out, False, scale)

    assert run_oracle(no_mask, "bf16", 128, True, "cpu")["status"] == "fail"


def test_unwritten_row_fails():
    def skip_last_row(q, k, v, out, causal, scale):
        full = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        out[..., :-1, :].copy_(full[..., :-1, :])

    record = run_oracle(skip_last_row, "fp16", 64, True, "cpu")
    assert record["status"] == "fail" and record["max_abs"] == math.inf

