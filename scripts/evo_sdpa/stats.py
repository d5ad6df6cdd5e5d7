"""Distribution statistics of timing samples and the noise-based stopping rule."""
from __future__ import annotations

import math
from dataclasses import dataclass


def percentile(samples: list[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100] (numpy's default method)."""
    if not samples:
        raise ValueError("percentile of no samples")
    return _sorted_percentile(sorted(samples), q)


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


def _sorted_percentile(ordered: list[float], q: float) -> float:
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def rel_spread(samples: list[float]) -> float:
    ordered = sorted(samples)
    p25, p50, p75 = (_sorted_percentile(ordered, q) for q in (25, 50, 75))
    return (p75 - p25) / p50 if p50 > 0 else math.inf


def p50_halfwidth(samples: list[float]) -> float:
    """Half the width of a distribution-free 95% interval of the median (the order statistics
    n/2 -+ 0.98 sqrt(n)), relative to the median: how firmly n samples pin the p50, however wide
    the distribution itself is."""
    ordered = sorted(samples)
    n = len(ordered)
    reach = math.ceil(0.98 * math.sqrt(n))
    lo, hi = max(0, (n - 1) // 2 - reach), min(n - 1, n // 2 + reach)
    p50 = _sorted_percentile(ordered, 50)
    return (ordered[hi] - ordered[lo]) / (2 * p50) if p50 > 0 else math.inf


# How sampling may end. The first two are firm numbers; a time cap is marked wherever it is shown.
CONVERGED, PINNED, TIME_CAP = "converged", "p50 pinned", "time cap"
FIRM_ENDINGS = (CONVERGED, PINNED)


@dataclass(frozen=True)
class StopRule:
    """Stop when enough samples and GPU time are in and every series is either narrow (spread
    under a bound) or pinned (its p50's 95% interval within +-p50_precision), or at a cap. A
    launch-jittered small kernel has a wide distribution however long it is sampled; what the
    ratio needs is its p50 pinned, which more samples do give."""
    min_samples: int
    min_time_ms: float
    max_time_ms: float
    rel_spread: float
    p50_precision: float | None = None

    @classmethod
    def from_config(cls, timing: dict) -> "StopRule":
        return cls(timing["min_samples"], timing["min_time_ms"], timing["max_time_ms"],
                   timing["rel_spread"], timing.get("p50_precision"))

    def check(self, series: list[list[float]], wall_ms: float, gpu_ms: float | None = None) -> str | None:
        """None to keep sampling, else why sampling ended (CONVERGED, PINNED or TIME_CAP).

        `series` holds each timed callable's samples in microseconds. `gpu_ms` is the GPU time
        measured so far (default: the samples' sum; a graph sample is one call of a replay of
        many, so its caller passes the replays' time), which must reach min_time_ms. The cap is
        on wall-clock time."""
        if wall_ms >= self.max_time_ms:
            return TIME_CAP
        if gpu_ms is None:
            gpu_ms = sum(sum(s) for s in series) / 1000.0
        if min(len(s) for s in series) < self.min_samples or gpu_ms < self.min_time_ms:
            return None
        narrow = [rel_spread(s) <= self.rel_spread for s in series]
        if all(narrow):
            return CONVERGED
        if self.p50_precision is not None and all(
                ok or p50_halfwidth(s) <= self.p50_precision for ok, s in zip(narrow, series)):
            return PINNED
        return None


# Two runs of the same code agree on a speedup to about this fraction when each pins it to half.
REPEAT_TOLERANCE = 0.02
BOOTSTRAP_RESAMPLES = 400
MIN_ROUNDS = 4


def speedup_interval(baseline_us: list[float], variant_us: list[float], seed: int = 0) -> dict:
    """How firmly one run pins p50(baseline) / p50(variant). The samples are paired by round (the
    timing interleaves the two), so rounds are resampled together: a 95% bootstrap interval of the
    ratio. Rounds are time-ordered, so the ratio of the first half against the second shows a
    drift (clocks, another tenant) that resampling would average away. `flag` says why the ratio
    is not pinned to REPEAT_TOLERANCE (the interval wider, or the halves further apart), else None.
    Fewer than MIN_ROUNDS rounds (calls so slow that the time cap came first) bound nothing: no
    interval, and a flag that says so."""
    import numpy as np

    if len(baseline_us) != len(variant_us):
        raise ValueError("speedup_interval needs paired rounds")
    if len(baseline_us) < MIN_ROUNDS:
        return {"ci95": None, "halves": None,
                "flag": f"speedup not pinned: {len(baseline_us)} round(s) before the time cap, "
                        f"at least {MIN_ROUNDS} bound it"}
    base, var = np.asarray(baseline_us), np.asarray(variant_us)
    ratio = float(np.median(base) / np.median(var))
    picks = np.random.default_rng(seed).integers(0, len(base), size=(BOOTSTRAP_RESAMPLES, len(base)))
    boot = np.median(base[picks], axis=1) / np.median(var[picks], axis=1)
    lo, hi = (float(x) for x in np.percentile(boot, [2.5, 97.5]))
    half = len(base) // 2
    halves = [float(np.median(base[:half]) / np.median(var[:half])),
              float(np.median(base[half:]) / np.median(var[half:]))]
    reasons = []
    if (hi - lo) / ratio > REPEAT_TOLERANCE:
        reasons.append(f"95% interval {lo:.3f}-{hi:.3f} is wider than {REPEAT_TOLERANCE:.0%}")
    if abs(halves[1] - halves[0]) / ratio > REPEAT_TOLERANCE:
        reasons.append(f"first and second half of the rounds give {halves[0]:.3f} and {halves[1]:.3f}")
    return {"ci95": [lo, hi], "halves": halves,
            "flag": ("speedup not pinned to " + f"{REPEAT_TOLERANCE:.0%}: " + "; ".join(reasons)) if reasons else None}


def tflops(flops: float, time_us: float) -> float:
    return flops / (time_us * 1e-6) / 1e12


def gbps(nbytes: float, time_us: float) -> float:
    return nbytes / (time_us * 1e-6) / 1e9
