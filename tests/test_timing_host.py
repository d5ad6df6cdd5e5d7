"""The eager timer's host time: every call's host time is recorded beside its GPU time, and a call
whose host time outlasts the GPU work queued before it (the L2 flush) is flagged, since its p50
then holds host time that moves with the host's load (NOTES.md of triton_flash, run 30)."""
import time
import types

import pytest

from evo_sdpa import timing
from evo_sdpa.bench import host_flag
from evo_sdpa.stats import StopRule


class FakeEvent:
    """A CUDA event on a fake clock: record() stamps the GPU time the fake stream has reached."""
    clock = [0.0]
    made = [0]

    def __init__(self, enable_timing=True):
        self.t = None
        FakeEvent.made[0] += 1

    def record(self, stream=None):
        self.t = FakeEvent.clock[0]

    def elapsed_time(self, other):
        return (other.t - self.t) / 1e3  # ms, as torch returns it


@pytest.fixture
def fake_cuda(monkeypatch):
    import torch

    cuda = types.SimpleNamespace(Event=FakeEvent, synchronize=lambda: None,
                                 current_stream=lambda: types.SimpleNamespace(cuda_stream=0))
    monkeypatch.setattr(torch, "cuda", cuda)
    FakeEvent.clock[0] = 0.0
    FakeEvent.made[0] = 0
    return cuda


def gpu_work(us: float, host_s: float = 0.0):
    """A callable that advances the fake GPU clock by `us` and spends `host_s` seconds on the host."""
    def call():
        if host_s:
            time.sleep(host_s)
        FakeEvent.clock[0] += us
    return call


def test_each_call_records_its_host_time_beside_its_gpu_time(fake_cuda):
    rule = StopRule(min_samples=5, min_time_ms=0.0, max_time_ms=10_000.0, rel_spread=1.0, p50_precision=1.0)
    samples, host, ended_by = timing._interleaved_samples(
        {"slow_host": gpu_work(100.0, host_s=0.003), "fast_host": gpu_work(50.0)}, rule,
        before_each=lambda: None, calls_per_sample=1)
    assert samples["slow_host"][0] == pytest.approx(100.0) and samples["fast_host"][0] == pytest.approx(50.0)
    assert min(host["slow_host"]) >= 3000.0 > max(host["fast_host"])  # from the flush's queueing on
    assert len(host["slow_host"]) == len(samples["slow_host"]) >= 5


def test_each_callable_keeps_one_pair_of_events_for_the_whole_loop(fake_cuda):
    """Events made per sample cost host time inside the timed interval and widened SDPA's spread
    (run 98); reused, every sample must still be its own callable's, in both round orders."""
    rule = StopRule(min_samples=40, min_time_ms=0.0, max_time_ms=10_000.0, rel_spread=1.0, p50_precision=1.0)
    samples, _, _ = timing._interleaved_samples(
        {"long": gpu_work(100.0), "short": gpu_work(7.0), "mid": gpu_work(30.0)}, rule,
        before_each=gpu_work(50.0), calls_per_sample=1)
    assert len(samples["long"]) >= 40
    assert set(samples["long"]) == {100.0} and set(samples["short"]) == {7.0} and set(samples["mid"]) == {30.0}
    assert FakeEvent.made[0] == 6


def test_gpu_time_of_the_flush_is_what_hides_host_time(fake_cuda):
    assert timing.gpu_time_us(gpu_work(35.0)) == pytest.approx(35.0)


def test_eager_results_carry_the_host_p50_and_the_hidden_time():
    results = timing._results({"variant": [100.0, 110.0, 120.0]}, "converged", mode="eager", cache="",
                              host={"variant": [40.0, 50.0, 60.0]}, hidden_us=35.0)
    assert results["variant"]["host_p50_us"] == pytest.approx(50.0)
    assert results["variant"]["hidden_us"] == 35.0
    graph = timing._results({"variant": [5.0]}, "converged", mode="graph x32", cache="")
    assert "host_p50_us" not in graph["variant"]


def test_a_call_whose_host_time_outlasts_the_flush_is_flagged():
    flag = host_flag(50.0, 12.0, 35.0, 127.0, 100.0)
    assert flag == ("host-bound: the variant's call takes 50 µs of host time, more than the 35 µs of GPU "
                    "work queued before it, so up to 15 µs of its 127 µs p50 can be the host's")


def test_sdpa_outlasting_the_flush_is_flagged_too():
    """Either side of the ratio holding host time makes it move from run to run."""
    flag = host_flag(20.0, 60.0, 35.0, 127.0, 100.0)
    assert flag == ("host-bound: SDPA's call takes 60 µs of host time, more than the 35 µs of GPU "
                    "work queued before it, so up to 25 µs of its 100 µs p50 can be the host's")
    both = host_flag(50.0, 60.0, 35.0, 127.0, 100.0)
    assert both.count("µs of host time") == 2 and "the variant's" in both and "SDPA's" in both


@pytest.mark.parametrize("variant_host,sdpa_host,hidden", [(30.0, 12.0, 35.0), (35.0, 35.0, 35.0),
                                                           (None, None, 35.0), (50.0, 60.0, None)])
def test_hidden_or_unmeasured_host_time_is_not_flagged(variant_host, sdpa_host, hidden):
    assert host_flag(variant_host, sdpa_host, hidden, 100.0, 90.0) is None
