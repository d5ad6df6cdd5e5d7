"""The correctness matrix of a variant: every declared (dtype, head dim, causal) against a
float64 reference, judged relative to SDPA's own error in the same dtype."""
from __future__ import annotations

import math
import traceback
from dataclasses import asdict, dataclass

from .inputs import make_qkv, poisoned_like, reference
from .shapes import torch_dtype
from .tolerance import ToleranceRule, error_stats, sdpa_error
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


def tier_name(parity_cfg: dict, on_gpu: bool) -> str:
    """The tier parity runs here (config `parity`): the GPU tier on a card, else the CPU tier. The
    SDPA table and every parity job take it from here, so the two agree."""
    return parity_cfg["tier"] if on_gpu else parity_cfg["cpu_tier"]


def build_matrix(variant: Variant, tier: dict) -> list[ParityCase]:
    """Every case of the variant's declared support that the tier asks for."""
    return support_matrix(variant.support, tier)


def support_matrix(support: dict, tier: dict) -> list[ParityCase]:
    """Every case of a support (dtypes, head_dims, causal, optional max_seq_len) the tier asks for."""
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


def _case_inputs(case: ParityCase, device: str):
    """The case's q, k, v (drawn on the CPU from its seed: the same case on any card), its scale
    and its float64 reference."""
    scale = 1.0 / math.sqrt(case.D)
    q, k, v = make_qkv(case.B, case.H, case.S, case.D, torch_dtype(case.dtype), device, case.seed, case.distribution)
    return q, k, v, scale, reference(q, k, v, case.causal, scale)


def sdpa_errors(cases: list[ParityCase], device: str) -> dict[str, float]:
    """SDPA's own max abs error on each case: {case_id: error}, what a variant's bound is made of."""
    errors = {}
    for case in cases:
        q, k, v, scale, ref = _case_inputs(case, device)
        errors[case.case_id] = sdpa_error(q, k, v, ref, case.causal, scale)
    return errors


def sdpa_stack(device: str) -> dict:
    """What SDPA's error depends on besides the case and the card: torch and, on a GPU, cuDNN."""
    import torch

    cudnn = torch.backends.cudnn.version() if device == "cuda" and torch.backends.cudnn.is_available() else None
    return {"torch": torch.__version__, "cudnn": cudnn}


def sdpa_table(tier_name: str, tier: dict, table_support: dict, device: str) -> dict:
    """SDPA's error on every case of the tier over `table_support` (dtypes and head dims, both
    masks), measured once for every variant's parity job: cuDNN builds a plan for each new case
    shape, 2.7-3.5 s of each job on an H200, 11 s in the first process of a fresh machine."""
    support = {"dtypes": table_support["dtypes"], "head_dims": table_support["head_dims"], "causal": [True, False]}
    return {"status": "measured", "tier": tier_name, "device": device, "support": support,
            "stack": sdpa_stack(device), "errors": sdpa_errors(support_matrix(support, tier), device)}


def table_errors(table: dict, tier_name: str, device: str, measured_on: dict) -> tuple[dict[str, float], str | None]:
    """The table's errors when it was measured as this job measures (the same tier, device, card,
    torch and cuDNN), else ({}, why not): SDPA's error then comes from this job's own calls."""
    try:
        made_on = table["measured_at"]["card"] or {}
        checks = [
            ("tier", table["tier"], tier_name),
            ("device", table["device"], device),
            ("card", made_on.get("uuid") or made_on.get("name"), measured_on.get("uuid") or measured_on.get("name")),
            ("torch and cuDNN", table["stack"], sdpa_stack(device)),
        ]
        errors = {str(case): float(error) for case, error in table["errors"].items()}
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        return {}, f"not an SDPA error table ({type(exc).__name__}: {exc})"
    for what, theirs, ours in checks:
        if theirs != ours:
            return {}, f"measured with {what} {theirs!r}, this job has {ours!r}"
    return errors, None


def run_case(case: ParityCase, forward, rule: ToleranceRule, device: str,
             sdpa_max_abs: float | None = None) -> dict:
    """Run one case: the variant twice into NaN-poisoned outputs, one reference, and SDPA once
    unless its error on this case is given (`sdpa_max_abs`, from the card's SDPA table)."""
    import torch

    q, k, v, scale, ref = _case_inputs(case, device)
    record = {"id": case.case_id, **asdict(case)}
    if sdpa_max_abs is None:
        sdpa_max_abs = sdpa_error(q, k, v, ref, case.causal, scale)
    record["sdpa_max_abs"] = sdpa_max_abs
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
    passed, bound = rule.judge(case.dtype, err["max_abs"], sdpa_max_abs)
    deterministic = bool(torch.equal(out_first, out_second))
    record.update(max_abs=err["max_abs"], mean_abs=err["mean_abs"], rel_l2=err["rel_l2"],
                  nonfinite=err["nonfinite"], bound=bound, deterministic=deterministic)
    if err["nonfinite"]:
        record.update(status="fail", reason=f"{err['nonfinite']} NaN/Inf outputs "
                                            "(unwritten elements stay NaN-poisoned)")
    elif not passed:
        record.update(status="fail", reason=f"max abs error {err['max_abs']:.3g} above bound {bound:.3g} "
                                            f"(SDPA's own error {sdpa_max_abs:.3g})")
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
