"""The Triton mutants of the broken-kernel suite (tests/mutants/triton_*) under the Triton
interpreter on the CPU: through the parity stage's own case runner, oracle and verdict, each
fails with the reason that names its defect, while kernels/triton_flash passes the very same
cases."""
import os

import pytest
import torch

# As in tests/test_triton_flash_interpreter.py: Triton picks interpreter or compiler once per
# process, so on a CUDA host these run only with TRITON_INTERPRET=1 set in the environment (the
# GPU side of the suite is tests/test_broken_variants.py).
if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("a CUDA device is present: the Triton interpreter tests run on CPU hosts "
                "(or with TRITON_INTERPRET=1)", allow_module_level=True)
os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

from evo_sdpa.oracle import run_oracle  # noqa: E402
from evo_sdpa.parity import ParityCase, run_case, verdict  # noqa: E402
from evo_sdpa.runners import load_forward, load_triton_module  # noqa: E402
from evo_sdpa.tolerance import ToleranceRule  # noqa: E402
from evo_sdpa.variants import KERNELS_DIR, load_variant  # noqa: E402
from pipeline_helpers import MUTANTS  # noqa: E402
from planted import materialized  # noqa: E402

RULE = ToleranceRule(sdpa_multiple=4.0, atol={"fp16": 1e-3, "bf16": 8e-3})  # config/config.yaml

# S = 1 is left out of the wrong scale's cases on purpose: one key gets weight 1 at any scale.
CASES = {
    "triton_wrong_scale": [
        ParityCase("fp16", 1, 2, 17, 64, False, "normal", 0),
        ParityCase("bf16", 1, 2, 70, 128, True, "large", 1),
    ],
    # 17 < BLOCK_M (64): no tile is whole, nothing is written; 70: rows 64..69 of the ragged tile.
    "triton_unwritten_tail": [
        ParityCase("fp16", 1, 2, 17, 64, False, "normal", 0),
        ParityCase("bf16", 1, 2, 70, 128, True, "near_constant", 1),
    ],
}
REASONS = {
    "triton_wrong_scale": "above bound",
    "triton_unwritten_tail": "NaN/Inf outputs (unwritten elements stay NaN-poisoned)",
}
# The hand-worked oracle (S = 3 < BLOCK_M, scale 1) catches both too, in its own words.
ORACLE_REASONS = {
    "triton_wrong_scale": "hand-computed oracle: max abs error",
    "triton_unwritten_tail": "hand-computed oracle: 384 NaN/Inf outputs",  # all 3 x 128
}


def forward_of(folder):
    variant = load_variant(folder)
    if not load_triton_module(variant)._INTERPRETER:
        pytest.skip("triton was imported before TRITON_INTERPRET=1 could be set")
    return load_forward(variant, None)  # with the tunables of variant.yaml (the parent's, for a mutant)


@pytest.mark.parametrize("name", sorted(CASES))
def test_triton_mutant_fails_parity_and_parent_passes(name):
    mutant, parent = forward_of(materialized(MUTANTS / name)), forward_of(KERNELS_DIR / "triton_flash")
    records = [run_case(case, mutant, RULE, "cpu") for case in CASES[name]]
    for record in records:
        assert record["status"] == "fail", record
        assert REASONS[name] in record["reason"], record["reason"]
    result = verdict(records, repro="python scripts/run_parity.py")
    assert result["status"] == "fail" and result["failed"] == len(records)
    assert REASONS[name] in result["reasons"][0]
    assert result["first_failure"]["id"] == CASES[name][0].case_id
    for case in CASES[name]:
        record = run_case(case, parent, RULE, "cpu")
        assert record["status"] == "pass", (case.case_id, record["reason"])


@pytest.mark.parametrize("name", sorted(CASES))
def test_triton_mutant_fails_the_oracle_and_parent_passes(name):
    mutant, parent = forward_of(materialized(MUTANTS / name)), forward_of(KERNELS_DIR / "triton_flash")
    record = run_oracle(mutant, "bf16", 128, True, "cpu")
    assert record["status"] == "fail" and ORACLE_REASONS[name] in record["reason"], record
    assert run_oracle(parent, "bf16", 128, True, "cpu")["status"] == "pass"


def test_unwritten_tail_leaves_exactly_the_ragged_tile():
    """The defect is the one planted: whole tiles are written and right, the ragged one is not
    touched (it keeps the NaN poison)."""
    from evo_sdpa.inputs import make_qkv, poisoned_like, reference

    forward = forward_of(materialized(MUTANTS / "triton_unwritten_tail"))
    q, k, v = make_qkv(1, 1, 70, 64, torch.float16, "cpu", seed=2)
    out = poisoned_like(q)
    forward(q, k, v, out, False, 0.125)
    assert torch.isnan(out[:, :, 64:]).all()
    ref = reference(q, k, v, False, 0.125)
    assert (out[:, :, :64].double() - ref[:, :, :64]).abs().max() < 2e-3
