"""Distribution statistics of timing samples and the noise-based stopping rule."""
from __future__ import annotations

import math
from dataclasses import dataclass


def percentile(samples: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100] (numpy's default method)."""
    if not samples:
        raise ValueError("percentile of no samples")
    ordered = sorted(samples)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(samples_us: list[float]) -> dict:
    p25, p50, p75 = (percentile(samples_us, q) for q in (25, 50, 75))
    mean = sum(samples_us) / len(samples_us)
    return {
        "n": len(samples_us),
        "min_us": min(samples_us),
        "p50_us": p50,
        "p90_us": percentile(samples_us, 90),
        "p99_us": percentile(samples_us, 99),
        "max_us": max(samples_us),
        "mean_us": mean,
        "iqr_us": p75 - p25,
        "rel_spread": (p75 - p25) / p50 if p50 > 0 else math.inf,
    }


def rel_spread(samples: list[float]) -> float:
    p50 = percentile(samples, 50)
    return (percentile(samples, 75) - percentile(samples, 25)) / p50 if p50 > 0 else math.inf


@dataclass(frozen=True)
class StopRule:
    """Stop when enough samples and GPU time are in and the spread is under a bound, or at a cap."""
    min_samples: int
    min_time_ms: float
    max_time_ms: float
    rel_spread: float

    @classmethod
    def from_config(cls, timing: dict) -> "StopRule":
        return cls(timing["min_samples"], timing["min_time_ms"], timing["max_time_ms"],
                   timing["rel_spread"])

    def check(self, series: list[list[float]], wall_ms: float) -> str | None:
        """None to keep sampling, else why sampling ended ("converged" or "time cap").

        `series` holds each timed callable's samples in microseconds; their sum is the GPU time
        measured so far, which must reach min_time_ms. The cap is on wall-clock time."""
        if wall_ms >= self.max_time_ms:
            return "time cap"
        gpu_ms = sum(sum(s) for s in series) / 1000.0
        if min(len(s) for s in series) < self.min_samples or gpu_ms < self.min_time_ms:
            return None
        if all(rel_spread(s) <= self.rel_spread for s in series):
            return "converged"
        return None


def tflops(flops: float, time_us: float) -> float:
    return flops / (time_us * 1e-6) / 1e12


def gbps(nbytes: float, time_us: float) -> float:
    return nbytes / (time_us * 1e-6) / 1e9
