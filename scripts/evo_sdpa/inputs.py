"""Attention inputs: the distributions parity draws from, never zeros, and the reference."""
from __future__ import annotations

DISTRIBUTIONS = ("normal", "large", "near_constant", "dominant_key")

# std 10 makes q.k/sqrt(D) reach ~100: exp() of that overflows fp32 unless the max is subtracted.
LARGE_STD = 10.0


def make_qkv(B: int, H: int, S: int, D: int, dtype, device, seed: int, distribution: str = "normal",
             draw_on_device: bool = False):
    """q, k, v as contiguous [B, H, S, D] tensors drawn from `distribution` with `seed`. Drawn on
    the CPU, so that a seed gives the same inputs on any host and card (parity's repro), unless
    `draw_on_device`: then `device`'s own generator draws them, whose values depend on the card
    but which is faster (4,16,2048,128 took 0.6 s on the CPU of the H200 host). That is for
    timing inputs, whose values nothing compares."""
    import torch

    where = device if draw_on_device else "cpu"
    gen = torch.Generator(device=where).manual_seed(seed)

    def normal(std: float = 1.0):
        return torch.randn(B, H, S, D, generator=gen, dtype=torch.float32, device=where) * std

    if distribution == "normal":
        q, k, v = normal(), normal(), normal()
    elif distribution == "large":
        q, k, v = normal(LARGE_STD), normal(LARGE_STD), normal()
    elif distribution == "near_constant":
        # Every key nearly the same: scores in a row tie to ~1e-3, so softmax is almost uniform
        # and any error in the running sum shows.
        base = torch.randn(B, H, 1, D, generator=gen, device=where)
        q = normal()
        k = base + 1e-3 * normal()
        v = base.flip(-1) + 1e-3 * normal()
    elif distribution == "dominant_key":
        # One key aligned with every query: its weight is ~1 and the rest underflow.
        q, k, v = normal(), normal(), normal()
        hot = S // 2
        direction = torch.randn(B, H, 1, D, generator=gen, device=where)
        q = q + 4.0 * direction
        k[:, :, hot : hot + 1, :] = 8.0 * direction
    else:
        raise ValueError(f"unknown input distribution {distribution!r} (known: {', '.join(DISTRIBUTIONS)})")
    return tuple(t.to(dtype=dtype).contiguous().to(device) for t in (q, k, v))


# The bits of a quiet NaN, and of the exponent field (all ones: inf or NaN), per dtype.
NAN_BITS = {"fp16": 0x7E00, "bf16": 0x7FC0}
EXPONENT_BITS = {"fp16": 0x7C00, "bf16": 0x7F80}


def host_qkv(B: int, H: int, S: int, D: int, dtype: str, seed: int):
    """q, k, v drawn normal(0, 1) with NumPy's generator, as uint16 arrays of the dtype's bits
    ("fp16" or "bf16"): inputs for a process that runs a CUDA variant without torch (the
    sanitizer's and Nsight Compute's targets). The distribution of make_qkv's "normal", not its
    numbers."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return tuple(float_bits(rng.standard_normal((B, H, S, D), dtype=np.float32), dtype) for _ in range(3))


def float_bits(values, dtype: str):
    """float32 values rounded to nearest-even in `dtype`, as uint16 bits (finite values only)."""
    import numpy as np

    if dtype == "fp16":
        return values.astype(np.float16).view(np.uint16)
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def all_finite_bits(bits, dtype: str) -> bool:
    """Whether no element of a `dtype` bit array is inf or NaN."""
    mask = EXPONENT_BITS[dtype]
    return not bool(((bits & mask) == mask).any())


def reference(q, k, v, causal: bool, scale: float):
    """softmax(q k^T * scale [masked]) v in float64 on the tensors' device, one batch at a time
    so the S x S scores stay small enough for the bench's large shapes."""
    import torch

    S = q.shape[-2]
    mask = torch.ones(S, S, dtype=torch.bool, device=q.device).triu(1) if causal else None
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    for b in range(q.shape[0]):
        q64, k64, v64 = (t[b].to(torch.float64) for t in (q, k, v))
        scores = torch.matmul(q64, k64.transpose(-1, -2)) * scale
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
        out[b] = torch.matmul(torch.softmax(scores, dim=-1), v64)
    return out


def poisoned_like(q):
    """An output buffer full of NaN, so an element the kernel never writes fails parity."""
    import torch

    return torch.full_like(q, float("nan"))
