"""The correctness matrix of a variant: every declared (dtype, head dim, causal) against a
float64 reference, judged relative to SDPA's own error in the same dtype."""
from __future__ import annotations

import math
import traceback
from dataclasses import asdict, dataclass

from .inputs import make_qkv, poisoned_like, reference
from .shapes import torch_dtype
from .tolerance import ToleranceRule, error_stats
from .variants import Variant


# A case (or the oracle's set) that has not returned after this long is recorded as hung and the
# stage ends: the largest full-tier case takes milliseconds on a GPU, and the CPU tier's largest
# seconds under the Triton interpreter.
CASE_LIMIT_S = 300.0


@dataclass(frozen=True)
class ParityCase:
    dtype: str
    B: int
    H: int
    S: int
    D: int
    causal: bool
    distribution: str
    seed: int

    @property
    def case_id(self) -> str:
        mask = "causal" if self.causal else "full"
        return (f"{self.dtype}-B{self.B}H{self.H}S{self.S}D{self.D}-{mask}"
                f"-{self.distribution}-seed{self.seed}")


def build_matrix(variant: Variant, tier: dict) -> list[ParityCase]:
    """Every case of the variant's declared support that the tier asks for."""
    support = variant.support
    cases = []
    for dtype in support["dtypes"]:
        for D in support["head_dims"]:
            for causal in support["causal"]:
                for S in tier["seq_lens"]:
                    if support.get("max_seq_len") and S > support["max_seq_len"]:
                        continue
                    for B, H in tier["batch_heads"]:
                        for distribution in tier["distributions"]:
                            for seed in tier["seeds"]:
                                cases.append(ParityCase(dtype, B, H, S, D, causal, distribution, seed))
    return cases


def run_case(case: ParityCase, forward, rule: ToleranceRule, device: str) -> dict:
    """Run one case: the variant twice into NaN-poisoned outputs, SDPA once, one reference."""
    import torch
    import torch.nn.functional as F

    dtype = torch_dtype(case.dtype)
    scale = 1.0 / math.sqrt(case.D)
    q, k, v = make_qkv(case.B, case.H, case.S, case.D, dtype, device, case.seed, case.distribution)
    record = {"id": case.case_id, **asdict(case)}
    ref = reference(q, k, v, case.causal, scale)
    sdpa_out = F.scaled_dot_product_attention(q, k, v, is_causal=case.causal, scale=scale)
    sdpa_err = error_stats(sdpa_out, ref)
    record["sdpa_max_abs"] = sdpa_err["max_abs"]
    try:
        out_first, out_second = poisoned_like(q), poisoned_like(q)
        forward(q, k, v, out_first, case.causal, scale)
        forward(q, k, v, out_second, case.causal, scale)
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:  # the kernel's failure is this case's evidence, not a harness crash
        record.update(status="fail", reason=f"raised {type(exc).__name__}: {exc}",
                      traceback=traceback.format_exc(limit=3))
        return record
    err = error_stats(out_first, ref)
    passed, bound = rule.judge(case.dtype, err["max_abs"], sdpa_err["max_abs"])
    deterministic = bool(torch.equal(out_first, out_second))
    record.update(max_abs=err["max_abs"], mean_abs=err["mean_abs"], rel_l2=err["rel_l2"],
                  nonfinite=err["nonfinite"], bound=bound, deterministic=deterministic)
    if err["nonfinite"]:
        record.update(status="fail", reason=f"{err['nonfinite']} NaN/Inf outputs "
                                            "(unwritten elements stay NaN-poisoned)")
    elif not passed:
        record.update(status="fail", reason=f"max abs error {err['max_abs']:.3g} above bound {bound:.3g} "
                                            f"(SDPA's own error {sdpa_err['max_abs']:.3g})")
    elif not deterministic:
        record.update(status="fail", reason="two runs on the same input disagree")
    else:
        record.update(status="pass", reason="")
    return record


def run_tier(variant: Variant, forward, tier: dict, rule: ToleranceRule, device: str) -> list[dict]:
    """The hand-computed oracle's cases, then every case of the tier's matrix (what the parity
    stage runs, without its single-case repro filter)."""
    from .oracle import oracle_records

    return oracle_records(variant, forward, device) + [run_case(case, forward, rule, device)
                                                       for case in build_matrix(variant, tier)]


def hung_record(case_id: str, limit_s: float) -> dict:
    """The record of a case that never returned (the stage ends on it)."""
    return {"id": case_id, "status": "fail",
            "reason": f"did not return within {limit_s:.0f} s: the kernel hangs or is far too slow"}


def verdict(records: list[dict], repro: str) -> dict:
    failed = [r for r in records if r["status"] != "pass"]
    result = {
        "status": "fail" if failed else "pass",
        "cases": len(records),
        "passed": len(records) - len(failed),
        "failed": len(failed),
        "reasons": [],
    }
    if not records:
        result.update(status="fail", reasons=["no parity case was run: the variant's declared "
                                              "support and the parity tier share nothing"])
    if failed:
        first = failed[0]
        result["first_failure"] = {"id": first["id"], "reason": first["reason"],
                                   "repro": f"{repro} --case {first['id']}"}
        result["reasons"] = [f"{len(failed)} of {len(records)} cases failed; first: "
                             f"{first['id']}: {first['reason']}"]
    worst = max((r.get("max_abs", 0.0) for r in records if r["status"] == "pass"), default=None)
    result["worst_passing_max_abs"] = worst
    return result
