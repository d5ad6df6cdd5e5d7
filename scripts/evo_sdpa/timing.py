"""GPU timing: CUDA events on one stream, interleaved callables, L2 flush or rotated inputs,
optional CUDA-graph replay, and a noise-based stop. Every number says how it was taken."""
from __future__ import annotations

import ctypes
import functools
import time
from typing import Callable

from . import device
from .driver import load_libcuda
from .errors import StageError
from .stats import StopRule, percentile, summarize
from .streamgate import StreamGate

# Buffer written between timed eager calls: twice the L2, so no input survives in the cache.
FLUSH_FACTOR = 2

# The bench stage's timing bounds, shortened for a tool that times many configurations in one
# process (ab_sweep.py, trace_v5.py); the spread and p50 precision stay the config's.
SWEEP_TIMING = {"warmup_ms": 20, "min_samples": 15, "min_time_ms": 60, "max_time_ms": 700}


def sweep_timing(timing: dict) -> dict:
    """The config's `timing` section with SWEEP_TIMING's bounds."""
    return dict(timing, **SWEEP_TIMING)


@functools.lru_cache(maxsize=1)
def _this_card() -> str | None:
    """The UUID of the card this process times on (CUDA device 0 under its visible devices):
    nvidia-smi lists every card of the host, and on a multi-GPU host the first is another job's."""
    gpu = device.torch_gpu()
    return gpu.uuid if gpu else None


def _smi_clock(field: str) -> int | None:
    smi = device.find_tool("nvidia-smi")
    if not smi:
        return None
    card = _this_card()
    out = device.command_output([smi, *(["-i", card] if card else []), f"--query-gpu={field}",
                                 "--format=csv,noheader,nounits"], timeout_s=10)
    try:
        return int(out.split()[0]) if out else None
    except (ValueError, IndexError):
        return None


@functools.lru_cache(maxsize=1)
def _nvml():
    from .nvml import open_card

    return open_card(_this_card())


def _clock(read_nvml: Callable, smi_field: str) -> int | None:
    """A clock of this process's card: through NVML in this process where it opens, else from
    nvidia-smi (about 25 ms a run, read twice per timed case)."""
    card = _nvml()
    if card is not None:
        try:
            return read_nvml(card)
        except OSError:
            pass
    return _smi_clock(smi_field)


def sm_clock_mhz() -> int | None:
    """Current SM clock of this process's card (read, never set)."""
    return _clock(lambda card: card.sm_clock_mhz(), "clocks.sm")


def max_sm_clock_mhz() -> int | None:
    """The SM clock's maximum on this process's card (read, never set)."""
    return _clock(lambda card: card.max_sm_clock_mhz(), "clocks.max.sm")


# Measured on the H100 (issue 12): every bench process found the card idling at 345 MHz, so its
# first timed case ran while the clock ramped (to 1980 MHz); 30 ms of warm-up calls do not lift it.
SPIN_UP_FRACTION = 0.9
SPIN_UP_MAX_S = 3.0


def spin_up_clock(clock=sm_clock_mhz, max_clock=max_sm_clock_mhz,
                  busy=None, max_s: float = SPIN_UP_MAX_S) -> dict:
    """Keep the card busy (matrix products, queued ahead so it never idles while the clock is
    read) until its SM clock is within SPIN_UP_FRACTION of its maximum, or max_s has passed.
    Returns what it saw, for the record; changes no setting of the card."""
    started = time.perf_counter()
    top, now = max_clock(), clock()
    record = {"clock_before_mhz": now, "max_clock_mhz": top}
    if top is None or now is None:
        return {**record, "status": "no clock reading", "seconds": 0.0}
    if busy is None:
        busy = _matmul_burst()
    while now is not None and now < SPIN_UP_FRACTION * top and time.perf_counter() - started < max_s:
        busy()
        now = clock()
    reached = now is not None and now >= SPIN_UP_FRACTION * top
    return {**record, "clock_after_mhz": now, "status": "at clock" if reached else "not at clock",
            "seconds": round(time.perf_counter() - started, 3)}


def _matmul_burst():
    import torch

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)

    def burst() -> None:
        torch.cuda.synchronize()
        for _ in range(200):   # about 40 ms of work on an H100, queued before the clock is read
            torch.mm(a, a)

    return burst


def l2_bytes() -> int:
    import torch

    return int(torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size)


class PersistingL2Reset:
    """Undo any persisting-L2 state between timed calls. A kernel can set an access-policy
    window on the stream; the lines it marks persisting survive a flush buffer and have been
    used to report bandwidth above the card's peak. Lines persist only in the L2 the context sets
    aside for them (cuCtxSetLimit; the H200's contexts start with some): the timing process sets
    none aside, and while none is, a window keeps nothing, there is nothing to undo, and the reset
    (10.7 µs of GPU time a sample, v5_hopper's NOTES, run 87) is skipped. A call that sets a
    set-aside itself is reset before every sample. Driver API through ctypes: no build step."""

    ACCESS_POLICY_WINDOW = 1  # CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW
    ATTR_VALUE_BYTES = 64     # sizeof(CUlaunchAttributeValue)
    PERSISTING_L2_LIMIT = 0x06  # CU_LIMIT_PERSISTING_L2_CACHE_SIZE

    def __init__(self, stream_handle: int, driver=None):
        self.stream = ctypes.c_void_p(stream_handle)
        self.empty_window = ctypes.create_string_buffer(self.ATTR_VALUE_BYTES)  # num_bytes 0: off
        self.set_aside = ctypes.c_size_t()
        self._set_aside_ref = ctypes.byref(self.set_aside)
        self.resets = 0
        if driver is None:
            try:
                driver = load_libcuda("no persisting-L2 reset")
                driver.cuCtxGetLimit.argtypes = [ctypes.POINTER(ctypes.c_size_t), ctypes.c_int]
                driver.cuCtxSetLimit.argtypes = [ctypes.c_int, ctypes.c_size_t]
            except StageError:
                driver = None
        self.driver = driver
        if driver is not None:
            driver.cuCtxSetLimit(self.PERSISTING_L2_LIMIT, 0)

    def __call__(self) -> None:
        if self.driver is None:
            return
        if self.driver.cuCtxGetLimit(self._set_aside_ref, self.PERSISTING_L2_LIMIT) == 0 and self.set_aside.value == 0:
            return
        self.driver.cuStreamSetAttribute(self.stream, self.ACCESS_POLICY_WINDOW, self.empty_window)
        self.driver.cuCtxResetPersistingL2Cache()
        self.resets += 1

    def describe(self) -> str:
        """What the samples' L2 held across them, for a timing's cache label ("" without a driver)."""
        if self.driver is None:
            return ""
        if self.resets:
            return f"; a call set L2 aside for persisting lines: reset before {self.resets} samples"
        return "; no L2 set aside for persisting lines"


class L2Flusher:
    def __init__(self, nbytes: int):
        import torch

        self.buffer = torch.empty(max(nbytes, 1 << 20), dtype=torch.uint8, device="cuda")

    def __call__(self) -> None:
        self.buffer.fill_(1)


def _warm(call: Callable[[], None], warmup_ms: float) -> None:
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    calls = 0
    while calls < 3 or (time.perf_counter() - start) * 1e3 < warmup_ms:
        call()
        calls += 1
        torch.cuda.synchronize()


class _NoGate:
    """The stream left open: for the loop's own tests, which run without a driver."""
    forced = 0

    def close(self) -> None:
        pass

    def open(self) -> None:
        pass


def _interleaved_samples(timed: dict[str, Callable[[], None]], rule: StopRule,
                         before_each: Callable[[], None], calls_per_sample: int,
                         gate=_NoGate()) -> tuple[dict, dict, str]:
    """Sample every callable between CUDA events on one stream, round by round, until the stop
    rule ends it. The order alternates each round so neither side always runs on a warmer GPU;
    `before_each` runs outside the timed region (L2 reset and flush). With a `gate`
    (streamgate.StreamGate) closed before the begin event and opened after the end event is
    queued, the GPU reaches the call only once all of it is queued, so the host's time never
    lands in the interval; it is returned beside the samples, per call, from the begin event's
    record to the call's return.

    Each callable keeps one pair of events for the whole loop, recorded again each round after the
    last round was read. A pair made per sample cost 6-9 µs of host time against 2.5 µs, and torch
    creates an event's CUDA handle at its first record, so the end event's was made after the call
    returned, which can fall inside a short call's timed interval. SDPA's GPU-time spread at
    (1,8,512,64) was 0.35-0.67 that way against 0.02-0.06 (H200, NOTES.md of v5_hopper, run 98)."""
    import torch

    names = list(timed)
    samples: dict[str, list[float]] = {name: [] for name in names}
    host: dict[str, list[float]] = {name: [] for name in names}
    stream = torch.cuda.current_stream()
    pairs = {name: (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for name in names}
    start_wall = time.perf_counter()
    ended_by = None
    round_index = 0
    next_check = 1
    while ended_by is None:
        order = names if round_index % 2 == 0 else names[::-1]
        for name in order:
            begin, end = pairs[name]
            before_each()
            forced = gate.forced
            gate.close()
            launched = time.perf_counter()
            try:
                begin.record(stream)
                timed[name]()
                host[name].append((time.perf_counter() - launched) * 1e6 / calls_per_sample)
                end.record(stream)
            finally:
                gate.open()
            if gate.forced != forced:
                raise StageError(f"timing {name}: its call waited for the GPU inside itself (a synchronise, "
                                 ".item() or cudaFree) while the stream was gated; a timed call must only "
                                 "queue work: take the synchronisation out of it")
        torch.cuda.synchronize()
        for name in order:
            begin, end = pairs[name]
            samples[name].append(begin.elapsed_time(end) * 1e3 / calls_per_sample)
        round_index += 1
        wall_ms = (time.perf_counter() - start_wall) * 1e3
        # The spread check sorts every series: run it each round, it made sampling quadratic and
        # small kernels hit the time cap long before min_time_ms of GPU time. Checked once the
        # rounds grow by a 32nd, the stop lands at most 3% of rounds late; the cap every round.
        if round_index >= next_check or wall_ms >= rule.max_time_ms:
            series = list(samples.values())
            gpu_ms = sum(sum(s) for s in series) * calls_per_sample / 1000.0
            ended_by = rule.check(series, wall_ms, gpu_ms)
            next_check = round_index + max(1, round_index // 32)
    return samples, host, ended_by


def _gated_samples(timed: dict[str, Callable[[], None]], rule: StopRule, before_each: Callable[[], None],
                   calls_per_sample: int) -> tuple[dict, dict, str]:
    """_interleaved_samples behind a gate on the current stream, released however sampling ends."""
    import torch

    gate = StreamGate(torch.cuda.current_stream().cuda_stream)
    try:
        return _interleaved_samples(timed, rule, before_each, calls_per_sample, gate)
    finally:
        gate.release()


def time_eager(calls: dict[str, Callable[[], None]], rule: StopRule, warmup_ms: float,
               flush: bool) -> dict:
    """Time each callable alone, one call a sample, with L2 flushed before each call. The samples
    are GPU time: the stream is gated while the host queues the call, whose host time per call
    is reported beside them."""
    import torch

    flusher = L2Flusher(FLUSH_FACTOR * l2_bytes()) if flush else None
    reset_l2 = PersistingL2Reset(torch.cuda.current_stream().cuda_stream)

    def before_each() -> None:
        reset_l2()
        if flusher:
            flusher()

    for call in calls.values():
        _warm(call, warmup_ms)
    samples, host, ended_by = _gated_samples(calls, rule, before_each, calls_per_sample=1)
    cache = "L2 flushed before each call" if flush else "L2 not flushed"
    cache += reset_l2.describe()
    return _results(samples, ended_by, mode="eager", cache=cache, host=host)


def capture_graph(call: Callable[[int], None], n_sets: int, graph_calls: int):
    """One CUDA graph of `graph_calls` calls, call(i) on input set i % n_sets."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside capture: compiles, allocates
        for i in range(3):
            call(i % n_sets)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(graph_calls):
            call(i % n_sets)
    return graph


def time_graph(calls: dict[str, Callable[[int], None]], n_sets: int, graph_calls: int,
               rule: StopRule, warmup_ms: float, set_bytes: int) -> dict:
    """Replay a captured graph of `graph_calls` calls; a sample is replay time / graph_calls, the
    stream gated while the host launches the replay. `set_bytes` (q, k, v and out of one input
    set) is for the record's cache label."""
    import torch

    graphs = {name: capture_graph(call, n_sets, graph_calls) for name, call in calls.items()}
    for graph in graphs.values():
        _warm(graph.replay, warmup_ms)
    reset_l2 = PersistingL2Reset(torch.cuda.current_stream().cuda_stream)
    samples, _, ended_by = _gated_samples({name: g.replay for name, g in graphs.items()}, rule, reset_l2,
                                          calls_per_sample=graph_calls)
    # call(i % n_sets) for i < graph_calls: a graph reads no more sets than it has calls
    cache = rotation_label(min(n_sets, graph_calls), set_bytes, l2_bytes()) + reset_l2.describe()
    return _results(samples, ended_by, mode=f"graph x{graph_calls}", cache=cache)


def rotation_label(n_sets: int, set_bytes: int, l2: int) -> str:
    """What a graph's input rotation leaves in L2, as the record says it: the sets' bytes against
    the L2's. A graph shorter than its sets caps them (graph_plan grows the pipeline's graphs past
    that; a diagnosis may not), and the label then says the rotation fits rather than claim otherwise."""
    mib = 1 << 20
    together = n_sets * set_bytes
    what = "one set" if n_sets == 1 else "together"
    if together > l2:
        where = f"larger than the {l2 / mib:.0f} MiB L2, {together / l2:.1f}x"
    else:
        where = f"fits in the {l2 / mib:.0f} MiB L2"
    return f"{n_sets} input sets rotated per replay ({what} {together / mib:.1f} MiB: {where})"


MAX_GRAPH_CALLS = 1024   # the config schema's bound on timing.graph_calls


def graph_plan(set_bytes: int, graph_calls: int, graph_sets: int | None = None) -> tuple[int, int]:
    """(input sets, calls per replay) for a graph-timed shape: enough sets to outgrow twice the L2,
    in a graph of at least `graph_calls` calls that reads every one of them (a graph reads at most
    one set per call, so a short graph would cap a small shape's rotation inside the L2). With
    `graph_sets` (a diagnosis), that many sets in a graph of `graph_calls`."""
    if graph_sets:
        return graph_sets, graph_calls
    n_sets = input_sets_beyond_l2(set_bytes, MAX_GRAPH_CALLS)
    return n_sets, max(graph_calls, n_sets)


def input_sets_beyond_l2(set_bytes: int, cap: int) -> int:
    """How many input sets make the rotation larger than twice the L2 (at most `cap`)."""
    needed = -(-FLUSH_FACTOR * l2_bytes() // max(set_bytes, 1))
    return max(1, min(cap, needed))


def _results(samples: dict[str, list[float]], ended_by: str, mode: str, cache: str,
             host: dict[str, list[float]] | None = None) -> dict:
    """Per callable: its samples and their statistics; in eager mode also the p50 of its host
    time per call."""
    results = {}
    for name, s in samples.items():
        results[name] = {"samples_us": s, "stats": summarize(s), "ended_by": ended_by,
                         "mode": mode, "cache": cache}
        if host is not None:
            results[name]["host_p50_us"] = percentile(host[name], 50)
    return results


@functools.lru_cache(maxsize=1)
def _input_sets(B: int, H: int, S: int, D: int, dtype: str, seed: int) -> list:
    return []


def input_set(shape, dtype: str, seed: int = 0, index: int = 0) -> tuple:
    """make_qkv's q, k, v for input set `index` of a timed (shape, dtype), drawn on the GPU with
    seed + index. The sets of the last (shape, dtype, seed) asked for are kept, since the baseline
    times five backends in turn on the same inputs. A caller that writes into them (the bench's
    recheck) calls drop_input_sets() after."""
    from .inputs import make_qkv
    from .shapes import torch_dtype

    sets = _input_sets(shape.B, shape.H, shape.S, shape.D, dtype, seed)
    while len(sets) <= index:
        sets.append(make_qkv(shape.B, shape.H, shape.S, shape.D, torch_dtype(dtype), "cuda", seed + len(sets),
                             draw_on_device=True))
    return sets[index]


def drop_input_sets() -> None:
    _input_sets.cache_clear()


def time_shape(factories: dict[str, Callable], shape, dtype: str, timing: dict, seed: int = 0,
               graph_sets: int | None = None) -> dict:
    """Time callables on one shape and dtype, interleaved. `factories[name](q, k, v)` returns a
    zero-argument call on those inputs. Returns {mode: {name: result}}: always "eager"
    (L2 flushed per call when configured), plus "graph" for shapes marked graph: true, whose
    replays rotate enough input sets to exceed twice the L2 (graph_plan) unless `graph_sets` says
    how many (a diagnosis: 1 keeps the inputs in L2; the record says which)."""
    import torch

    rule = StopRule.from_config(timing)
    first = input_set(shape, dtype, seed)
    results = {"eager": time_eager({name: make(*first) for name, make in factories.items()},
                                   rule, timing["warmup_ms"], timing["l2_flush"])}
    if shape.graph:
        set_bytes = 4 * first[0].numel() * first[0].element_size()
        n_sets, graph_calls = graph_plan(set_bytes, timing["graph_calls"], graph_sets)
        sets = [input_set(shape, dtype, seed, i) for i in range(n_sets)]
        calls = {}
        for name, make in factories.items():
            per_set = [make(*qkv) for qkv in sets]
            calls[name] = lambda i, per_set=per_set: per_set[i]()
        results["graph"] = time_graph(calls, n_sets, graph_calls, rule, timing["warmup_ms"], set_bytes)
        del sets, calls
    del first
    torch.cuda.empty_cache()
    return results
