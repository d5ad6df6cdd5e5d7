"""Timing statistics and the noise-based stopping rule."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest

from evo_sdpa.stats import (PINNED, REPEAT_TOLERANCE, StopRule, gbps, p50_halfwidth, percentile,
                             rel_spread, speedup_interval, summarize, tflops)


@pytest.mark.parametrize("n", [1, 2, 7, 100, 1001])
@pytest.mark.parametrize("q", [0, 1, 25, 50, 75, 90, 99, 99.9, 100])
def test_percentile_matches_numpy_linear(n, q):
    rng = np.random.default_rng(n)
    samples = rng.lognormal(mean=3.0, sigma=0.5, size=n).tolist()
    expected = float(np.percentile(samples, q, method="linear"))
    assert percentile(samples, q) == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_percentile_does_not_depend_on_order():
    samples = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(samples, 50) == 3.0
    assert percentile(samples, 25) == 2.0
    assert percentile(samples, 10) == pytest.approx(1.4)
    assert samples == [5.0, 1.0, 4.0, 2.0, 3.0], "percentile must not sort its input in place"


def test_percentile_of_nothing_raises():
    with pytest.raises(ValueError):
        percentile([], 50)


def test_summarize_fields():
    samples = [float(v) for v in range(1, 101)]  # 1..100
    stats = summarize(samples)
    assert stats["n"] == 100
    assert stats["min_us"] == 1.0 and stats["max_us"] == 100.0
    assert stats["mean_us"] == pytest.approx(50.5)
    assert stats["p50_us"] == pytest.approx(np.percentile(samples, 50))
    assert stats["p90_us"] == pytest.approx(np.percentile(samples, 90))
    assert stats["p99_us"] == pytest.approx(np.percentile(samples, 99))
    iqr = np.percentile(samples, 75) - np.percentile(samples, 25)
    assert stats["iqr_us"] == pytest.approx(iqr)
    assert stats["rel_spread"] == pytest.approx(iqr / np.percentile(samples, 50))
    assert stats["rel_spread"] == pytest.approx(rel_spread(samples))


def test_summarize_constant_samples_has_no_spread():
    stats = summarize([12.5] * 10)
    assert stats["p50_us"] == stats["p99_us"] == 12.5
    assert stats["iqr_us"] == 0.0 and stats["rel_spread"] == 0.0


def test_rel_spread_zero_median_is_infinite():
    assert math.isinf(rel_spread([0.0, 0.0, 0.0]))


# ---------------------------------------------------------------- StopRule

RULE = StopRule(min_samples=10, min_time_ms=5.0, max_time_ms=1000.0, rel_spread=0.05)


def steady(n: int, value_us: float = 1000.0) -> list[float]:
    """n samples within +-1% of value_us."""
    return [value_us * (1 + 0.01 * ((i % 3) - 1)) for i in range(n)]


def noisy(n: int, value_us: float = 1000.0) -> list[float]:
    """n samples spread over a factor of 3."""
    return [value_us * (1 + 2 * (i % 4) / 3) for i in range(n)]


def test_from_config():
    rule = StopRule.from_config({"min_samples": 25, "min_time_ms": 150, "max_time_ms": 2500,
                                 "rel_spread": 0.05, "warmup_ms": 30})
    assert rule == StopRule(25, 150, 2500, 0.05)


def test_not_enough_samples_keeps_sampling():
    assert RULE.check([steady(9), steady(20)], wall_ms=10.0) is None


def test_enough_samples_and_converged():
    assert RULE.check([steady(10), steady(10)], wall_ms=10.0) == "converged"


def test_one_noisy_series_keeps_sampling_until_the_cap():
    series = [steady(50), noisy(50)]
    assert rel_spread(series[1]) > RULE.rel_spread
    assert RULE.check(series, wall_ms=10.0) is None
    assert RULE.check(series, wall_ms=999.9) is None
    assert RULE.check(series, wall_ms=1000.0) == "time cap"


def test_time_cap_wins_even_with_too_few_samples():
    assert RULE.check([[1.0], [1.0]], wall_ms=5000.0) == "time cap"


def test_min_time_is_gpu_time_summed_over_all_series():
    rule = StopRule(min_samples=5, min_time_ms=15.0, max_time_ms=1e9, rel_spread=0.05)
    one = steady(10, 1000.0)  # 10 ms of GPU time
    assert rule.check([one], wall_ms=1e6) is None, "10 ms of samples is under 15 ms"
    assert rule.check([one, steady(10, 1000.0)], wall_ms=0.0) == "converged", "10 + 10 ms reach 15 ms"
    assert rule.check([one, steady(10, 100.0)], wall_ms=0.0) is None, "10 + 1 ms stay under 15 ms"


def test_wall_time_does_not_count_as_gpu_time():
    rule = StopRule(min_samples=5, min_time_ms=100.0, max_time_ms=1e9, rel_spread=0.5)
    assert rule.check([steady(20, 10.0)], wall_ms=500.0) is None  # 0.2 ms GPU, 500 ms wall


def test_a_graph_sample_counts_its_whole_replay_as_gpu_time():
    """A graph sample is one call of a 32-call replay: 300 samples of 10 us are 96 ms of GPU time,
    not 3 ms (counted as 3 ms, every small graph shape sampled to the time cap)."""
    rule = StopRule(min_samples=25, min_time_ms=150.0, max_time_ms=2500.0, rel_spread=0.05)
    series = [steady(300, 10.0), steady(300, 10.0)]
    assert rule.check(series, wall_ms=100.0) is None
    assert rule.check(series, wall_ms=100.0, gpu_ms=2 * 300 * 10.0 * 32 / 1000) == "converged"


def wide(n: int, seed: int, value_us: float = 10.0) -> list[float]:
    """Launch-jittered samples: IQR about 20% of the median, whatever n is."""
    rng = random.Random(seed)
    return [value_us * (1 + 0.3 * rng.random()) for _ in range(n)]


def test_p50_halfwidth_shrinks_with_samples_while_the_spread_does_not():
    few, many = wide(50, 1), wide(20000, 1)
    assert rel_spread(few) > 0.1 and rel_spread(many) > 0.1
    assert p50_halfwidth(few) > 0.02
    assert p50_halfwidth(many) < 0.003


def test_a_wide_series_stops_once_its_p50_is_pinned():
    rule = StopRule(min_samples=25, min_time_ms=1.0, max_time_ms=1e9, rel_spread=0.05, p50_precision=0.005)
    assert rule.check([wide(100, 2), steady(100, 10.0)], wall_ms=10.0) is None, "100 samples pin it to ~2%"
    assert rule.check([wide(20000, 3), steady(20000, 10.0)], wall_ms=10.0) == PINNED
    assert rule.check([steady(100, 10.0), steady(100, 12.0)], wall_ms=10.0) == "converged"
    without = StopRule(min_samples=25, min_time_ms=1.0, max_time_ms=1e9, rel_spread=0.05)
    assert without.check([wide(20000, 3), steady(20000, 10.0)], wall_ms=10.0) is None


def test_from_config_reads_the_precision_when_given():
    timing = {"min_samples": 25, "min_time_ms": 150, "max_time_ms": 2500, "rel_spread": 0.05}
    assert StopRule.from_config(timing).p50_precision is None
    assert StopRule.from_config({**timing, "p50_precision": 0.005}).p50_precision == 0.005


# ---------------------------------------------------------------- speedup firmness


def jitter(n: int, value_us: float, rel: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [value_us * (1 + rng.uniform(-rel, rel)) for _ in range(n)]


def test_a_tight_pair_of_series_pins_the_ratio():
    sdpa, variant = jitter(400, 12.0, 0.01, 1), jitter(400, 10.0, 0.01, 2)
    firm = speedup_interval(sdpa, variant)
    lo, hi = firm["ci95"]
    assert lo < 1.2 < hi and (hi - lo) / 1.2 < REPEAT_TOLERANCE
    assert firm["flag"] is None


def test_a_bimodal_variant_leaves_the_ratio_unpinned():
    """Half the calls 10 us, half 11 us, shuffled: the p50 sits between two modes 10% apart and a
    rerun can land on either; the spread rule alone converges on neither."""
    rng = random.Random(3)
    variant = [10.0 if rng.random() < 0.5 else 11.0 for _ in range(200)]
    firm = speedup_interval(jitter(200, 12.0, 0.005, 4), variant)
    assert firm["flag"] and "interval" in firm["flag"]


def test_a_drift_between_the_halves_is_flagged_even_when_each_half_is_tight():
    variant = jitter(300, 10.0, 0.002, 5) + jitter(300, 10.6, 0.002, 6)
    firm = speedup_interval(jitter(600, 12.0, 0.002, 7), variant)
    first, second = firm["halves"]
    assert first == pytest.approx(1.2, rel=0.01) and second == pytest.approx(12 / 10.6, rel=0.01)
    assert firm["flag"] and "first and second half" in firm["flag"]


def test_the_interval_is_the_same_for_the_same_samples():
    sdpa, variant = jitter(100, 12.0, 0.05, 8), jitter(100, 10.0, 0.05, 9)
    assert speedup_interval(sdpa, variant) == speedup_interval(sdpa, variant)


def test_unpaired_series_are_refused():
    with pytest.raises(ValueError, match="paired"):
        speedup_interval([1.0] * 10, [1.0] * 9)


def test_too_few_rounds_bound_nothing_and_say_so():
    """A call so slow that the time cap ends its timing after three rounds still gets a record."""
    firm = speedup_interval([900_000.0, 905_000.0, 899_000.0], [450_000.0, 452_000.0, 451_000.0])
    assert firm == {"ci95": None, "halves": None,
                    "flag": "speedup not pinned: 3 round(s) before the time cap, at least 4 bound it"}
    assert speedup_interval([12.0] * 4, [10.0] * 4)["ci95"] == [1.2, 1.2]


# ---------------------------------------------------------------- rates


def test_tflops_and_gbps():
    assert tflops(1e12, 1e6) == pytest.approx(1.0)          # 1 TFLOP in 1 s
    assert tflops(4 * 4 * 16 * 2048**2 * 128 / 2, 148.0) == pytest.approx(464.3, rel=1e-3)
    assert gbps(1e9, 1e6) == pytest.approx(1.0)              # 1 GB in 1 s
    assert gbps(2e6, 2.0) == pytest.approx(1000.0)           # 2 MB in 2 us
