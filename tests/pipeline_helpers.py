"""Driving the workflow from tests: copy the repository tree into a temporary folder, run
Snakemake there, read what a dry-run plans. Shared by tests/test_workflow.py (CPU) and
tests/test_broken_variants.py (the broken-kernel suite, on a GPU)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from planted import materialize

REPO = Path(__file__).resolve().parents[1]
MUTANTS = REPO / "tests" / "mutants"
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
TREE = ["Snakefile", "workflow", "config", "kernels", "scripts", "envs"]
# This interpreter's bin/ first, so the rules' `python3` is the one running the tests.
PATH_WITH_PYTHON = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
CPU_ENV = {**os.environ, "EVO_SDPA_FORCE_CPU": "1", "PATH": PATH_WITH_PYTHON}
DEVICE_ENV = {**{k: v for k, v in os.environ.items() if k != "EVO_SDPA_FORCE_CPU"},
              "PATH": PATH_WITH_PYTHON}
SHARED_KERNEL_DIR = "common"


def copy_tree(dest: Path, kernels: list[str] | None = None) -> Path:
    """The repository's workflow tree under `dest`. With `kernels`, kernels/ holds only those
    variant folders (and kernels/common), so variants being written elsewhere in the working
    tree cannot break discovery in the copy."""
    for name in TREE:
        src = REPO / name
        if name == "kernels" and kernels is not None:
            for folder in [SHARED_KERNEL_DIR, *kernels]:
                shutil.copytree(src / folder, dest / name / folder,
                                ignore=shutil.ignore_patterns("__pycache__"))
        elif src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / name)
    return dest


def add_mutants(root: Path, names: list[str]) -> None:
    """Write test mutants (tests/mutants/<name>/: parent + planted.patch) into the copy's
    kernels/, as a user adds a variant."""
    for name in names:
        materialize(MUTANTS / name, root / "kernels")


def snakemake(cwd: Path, *args: str, check: bool = True, env: dict | None = None,
              timeout: float = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run(SNAKEMAKE + list(args), cwd=cwd, env=CPU_ENV if env is None else env,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def planned_jobs(cwd: Path, *args: str) -> set[tuple[str, str]]:
    """(rule, variant or '') for every job a dry-run would run."""
    out = snakemake(cwd, "-n", *args, "--configfile", "config/test.yaml").stdout
    jobs = set()
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", out):
        match = re.match(r"(?:local)?rule (\w+):", block.strip())
        if match:
            wildcard = re.search(r"wildcards: variant=(\w+)", block)
            jobs.add((match.group(1), wildcard.group(1) if wildcard else ""))
    return jobs


# The rules' results layout as the summarize rule passes it (tests/test_workflow.py checks the two
# agree), rooted at a test's own results tree.
RESULTS_LAYOUT = {
    "env": "env/environment.json",
    "baseline": "baseline/sdpa.json",
    "patterns": {
        "build": "build/{variant}/verdict.json",
        "resources": "build/{variant}/resources.json",
        "sanitizer": "sanitizer/{variant}/verdict.json",
        "parity": "parity/{variant}.json",
        "bench": "bench/{variant}.json",
        "ncu": "nsight/{variant}/status.json",
        "analysis": "analysis/{variant}/bottlenecks.json",
        "evolve_curve": "evolve/{variant}/curve.json",
        "evolve_best": "evolve/{variant}/best.json",
    },
}


def layout_json(root: Path | str) -> dict:
    return {"env": f"{root}/{RESULTS_LAYOUT['env']}", "baseline": f"{root}/{RESULTS_LAYOUT['baseline']}",
            "patterns": {name: f"{root}/{pattern}" for name, pattern in RESULTS_LAYOUT["patterns"].items()}}


def layout_of(root: Path):
    from evo_sdpa.report import ResultsLayout

    return ResultsLayout.from_json(layout_json(root))
