"""Nsight Compute: build the profiling command lines and read the raw-page CSV into typed profiles.

`ncu --import X.ncu-rep --page raw --csv` prints row 0 = metric names, row 1 = units, then one
row per profiled kernel. Numbers carry thousands separators ("1,443.83"); cells may be empty,
"n/a", "nan" or "no data" (all read as absent); other text ("(384, 1, 1)", "PolicySpread") is
kept as a string. When ncu writes to stdout its own `==PROF==`/`==WARNING==` lines land before
the CSV; `clean_csv_text` drops them. Everything here is pure except `read_raw_csv`.
"""
from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from .errors import StageError
from .io import rebuild_hint

HEADER_PREFIX = '"ID",'
# ncu's own log lines: "==PROF== Connected...", "==WARNING== ...", "==ERROR== ...".
LOG_LINE = re.compile(r"^==[A-Z]+==")
# Cell texts that mean "no value" in ncu's raw page.
ABSENT_VALUES = frozenset({"", "n/a", "nan", "-nan", "no data", "N/A"})

# Columns of the raw page that describe the launch rather than measure it.
ID_COLUMN = "ID"
NAME_COLUMN = "Kernel Name"

STALL_PREFIX = "smsp__average_warps_issue_stalled_"
STALL_SUFFIX = "_per_issue_active.ratio"
OCCUPANCY_LIMIT_PREFIX = "launch__occupancy_limit_"
OCCUPANCY_LIMITERS = ("registers", "shared_mem", "warps", "blocks", "barriers")


@dataclass
class KernelProfile:
    """One profiled kernel launch: its raw-page metrics (number or text) and their units."""

    id: int
    name: str
    metrics: dict[str, float | str] = field(default_factory=dict)
    units: dict[str, str] = field(default_factory=dict)

    def get(self, metric: str, default: float | None = None) -> float | None:
        """The metric as a number; `default` when it is absent or not numeric."""
        value = self.metrics.get(metric)
        if isinstance(value, float):
            return value
        return default

    def first(self, *metrics: str) -> float | None:
        """The first of several equivalent metric names that has a number (ncu renames across versions)."""
        for metric in metrics:
            value = self.get(metric)
            if value is not None:
                return value
        return None


# ---------------------------------------------------------------- parsing


def parse_value(cell: str) -> float | str | None:
    """A raw-page cell: a float (thousands separators removed), the text itself, or None if absent."""
    text = cell.strip()
    if text in ABSENT_VALUES or text.lower() in ABSENT_VALUES:
        return None
    try:
        number = float(text.replace(",", ""))
    except ValueError:
        return text
    if math.isnan(number):
        return None
    return number


def _is_log_line(line: str) -> bool:
    return bool(LOG_LINE.match(line))


def clean_csv_text(text: str) -> str:
    """The raw-page CSV alone: from the `"ID",` header on, without ncu's log lines."""
    lines = text.splitlines(keepends=True)
    for start, line in enumerate(lines):
        if line.startswith(HEADER_PREFIX):
            break
    else:
        raise ValueError('no ncu raw-page header (a line starting with "ID",) in the CSV text')
    return "".join(line for line in lines[start:] if not _is_log_line(line))


def _is_units_row(row: list[str], header: list[str]) -> bool:
    """The units row has an empty ID cell; kernel rows have an integer there."""
    return bool(row) and row[header.index(ID_COLUMN)].strip() == ""


def _profile_from_row(row: list[str], header: list[str], units_row: list[str]) -> KernelProfile:
    metrics: dict[str, float | str] = {}
    units: dict[str, str] = {}
    for column, cell in enumerate(row):
        if column >= len(header):
            break
        name = header[column]
        value = parse_value(cell)
        if value is not None:
            metrics[name] = value
        unit = units_row[column].strip() if column < len(units_row) else ""
        if unit:
            units[name] = unit
    kernel_id = metrics.get(ID_COLUMN)
    if not isinstance(kernel_id, float):
        raise ValueError(f"ncu raw-page row without a numeric ID: {row[:3]!r}")
    name = metrics.get(NAME_COLUMN, "")
    return KernelProfile(id=int(kernel_id), name=str(name), metrics=metrics, units=units)


def parse_raw_csv(text: str) -> list[KernelProfile]:
    """Every kernel of an `ncu --page raw --csv` export, in ID order; tolerant of ncu's log lines."""
    rows = [row for row in csv.reader(io.StringIO(clean_csv_text(text))) if row]
    header, body = rows[0], rows[1:]
    if ID_COLUMN not in header:
        raise ValueError("ncu raw-page header has no ID column")
    units_row: list[str] = []
    if body and _is_units_row(body[0], header):
        units_row, body = body[0], body[1:]
    profiles = [_profile_from_row(row, header, units_row) for row in body]
    return sorted(profiles, key=lambda profile: profile.id)


def read_raw_csv(path: str | Path) -> list[KernelProfile]:
    """A profile stage's CSV; a missing, empty or damaged one is one line naming it and the fix."""
    try:
        return parse_raw_csv(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise StageError(f"{path}: not an ncu raw-page CSV ({exc}); rebuild it: {rebuild_hint(path)}") from None


def select_kernels(profiles: list[KernelProfile], name_regex: str) -> list[KernelProfile]:
    """The profiles whose kernel name matches `name_regex` anywhere (re.search)."""
    pattern = re.compile(name_regex)
    return [profile for profile in profiles if pattern.search(profile.name)]


# ---------------------------------------------------------------- command lines


def profile_command(
    ncu: str,
    report_base: str,
    target_argv: list[str],
    launch_count: int,
    log_file: str,
) -> list[str]:
    """Profile the first `launch_count` kernels the target launches between its profiler start and
    stop (cuProfilerStart/cudaProfilerStart), full section set, clocks left as they run, ncu's own
    output sent to `log_file` so it never mixes with the target's stdout. A start/stop pair rather
    than an NVTX range: a target without torch can call it through the driver alone."""
    return [
        ncu,
        "--set", "full",
        "--clock-control", "none",
        "--profile-from-start", "off",
        "--launch-count", str(launch_count),
        "--export", report_base,
        "--force-overwrite",
        "--log-file", log_file,
        "--",
        *target_argv,
    ]


def export_command(ncu: str, report_path: str) -> list[str]:
    """Print a saved report's raw page (every metric, one row per kernel) as CSV on stdout."""
    return [ncu, "--import", report_path, "--page", "raw", "--csv"]


# ---------------------------------------------------------------- key metrics


# Units ncu may print for a duration or a byte count (the raw page normally uses ns and byte).
MICROSECONDS_PER_UNIT = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0,
                         "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}
BYTES_PER_UNIT = {"byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9,
                  "byte/block": 1.0, "Kbyte/block": 1e3}
SECTOR_BYTES = 32  # an L2 sector


def _in_units(kernel: KernelProfile, metric: str, scale: dict[str, float], default_unit: str) -> float | None:
    """The metric converted by its unit's factor; None when absent or in a unit we do not know."""
    value = kernel.get(metric)
    factor = scale.get(kernel.units.get(metric, default_unit))
    if value is None or factor is None:
        return None
    return value * factor


def _duration_us(kernel: KernelProfile) -> float | None:
    duration = _in_units(kernel, "gpu__time_duration.sum", MICROSECONDS_PER_UNIT, "ns")
    return None if duration is None else round(duration, 6)  # drop float noise below a picosecond


def _bytes(kernel: KernelProfile, metric: str) -> float | None:
    return _in_units(kernel, metric, BYTES_PER_UNIT, "byte")


def _sum_or_none(*values: float | None) -> float | None:
    """The sum when every part is known; None otherwise (a partial sum would be invented)."""
    if any(value is None for value in values):
        return None
    return float(sum(values))  # type: ignore[arg-type]


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def warp_stalls(kernel: KernelProfile) -> dict[str, float]:
    """Warp stall breakdown: {reason: warps stalled per issued instruction} for every reason present."""
    stalls: dict[str, float] = {}
    for metric in kernel.metrics:
        if metric.startswith(STALL_PREFIX) and metric.endswith(STALL_SUFFIX):
            value = kernel.get(metric)
            if value is not None:
                stalls[metric[len(STALL_PREFIX):-len(STALL_SUFFIX)]] = value
    return stalls


def occupancy_limits(kernel: KernelProfile) -> dict[str, float]:
    """Blocks per SM each resource allows (launch__occupancy_limit_*), for the resources present."""
    limits: dict[str, float] = {}
    for limiter in OCCUPANCY_LIMITERS:
        value = kernel.get(OCCUPANCY_LIMIT_PREFIX + limiter)
        if value is not None:
            limits[limiter] = value
    return limits


def occupancy_limiter(limits: dict[str, float]) -> str | None:
    """The resource(s) allowing the fewest blocks per SM, joined by "+" on a tie; None if unknown."""
    if not limits:
        return None
    fewest = min(limits.values())
    return "+".join(name for name, value in limits.items() if value == fewest)


def _memory_metrics(kernel: KernelProfile) -> dict:
    dram_read = _bytes(kernel, "dram__bytes_read.sum")
    dram_write = _bytes(kernel, "dram__bytes_write.sum")
    return {
        "memory_throughput_pct": kernel.get("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
        "dram_throughput_pct": kernel.first(
            "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
            "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        ),
        "dram_read_bytes": dram_read,
        "dram_write_bytes": dram_write,
        "dram_bytes": _sum_or_none(dram_read, dram_write),
        # Bytes the SMs read from L2: K/V re-reads across query tiles show here even when L2 hits.
        "l2_to_sm_read_bytes": _bytes(kernel, "l1tex__m_xbar2l1tex_read_bytes.sum"),
        "l2_hit_rate_pct": kernel.get("lts__t_sector_hit_rate.pct"),
        "l1_hit_rate_pct": kernel.get("l1tex__t_sector_hit_rate.pct"),
    }


def _pipe_metrics(kernel: KernelProfile) -> dict:
    return {
        "sm_throughput_pct": kernel.get("sm__throughput.avg.pct_of_peak_sustained_elapsed"),
        "issue_active_pct": kernel.get("smsp__issue_active.avg.pct_of_peak_sustained_active"),
        # Tensor pipe busy share of the cycles the SMs were active (all tensor ops, wgmma included).
        "tensor_pipe_pct": kernel.first(
            "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
            "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
        ),
        "tensor_pipe_elapsed_pct": kernel.first(
            "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
            "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
        ),
        "fma_pipe_pct": kernel.first(
            "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
            "sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
        ),
        "inst_executed": kernel.get("smsp__inst_executed.sum"),
    }


def _launch_metrics(kernel: KernelProfile) -> dict:
    limits = occupancy_limits(kernel)
    return {
        "achieved_occupancy_pct": kernel.get("sm__warps_active.avg.pct_of_peak_sustained_active"),
        "theoretical_occupancy_pct": kernel.get("sm__maximum_warps_per_active_cycle_pct"),
        "occupancy_limiter": occupancy_limiter(limits),
        "occupancy_limit_blocks": min(limits.values()) if limits else None,
        "occupancy_limits": limits,
        "registers_per_thread": kernel.get("launch__registers_per_thread"),
        "shared_mem_per_block_bytes": _bytes(kernel, "launch__shared_mem_per_block"),
        "grid_size": kernel.get("launch__grid_size"),
        "block_size": kernel.get("launch__block_size"),
        "sm_count": kernel.get("launch__sm_count"),
        "waves_per_sm": kernel.get("launch__waves_per_multiprocessor"),
        # Cycles an SM had a CTA resident, on the busiest SM and on average, against the kernel's
        # elapsed cycles: what waves and grid sizes predict, measured.
        "sm_active_cycles_max": kernel.get("sm__cycles_active.max"),
        "sm_active_cycles_avg": kernel.get("sm__cycles_active.avg"),
        "sm_elapsed_cycles_max": kernel.get("sm__cycles_elapsed.max"),
    }


def _access_pattern_metrics(kernel: KernelProfile) -> dict:
    conflicts = kernel.get("l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum")
    wavefronts = kernel.get("l1tex__data_pipe_lsu_wavefronts_mem_shared.sum")
    excessive = kernel.get("derived__memory_l2_theoretical_sectors_global_excessive")
    sectors = kernel.get("memory_l2_theoretical_sectors_global")
    # The sectors above are the LSU's (ld, st, cp.async); TMA's copies move whole boxes beside them,
    # and in a TMA kernel the LSU's part may be only the epilogue's stores.
    tma_bytes = _sum_or_none(_bytes(kernel, "l1tex__m_xbar2l1tex_read_bytes_mem_global_op_tma_ld.sum"),
                             _bytes(kernel, "l1tex__m_l1tex2xbar_write_bytes_mem_global_op_tma_st.sum"))
    lsu_bytes = None if sectors is None else sectors * SECTOR_BYTES
    return {
        "shared_bank_conflicts": conflicts,
        "shared_wavefronts": wavefronts,
        "shared_bank_conflict_ratio": _ratio(conflicts, wavefronts),
        "global_excessive_sectors": excessive,
        "global_sectors": sectors,
        "uncoalesced_excess_ratio": _ratio(excessive, sectors),
        "global_load_bytes_per_sector": kernel.get("smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.ratio"),
        "global_store_bytes_per_sector": kernel.get("smsp__sass_average_data_bytes_per_sector_mem_global_op_st.ratio"),
        "tma_global_bytes": tma_bytes,
        "lsu_global_share": _ratio(lsu_bytes, _sum_or_none(lsu_bytes, tma_bytes)),
        "local_loads": kernel.get("sass__inst_executed_local_loads"),
        "local_stores": kernel.get("sass__inst_executed_local_stores"),
        "local_load_sectors": kernel.get("l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum"),
        "local_store_sectors": kernel.get("l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum"),
        "local_spilling_requests": kernel.get("derived__local_spilling_requests"),
    }


def key_metrics(kernel: KernelProfile) -> dict:
    """The metrics the bottleneck analysis reads, under clean names with units; None when absent."""
    return {
        "kernel_name": kernel.name,
        "duration_us": _duration_us(kernel),
        **_pipe_metrics(kernel),
        **_memory_metrics(kernel),
        **_launch_metrics(kernel),
        **_access_pattern_metrics(kernel),
        "warp_stalls": warp_stalls(kernel),
    }
