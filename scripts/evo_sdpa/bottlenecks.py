"""Ranked bottlenecks of a variant's kernels from their Nsight Compute profile, and a roofline point.

Each rule is a small function of the dominant kernel's key metrics (`ncu.key_metrics`): it returns
a `Finding` (the metric that shows the problem, its value and threshold, one sentence of evidence
with the numbers, the lever to try) or None. A rule whose metrics are absent returns None: a
missing number never becomes a finding. Severity (0..1) is computed from the metric itself, so
ranking by severity ranks by how much each problem costs.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable

from evo_sdpa.ncu import SECTOR_BYTES, KernelProfile, key_metrics

# ---------------------------------------------------------------- thresholds

# Fewer than one full wave of CTAs leaves SMs idle for the whole kernel.
UNDERFILL_WAVES = 1.0
# Past one wave, a last wave this empty (share of the kernel's CTA-slot time idle in the tail,
# CTAs assumed equally long) is worth a different tile count or a persistent schedule.
TAIL_IDLE_SHARE = 0.10
# A kernel whose one launch (measured empty, under graph replay) is at least this share of the
# call (launch + duration) is launch-bound: its fixed costs matter as much as its throughput.
LAUNCH_BOUND_SHARE = 0.15
# Even the busiest SM holding no CTA for this share of the kernel's elapsed cycles (launch ramp-up,
# drain, gaps between its CTAs): the same share of a call as launch_bound's, measured in the kernel.
RAMP_DRAIN_SHARE = 0.15
# Below a quarter of the SM's warp slots there are too few warps to hide memory and MMA latency
# unless the kernel hides it inside the CTA (deep pipelines, warp specialisation).
LOW_OCCUPANCY_PCT = 25.0
# A tuned flash-attention kernel keeps the tensor pipe busy well over half of its active cycles
# on large shapes; below half the MMAs are starved (loads, softmax, barriers in between).
TENSOR_PIPE_LOW_PCT = 50.0
# Below this the matrix products are not on the tensor cores at all.
TENSOR_PIPE_UNUSED_PCT = 5.0
# Without a FLOP count, a kernel is treated as matmul-heavy when tensor + FMA pipes are this busy.
MATMUL_HEAVY_PIPE_PCT = 10.0
# More than 1 shared-memory wavefront in 10 being a bank-conflict replay is worth fixing.
BANK_CONFLICT_RATIO = 0.10
# More than 10% of the global sectors requested beyond the ideal means uncoalesced access.
UNCOALESCED_EXCESS_RATIO = 0.10
# Local-memory instructions at this share of all instructions count as a full-severity spill.
SPILL_FULL_SEVERITY_FRACTION = 0.05
# Any spill is at least this severe: the build stage already rejects spills by default.
SPILL_MIN_SEVERITY = 0.5
# L2->SM bytes beyond this multiple of q+k+v+o: K/V is re-fetched per query row rather than staged
# once per tile (a 64-row tile on the profiling shape re-reads K/V S/64 = 8 times, ~4.5x the minimum).
L2_TRAFFIC_MULTIPLE = 16.0
# DRAM bytes beyond this multiple of q+k+v+o: the working set of the profiling shape fits in L2,
# so DRAM should see each byte about once.
DRAM_TRAFFIC_MULTIPLE = 4.0
# A stall reason holding this share of all stall cycles (the issuing warp excluded) is dominant.
STALL_SHARE_THRESHOLD = 0.20
# Not stalls: the warp issuing, and warps that were ready but another warp was picked.
NOT_STALL_REASONS = frozenset({"selected", "not_selected"})

# Stall reason -> (title, lever). Reasons not listed here are reported in the breakdown only.
STALL_LEVERS: dict[str, tuple[str, str]] = {
    "long_scoreboard": (
        "Warps wait on global-memory latency (long scoreboard)",
        "Prefetch K/V tiles with a multi-stage cp.async or TMA pipeline so loads for tile i+1 overlap the math on tile i.",
    ),
    "barrier": (
        "Warps wait at barriers",
        "Remove __syncthreads that guard nothing, double-buffer so one barrier covers a load and a compute phase, or use warp specialisation with mbarriers.",
    ),
    "mio_throttle": (
        "Shared-memory instruction queue full (MIO throttle)",
        "Issue fewer, wider shared-memory accesses: ldmatrix/16-byte loads, and keep reused fragments in registers.",
    ),
    "short_scoreboard": (
        "Warps wait on shared-memory or special-function results (short scoreboard)",
        "Cut shared-memory round trips (ldmatrix, register-resident fragments) and hoist exp2/rcp out of inner loops.",
    ),
    "math_pipe_throttle": (
        "Math pipe saturated (math-pipe throttle)",
        "The kernel is math-bound on one pipe: move work to the tensor cores or to an idle pipe (exp2 via FMA polynomial, fewer scalar ops per element).",
    ),
    "wait": (
        "Dependent fixed-latency chains (wait)",
        "Raise instruction-level parallelism: interleave independent MMAs and softmax steps, unroll over independent tiles.",
    ),
    "lg_throttle": (
        "Too many global memory instructions (LG throttle)",
        "Vectorise global accesses to 16 bytes per thread and move repeated loads into shared memory.",
    ),
    "no_instruction": (
        "Warps wait for instructions (instruction cache or launch)",
        "Shrink the unrolled code (fewer template instantiations, less full unrolling) or amortise launch cost with more work per CTA.",
    ),
    "gmma": (
        "Warps wait on wgmma completion",
        "Keep more wgmma groups in flight before waiting (wgmma.wait_group N>0) and overlap softmax of one tile with the MMA of the next.",
    ),
    "dispatch_stall": (
        "Dispatch stalls",
        "Reduce register-bank and pipeline contention: fewer mixed-pipe dependent sequences in the inner loop.",
    ),
    "branch_resolving": (
        "Warps wait on branch resolution",
        "Make inner-loop control flow uniform: predicate masking instead of branches, peel the boundary tile.",
    ),
    "imc_miss": (
        "Immediate-constant cache misses",
        "Pass loop-invariant parameters in registers or shared memory rather than indexing kernel-parameter arrays.",
    ),
    "membar": (
        "Warps wait at memory fences",
        "Drop fences that order nothing the kernel relies on, or use the narrowest scope (cta instead of gpu).",
    ),
    "tex_throttle": (
        "Texture pipe throttle",
        "Move reads off the texture path (__ldg of scattered data) to coalesced global or shared-memory loads.",
    ),
}

# Occupancy limiter -> what to change.
OCCUPANCY_LEVERS: dict[str, str] = {
    "registers": "cap registers with __launch_bounds__ or shorten live ranges (fewer accumulators live at once)",
    "shared_mem": "use smaller tiles or fewer pipeline stages per CTA",
    "warps": "use smaller CTAs so more fit per SM",
    "blocks": "give each CTA more warps (the per-SM block limit is hit before the warp limit)",
    "barriers": "use fewer named barriers per CTA",
}


@dataclass
class Finding:
    id: str
    title: str
    severity: float
    metric: str
    value: float | str | None
    threshold: float | None
    evidence: str
    lever: str


@dataclass
class RuleContext:
    flops: float | None
    min_bytes: float | None
    launch_us: float | None = None  # the env stage's measured empty-kernel launch (graph replay)


Rule = Callable[[dict, RuleContext], "Finding | None"]


# ---------------------------------------------------------------- helpers


def _clamp01(value: float) -> float:
    return max(0.0, min(1.0, value))


def _fmt(value: float | None, digits: int = 3) -> str:
    """A number for a sentence: integers without decimals, others to `digits` significant digits."""
    if value is None:
        return "n/a"
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:,.{digits}g}" if abs(value) >= 1 else f"{value:.{digits}g}"


def _known(*values: object) -> bool:
    return all(value is not None for value in values)


# ---------------------------------------------------------------- rules


def underfilled_grid(m: dict, ctx: RuleContext) -> Finding | None:
    """Fewer CTAs than the GPU can run at once: a share of the SMs idles for the whole kernel."""
    waves, grid, sms = m.get("waves_per_sm"), m.get("grid_size"), m.get("sm_count")
    idle_fractions = []
    if waves is not None and waves < UNDERFILL_WAVES:
        idle_fractions.append(1.0 - waves / UNDERFILL_WAVES)
    if _known(grid, sms) and sms > 0 and grid < sms:
        idle_fractions.append(1.0 - grid / sms)
    if not idle_fractions:
        return None
    return Finding(
        id="underfilled_grid",
        title="Grid under-fills the GPU",
        severity=_clamp01(max(idle_fractions)),
        metric="launch__waves_per_multiprocessor",
        value=waves,
        threshold=UNDERFILL_WAVES,
        evidence=(
            f"{_fmt(grid)} CTAs on {_fmt(sms)} SMs is {_fmt(waves)} waves, "
            f"so about {max(idle_fractions):.0%} of the GPU's CTA slots stay empty for the whole kernel."
        ),
        lever=(
            "Create more CTAs: smaller query tiles or split the key/value sequence across CTAs "
            "(split-KV with a combine step), or schedule tiles persistently over all SMs."
        ),
    )


def tail_effect(m: dict, ctx: RuleContext) -> Finding | None:
    """More than one wave whose last one is partly empty: that share of the CTA slots idles while
    the tail runs (assuming CTAs of equal length; a causal grid's longest-first order shortens it)."""
    waves, grid = m.get("waves_per_sm"), m.get("grid_size")
    if waves is None or waves <= UNDERFILL_WAVES:
        return None
    whole = math.ceil(waves - 1e-9)
    last = waves - (whole - 1)  # how full the last wave is, 0 < last <= 1
    idle = (1.0 - last) / whole
    if idle < TAIL_IDLE_SHARE:
        return None
    return Finding(
        id="tail_effect",
        title="Partial last wave (tail effect)",
        severity=_clamp01(idle),
        metric="launch__waves_per_multiprocessor",
        value=waves,
        threshold=TAIL_IDLE_SHARE,
        evidence=(
            f"{_fmt(grid)} CTAs make {_fmt(waves)} waves: the last of {whole} runs {last:.0%} full, so about "
            f"{idle:.0%} of the kernel's CTA-slot time idles in the tail."
        ),
        lever=(
            "Make the grid a whole number of waves (tile size, key-split count, CTAs per SM), or schedule "
            "tiles persistently so the last CTAs share the tail."
        ),
    )


def launch_bound(m: dict, ctx: RuleContext) -> Finding | None:
    """A kernel so short that one launch's fixed cost is a large share of the call."""
    duration = m.get("duration_us")
    if not _known(duration, ctx.launch_us) or duration <= 0 or ctx.launch_us <= 0:
        return None
    share = ctx.launch_us / (ctx.launch_us + duration)
    if share < LAUNCH_BOUND_SHARE:
        return None
    return Finding(
        id="launch_bound",
        title="Launch-bound: the fixed cost of a launch is a large share of the call",
        severity=_clamp01(share),
        metric="gpu__time_duration.sum",
        value=duration,
        threshold=LAUNCH_BOUND_SHARE,
        evidence=(
            f"The kernel runs {_fmt(duration)} µs and an empty kernel costs {_fmt(ctx.launch_us)} µs a launch on "
            f"this card (env stage, graph replay): launch is about {share:.0%} of a call, and the CTA's fixed "
            "prologue (first loads) and epilogue are a large part of the rest."
        ),
        lever=(
            "Keep the call to one launch (combine split-K partials inside the kernel: clusters and distributed "
            "shared memory), shorten the serial chain per CTA (smaller tiles, key splits across SMs), and "
            "issue every load of a short CTA up front."
        ),
    )


def ramp_and_drain(m: dict, ctx: RuleContext) -> Finding | None:
    """The share of the kernel's elapsed cycles in which even the busiest SM held no CTA: launch
    ramp-up, drain and gaps, which no grid or tile shape removes (ncu's own measurement; under
    graph replay with programmatic dependent launch part of it overlaps the neighbouring calls)."""
    busiest, elapsed, average = m.get("sm_active_cycles_max"), m.get("sm_elapsed_cycles_max"), m.get("sm_active_cycles_avg")
    if not _known(busiest, elapsed) or elapsed <= 0:
        return None
    idle = 1.0 - busiest / elapsed
    if idle < RAMP_DRAIN_SHARE:
        return None
    mean_active = (f" (the average SM for {average / elapsed:.0%}; the gap between the two is SMs with less "
                   f"work or none)" if _known(average) else "")
    return Finding(
        id="ramp_and_drain",
        title="Launch ramp-up and drain: even the busiest SM idles for part of the kernel",
        severity=_clamp01(idle),
        metric="sm__cycles_active.max",
        value=busiest,
        threshold=RAMP_DRAIN_SHARE,
        evidence=(
            f"The busiest SM held a CTA for {_fmt(busiest)} of the kernel's {_fmt(elapsed)} cycles{mean_active}: "
            f"{idle:.0%} of the kernel is launch ramp-up, drain and gaps, whatever the grid."
        ),
        lever=(
            "Overlap the fixed part with the neighbouring kernels (programmatic dependent launch under graph "
            "replay), do more work per launch, and shorten the CTA's prologue and epilogue (barrier setup, "
            "first loads issued at entry, the store)."
        ),
    )


def low_occupancy(m: dict, ctx: RuleContext) -> Finding | None:
    """Few warps resident per SM; names the resource that caps blocks per SM."""
    achieved, theoretical = m.get("achieved_occupancy_pct"), m.get("theoretical_occupancy_pct")
    known = [value for value in (achieved, theoretical) if value is not None]
    if not known or min(known) >= LOW_OCCUPANCY_PCT:
        return None
    lowest = min(known)
    observed = achieved if achieved is not None else theoretical
    limiter = m.get("occupancy_limiter")
    levers = [OCCUPANCY_LEVERS[name] for name in (limiter or "").split("+") if name in OCCUPANCY_LEVERS]
    limiter_text = (
        f"; {_fmt(m.get('occupancy_limit_blocks'))} block(s)/SM, limited by {limiter} "
        f"({_fmt(m.get('registers_per_thread'))} registers/thread, "
        f"{_fmt(m.get('shared_mem_per_block_bytes'))} B shared/block)"
        if limiter else ""
    )
    lever = (
        ("To fit more warps, " + " and ".join(levers) + "; " if levers else "")
        + "or hide latency inside the CTA with deeper pipelining and warp specialisation."
    )
    return Finding(
        id="low_occupancy",
        title=f"Low occupancy{f' (limited by {limiter})' if limiter else ''}",
        severity=_clamp01((LOW_OCCUPANCY_PCT - lowest) / LOW_OCCUPANCY_PCT),
        metric="sm__warps_active.avg.pct_of_peak_sustained_active",
        value=observed,
        threshold=LOW_OCCUPANCY_PCT,
        evidence=(
            f"Achieved occupancy {_fmt(achieved)}% of the SM's warp slots "
            f"(theoretical {_fmt(theoretical)}%){limiter_text}."
        ),
        lever=lever[0].upper() + lever[1:],
    )


def _is_matmul_heavy(m: dict, ctx: RuleContext) -> bool:
    if ctx.flops is not None and ctx.flops > 0:
        return True
    busy = (m.get("tensor_pipe_pct") or 0.0) + (m.get("fma_pipe_pct") or 0.0)
    return busy >= MATMUL_HEAVY_PIPE_PCT


def low_tensor_pipe(m: dict, ctx: RuleContext) -> Finding | None:
    """The matrix products of attention do not keep the tensor cores busy."""
    tensor = m.get("tensor_pipe_pct")
    if tensor is None or tensor >= TENSOR_PIPE_LOW_PCT or not _is_matmul_heavy(m, ctx):
        return None
    fma = m.get("fma_pipe_pct")
    if tensor < TENSOR_PIPE_UNUSED_PCT:
        title = "Matmuls not on tensor cores"
        evidence = (
            f"The tensor pipe is active {_fmt(tensor)}% of active cycles while the FMA pipe is "
            f"{_fmt(fma)}%: QK^T and PV run as scalar FMAs."
        )
        lever = "Move QK^T and PV onto tensor cores (mma.sync m16n8k16 warp tiles, or wgmma on Hopper)."
    else:
        title = "Tensor pipe under-used"
        evidence = (
            f"The tensor pipe is active only {_fmt(tensor)}% of active SM cycles "
            f"(FMA pipe {_fmt(fma)}%), so the MMAs wait on loads, softmax or barriers."
        )
        lever = (
            "Give each warp bigger tiles (more MMAs per byte loaded) and keep the tensor pipe fed: "
            "async multi-stage loads and softmax overlapped with the next tile's MMA."
        )
    return Finding(
        id="low_tensor_pipe",
        title=title,
        severity=_clamp01((TENSOR_PIPE_LOW_PCT - tensor) / TENSOR_PIPE_LOW_PCT),
        metric="sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
        value=tensor,
        threshold=TENSOR_PIPE_LOW_PCT,
        evidence=evidence,
        lever=lever,
    )


def shared_bank_conflicts(m: dict, ctx: RuleContext) -> Finding | None:
    """Shared-memory accesses replayed because threads of a warp hit the same bank."""
    ratio = m.get("shared_bank_conflict_ratio")
    if ratio is None or ratio <= BANK_CONFLICT_RATIO:
        return None
    return Finding(
        id="shared_bank_conflicts",
        title="Shared-memory bank conflicts",
        severity=_clamp01(ratio),
        metric="l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
        value=m.get("shared_bank_conflicts"),
        threshold=BANK_CONFLICT_RATIO,
        evidence=(
            f"{_fmt(m.get('shared_bank_conflicts'))} bank conflicts in "
            f"{_fmt(m.get('shared_wavefronts'))} shared-memory wavefronts ({ratio:.0%} are replays)."
        ),
        lever="Pad each shared-memory row by 16 bytes or XOR-swizzle the column index so a warp's accesses spread over all 32 banks.",
    )


UNCOALESCED_LEVERS = {
    "loads": "Load 16 bytes per thread along the contiguous head dimension so consecutive threads of a warp read consecutive addresses.",
    "stores": "Store 16 bytes per thread along the contiguous head dimension (or stage the tile in shared memory and store it with TMA) so each warp store fills whole 32-byte sectors.",
}


def _wasteful_ops(m: dict) -> dict[str, float]:
    """The LSU's global loads and stores that use too little of each sector they touch: the bytes
    of a sector each uses."""
    full = SECTOR_BYTES * (1.0 - UNCOALESCED_EXCESS_RATIO)
    used = {"loads": m.get("global_load_bytes_per_sector"), "stores": m.get("global_store_bytes_per_sector")}
    return {op: per_sector for op, per_sector in used.items() if per_sector and per_sector < full}


def uncoalesced_global(m: dict, ctx: RuleContext) -> Finding | None:
    """Global loads/stores touching more 32-byte sectors than the data they move needs. The
    severity is the excess's share of the kernel's global traffic: in a TMA kernel the LSU may
    move only the epilogue's stores, and half-filled sectors there waste a few percent, not half."""
    ratio = m.get("uncoalesced_excess_ratio")
    if ratio is None or ratio <= UNCOALESCED_EXCESS_RATIO:
        return None
    share = m.get("lsu_global_share")
    ops = _wasteful_ops(m)
    per_op = "; ".join(f"{op}: {used:.0f} of each sector's {SECTOR_BYTES} bytes used" for op, used in ops.items())
    return Finding(
        id="uncoalesced_global",
        title="Uncoalesced global memory " + (" and ".join(ops) if ops else "access"),
        severity=_clamp01(ratio * (1.0 if share is None else share)),
        metric="derived__memory_l2_theoretical_sectors_global_excessive",
        value=m.get("global_excessive_sectors"),
        threshold=UNCOALESCED_EXCESS_RATIO,
        evidence=(
            f"{_fmt(m.get('global_excessive_sectors'))} of {_fmt(m.get('global_sectors'))} global "
            f"sectors ({ratio:.0%}) are beyond what a coalesced access pattern would need"
            + (f" ({per_op})" if ops else "")
            + (f"; these loads and stores are {share:.0%} of the kernel's global traffic, TMA moves the rest"
               if share is not None and share < 1.0 else "") + "."
        ),
        lever=" ".join(UNCOALESCED_LEVERS[op] for op in ops) if ops else UNCOALESCED_LEVERS["loads"],
    )


def _local_memory_instructions(m: dict) -> float | None:
    loads, stores = m.get("local_loads"), m.get("local_stores")
    if loads is None and stores is None:
        return None
    return (loads or 0.0) + (stores or 0.0)


def register_spills(m: dict, ctx: RuleContext) -> Finding | None:
    """Local-memory traffic: registers spilled to (or arrays placed in) thread-local memory."""
    local_inst = _local_memory_instructions(m)
    local_sectors = (m.get("local_load_sectors") or 0.0) + (m.get("local_store_sectors") or 0.0)
    spill_requests = m.get("local_spilling_requests") or 0.0
    if not (local_inst or local_sectors or spill_requests):
        return None
    fraction = (local_inst or 0.0) / m["inst_executed"] if m.get("inst_executed") else 0.0
    severity = SPILL_MIN_SEVERITY + (1 - SPILL_MIN_SEVERITY) * min(1.0, fraction / SPILL_FULL_SEVERITY_FRACTION)
    return Finding(
        id="register_spills",
        title="Register spills to local memory",
        severity=_clamp01(severity),
        metric="sass__inst_executed_local_loads",
        value=local_inst,
        threshold=0.0,
        evidence=(
            f"{_fmt(local_inst)} local-memory instructions ({fraction:.2%} of all) moving "
            f"{_fmt(local_sectors)} sectors, with {_fmt(m.get('registers_per_thread'))} registers/thread."
        ),
        lever="Shorten live ranges (rescale and store the output accumulator per tile, split accumulators across warps) and avoid dynamically indexed per-thread arrays.",
    )


def _traffic_excess(value: float | None, min_bytes: float, multiple: float) -> float | None:
    """Severity of traffic beyond `multiple` x the minimum: the share of bytes past that allowance."""
    if value is None:
        return None
    ratio = value / min_bytes
    return 1.0 - multiple / ratio if ratio > multiple else None


def no_kv_reuse(m: dict, ctx: RuleContext) -> Finding | None:
    """Bytes moved far beyond q+k+v+o: K/V are re-fetched instead of staged once per tile."""
    if ctx.min_bytes is None or ctx.min_bytes <= 0:
        return None
    l2_bytes, dram_bytes = m.get("l2_to_sm_read_bytes"), m.get("dram_bytes")
    candidates = [
        (_traffic_excess(l2_bytes, ctx.min_bytes, L2_TRAFFIC_MULTIPLE), "l1tex__m_xbar2l1tex_read_bytes.sum",
         l2_bytes, L2_TRAFFIC_MULTIPLE, "L2 to SM"),
        (_traffic_excess(dram_bytes, ctx.min_bytes, DRAM_TRAFFIC_MULTIPLE), "dram__bytes_read.sum+dram__bytes_write.sum",
         dram_bytes, DRAM_TRAFFIC_MULTIPLE, "DRAM"),
    ]
    fired = [c for c in candidates if c[0] is not None]
    if not fired:
        return None
    severity, metric, value, multiple, path = max(fired, key=lambda c: c[0])
    return Finding(
        id="no_kv_reuse",
        title="K/V not reused from shared memory",
        severity=_clamp01(severity),
        metric=metric,
        value=value,
        threshold=multiple * ctx.min_bytes,
        evidence=(
            f"{path} traffic is {_fmt(value)} bytes, {value / ctx.min_bytes:.1f}x the "
            f"{_fmt(ctx.min_bytes)} bytes of q+k+v+o (allowance {multiple:g}x)."
        ),
        lever="Stage each K/V tile in shared memory once per CTA and reuse it across all query rows of the tile (bigger BLOCK_M reuses it more).",
    )


def stall_shares(stalls: dict[str, float]) -> dict[str, float]:
    """Each reason's share of stall cycles, the issuing warp ('selected') left out of the total."""
    total = sum(value for reason, value in stalls.items() if reason != "selected")
    if total <= 0:
        return {}
    return {reason: value / total for reason, value in stalls.items() if reason != "selected"}


def dominant_stalls(m: dict, ctx: RuleContext) -> list[Finding]:
    """Stall reasons holding a large share of stall cycles, weighted by how idle the issue slots are."""
    shares = stall_shares(m.get("warp_stalls") or {})
    issue_active = m.get("issue_active_pct")
    idle_issue = 1.0 - issue_active / 100.0 if issue_active is not None else 1.0
    findings = []
    for reason, share in sorted(shares.items(), key=lambda item: -item[1]):
        if share < STALL_SHARE_THRESHOLD or reason in NOT_STALL_REASONS or reason not in STALL_LEVERS:
            continue
        title, lever = STALL_LEVERS[reason]
        value = m["warp_stalls"][reason]
        findings.append(Finding(
            id=f"stall_{reason}",
            title=title,
            severity=_clamp01(share * idle_issue),
            metric=f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio",
            value=value,
            threshold=STALL_SHARE_THRESHOLD,
            evidence=(
                f"'{reason}' holds {share:.0%} of warp stall cycles ({_fmt(value)} warps per issued "
                f"instruction) while issue slots are busy {_fmt(issue_active)}% of active cycles."
            ),
            lever=lever,
        ))
    return findings


RULES: tuple[Rule, ...] = (
    launch_bound,
    ramp_and_drain,
    underfilled_grid,
    tail_effect,
    low_occupancy,
    low_tensor_pipe,
    shared_bank_conflicts,
    uncoalesced_global,
    register_spills,
    no_kv_reuse,
)


def find_bottlenecks(m: dict, ctx: RuleContext) -> list[Finding]:
    """Every rule's finding on one kernel's key metrics, most severe first (rule order breaks ties)."""
    findings = [finding for rule in RULES if (finding := rule(m, ctx)) is not None]
    findings += dominant_stalls(m, ctx)
    return sorted(findings, key=lambda finding: -finding.severity)


# ---------------------------------------------------------------- roofline


def _compute_ceiling_tflops(ceilings: dict | None, dtype: str) -> float | None:
    per_dtype = (ceilings or {}).get("matmul_tflops") or {}
    value = per_dtype.get(dtype)
    return float(value) if value else None


def roofline(m: dict, flops: float | None, ceilings: dict | None, dtype: str = "fp16") -> dict:
    """Achieved TFLOP/s and DRAM GB/s of the dominant kernel, its arithmetic intensity against the
    ridge point of the measured ceilings, and which side of the ridge it sits on."""
    seconds = m["duration_us"] * 1e-6 if m.get("duration_us") else None
    dram_bytes = m.get("dram_bytes")
    achieved_tflops = flops / seconds / 1e12 if _known(flops, seconds) else None
    dram_gbps = dram_bytes / seconds / 1e9 if _known(dram_bytes, seconds) else None
    intensity = flops / dram_bytes if _known(flops, dram_bytes) and dram_bytes > 0 else None
    compute_tflops = _compute_ceiling_tflops(ceilings, dtype)
    copy_gbps = (ceilings or {}).get("copy_gbps") or None
    ridge = compute_tflops * 1e12 / (copy_gbps * 1e9) if _known(compute_tflops, copy_gbps) else None
    bound = "unknown" if not _known(intensity, ridge) else ("compute" if intensity >= ridge else "memory")
    return {
        "achieved_tflops": achieved_tflops,
        "dram_gbps": dram_gbps,
        "arithmetic_intensity_flop_per_byte": intensity,
        "ridge_point": ridge,
        "bound": bound,
        "compute_ceiling_tflops": compute_tflops,
        "memory_ceiling_gbps": copy_gbps,
        "pct_of_compute_ceiling": 100.0 * achieved_tflops / compute_tflops if _known(achieved_tflops, compute_tflops) else None,
        "pct_of_memory_ceiling": 100.0 * dram_gbps / copy_gbps if _known(dram_gbps, copy_gbps) else None,
    }


# ---------------------------------------------------------------- analysis


def _duration_us(kernel: KernelProfile) -> float | None:
    return key_metrics(kernel)["duration_us"]


def dominant_kernel(kernels: list[KernelProfile]) -> KernelProfile | None:
    """The longest-running kernel (kernels without a duration count as shortest)."""
    if not kernels:
        return None
    return max(kernels, key=lambda kernel: _duration_us(kernel) or -math.inf)


def _finding_row(rank: int, finding: Finding) -> dict:
    return {"rank": rank, **asdict(finding), "severity": round(finding.severity, 3)}


def analyze(
    kernels: list[KernelProfile],
    flops: float | None,
    ceilings: dict | None,
    min_bytes: float | None = None,
    dtype: str = "fp16",
) -> dict:
    """The ranked bottlenecks of a variant's kernels on the profiling shape.

    Findings and roofline come from the dominant (longest) kernel, to which the call's `flops`
    (4*B*H*S*S*D, halved if causal) is attributed; `min_bytes` is q+k+v+o in bytes, the least
    traffic the call can move; `ceilings` are the env stage's measured matmul TFLOP/s per dtype,
    copy GB/s and empty-kernel launch µs.
    """
    dominant = dominant_kernel(kernels)
    metrics = key_metrics(dominant) if dominant is not None else {}
    findings = find_bottlenecks(metrics, RuleContext(flops=flops, min_bytes=min_bytes,
                                                     launch_us=(ceilings or {}).get("launch_us")))
    return {
        "dominant_kernel": dominant.name if dominant is not None else None,
        "kernels": [{"id": k.id, "name": k.name, "duration_us": _duration_us(k)} for k in kernels],
        "key_metrics": metrics,
        "findings": [_finding_row(rank, finding) for rank, finding in enumerate(findings, start=1)],
        "roofline": roofline(metrics, flops, ceilings, dtype),
    }


# ---------------------------------------------------------------- markdown


def _cell(value: object) -> str:
    text = _fmt(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _roofline_line(roof: dict) -> str:
    if roof.get("achieved_tflops") is None:
        return "Roofline: not available (no FLOP count or duration)."
    parts = [f"{roof['achieved_tflops']:.1f} TFLOP/s"]
    if roof.get("pct_of_compute_ceiling") is not None:
        parts[0] += f" ({roof['pct_of_compute_ceiling']:.1f}% of {roof['compute_ceiling_tflops']:g})"
    if roof.get("dram_gbps") is not None:
        memory = f"DRAM {roof['dram_gbps']:.0f} GB/s"
        if roof.get("pct_of_memory_ceiling") is not None:
            memory += f" ({roof['pct_of_memory_ceiling']:.1f}% of {roof['memory_ceiling_gbps']:g})"
        parts.append(memory)
    if roof.get("arithmetic_intensity_flop_per_byte") is not None:
        intensity = f"intensity {roof['arithmetic_intensity_flop_per_byte']:.0f} FLOP/B"
        if roof.get("ridge_point") is not None:
            intensity += f" vs ridge {roof['ridge_point']:.0f}"
        parts.append(intensity)
    return "Roofline: " + ", ".join(parts) + f"; bound: {roof['bound']}."


# Longer kernel names (templated C++) are shortened in the markdown kernel table.
MARKDOWN_NAME_CHARS = 100


def _short_name(name: str) -> str:
    return name if len(name) <= MARKDOWN_NAME_CHARS else name[: MARKDOWN_NAME_CHARS - 1] + "…"


def render_markdown(analysis: dict, title: str) -> str:
    """A short page: the dominant kernel, the roofline line, the findings table, the kernel list."""
    lines = [f"# {title}", ""]
    lines.append(f"Dominant kernel: `{analysis.get('dominant_kernel') or 'none'}`")
    lines += ["", _roofline_line(analysis.get("roofline") or {}), "", "## Findings", ""]
    findings = analysis.get("findings") or []
    if findings:
        lines.append("| rank | finding | severity | metric | value | evidence | lever |")
        lines.append("| --- | --- | --- | --- | --- | --- | --- |")
        for f in findings:
            lines.append(
                f"| {f['rank']} | {_cell(f['title'])} | {f['severity']:.2f} | `{_cell(f['metric'])}` "
                f"| {_cell(f['value'])} | {_cell(f['evidence'])} | {_cell(f['lever'])} |"
            )
    else:
        lines.append("No bottleneck rule fired on the available metrics.")
    lines += ["", "## Kernels", "", "| kernel | duration (µs) |", "| --- | --- |"]
    for kernel in analysis.get("kernels") or []:
        duration = kernel.get("duration_us")
        lines.append(f"| `{_cell(_short_name(kernel['name']))}` | {_cell(duration) if duration is not None else 'n/a'} |")
    return "\n".join(lines) + "\n"
