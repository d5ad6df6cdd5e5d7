"""The timer's host time and its gate: every eager call's host time is recorded beside its GPU
time; the stream is gated while the host queues a call, so no host time lands between its events
(NOTES.md of v5_hopper, run 101: an L2 flush before the call hid only 1-23 µs of it); a call that
waits for the GPU inside itself is named instead of deadlocking; a call slower on the host than on
the GPU is flagged as host-bound from Python."""
import ctypes
import time
import types

import pytest
import yaml

from evo_sdpa import streamgate, timing
from evo_sdpa.bench import host_flag
from evo_sdpa.errors import StageError
from evo_sdpa.stats import StopRule
from evo_sdpa.variants import REPO


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
    assert min(host["slow_host"]) >= 3000.0 > max(host["fast_host"])
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


class FakeGate:
    """A gate that logs its closes and opens beside the events' records."""

    def __init__(self, log: list):
        self.log, self.forced = log, 0

    def close(self):
        self.log.append("close")

    def open(self):
        self.log.append("open")


def logged_events(log: list):
    class LoggedEvent(FakeEvent):
        def record(self, stream=None):
            log.append("record")
            super().record(stream)
    return LoggedEvent


def test_the_gate_closes_before_the_begin_event_and_opens_after_the_end_event(fake_cuda, monkeypatch):
    log = []
    monkeypatch.setattr(fake_cuda, "Event", logged_events(log))
    rule = StopRule(min_samples=3, min_time_ms=0.0, max_time_ms=10_000.0, rel_spread=1.0, p50_precision=1.0)

    def call():
        log.append("call")
        FakeEvent.clock[0] += 10.0

    timing._interleaved_samples({"a": call, "b": call}, rule, before_each=lambda: log.append("flush"),
                                calls_per_sample=1, gate=FakeGate(log))
    assert log[:12] == ["flush", "close", "record", "call", "record", "open"] * 2


def test_the_gate_opens_when_the_call_raises(fake_cuda):
    log = []
    rule = StopRule(min_samples=3, min_time_ms=0.0, max_time_ms=10_000.0, rel_spread=1.0)

    def broken():
        raise RuntimeError("launch failed")

    with pytest.raises(RuntimeError, match="launch failed"):
        timing._interleaved_samples({"broken": broken}, rule, before_each=lambda: None, calls_per_sample=1,
                                    gate=FakeGate(log))
    assert log == ["close", "open"]


def test_a_call_that_waits_on_the_gated_stream_is_named(fake_cuda):
    """A synchronise inside a gated call waits for a gate only the host opens; the watcher opens
    it (counting it in `forced`), and the timing fails naming the call rather than report it."""
    gate = FakeGate([])
    rule = StopRule(min_samples=3, min_time_ms=0.0, max_time_ms=10_000.0, rel_spread=1.0)

    def syncing_call():
        gate.forced += 1  # what the watcher does once the gate has stayed closed too long
        FakeEvent.clock[0] += 10.0

    with pytest.raises(StageError, match="timing syncing: its call waited for the GPU inside itself"):
        timing._interleaved_samples({"quiet": gpu_work(5.0), "syncing": syncing_call}, rule,
                                    before_each=lambda: None, calls_per_sample=1, gate=gate)


class FakeDriver:
    """The driver calls a StreamGate makes, on a host buffer; records the waits it queues."""

    def __init__(self):
        self.buffer = ctypes.create_string_buffer(8)
        self.waits = []
        self.freed = False

    def cuMemHostAlloc(self, pointer, size, flags):
        pointer._obj.value = ctypes.addressof(self.buffer)
        return 0

    def cuMemHostGetDevicePointer_v2(self, pointer, host, flags):
        pointer._obj.value = 0xD000
        return 0

    def cuStreamWaitValue64_v2(self, stream, address, value, flags):
        self.waits.append((address, value, flags))
        return 0

    def cuCtxSynchronize(self):
        return 0

    def cuMemFreeHost(self, host):
        self.freed = True
        return 0


def test_a_gate_waits_for_the_next_count_and_opening_writes_it():
    driver = FakeDriver()
    gate = streamgate.StreamGate(0, driver=driver)
    try:
        gate.close()
        assert driver.waits == [(0xD000, 1, streamgate.CU_STREAM_WAIT_VALUE_GEQ)] and gate.word.value == 0
        gate.open()
        assert gate.word.value == 1
        gate.close()
        assert driver.waits[-1][1] == 2 and gate.word.value == 1  # the earlier count no longer opens it
    finally:
        gate.release()
    assert gate.word.value == 2 and driver.freed and gate.forced == 0


def test_the_watcher_opens_a_gate_left_closed(monkeypatch):
    monkeypatch.setattr(streamgate, "FORCE_OPEN_S", 0.05)
    gate = streamgate.StreamGate(0, driver=FakeDriver())
    try:
        gate.close()
        deadline = time.perf_counter() + 5.0
        while gate.forced == 0 and time.perf_counter() < deadline:
            time.sleep(0.01)
        assert gate.forced == 1 and gate.word.value == gate.count
        gate.close()
        gate.open()
        time.sleep(0.15)
        assert gate.forced == 1  # an opened gate is left alone
    finally:
        gate.release()


def test_eager_results_carry_the_host_p50():
    results = timing._results({"variant": [100.0, 110.0, 120.0]}, "converged", mode="eager", cache="",
                              host={"variant": [40.0, 50.0, 60.0]})
    assert results["variant"]["host_p50_us"] == pytest.approx(50.0)
    graph = timing._results({"variant": [5.0]}, "converged", mode="graph x32", cache="")
    assert "host_p50_us" not in graph["variant"]


def test_a_call_slower_on_the_host_than_on_the_gpu_is_flagged():
    flag = host_flag(50.0, 12.0, 27.0, 100.0)
    assert flag == "host-bound from Python: the variant's call takes 50 µs of host time against 27 µs on the GPU"


def test_sdpa_slower_on_the_host_is_flagged_too():
    flag = host_flag(20.0, 60.0, 27.0, 10.0)
    assert flag == "host-bound from Python: SDPA's call takes 60 µs of host time against 10 µs on the GPU"
    both = host_flag(50.0, 60.0, 27.0, 10.0)
    assert both.count("µs of host time") == 2 and "the variant's" in both and "SDPA's" in both


@pytest.mark.parametrize("variant_host,sdpa_host", [(30.0, 12.0), (100.0, 90.0), (None, None), (None, 50.0)])
def test_calls_the_gpu_outlasts_or_unmeasured_are_not_flagged(variant_host, sdpa_host):
    assert host_flag(variant_host, sdpa_host, 100.0, 90.0) is None


def test_a_driver_error_names_the_call_and_the_error():
    class RefusingDriver(FakeDriver):
        def cuStreamWaitValue64_v2(self, stream, address, value, flags):
            return 801  # CUDA_ERROR_NOT_SUPPORTED

        def cuGetErrorName(self, code, name):
            name._obj.value = b"CUDA_ERROR_NOT_SUPPORTED"
            return 0

    gate = streamgate.StreamGate(0, driver=RefusingDriver())
    try:
        with pytest.raises(StageError, match=r"cuStreamWaitValue64 failed \(CUDA_ERROR_NOT_SUPPORTED\): the timed "
                                             "stream cannot be gated on this driver"):
            gate.close()
    finally:
        gate.release()


class PersistingDriver:
    """The calls PersistingL2Reset makes; `set_aside` is the context's persisting-L2 limit."""

    def __init__(self, set_aside: int, limit_code: int = 0):
        self.set_aside, self.limit_code, self.calls = set_aside, limit_code, []

    def cuCtxSetLimit(self, limit, value):
        assert limit == timing.PersistingL2Reset.PERSISTING_L2_LIMIT
        self.calls.append(f"set aside {value}")
        self.set_aside = value
        return 0

    def cuCtxGetLimit(self, value, limit):
        assert limit == timing.PersistingL2Reset.PERSISTING_L2_LIMIT
        value._obj.value = self.set_aside
        return self.limit_code

    def cuStreamSetAttribute(self, stream, attribute, value):
        self.calls.append("window off")
        return 0

    def cuCtxResetPersistingL2Cache(self):
        self.calls.append("reset")
        return 0


def test_the_timing_sets_no_l2_aside_and_skips_the_reset_while_none_is():
    driver = PersistingDriver(set_aside=4 << 20)  # a context starts with some on the H200 (run 108)
    reset = timing.PersistingL2Reset(0, driver=driver)
    reset()
    assert driver.calls == ["set aside 0"] and reset.resets == 0
    assert reset.describe() == "; no L2 set aside for persisting lines"


@pytest.mark.parametrize("set_aside,limit_code", [(20 << 20, 0), (0, 1)])
def test_the_window_and_the_lines_are_reset_once_l2_is_set_aside_or_the_limit_unreadable(set_aside, limit_code):
    """A call that sets a set-aside (cuCtxSetLimit) and a window gets its lines undone before the
    next sample; a limit the driver will not report is taken as set."""
    driver = PersistingDriver(0, limit_code)
    reset = timing.PersistingL2Reset(0, driver=driver)
    driver.set_aside = set_aside  # what the call did
    reset()
    assert driver.calls == ["set aside 0", "window off", "reset"] and reset.resets == 1
    assert reset.describe() == "; a call set L2 aside for persisting lines: reset before 1 samples"


def test_without_a_driver_the_cache_label_claims_nothing_about_persisting_lines(monkeypatch):
    reset = timing.PersistingL2Reset(0, driver=None)
    monkeypatch.setattr(reset, "driver", None)  # libcuda may load on a GPU host
    assert reset.describe() == ""


def test_a_graph_grows_to_read_enough_sets_to_outgrow_twice_the_l2(monkeypatch):
    """graph_calls is the fewest calls a replay makes; a shape whose sets are small gets a longer
    graph, since a graph reads at most one set per call (an H100's 50 MiB L2 here)."""
    mib = 1 << 20
    monkeypatch.setattr(timing, "l2_bytes", lambda: 50 * mib)
    assert timing.graph_plan(1 * mib, 32) == (100, 100)     # (1,8,256,64) fp16: 100 MiB in 100 calls
    assert timing.graph_plan(2 * mib, 32) == (50, 50)       # (1,8,512,64)
    assert timing.graph_plan(2 * mib, 128) == (50, 128)     # the config's floor is longer
    assert timing.graph_plan(8 * mib, 32) == (13, 32)       # (4,8,512,64): 104 MiB
    assert timing.graph_plan(1024, 32) == (timing.MAX_GRAPH_CALLS,) * 2   # the schema's bound caps both
    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
    assert schema["properties"]["timing"]["properties"]["graph_calls"]["maximum"] == timing.MAX_GRAPH_CALLS
    assert timing.graph_plan(2 * mib, 32, graph_sets=1) == (1, 32)        # a diagnosis keeps its sets
    for set_bytes in (1024, mib, 2 * mib, 3 * mib, 8 * mib, 64 * mib):
        n_sets, calls = timing.graph_plan(set_bytes, 32)
        assert calls >= n_sets and (n_sets * set_bytes >= 2 * 50 * mib or n_sets == timing.MAX_GRAPH_CALLS)
        assert timing.rotation_label(min(n_sets, calls), set_bytes, 50 * mib).endswith(
            "x)") or n_sets == timing.MAX_GRAPH_CALLS   # "larger than the 50 MiB L2, N.Nx"


def test_the_rotation_label_says_whether_the_sets_outgrow_l2():
    """A graph shorter than its sets caps the rotation, so a diagnosis's can fit in L2: the
    label says what the bytes are against the card's L2 (an H100's 50 MiB here)."""
    l2, mib = 50 << 20, 1 << 20
    assert timing.rotation_label(32, 1 * mib, l2) == (
        "32 input sets rotated per replay (together 32.0 MiB: fits in the 50 MiB L2)")   # (1,8,256,64) fp16
    assert timing.rotation_label(32, 2 * mib, l2) == (
        "32 input sets rotated per replay (together 64.0 MiB: larger than the 50 MiB L2, 1.3x)")   # (1,8,512,64)
    assert timing.rotation_label(1, 8 * mib, l2) == (
        "1 input sets rotated per replay (one set 8.0 MiB: fits in the 50 MiB L2)")
