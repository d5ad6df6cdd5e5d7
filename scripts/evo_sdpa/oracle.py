"""Parity cases whose answer needs no PyTorch: three queries and three keys along one axis,
scores 0..6 by construction, the softmax worked out with math.exp, with and without the mask.

Query i is (i+1)*e0 and key j is j*e0, so with scale 1 the score of (i, j) is (i+1)*j exactly
in any dtype; value j holds j+1 plus a quarter step per column, exact in fp16 and bf16."""
from __future__ import annotations

import math

ORACLE_S = 3
ORACLE_SCALE = 1.0
# Two units in the last place at the outputs' magnitude (values lie in [1, 4)): the error a
# correct kernel can make rounding P and O to the dtype.
ORACLE_TOL = {"fp16": 2 * 2.0**-9, "bf16": 2 * 2.0**-6}


def value(j: int, d: int) -> float:
    return (j + 1) + 0.25 * (d % 4)


def expected(D: int, causal: bool) -> list[list[float]]:
    """out[i][d] = sum_j softmax_j((i+1)*j) * value(j, d) over the keys row i sees."""
    rows = []
    for i in range(ORACLE_S):
        keys = range(i + 1) if causal else range(ORACLE_S)
        weights = [math.exp((i + 1) * j) for j in keys]
        total = sum(weights)
        rows.append([sum(w * value(j, d) for w, j in zip(weights, keys)) / total for d in range(D)])
    return rows


def inputs(D: int, dtype, device):
    """q, k, v as [1, 1, 3, D] tensors of `dtype` (torch only holds the numbers)."""
    import torch

    q = torch.zeros(1, 1, ORACLE_S, D, dtype=torch.float32)
    k = torch.zeros_like(q)
    for i in range(ORACLE_S):
        q[0, 0, i, 0] = i + 1
        k[0, 0, i, 0] = i
    v = torch.tensor([[value(j, d) for d in range(D)] for j in range(ORACLE_S)]).view(1, 1, ORACLE_S, D)
    return tuple(t.to(dtype).contiguous().to(device) for t in (q, k, v))


def run_oracle(forward, dtype_name: str, D: int, causal: bool, device: str) -> dict:
    import torch

    from .shapes import torch_dtype

    q, k, v = inputs(D, torch_dtype(dtype_name), device)
    out = torch.full_like(q, float("nan"))
    record = {"id": f"oracle-{dtype_name}-D{D}-{'causal' if causal else 'full'}", "dtype": dtype_name,
              "B": 1, "H": 1, "S": ORACLE_S, "D": D, "causal": causal, "distribution": "oracle",
              "seed": None}
    try:
        forward(q, k, v, out, causal, ORACLE_SCALE)
        if device == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:  # the kernel's failure is this case's evidence
        return {**record, "status": "fail", "reason": f"raised {type(exc).__name__}: {exc}"}
    got = out[0, 0].to(torch.float64).cpu().tolist()
    want = expected(D, causal)
    worst = max(abs(g - w) if math.isfinite(g) else math.inf
                for grow, wrow in zip(got, want) for g, w in zip(grow, wrow))
    tol = ORACLE_TOL[dtype_name]
    record.update(max_abs=worst, bound=tol)
    nonfinite = sum(not math.isfinite(g) for row in got for g in row)
    if nonfinite:  # named as parity's own cases name it, not as an infinite error
        return {**record, "status": "fail", "reason": f"hand-computed oracle: {nonfinite} NaN/Inf "
                                                      "outputs (unwritten elements stay NaN-poisoned)"}
    if worst <= tol:
        return {**record, "status": "pass", "reason": ""}
    return {**record, "status": "fail",
            "reason": f"hand-computed oracle: max abs error {worst:.3g} above {tol:.3g}"}


def oracle_records(variant, forward, device: str) -> list[dict]:
    s = variant.support
    return [run_oracle(forward, dtype, D, causal, device)
            for dtype in s["dtypes"] for D in s["head_dims"] for causal in s["causal"]]
