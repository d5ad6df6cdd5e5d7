"""Where a kernel's warps wait, instruction by instruction: Nsight Compute's source page (SASS
with its warp-stall samples, from the SourceCounters section that `--set full` collects) read
into the instructions and opcodes holding the most samples, each with its main stall reasons.

The pipeline's analysis reads ncu's kernel-wide stall shares; those name a reason ("barrier")
but not the instruction, and on Hopper the wgmma waits (`WARPGROUP.DEPBAR`) count as barrier
stalls beside the named barriers. This is what tells them apart."""
from __future__ import annotations

import csv
import io
import re
from collections import Counter

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"
STALL_PREFIX = "stall_"
NOT_ISSUED = " (Not Issued)"
# A guard predicate before an opcode: @P0, @!P1, @UP2, @!PT.
PREDICATE = re.compile(r"^@!?U?P\w+\s+")


def source_export_command(ncu: str, report_path: str) -> list[str]:
    """Print a saved report's source page (SASS, one row per instruction) as CSV on stdout."""
    return [ncu, "--import", report_path, "--page", "source", "--csv", "--print-source", "sass"]


def _int(cell: str) -> int:
    try:
        return int(float(cell))
    except ValueError:
        return 0


def parse_source_page(text: str) -> list[dict]:
    """One entry per kernel: its name and its instructions in address order, each with its SASS
    text, samples, executions and samples per stall reason (issued and not-issued summed)."""
    kernels: list[dict] = []
    header: list[str] | None = None
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        if row[0] == "Kernel Name":
            kernels.append({"name": row[1] if len(row) > 1 else "", "instructions": []})
            header = None
        elif row[0] == "Address" and kernels:
            header = row
        elif header is not None and len(row) == len(header):
            cells = dict(zip(header, row))
            reasons: Counter = Counter()
            for column, value in cells.items():
                if column.startswith(STALL_PREFIX) and not column.endswith(NOT_ISSUED):
                    reasons[column.removeprefix(STALL_PREFIX)] += _int(value)
            kernels[-1]["instructions"].append({
                "index": len(kernels[-1]["instructions"]), "sass": cells["Source"].strip(),
                "samples": _int(cells.get(SAMPLES, "0")), "executed": _int(cells.get(EXECUTED, "0")),
                "reasons": {k: v for k, v in reasons.items() if v}})
    if not kernels or not any(k["instructions"] for k in kernels):
        raise ValueError("no source page rows (was the report collected with the SourceCounters section?)")
    return kernels


def opcode(sass: str) -> str:
    """The instruction's opcode without its guard predicate; barrier-like families keep their
    first modifier (BAR.SYNC against BAR.ARV, WARPGROUP.DEPBAR, SYNCS.PHASECHK)."""
    words = PREDICATE.sub("", sass).split()
    if not words:
        return ""
    parts = words[0].split(".")
    keep_modifier = parts[0] in ("BAR", "WARPGROUP", "SYNCS") and len(parts) > 1
    return ".".join(parts[:2]) if keep_modifier else parts[0]


def hotspots(kernel: dict, top: int = 12) -> dict:
    """The `top` instructions by samples (share of the kernel's samples, the two main reasons,
    the instruction just before for context) and every opcode's share, largest first."""
    instructions = kernel["instructions"]
    total = sum(i["samples"] for i in instructions)
    if total == 0:
        raise ValueError(f"{kernel['name'][:80]}: the source page holds no stall samples")
    by_opcode: Counter = Counter()
    for i in instructions:
        by_opcode[opcode(i["sass"])] += i["samples"]
    ranked = sorted(instructions, key=lambda i: -i["samples"])[:top]
    return {
        "kernel": kernel["name"], "samples": total,
        "by_opcode": [{"opcode": op, "share": n / total} for op, n in by_opcode.most_common() if n],
        "top": [{"index": i["index"], "sass": i["sass"], "share": i["samples"] / total, "executed": i["executed"],
                 "reasons": [{"reason": r, "share": n / i["samples"]}
                             for r, n in Counter(i["reasons"]).most_common(2)] if i["samples"] else [],
                 "previous": instructions[i["index"] - 1]["sass"] if i["index"] > 0 else None}
                for i in ranked],
    }


def format_hotspots(spots: dict, opcodes: int = 10) -> list[str]:
    lines = [f"  {spots['samples']} stall samples; by opcode: " + ", ".join(
        f"{o['opcode']} {o['share']:.1%}" for o in spots["by_opcode"][:opcodes])]
    for t in spots["top"]:
        why = ", ".join(f"{r['reason']} {r['share']:.0%}" for r in t["reasons"])
        lines.append(f"  {t['share']:6.2%}  #{t['index']:<5d} {t['sass'][:58]:58s} ({why}; after {t['previous'] or '-'})"[:200])
    return lines
