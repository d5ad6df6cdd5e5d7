"""v5_hopper's diagnostic timelines (kernels/v5_hopper/trace.cuh, scripts/trace_v5.py). CPU: the
Python reading of the buffer agrees with the header's layout, and a synthetic trace gives the
periods and steps it was built with. GPU (an sm_90 device): a traced build of the 64-row split on
the mission shape records every CTA of every call, each CTA's probes in program order, and a period
that matches the graph's own timing."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from evo_sdpa import timeline
from evo_sdpa.variants import KERNELS_DIR, REPO

HEADER = (KERNELS_DIR / "v5_hopper" / "trace.cuh").read_text()


def test_points_follow_the_header_enum():
    body = re.search(r"enum Point : int \{(.*?)\};", HEADER, re.S).group(1)
    names = re.findall(r"^\s*k(\w+?)(?:,|\s*//|$)", body, re.M)
    assert names[-1] == "Points"
    snake = [re.sub(r"(?<!^)(?=[A-Z])", "_", n).lower() for n in names[:-1]]
    assert tuple(snake) == timeline.POINTS


@pytest.mark.parametrize("name, value", [("kSlots", timeline.SLOTS), ("kCalls", timeline.CALLS),
                                         ("kCtas", timeline.CTAS)])
def test_sizes_follow_the_header(name, value):
    assert int(re.search(rf"constexpr int {name} = (\d+);", HEADER).group(1)) == value


def synthetic(calls: int, grid: int, period: int, step: int) -> bytes:
    """`calls` calls of `grid` CTAs each; CTA c of call i enters at i * period + c, every point
    `step` ns after the one before it (cycles: twice the ns)."""
    words = np.zeros(timeline.buffer_bytes() // 8, dtype=np.uint64)
    words[0] = calls   # the host's copy counts launches
    words[2:2 + calls] = grid
    table = words[2 + timeline.CALLS:].reshape(2, timeline.CALLS, timeline.CTAS, timeline.SLOTS)
    for i in range(calls):
        for c in range(grid):
            for p in range(len(timeline.POINTS)):
                table[0, i, c, p] = 10_000 + i * period + c + p * step
                table[1, i, c, p] = 2 * (p * step)
            table[0, i, c, len(timeline.POINTS)] = c % 7
    return words.tobytes()


def test_synthetic_trace_gives_its_period_and_steps():
    grid, period, step = 40, 5_000, 100
    summary = timeline.summarize(timeline.parse(synthetic(10, grid, period, step)), 8)
    assert len(summary["calls"]) == 8
    assert summary["ctas"] == grid and summary["sms"] == 7
    median = summary["median"]
    assert median["period_ns"] == period
    last_exit = timeline.POINTS.index("exit") * step + grid - 1
    assert median["span_ns"] == last_exit
    assert median["previous_exit_to_first_entry_ns"] == period - last_exit
    assert median["previous_exit_to_first_past_wait_ns"] == period - last_exit + step
    first_s = median["steps"]["first_k_ready->first_s"]
    assert first_s["median_ns"] == step and first_s["median_cycles"] == 2 * step
    assert median["steps"]["entry->producer_start"]["median_ns"] == timeline.POINTS.index("producer_start") * step
    assert "period (last exit to last exit)" in timeline.render(summary)


def test_a_cycles_only_trace_gives_steps_in_cycles_and_no_release():
    # Levels 2 and 3 (trace.cuh) stamp %globaltimer at entry and exit alone; level 3 adds cycles.
    grid, period, step = 40, 5_000, 100
    raw = np.frombuffer(synthetic(10, grid, period, step), dtype=np.uint64).copy()
    table = raw[2 + timeline.CALLS:].reshape(2, timeline.CALLS, timeline.CTAS, timeline.SLOTS)
    timed = [timeline.POINTS.index("entry"), timeline.POINTS.index("exit")]
    keep = np.zeros(timeline.SLOTS, dtype=bool)
    keep[timed] = True
    keep[len(timeline.POINTS):] = True   # the SM slot
    table[0, :, :, ~keep] = 0
    summary = timeline.summarize(timeline.parse(raw.tobytes()), 8)
    median = summary["median"]
    assert median["period_ns"] == period
    assert median["previous_exit_to_first_past_wait_ns"] is None
    first_s = median["steps"]["first_k_ready->first_s"]
    assert first_s["median_ns"] is None and first_s["median_cycles"] == 2 * step
    text = timeline.render(summary)
    assert "first past PDL wait       - us" in text
    assert re.search(r"first_k_ready->first_s\s+-\s+-\s+200", text)


def test_rows_wrap_around_the_ring():
    raw = bytearray(synthetic(timeline.CALLS, 4, 1_000, 10))
    raw[:8] = np.uint64(timeline.CALLS + 3).tobytes()
    trace = timeline.parse(bytes(raw))
    assert trace["calls"] == timeline.CALLS + 3
    assert timeline.recent_calls(trace, 5) == [62, 63, 0, 1, 2]


def test_saved_calls_hold_each_ctas_stamps_oldest_first(tmp_path):
    grid, period, step = 6, 5_000, 100
    trace = timeline.parse(synthetic(10, grid, period, step))
    timeline.save_calls(tmp_path / "calls.npz", trace, 3)
    saved = np.load(tmp_path / "calls.npz")
    assert saved["ns"].shape == (3, grid, timeline.SLOTS)
    assert tuple(saved["points"]) == timeline.POINTS
    entry = timeline.POINTS.index("entry")
    assert [int(saved["ns"][i, 0, entry]) for i in range(3)] == [10_000 + i * period for i in (7, 8, 9)]
    assert int(saved["cycles"][0, 2, timeline.POINTS.index("exit")]) == 2 * timeline.POINTS.index("exit") * step


def test_a_buffer_of_another_layout_is_named():
    with pytest.raises(ValueError, match="rebuild the library"):
        timeline.parse(b"\0" * 64)


def test_too_few_calls_is_named():
    with pytest.raises(ValueError, match="fewer than two"):
        timeline.summarize(timeline.parse(synthetic(1, 4, 1_000, 10)), 8)


@pytest.mark.parametrize("argv, line", [
    (["--shape", "1,8,512"], "'1,8,512': give B,H,S,D, four positive integers"),
    (["--shape", "1,8,512,64", "--graph-calls", "64"], "--graph-calls must be 2 to 63"),
    (["--shape", "1,8,512,64", "--graph-calls", "1"], "--graph-calls must be 2 to 63"),
    (["--shape", "1,8,512,64", "--lib", "/nonexistent/trace.so"], "evo-sdpa: --lib /nonexistent/trace.so: no such library"),
    (["--shape", "1,8,512,64", "--untraced", "/nonexistent/d.so"], "evo-sdpa: --untraced /nonexistent/d.so: no such"),
    (["--shape", "1,8,512,64", "--set", "foo"], "evo-sdpa: --set 'foo': expected NAME=VALUE"),
    (["--shape", "1,8,512,64"], "evo-sdpa: trace_v5 replays the kernel on a card: no CUDA device on this host"),
])
def test_trace_script_stops_in_one_line_on_what_a_user_can_fix(argv, line):
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "trace_v5.py"), *argv], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "EVO_SDPA_FORCE_CPU": "1"})
    assert run.returncode in (1, 2) and "Traceback" not in run.stderr
    assert line in run.stderr.strip().splitlines()[-1]


@pytest.mark.gpu
def test_traced_split_records_every_cta_in_order(tmp_path):
    import torch

    from test_v5_hopper import needs_toolchain

    needs_toolchain()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 device")
    out = tmp_path / "trace.json"
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "trace_v5.py"), "--shape", "1,8,512,64",
                          "--set", "key_split=1", "--set", "split_block_m=64", "--build-dir", str(tmp_path / "build"),
                          "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads(out.read_text())
    ctas = summary["ctas"]
    assert ctas in (128, 256)   # 64 query tiles of 64 rows, in clusters of 2 or 4
    assert summary["sms"] >= 100
    for call in summary["calls"]:
        assert call["ctas"] == ctas
        for name, step in call["steps"].items():
            assert step["min_ns"] >= 0 and step["min_cycles"] >= 0, (name, step)
        assert call["steps"]["consumer_start->q_ready"]["ctas"] == ctas
    period_us = summary["median"]["period_ns"] / 1000
    assert 0.7 * summary["graph_per_call_us"] <= period_us <= 1.3 * summary["graph_per_call_us"]
    # The rows are the graph's calls in launch order (the host picks each launch's row): every call
    # ends after the one before it, and none by more than a few graph periods (a warm-up row would).
    for call in summary["calls"]:
        assert 0 < call["period_ns"] / 1000 < 5 * summary["graph_per_call_us"], call["period_ns"]


def test_handover_counts_early_entries_and_slots_taken_beside_running_ctas():
    words = np.zeros(timeline.buffer_bytes() // 8, dtype=np.uint64)
    words[0] = 2
    words[2:4] = 4
    table = words[2 + timeline.CALLS:].reshape(2, timeline.CALLS, timeline.CTAS, timeline.SLOTS)
    entry, exit_, sm = timeline.POINTS.index("entry"), timeline.POINTS.index("exit"), len(timeline.POINTS)
    # Call 0: CTAs 0, 1 on SM 0 and 2, 3 on SM 1, exit stamps 1000, 2000, 1500, 3000 (the last).
    for cta, (on, at) in enumerate([(0, 1000), (0, 2000), (1, 1500), (1, 3000)]):
        table[0, 0, cta, sm], table[0, 0, cta, exit_] = on, at
    # Call 1: CTA 1 enters SM 1 at 1600, beside CTA 3 still running; the others after their SM emptied.
    for cta, (on, at) in enumerate([(0, 2500), (1, 1600), (0, 2700), (1, 3100)]):
        table[0, 1, cta, sm], table[0, 1, cta, entry] = on, at
    result = timeline.handover(timeline.parse(words.tobytes()), 1, 0)
    early = sum(at < 3000 - timeline.EARLY_ENTRY_NS for at in (2500, 1600, 2700, 3100))   # 3 at 200 ns
    assert result == {"early_entries": early, "entries_beside_running": 1,
                      "entry_lag_after_sm_exit_ns": 300.0}   # lags 500, 100, 700, 100


def test_split_ranks_are_summarised_apart():
    raw = bytearray(synthetic(4, 8, 5_000, 100))
    words = np.frombuffer(raw, dtype=np.uint64).copy()
    table = words[2 + timeline.CALLS:].reshape(2, timeline.CALLS, timeline.CTAS, timeline.SLOTS)
    merged = timeline.POINTS.index("merged")
    for c in range(8):
        table[0, :4, c, len(timeline.POINTS)] |= np.uint64((c % 2) << 32)   # odd CTAs: rank 1
        if c % 2:
            table[1, :4, c, merged] += np.uint64(1_000)   # rank 1 folds 1,000 cycles longer
    summary = timeline.summarize(timeline.parse(words.tobytes()), 3)
    by_rank = summary["median"]["median_cycles_by_rank"]
    fold = "merge_landed->merged"   # both points synthetic: merged precedes merge_landed in the enum
    assert by_rank["0"][fold] == 2 * 100 * (merged - timeline.POINTS.index("merge_landed"))
    assert by_rank["1"][fold] == by_rank["0"][fold] + 1_000
    assert "by cluster rank" in timeline.render(summary)
