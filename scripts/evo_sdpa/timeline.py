"""Per-CTA timelines of v5_hopper's diagnostic build (kernels/v5_hopper/trace.cuh): the buffer's
layout, and where a call's time goes."""
from __future__ import annotations

import statistics

import numpy as np

# trace.cuh's Point enum, in order; SLOTS, CALLS and CTAS are its kSlots, kCalls and kCtas.
POINTS = ("entry", "past_wait", "kv_issued", "q_ready", "first_k_ready", "first_s", "first_softmax",
          "last_pv", "merged", "store_issued", "exit", "producer_start", "kv_scheduled", "k_acquired",
          "q_issued", "consumer_start", "init_done", "synced",
          "step1_top", "step1_s", "step1_softmax", "step1_pv", "step2_top", "step2_s", "step2_softmax", "step2_pv",
          "step3_top", "step3_s", "step3_softmax", "step3_pv", "last_pv_issued", "merge_ready", "merge_landed")
SLOTS, CALLS, CTAS = 40, 64, 1024
# Steps ordered by program order within one thread, or by cause across two (a load lands after
# its issue): each is non-negative. The K/V thread: entry (thread 0) to its first load; consumer
# thread 0: from its start to its exit; the Q thread's issue to Q's landing.
STEPS = (("entry", "producer_start"), ("producer_start", "kv_scheduled"), ("kv_scheduled", "k_acquired"),
         ("k_acquired", "past_wait"), ("past_wait", "kv_issued"), ("kv_issued", "first_k_ready"),
         ("q_issued", "q_ready"), ("entry", "consumer_start"), ("consumer_start", "q_ready"),
         ("q_ready", "first_k_ready"), ("first_k_ready", "first_s"), ("first_s", "first_softmax"),
         ("first_softmax", "last_pv"), ("last_pv", "merged"), ("merged", "store_issued"),
         ("store_issued", "exit"),
         # The prologue, finer, all in warp 0 (the K/V thread is one of its lanes): thread 0's barrier
         # set-up, the CTA's first barrier, then the producer's register release and pipeline objects.
         ("entry", "init_done"), ("init_done", "synced"), ("synced", "producer_start"),
         # The key loop's passes after the first tile, each from its top: the K and V waits and the
         # issue, S landing, the softmax, the previous P V's wait, then the convert and the next top.
         ("first_softmax", "step1_top"),
         *((f"step{i}_{a}", f"step{i}_{b}") for i in (1, 2, 3)
           for a, b in (("top", "s"), ("s", "softmax"), ("softmax", "pv"))),
         ("step1_pv", "step2_top"), ("step2_pv", "step3_top"), ("step3_pv", "last_pv_issued"),
         ("last_pv_issued", "last_pv"), ("last_pv", "merge_ready"), ("merge_ready", "merge_landed"),
         ("merge_landed", "merged"))


def buffer_bytes() -> int:
    return 8 * (2 + CALLS + 2 * CALLS * CTAS * SLOTS)


def parse(raw: bytes) -> dict:
    """The buffer as arrays: traced launches since the reset (the host's count, in the first word;
    launch i wrote row i % CALLS), each row's grid size, and (row, CTA, slot) stamps in ns
    (globaltimer) and SM cycles (clock64); slot len(POINTS) holds SM | rank << 32."""
    if len(raw) != buffer_bytes():
        raise ValueError(f"trace buffer is {len(raw)} bytes, trace.cuh's layout is {buffer_bytes()}: "
                         "rebuild the library against this checkout")
    words = np.frombuffer(raw, dtype=np.uint64)
    table = words[2 + CALLS:].reshape(2, CALLS, CTAS, SLOTS)
    grid = words[2:2 + CALLS].astype(np.int64)
    return {"calls": int(words[0]), "grid": grid, "ns": table[0].astype(np.int64), "cycles": table[1].astype(np.int64)}


def recent_calls(trace: dict, count: int) -> list[int]:
    """Rows of the last `count` calls launched, oldest first (at most CALLS - 1 back): complete once
    the device has synchronised."""
    done = trace["calls"]
    count = min(count, done, CALLS - 1)
    return [(done - count + i) % CALLS for i in range(count)]


def save_calls(path, trace: dict, count: int) -> None:
    """The last `count` completed calls' stamps, oldest first, for a look CTA by CTA: arrays
    (call, CTA, slot) of ns and cycles, the last slot holding SM | rank << 32, and POINTS."""
    rows = recent_calls(trace, count)
    ctas = min(int(trace["grid"][rows[0]]), CTAS)
    np.savez_compressed(path, ns=trace["ns"][rows, :ctas], cycles=trace["cycles"][rows, :ctas],
                        points=np.array(POINTS))


def _column(stamps: np.ndarray, point: str) -> np.ndarray:
    return stamps[:, POINTS.index(point)]


# A CTA that enters more than this long before the previous call's last exit took a slot that was
# free, or freed, while that call ran (the handover's backfill).
EARLY_ENTRY_NS = 200


def handover(trace: dict, row: int, previous_row: int) -> dict:
    """How call `row`'s CTAs took the SMs' slots from call `previous_row`'s, by their stamps: how many
    entered more than EARLY_ENTRY_NS before its last exit, how many entered an SM where one of its
    CTAs had not yet stamped its exit, and the median lag from the last earlier exit stamp on a CTA's
    SM to its entry (over the CTAs that have one; None where none has)."""
    sm_slot = len(POINTS)
    prev = trace["ns"][previous_row, :min(int(trace["grid"][previous_row]), CTAS)]
    cur = trace["ns"][row, :min(int(trace["grid"][row]), CTAS)]
    prev_sm, prev_exit = prev[:, sm_slot] & 0xFFFFFFFF, _column(prev, "exit")
    entry = _column(cur, "entry")
    beside, lags = 0, []
    for sm, at in zip(cur[:, sm_slot] & 0xFFFFFFFF, entry):
        exits = prev_exit[prev_sm == sm]
        beside += bool((exits > at).any())
        earlier = exits[exits <= at]
        if earlier.size:
            lags.append(int(at - earlier.max()))
    return {"early_entries": int((entry < prev_exit.max() - EARLY_ENTRY_NS).sum()),
            "entries_beside_running": beside,
            "entry_lag_after_sm_exit_ns": float(np.median(lags)) if lags else None}


def summarize_call(trace: dict, row: int, previous_row: int | None) -> dict:
    """One call: its span (first entry to last exit), the gap from the previous call's last exit
    to this call's first CTA past the PDL wait, and each step's median and max over the CTAs that
    recorded it (ns from globaltimer; cycles from clock64, the same SM at both ends)."""
    ctas = min(int(trace["grid"][row]), CTAS)
    ns, cycles = trace["ns"][row, :ctas], trace["cycles"][row, :ctas]
    entry, exit_ = _column(ns, "entry"), _column(ns, "exit")
    summary = {"ctas": ctas, "span_ns": int(exit_.max() - entry.min()),
               "entry_spread_ns": int(entry.max() - entry.min()),
               "sms": len({int(v) & 0xFFFFFFFF for v in ns[:, len(POINTS)]})}
    if previous_row is not None:
        previous_exit = _column(trace["ns"][previous_row, :min(int(trace["grid"][previous_row]), CTAS)], "exit").max()
        past_wait = _column(ns, "past_wait")
        # Levels 2 and 3 of the trace (trace.cuh) take no %globaltimer stamp past the wait.
        summary["previous_exit_to_first_past_wait_ns"] = (
            int(past_wait[past_wait > 0].min() - previous_exit) if (past_wait > 0).any() else None)
        summary["previous_exit_to_first_entry_ns"] = int(entry.min() - previous_exit)
        summary["period_ns"] = int(exit_.max() - previous_exit)
        summary.update(handover(trace, row, previous_row))
    # A split cluster's ranks do different things at the merge (the owner waits, a pusher sends):
    # each step's median cycles per rank as well.
    ranks = ns[:, len(POINTS)] >> 32
    steps = {}
    by_rank = {str(int(rank)): {} for rank in np.unique(ranks)} if ranks.max() > 0 else {}
    for start, end in STEPS:
        # A point is stamped where either clock is: level 3 takes the cycles alone.
        recorded = ((_column(ns, start) > 0) | (_column(cycles, start) > 0)) & \
                   ((_column(ns, end) > 0) | (_column(cycles, end) > 0))
        if not recorded.any():
            continue
        name = f"{start}->{end}"
        all_cyc = _column(cycles, end) - _column(cycles, start)
        timed = recorded & (_column(ns, start) > 0) & (_column(ns, end) > 0)
        d_ns = (_column(ns, end) - _column(ns, start))[timed]
        d_cyc = all_cyc[recorded]
        steps[name] = {"ctas": int(recorded.sum()),
                       "median_ns": float(np.median(d_ns)) if d_ns.size else None,
                       "min_ns": int(d_ns.min()) if d_ns.size else None,
                       "max_ns": int(d_ns.max()) if d_ns.size else None,
                       "median_cycles": float(np.median(d_cyc)), "min_cycles": int(d_cyc.min()),
                       "max_cycles": int(d_cyc.max())}
        for rank, rank_steps in by_rank.items():
            in_rank = recorded & (ranks == int(rank))
            if in_rank.any():
                rank_steps[name] = float(np.median(all_cyc[in_rank]))
    summary["steps"] = steps
    if by_rank:
        summary["median_cycles_by_rank"] = by_rank
    return summary


def _median_of_known(values) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _us(ns: float | None) -> str:
    return "      -" if ns is None else f"{ns / 1000:7.2f}"


def summarize(trace: dict, count: int) -> dict:
    """The last `count` calls (each against the call before it), and the medians over them."""
    rows = recent_calls(trace, count + 1)
    calls = [summarize_call(trace, row, previous) for previous, row in zip(rows, rows[1:])]
    if not calls:
        raise ValueError("the trace holds fewer than two completed calls")
    keys = ("span_ns", "period_ns", "previous_exit_to_first_entry_ns", "entry_spread_ns")
    medians = {key: statistics.median(call[key] for call in calls) for key in keys}
    for key in ("previous_exit_to_first_past_wait_ns", "early_entries", "entries_beside_running",
                "entry_lag_after_sm_exit_ns"):
        medians[key] = _median_of_known(call[key] for call in calls)
    medians["steps"] = {step: {"median_ns": _median_of_known(c["steps"][step]["median_ns"] for c in calls),
                               "max_ns": _median_of_known(c["steps"][step]["max_ns"] for c in calls),
                               "median_cycles": statistics.median(c["steps"][step]["median_cycles"] for c in calls)}
                        for step in calls[-1]["steps"] if all(step in c["steps"] for c in calls)}
    if all("median_cycles_by_rank" in c for c in calls):
        by_rank = calls[-1]["median_cycles_by_rank"]
        medians["median_cycles_by_rank"] = {
            rank: {step: statistics.median(c["median_cycles_by_rank"][rank][step] for c in calls)
                   for step in steps if all(step in c["median_cycles_by_rank"].get(rank, {}) for c in calls)}
            for rank, steps in by_rank.items()}
    return {"calls": calls, "median": medians, "ctas": calls[-1]["ctas"], "sms": calls[-1]["sms"]}


def render(summary: dict) -> str:
    m = summary["median"]
    lines = [f"{summary['ctas']} CTAs on {summary['sms']} SMs; medians over {len(summary['calls'])} calls:",
             f"  period (last exit to last exit)     {m['period_ns'] / 1000:7.2f} us",
             f"  span (first entry to last exit)     {m['span_ns'] / 1000:7.2f} us",
             f"  previous last exit -> first entry   {m['previous_exit_to_first_entry_ns'] / 1000:7.2f} us",
             f"  previous last exit -> first past PDL wait {_us(m['previous_exit_to_first_past_wait_ns'])} us",
             f"  entry spread                        {m['entry_spread_ns'] / 1000:7.2f} us",
             f"  CTAs entering > {EARLY_ENTRY_NS} ns before the previous last exit {m['early_entries']:g}; "
             f"entering beside a previous CTA still running {m['entries_beside_running']:g}",
             "  entry after the last earlier exit on its SM (median) " + (
                 "-" if m["entry_lag_after_sm_exit_ns"] is None else f"{m['entry_lag_after_sm_exit_ns'] / 1000:.2f} us"),
             "  step (consumer thread 0, the K/V thread, the Q thread)   median ns   max ns   median cycles"]
    for step, s in m["steps"].items():
        ns_cols = ("        -        -" if s["median_ns"] is None else f"{s['median_ns']:9.0f} {s['max_ns']:8.0f}")
        lines.append(f"  {step:38s} {ns_cols} {s['median_cycles']:12.0f}")
    by_rank = m.get("median_cycles_by_rank", {})
    if by_rank:
        lines.append("  median cycles by cluster rank: " + "   ".join(f"rank {rank}" for rank in by_rank))
        for step in next(iter(by_rank.values())):
            lines.append(f"  {step:38s} " + " ".join(f"{steps.get(step, float('nan')):9.0f}" for steps in by_rank.values()))
    return "\n".join(lines)
