"""Error metrics against a high-precision reference and the parity tolerance rule."""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ToleranceRule:
    """Pass when err <= sdpa_multiple * sdpa_err + atol (FlashAttention-3's test style)."""
    sdpa_multiple: float
    atol: dict

    @classmethod
    def from_config(cls, tolerance: dict) -> "ToleranceRule":
        return cls(tolerance["sdpa_multiple"], dict(tolerance["atol"]))

    def bound(self, dtype: str, sdpa_err: float) -> float:
        return self.sdpa_multiple * sdpa_err + self.atol[dtype]

    def judge(self, dtype: str, err: float, sdpa_err: float) -> tuple[bool, float]:
        bound = self.bound(dtype, sdpa_err)
        return (math.isfinite(err) and err <= bound), bound


def error_stats(out, ref) -> dict:
    """Max/mean abs error of `out` against `ref` (any float tensors); non-finite values counted.
    Computed on `out`'s device: copying float64 outputs to the host took 0.8 s of a bench job."""
    import torch

    out64 = out.detach().to(torch.float64)
    ref64 = ref.detach().to(device=out64.device, dtype=torch.float64)
    nonfinite = int((~torch.isfinite(out64)).sum())
    diff = (out64 - ref64).abs()
    if nonfinite:
        return {"max_abs": math.inf, "mean_abs": math.inf, "nonfinite": nonfinite,
                "rel_l2": math.inf}
    ref_norm = float(ref64.norm())
    return {
        "max_abs": float(diff.max()) if diff.numel() else 0.0,
        "mean_abs": float(diff.mean()) if diff.numel() else 0.0,
        "nonfinite": 0,
        "rel_l2": float((out64 - ref64).norm()) / ref_norm if ref_norm > 0 else 0.0,
    }


def sdpa_error(q, k, v, ref, causal: bool, scale: float) -> float:
    """SDPA's own max abs error on these inputs against `ref`: what a tolerance bound is made of."""
    from .runners import sdpa_call

    return error_stats(sdpa_call(q, k, v, causal, scale), ref)["max_abs"]
