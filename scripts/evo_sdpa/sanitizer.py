"""compute-sanitizer over a small run of the variant: memcheck, racecheck, initcheck, synccheck,
each buffer its own allocation (a CUDA variant's target runs without torch, on driver allocations;
a Triton variant's with PyTorch's caching allocator off) and allocation padding on, each tool's
verdict and first error."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

# Measured on an H100 (DESIGN.md): with the caching allocator on, an out-of-bounds write stayed
# inside the cached segment and went unseen; without padding a read into the neighbour went unseen.
SANITIZER_ENV = {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1", "CUDA_LAUNCH_BLOCKING": "1"}
# How each target allocates, as its verdict records it: a CUDA variant's runs without torch (bare.py).
ALLOCATION = {"cuda": "one driver allocation per buffer (no torch, no pool)",
              "triton": "PYTORCH_NO_CUDA_MEMORY_CACHING=1"}
TOOL_TIMEOUT_S = 900

_SUMMARY = re.compile(r"=+ ERROR SUMMARY: (\d+) errors?")
_RACE_SUMMARY = re.compile(r"=+ RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)")
_PREFIX = re.compile(r"^=+ ?")


def tool_command(sanitizer: str, tool: str, padding_bytes: int, log_file: str, target: list[str]) -> list[str]:
    argv = [sanitizer, "--tool", tool, "--log-file", log_file, "--print-limit", "20"]
    if tool == "memcheck":
        argv += ["--padding", str(padding_bytes), "--leak-check", "no"]
    if tool == "racecheck":
        argv += ["--racecheck-report", "all"]
    return argv + target


def parse_report(text: str) -> dict:
    """Count the errors a tool reported and keep the first one's description."""
    errors = None
    match = _SUMMARY.search(text)
    if match:
        errors = int(match.group(1))
    race = _RACE_SUMMARY.search(text)
    if race:
        errors = max(errors or 0, int(race.group(2)))
    first = api_error = None
    for line in text.splitlines():
        rest = _PREFIX.sub("", line)
        body = rest.strip()
        # An error's details (at ..., Host Frame ..., in libcuda.so) are indented under its headline.
        if not line.startswith("=") or not body or rest[:1].isspace():
            continue
        if body.startswith("Program hit"):  # an API error: the first error only if no other is reported
            api_error = api_error or body
            continue
        if body.startswith(("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY",
                            "Saved host backtrace", "Host Frame", "Device Frame", "at ", "by thread",
                            "Address ", "Target application returned")):
            continue
        first = body
        break
    first = first or api_error
    return {"errors": errors, "first_error": first if errors else None}


def judge(tool: str, returncode: int, report: dict, log_path: str) -> dict:
    if report["errors"] is None:
        return {"tool": tool, "status": "fail", "errors": None, "log": log_path,
                "reason": f"no summary in the {tool} report (target exit {returncode}); see {log_path}"}
    if report["errors"] > 0:
        return {"tool": tool, "status": "fail", "errors": report["errors"], "log": log_path,
                "reason": f"{report['errors']} error(s); first: {report['first_error']}"}
    if returncode != 0:
        return {"tool": tool, "status": "fail", "errors": 0, "log": log_path,
                "reason": f"the target exited {returncode} under {tool}; see {log_path}"}
    return {"tool": tool, "status": "pass", "errors": 0, "log": log_path, "reason": ""}


def run_tools(sanitizer: str, tools: list[str], padding_bytes: int, target: list[str], log_dir: Path) -> list[dict]:
    """Run every tool at once (none of them times anything) and judge each from its log."""
    env = {**os.environ, **SANITIZER_ENV}
    procs = []
    for tool in tools:
        log_path = log_dir / f"{tool}.log"
        if log_path.exists():
            log_path.unlink()
        argv = tool_command(sanitizer, tool, padding_bytes, str(log_path), target)
        out_path = log_dir / f"{tool}.stdout.log"
        handle = open(out_path, "w")
        procs.append((tool, log_path, handle, subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, env=env)))
    results = []
    for tool, log_path, handle, proc in procs:
        try:
            returncode = proc.wait(timeout=TOOL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            returncode = -9
        handle.close()
        text = log_path.read_text() if log_path.exists() else ""
        results.append(judge(tool, returncode, parse_report(text), str(log_path)))
    return results


def verdict(results: list[dict]) -> dict:
    failed = [r for r in results if r["status"] != "pass"]
    return {"status": "fail" if failed else "pass", "tools": results,
            "reasons": [f"{r['tool']}: {r['reason']}" for r in failed]}


TARGET = Path(__file__).resolve().parents[1] / "sanitizer_target.py"


def check_variant(sanitizer: str, cfg: dict, variant, build_verdict: Path, log_dir: Path,
                  card: Path | None = None) -> dict:
    """Every tool of the config's `sanitizer` section over one process that runs `variant` (built as
    `build_verdict` says) on the config's small shape and the variant's own sanitizer_shapes; the
    verdict records both. The target writes the card it ran on to `card` when given
    (provenance.report_card)."""
    target = [sys.executable, str(TARGET), "--variant", variant.name, "--variant-dir", str(variant.folder),
              "--build", str(build_verdict),
              "--B", str(cfg["shape"]["B"]), "--H", str(cfg["shape"]["H"]), "--S", str(cfg["shape"]["S"])]
    # The shapes go on the command line: the target would otherwise read them from variant.yaml on
    # disk, and a variant object given other shapes (a test, a candidate) would record shapes that
    # never ran.
    target += ["--shapes", ";".join(f"{s['B']},{s['H']},{s['S']}" for s in variant.sanitizer_shapes)]
    target += ["--card", str(card)] if card else []
    log_dir.mkdir(parents=True, exist_ok=True)
    result = verdict(run_tools(sanitizer, cfg["tools"], cfg["padding_bytes"], target, log_dir))
    result.update(shape=cfg["shape"], variant_shapes=variant.sanitizer_shapes, padding_bytes=cfg["padding_bytes"],
                  environment=ALLOCATION[variant.kind])
    return result
