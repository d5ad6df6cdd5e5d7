"""Tolerance rule, parity inputs and reference, the parity matrix and its case runner on CPU."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from evo_sdpa.inputs import DISTRIBUTIONS, LARGE_STD, make_qkv, poisoned_like, reference
from evo_sdpa import parity
from evo_sdpa.parity import ParityCase, build_matrix, run_case, sdpa_table, table_errors, verdict
from evo_sdpa.tolerance import ToleranceRule, error_stats
from evo_sdpa.variants import Variant

RULE = ToleranceRule(sdpa_multiple=4.0, atol={"fp16": 1e-3, "bf16": 8e-3})


# ---------------------------------------------------------------- tolerance


def test_rule_from_config():
    rule = ToleranceRule.from_config({"sdpa_multiple": 2.0, "atol": {"fp16": 1e-3, "bf16": 5e-3}})
    assert rule.bound("bf16", 0.01) == pytest.approx(2.0 * 0.01 + 5e-3)


def test_bound_and_judge():
    assert RULE.bound("fp16", 0.002) == pytest.approx(4 * 0.002 + 1e-3)
    assert RULE.bound("bf16", 0.0) == pytest.approx(8e-3)
    bound = RULE.bound("fp16", 0.002)
    assert RULE.judge("fp16", bound, 0.002) == (True, bound)
    assert RULE.judge("fp16", bound * 1.001, 0.002)[0] is False
    assert RULE.judge("fp16", 0.0, 0.002)[0] is True


@pytest.mark.parametrize("err", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("sdpa_err", [0.001, math.inf, math.nan])
def test_non_finite_error_never_passes(err, sdpa_err):
    passed, _ = RULE.judge("fp16", err, sdpa_err)
    assert passed is False


def test_error_stats_finite():
    ref = torch.zeros(2, 3, dtype=torch.float64) + 1.0
    out = ref.clone().to(torch.float32)
    out[0, 0] += 0.5
    out[1, 2] -= 0.25
    stats = error_stats(out, ref)
    assert stats["nonfinite"] == 0
    assert stats["max_abs"] == pytest.approx(0.5)
    assert stats["mean_abs"] == pytest.approx(0.75 / 6)
    assert stats["rel_l2"] == pytest.approx(math.sqrt(0.25 + 0.0625) / math.sqrt(6))


def test_error_stats_counts_non_finite():
    ref = torch.ones(4, 4, dtype=torch.float64)
    out = torch.ones(4, 4, dtype=torch.float16)
    out[0, 0] = float("nan")
    out[1, 1] = float("inf")
    out[2, 2] = float("-inf")
    stats = error_stats(out, ref)
    assert stats["nonfinite"] == 3
    assert math.isinf(stats["max_abs"]) and math.isinf(stats["mean_abs"]) and math.isinf(stats["rel_l2"])
    assert RULE.judge("fp16", stats["max_abs"], 0.0)[0] is False


def test_error_stats_exact_match_is_zero():
    ref = torch.randn(3, 5, dtype=torch.float64)
    stats = error_stats(ref.clone(), ref)
    assert stats == {"max_abs": 0.0, "mean_abs": 0.0, "nonfinite": 0, "rel_l2": 0.0}


# ---------------------------------------------------------------- inputs


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_make_qkv_never_zero_and_shaped(distribution):
    for S in (1, 17):
        q, k, v = make_qkv(2, 3, S, 64, torch.float16, "cpu", 0, distribution)
        for t in (q, k, v):
            assert t.shape == (2, 3, S, 64) and t.dtype == torch.float16 and t.is_contiguous()
            assert torch.isfinite(t).all()
            assert (t != 0).float().mean() > 0.9, "inputs must not be (mostly) zeros"


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_make_qkv_deterministic_per_seed_and_different_across_seeds(distribution):
    first = make_qkv(1, 2, 33, 64, torch.float32, "cpu", 7, distribution)
    again = make_qkv(1, 2, 33, 64, torch.float32, "cpu", 7, distribution)
    other = make_qkv(1, 2, 33, 64, torch.float32, "cpu", 8, distribution)
    for a, b, c in zip(first, again, other):
        assert torch.equal(a, b)
        assert not torch.equal(a, c)


def test_large_distribution_std():
    q, k, v = make_qkv(2, 4, 256, 64, torch.float32, "cpu", 0, "large")
    assert float(q.std()) == pytest.approx(LARGE_STD, rel=0.05)
    assert float(k.std()) == pytest.approx(LARGE_STD, rel=0.05)
    assert float(v.std()) == pytest.approx(1.0, rel=0.05)
    q_n, k_n, _ = make_qkv(2, 4, 256, 64, torch.float32, "cpu", 0, "normal")
    assert float(q_n.std()) == pytest.approx(1.0, rel=0.05)


def test_near_constant_keys_are_nearly_equal_across_s():
    q, k, v = make_qkv(2, 3, 128, 64, torch.float32, "cpu", 0, "near_constant")
    key_spread = (k - k.mean(dim=2, keepdim=True)).abs().max()
    assert float(key_spread) < 1e-2
    assert float(k.abs().mean()) > 0.3, "the shared key is not itself near zero"
    assert float(q.std(dim=2).mean()) > 0.5, "queries still vary"
    scores = (q @ k.transpose(-1, -2)) / 8.0
    row_range = scores.amax(-1) - scores.amin(-1)
    assert float(row_range.max()) < 0.05, "scores in a row nearly tie"


def test_dominant_key_dominates_softmax():
    S, D = 33, 64
    q, k, v = make_qkv(2, 3, S, D, torch.float32, "cpu", 0, "dominant_key")
    weights = torch.softmax((q.double() @ k.double().transpose(-1, -2)) / math.sqrt(D), dim=-1)
    assert bool((weights.argmax(-1) == S // 2).all())
    assert float(weights[..., S // 2].min()) > 0.99


def test_unknown_distribution_raises():
    with pytest.raises(ValueError, match=r"unknown input distribution 'uniform'.*normal"):
        make_qkv(1, 1, 4, 64, torch.float32, "cpu", 0, "uniform")


@pytest.mark.parametrize("causal", [False, True])
def test_reference_matches_torch_sdpa_float64(causal):
    q, k, v = make_qkv(2, 3, 37, 64, torch.float16, "cpu", 3, "normal")
    scale = 1.0 / math.sqrt(64)
    ref = reference(q, k, v, causal, scale)
    assert ref.dtype == torch.float64 and ref.shape == q.shape
    expected = F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                              is_causal=causal, scale=scale)
    torch.testing.assert_close(ref, expected, rtol=1e-12, atol=1e-12)


def test_reference_causal_differs_from_full():
    q, k, v = make_qkv(1, 2, 9, 64, torch.float32, "cpu", 0, "normal")
    full, causal = reference(q, k, v, False, 0.125), reference(q, k, v, True, 0.125)
    torch.testing.assert_close(causal[..., -1, :], full[..., -1, :])  # last row sees every key
    torch.testing.assert_close(causal[..., 0, :], v[..., 0, :].double())  # first row sees only key 0
    assert not torch.allclose(causal, full)


def test_poisoned_like_is_all_nan():
    q = torch.randn(1, 2, 5, 64, dtype=torch.bfloat16)
    out = poisoned_like(q)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert bool(torch.isnan(out).all())


# ---------------------------------------------------------------- matrix


def variant_with(support: dict) -> Variant:
    meta = {"name": "toy", "kind": "triton", "description": "toy", "sources": ["kernel.py"],
            "kernel_regex": ".*", "support": {"max_seq_len": None, **support}}
    return Variant("toy", Path("/nonexistent/toy"), meta)


TIER = {"seq_lens": [1, 17, 127, 1000], "batch_heads": [[1, 2], [2, 3]], "seeds": [0, 1],
        "distributions": ["normal", "large", "near_constant"]}
SUPPORT = {"dtypes": ["fp16", "bf16"], "head_dims": [64, 128], "causal": [True, False]}


def test_matrix_size_is_the_product_of_support_and_tier():
    cases = build_matrix(variant_with(SUPPORT), TIER)
    assert len(cases) == 2 * 2 * 2 * 4 * 2 * 2 * 3
    assert len({c.case_id for c in cases}) == len(cases), "case ids must be unique"
    assert {c.dtype for c in cases} == {"fp16", "bf16"}
    assert {(c.B, c.H) for c in cases} == {(1, 2), (2, 3)}


def test_matrix_respects_max_seq_len():
    cases = build_matrix(variant_with({**SUPPORT, "max_seq_len": 127}), TIER)
    assert {c.S for c in cases} == {1, 17, 127}
    assert len(cases) == 2 * 2 * 2 * 3 * 2 * 2 * 3


def test_matrix_of_disjoint_support_is_empty():
    tier = {**TIER, "seq_lens": [1000]}
    assert build_matrix(variant_with({**SUPPORT, "max_seq_len": 512}), tier) == []


def test_case_ids_unique_on_shipped_tiers():
    import yaml

    repo = Path(__file__).resolve().parents[1]
    cfg = yaml.safe_load((repo / "config" / "config.yaml").read_text())
    from evo_sdpa.variants import discover

    for variant in discover().values():
        for tier in cfg["parity"]["tiers"].values():
            ids = [c.case_id for c in build_matrix(variant, tier)]
            assert ids and len(set(ids)) == len(ids)


def test_case_id_format():
    case = ParityCase("bf16", 2, 3, 17, 128, True, "large", 1)
    assert case.case_id == "bf16-B2H3S17D128-causal-large-seed1"


# ---------------------------------------------------------------- run_case on CPU


def sdpa_forward(q, k, v, out, causal, scale):
    out.copy_(F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale))


@pytest.mark.parametrize("case", [
    ParityCase("fp16", 1, 2, 17, 64, False, "normal", 0),
    ParityCase("fp16", 1, 2, 17, 64, True, "large", 1),
    ParityCase("bf16", 2, 1, 1, 128, True, "dominant_key", 0),
    ParityCase("bf16", 1, 2, 33, 64, False, "near_constant", 0),
], ids=lambda c: c.case_id)
def test_correct_forward_passes(case):
    record = run_case(case, sdpa_forward, RULE, "cpu")
    assert record["status"] == "pass", record.get("reason")
    assert record["id"] == case.case_id
    assert record["deterministic"] is True and record["nonfinite"] == 0
    assert record["max_abs"] <= record["bound"]
    assert record["bound"] == pytest.approx(RULE.bound(case.dtype, record["sdpa_max_abs"]))


CASE = ParityCase("fp16", 1, 2, 17, 64, True, "normal", 0)


def test_unwritten_last_row_fails_naming_nan():
    def forward(q, k, v, out, causal, scale):
        full = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        out[..., :-1, :] = full[..., :-1, :]

    record = run_case(CASE, forward, RULE, "cpu")
    assert record["status"] == "fail"
    assert "NaN" in record["reason"]
    assert record["nonfinite"] == CASE.B * CASE.H * CASE.D


def test_wrong_scale_fails_naming_the_bound():
    def forward(q, k, v, out, causal, scale):
        sdpa_forward(q, k, v, out, causal, scale * 1.5)

    record = run_case(CASE, forward, RULE, "cpu")
    assert record["status"] == "fail"
    assert "above bound" in record["reason"]
    assert f"{record['bound']:.3g}" in record["reason"]
    assert record["max_abs"] > record["bound"]


def test_nondeterministic_forward_fails_disagree():
    calls = []

    def forward(q, k, v, out, causal, scale):
        calls.append(1)
        gen = torch.Generator().manual_seed(len(calls))
        full = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale).float()
        out.copy_(full + 2e-4 * torch.randn(full.shape, generator=gen))

    record = run_case(CASE, forward, RULE, "cpu")
    assert len(calls) == 2, "the variant runs twice on the same input"
    assert record["max_abs"] <= record["bound"], "the noise alone stays inside the tolerance"
    assert record["status"] == "fail"
    assert record["deterministic"] is False
    assert "disagree" in record["reason"]


def test_forward_that_raises_fails_with_the_exception():
    def forward(q, k, v, out, causal, scale):
        raise RuntimeError("launch failed: too many resources requested")

    record = run_case(CASE, forward, RULE, "cpu")
    assert record["status"] == "fail"
    assert record["reason"] == "raised RuntimeError: launch failed: too many resources requested"
    assert "RuntimeError" in record["traceback"]


# ---------------------------------------------------------------- SDPA's error table


TABLE_TIER = {"seq_lens": [1, 17], "batch_heads": [[1, 2]], "seeds": [0], "distributions": ["normal", "large"]}
TABLE_SUPPORT = {"dtypes": ["fp16"], "head_dims": [64]}
CPU_CARD = {"name": "cpu", "uuid": None, "compute_capability": None}


def made_table(card=CPU_CARD, **overrides):
    table = sdpa_table("t", TABLE_TIER, TABLE_SUPPORT, "cpu")
    table["measured_at"] = {"card": card}
    return {**table, **overrides}


def test_the_table_holds_sdpas_error_on_each_case_both_masks():
    table = made_table()
    cases = parity.support_matrix({**TABLE_SUPPORT, "causal": [True, False]}, TABLE_TIER)
    assert len(cases) == 8 and sorted(table["errors"]) == sorted(c.case_id for c in cases)
    for case in cases[:2]:
        assert table["errors"][case.case_id] == run_case(case, sdpa_forward, RULE, "cpu")["sdpa_max_abs"]


def test_a_case_judged_on_the_tables_error_never_calls_sdpa(monkeypatch):
    """The bound is the table's error: SDPA is not called again (here it would raise)."""
    case = ParityCase("fp16", 1, 2, 17, 64, False, "normal", 0)
    error = made_table()["errors"][case.case_id]
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: (_ for _ in ()).throw(AssertionError("called")))
    record = run_case(case, lambda q, k, v, out, causal, scale: out.copy_(reference(q, k, v, causal, scale)),
                      RULE, "cpu", sdpa_max_abs=error)
    assert record["status"] == "pass" and record["sdpa_max_abs"] == error
    assert record["bound"] == pytest.approx(RULE.bound("fp16", error))


def test_the_table_is_used_only_where_it_was_measured_as_this_job_measures():
    table = made_table()
    errors, why = table_errors(table, "t", "cpu", CPU_CARD)
    assert why is None and errors == table["errors"]
    h200 = {"name": "NVIDIA H200", "uuid": "GPU-1111", "compute_capability": "9.0"}
    for changed, expected in [
        (dict(table, tier="quick"), "measured with tier 'quick', this job has 't'"),
        (dict(table, device="cuda"), "measured with device 'cuda'"),
        (made_table(card=h200), "measured with card 'GPU-1111', this job has 'cpu'"),
        (dict(table, stack={"torch": "2.0.0", "cudnn": None}), "measured with torch and cuDNN"),
        ({"status": "measured"}, "not an SDPA error table"),
    ]:
        errors, why = table_errors(changed, "t", "cpu", CPU_CARD)
        assert errors == {} and why.startswith(expected), why


# ---------------------------------------------------------------- verdict


def test_verdict_counts_and_first_failure():
    records = [
        {"id": "a", "status": "pass", "reason": "", "max_abs": 0.001},
        {"id": "b", "status": "fail", "reason": "2 NaN/Inf outputs", "max_abs": math.inf},
        {"id": "c", "status": "pass", "reason": "", "max_abs": 0.003},
        {"id": "d", "status": "fail", "reason": "two runs on the same input disagree", "max_abs": 0.0},
    ]
    result = verdict(records, "python scripts/run_parity.py --variant toy")
    assert result["status"] == "fail"
    assert (result["cases"], result["passed"], result["failed"]) == (4, 2, 2)
    assert result["first_failure"]["id"] == "b"
    assert result["first_failure"]["repro"] == "python scripts/run_parity.py --variant toy --case b"
    assert "--case b" in result["first_failure"]["repro"]
    assert result["reasons"] == ["2 of 4 cases failed; first: b: 2 NaN/Inf outputs"]
    assert result["worst_passing_max_abs"] == 0.003


def test_verdict_all_pass():
    records = [{"id": "a", "status": "pass", "reason": "", "max_abs": 0.002}]
    result = verdict(records, "repro")
    assert result["status"] == "pass" and result["reasons"] == [] and "first_failure" not in result
    assert (result["cases"], result["passed"], result["failed"]) == (1, 1, 0)


def test_verdict_of_empty_matrix_fails():
    result = verdict([], "repro")
    assert result["status"] == "fail"
    assert result["cases"] == 0
    assert "no parity case" in result["reasons"][0]
    assert result["worst_passing_max_abs"] is None


def test_verdict_from_real_run_case_records():
    records = [run_case(CASE, sdpa_forward, RULE, "cpu"),
               run_case(CASE, lambda *a: (_ for _ in ()).throw(ValueError("x")), RULE, "cpu")]
    result = verdict(records, "repro")
    assert result["status"] == "fail" and result["passed"] == 1
    assert result["first_failure"]["repro"] == f"repro --case {CASE.case_id}"
