"""The profile stage: Nsight Compute over one call of a variant (or SDPA) on the profile shape."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from .ncu import clean_csv_text, export_command, parse_raw_csv, profile_command

NCU_TIMEOUT_S = 900
TARGET = Path(__file__).resolve().parents[1] / "ncu_target.py"


def target_argv(entry: str, build: str | None, shape: dict, dtype: str, card: Path | None) -> list[str]:
    argv = [sys.executable, str(TARGET), "--entry", entry, "--B", str(shape["B"]), "--H", str(shape["H"]),
            "--S", str(shape["S"]), "--D", str(shape["D"]), "--causal", str(int(shape["causal"])),
            "--dtype", dtype]
    return argv + (["--build", build] if build else []) + (["--card", str(card)] if card else [])


def profile(ncu: str, entry: str, build: str | None, shape: dict, dtype: str, launch_count: int,
            outdir: Path, card: Path | None = None) -> dict:
    """Profile, export the raw page, and return the status record plus the clean CSV text. The
    profiled process writes the card it ran on to `card` when given (provenance.report_card)."""
    outdir.mkdir(parents=True, exist_ok=True)
    report_base = outdir / "report"
    ncu_log = outdir / "ncu.log"
    argv = profile_command(ncu, str(report_base), target_argv(entry, build, shape, dtype, card), launch_count,
                           str(ncu_log))
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=NCU_TIMEOUT_S)
    seconds = time.perf_counter() - started
    report = Path(f"{report_base}.ncu-rep")
    record = {"command": argv, "profile_seconds": round(seconds, 1), "ncu_log": str(ncu_log),
              "shape": shape, "dtype": dtype}
    if proc.returncode != 0 or not report.exists():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
        return {**record, "status": "fail", "reasons": [f"ncu exited {proc.returncode}: {' | '.join(tail)}"]}, ""
    exported = subprocess.run(export_command(ncu, str(report)), capture_output=True, text=True,
                              timeout=NCU_TIMEOUT_S)
    csv_text = clean_csv_text(exported.stdout)
    kernels = parse_raw_csv(csv_text)
    if not kernels:
        return {**record, "status": "fail", "reasons": ["ncu profiled no kernel between the target's profiler "
                                                         f"start and stop (see {ncu_log})"]}, ""
    return {**record, "status": "measured", "reasons": [], "report": str(report),
            "kernels": [k.name for k in kernels]}, csv_text
