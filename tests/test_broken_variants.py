"""The broken-kernel suite (issue 3, "Proof"): deliberately broken variants, each a small edit of
a correct one, must be caught by the stage that should catch it, with a verdict that names the
defect; the correct variants must pass the same path, so the suite cannot pass by failing
everything.

The mutants live in tests/mutants/<name>/ (never in kernels/): a variant.yaml and planted.patch,
the one planted defect as a diff against its kernels/ parent (tests/planted.py writes the full
variant), described at the top of the entry source and marked `PLANTED DEFECT` where it is. The GPU tests (marked `gpu`) drop them into a copy of the repository
and run the pipeline once, in one Snakemake invocation, on the small test configuration. The CPU
tests check that every mutant's metadata validates and that the CUDA ones compile cleanly (they
are wrong, not uncompilable). The Triton mutants also run under the Triton interpreter on the CPU:
tests/test_broken_triton.py.
"""
from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from evo_sdpa.variants import KERNELS_DIR, load_variant
from planted import build_all, materialized
from pipeline_helpers import DEVICE_ENV, MUTANTS, add_mutants, copy_tree, snakemake


@dataclass(frozen=True)
class Catch:
    """Where a mutant must be caught: the stage, for the sanitizer the tool, and a pattern its
    verdict's reason must match (the words that name the defect)."""
    stage: str
    reason: str
    tool: str | None = None


# The words that name each defect in a verdict. Parity's first cases are the hand-worked oracle
# (S = 3, scale 1), then the matrix; both say "max abs error E above B" and "N NaN/Inf outputs".
ABOVE_BOUND = r"max abs error (?!inf)[0-9][0-9.e+-]* above"
UNWRITTEN = r"NaN/Inf outputs \(unwritten elements stay NaN-poisoned\)"

# Every mutant folder under tests/mutants and the stage that must catch it.
CUDA_MUTANTS = {
    "oob_write": Catch("sanitizer", r"Invalid __global__ write", tool="memcheck"),
    "smem_race": Catch("sanitizer", r"RAW hazard", tool="racecheck"),  # read-after-write
    "wrong_scale": Catch("parity", ABOVE_BOUND),
    "unwritten_tail": Catch("parity", UNWRITTEN),
    # Parity's run-twice check agrees (same q, same saved output); the catch comes from parity's
    # next case of the same shape, whose new q is handed the freed block of the last one by
    # PyTorch's caching allocator: same address, new contents, stale output. See
    # test_output_cache_is_caught_by_parity_at_a_reused_address.
    "output_cache": Catch("parity", ABOVE_BOUND),
    "launch_order": Catch("parity", r"two runs on the same input disagree"),
}
TRITON_MUTANTS = {
    "triton_wrong_scale": Catch("parity", ABOVE_BOUND),
    "triton_unwritten_tail": Catch("parity", UNWRITTEN),
}
MUTANTS_CATALOGUE = {**CUDA_MUTANTS, **TRITON_MUTANTS}
# The mutants' parents: the CUDA mutants are edits of v1_scalar, smem_race of v2_tiled (the
# first rung with shared memory), the Triton ones of triton_flash.
CORRECT = ("v1_scalar", "v2_tiled", "triton_flash")
# The funnel in order; a mutant caught at one stage must have passed every stage before it.
FUNNEL = ("build", "sanitizer", "parity", "bench")
PASSED = {"build": "pass", "sanitizer": "pass", "parity": "pass", "bench": "measured"}
DEFAULT_CC = "9.0"


# ---------------------------------------------------------------- CPU: the mutants themselves

def test_catalogue_names_every_mutant_folder():
    folders = {p.name for p in MUTANTS.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    assert folders == set(MUTANTS_CATALOGUE)
    assert not set(MUTANTS_CATALOGUE) & {p.name for p in KERNELS_DIR.iterdir()}, \
        "mutants belong in tests/mutants, never in kernels/"


@pytest.mark.parametrize("name", sorted(MUTANTS_CATALOGUE))
def test_mutant_metadata_validates_and_names_its_defect(name):
    variant = load_variant(materialized(MUTANTS / name))  # schema check; name == folder name
    assert variant.name == name
    assert variant.kind == ("triton" if name in TRITON_MUTANTS else "cuda")
    entry = variant.sources[0].read_text()
    assert f"MUTANT {name}" in entry.splitlines()[0], "the entry source opens with what is planted"
    assert "PLANTED DEFECT" in entry


@pytest.fixture(scope="module")
def nvcc_builds(tmp_path_factory):
    """Every CUDA mutant built with the build stage's own function, once."""
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    return build_all([MUTANTS / name for name in CUDA_MUTANTS], tmp_path_factory.mktemp("builds"),
                     DEFAULT_CC)


@pytest.mark.parametrize("name", sorted(CUDA_MUTANTS))
def test_cuda_mutant_compiles_with_a_pass_verdict(nvcc_builds, name):
    """Wrong, not uncompilable: the build stage must pass each one (no warnings, no spills), so
    the stage that catches it is a later one."""
    verdict, resources, log = nvcc_builds[name]
    assert verdict["status"] == "pass", (verdict["reasons"], log[-2000:])
    assert Path(verdict["artifact"]).is_file()
    assert resources and all(r["spill_store_bytes"] == 0 for r in resources)
    if name == "smem_race":
        assert "__shared__" in (materialized(MUTANTS / name) / "kernel.cu").read_text(), "a race needs shared memory"


# ---------------------------------------------------------------- GPU: through the pipeline

def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def stage_records(root: Path, variant: str) -> dict[str, dict]:
    results = root / "results"
    paths = {"build": results / "build" / variant / "verdict.json",
             "sanitizer": results / "sanitizer" / variant / "verdict.json",
             "parity": results / "parity" / f"{variant}.json",
             "bench": results / "bench" / f"{variant}.json",
             "ncu": results / "nsight" / variant / "status.json"}
    return {stage: read_json(path) for stage, path in paths.items() if path.exists()}


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory) -> Path:
    """One Snakemake invocation over a copy of the repository holding the correct variants and
    every mutant: each mutant up to its profile status (reached quickly: a variant that failed a
    gate is never profiled), each correct variant up to its bench."""
    root = copy_tree(tmp_path_factory.mktemp("broken"), kernels=list(CORRECT))
    mutants = sorted(MUTANTS_CATALOGUE)
    add_mutants(root, mutants)
    variants = list(CORRECT) + mutants
    targets = ([f"results/nsight/{m}/status.json" for m in mutants]
               + [f"results/bench/{c}.json" for c in CORRECT])
    # gpu=4: the check stages of several variants share the card (nothing here is a timing that
    # is asserted on); --keep-going so one harness crash does not hide the other verdicts.
    # (--config takes every word after it: it comes last)
    proc = snakemake(root, *targets, "--cores", "16", "--resources", "gpu=4", "--keep-going",
                     "--configfile", "config/test.yaml", "--config", f"variants=[{','.join(variants)}]",
                     env=DEVICE_ENV, timeout=1500, check=False)
    if proc.returncode != 0:
        logs = "\n".join(f"--- {p.relative_to(root)}\n{p.read_text()[-1500:]}"
                         for p in sorted((root / "results" / "logs").rglob("*.log")))
        raise AssertionError(f"snakemake failed:\n{proc.stderr[-4000:]}\n{logs[-12000:]}")
    return root


def assert_caught(root: Path, name: str, catch: Catch) -> None:
    records = stage_records(root, name)
    caught = records[catch.stage]
    where = f"{name}: {catch.stage} verdict {json.dumps(caught)[:3000]}"
    assert caught["status"] == "fail", where
    if catch.tool:
        tool = next(t for t in caught["tools"] if t["tool"] == catch.tool)
        assert tool["status"] == "fail", where
        assert re.search(catch.reason, tool["reason"]), where
        assert any(r.startswith(f"{catch.tool}: ") and re.search(catch.reason, r)
                   for r in caught["reasons"]), where
    else:
        assert re.search(catch.reason, "; ".join(caught["reasons"])), where
    # every earlier gate passed: the defect went through them, as it should
    for stage in FUNNEL[:FUNNEL.index(catch.stage)]:
        assert records[stage]["status"] == PASSED[stage], f"{name}: {stage} {records[stage]}"
    # every later measuring stage did not run, and names the root cause
    for stage in ("bench", "ncu"):
        if stage == catch.stage:
            continue
        record = records[stage]
        assert record["status"] == "skipped", f"{name}: {stage} {record}"
        assert record["cause"]["stage"] == catch.stage, f"{name}: {stage} {record}"
        assert record["cause"]["status"] == "fail"
        assert re.search(catch.reason, record["cause"]["reason"]), f"{name}: {stage} {record}"
        assert f"{catch.stage} failed" in record["reasons"][0]


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(MUTANTS_CATALOGUE))
def test_mutant_is_caught_by_its_stage(pipeline_run, name):
    assert_caught(pipeline_run, name, MUTANTS_CATALOGUE[name])


@pytest.mark.gpu
@pytest.mark.parametrize("name", CORRECT)
def test_correct_variant_passes_the_same_path(pipeline_run, name):
    """The same run, the same config: the parents of the mutants pass every gate and are
    measured, so the suite cannot pass by failing everything (and the stage that catches a
    mutant is reacting to its planted defect, not to its parent)."""
    records = stage_records(pipeline_run, name)
    for stage in FUNNEL:
        assert records[stage]["status"] == PASSED[stage], f"{name}: {stage} {records[stage]}"
    assert all(t["status"] == "pass" for t in records["sanitizer"]["tools"])
    assert records["parity"]["cases"] > 0 and records["parity"]["failed"] == 0
    measured = [c for c in records["bench"]["cases"] if c["status"] == "measured"]
    assert measured and all(c["recheck"]["status"] == "pass" for c in measured)


@pytest.mark.gpu
def test_oob_write_reaches_past_the_output_only_in_its_store(pipeline_run):
    """The planted defect is a write: memcheck reports no invalid read of this kernel."""
    log = (pipeline_run / "results" / "sanitizer" / "oob_write" / "memcheck.log").read_text()
    assert "Invalid __global__ write" in log
    assert "Invalid __global__ read" not in log


@pytest.mark.gpu
def test_output_cache_is_caught_by_parity_at_a_reused_address(pipeline_run):
    """Which stage catches output caching, and how (seen on an H200). Parity runs each case twice
    on one input, and the cache agrees with itself; but every case allocates new inputs after the
    last case's were freed, and PyTorch's caching allocator hands back the same block: from the
    second case of a shape on, the kernel is called with q at the address of the first case's q,
    new contents, and copies the first case's output. The verdict names that case's error: not
    NaN (the saved output is finite), not a disagreement (both runs copy the same saved output).
    The oracle cases pass: each is a new (dtype, D, causal) key. The bench's re-check would be
    the next line (test_bench_recheck_catches_output_cache_on_every_shape), never reached."""
    parity = read_json(pipeline_run / "results" / "parity" / "output_cache.json")
    oracle = [r for r in parity["records"] if r["distribution"] == "oracle"]
    matrix = [r for r in parity["records"] if r["distribution"] != "oracle"]
    assert oracle and all(r["status"] == "pass" for r in oracle)

    def shape_of(record):
        return (record["dtype"], record["D"], record["causal"], record["S"], record["B"], record["H"])

    first_of_shape = {}
    for record in matrix:
        first_of_shape.setdefault(shape_of(record), record)
    later = [r for r in matrix if r is not first_of_shape[shape_of(r)]]
    assert all(r["status"] == "pass" for r in first_of_shape.values()), "a new key computes"
    failed = [r for r in matrix if r["status"] == "fail"]
    assert failed and all(r in later for r in failed)
    assert all("above bound" in r["reason"] and r["deterministic"] and r["nonfinite"] == 0 for r in failed)
    # S > 1: every later case gets the stale output. (S = 1 is the output v, and make_qkv draws
    # v third from one seed for normal, large and dominant_key alike, so stale can equal right.)
    assert all(r["status"] == "fail" for r in later if r["S"] > 1)


@pytest.fixture(scope="module")
def gpu_test_config():
    import yaml

    base = yaml.safe_load((KERNELS_DIR.parent / "config" / "config.yaml").read_text())
    small = yaml.safe_load((KERNELS_DIR.parent / "config" / "test.yaml").read_text())
    return {**base, **small}


def built_forward(name: str, tmp_path: Path):
    import torch

    from evo_sdpa.build import build_cuda
    from evo_sdpa.runners import load_forward

    major, minor = torch.cuda.get_device_capability()
    variant = load_variant(materialized(MUTANTS / name) if name in MUTANTS_CATALOGUE else KERNELS_DIR / name)
    verdict, _, log = build_cuda(variant, f"{major}.{minor}", tmp_path)
    assert verdict["status"] == "pass", log[-2000:]
    return variant, load_forward(variant, verdict["artifact"])


def run_bench(variant, forward, cfg):
    import logging

    from evo_sdpa.bench import run
    from evo_sdpa.config import suite_shapes
    from evo_sdpa.tolerance import ToleranceRule

    return run(variant, forward, suite_shapes(cfg, cfg["bench_suite"]), cfg["dtypes"], cfg["timing"],
               ToleranceRule.from_config(cfg["tolerance"]), None, logging.getLogger("test"))


def rechecks(result: dict) -> dict[str, str]:
    return {f"{c['label']} {c['dtype']}": c["recheck"]["status"] for c in result["cases"]
            if c["status"] == "measured"}


# Seen on an H200: the re-check catches these two only on the eager-only shape (S=128), where
# the fresh tensors land at the timed ones' addresses after torch.cuda.empty_cache(). On the graph
# shape (S=64) the last host call was the capture of input set 3, the fresh q lands elsewhere,
# and the re-check passes. Refilling the first timed set in place (seen on an H100) still passed
# there: the graph's last call used another set. The re-check refills the buffers of the
# variant's last call and re-poisons its `out`, which catches both on every shape.
@pytest.mark.gpu
def test_bench_recheck_catches_output_cache_on_every_shape(gpu_test_config, tmp_path):
    """The second line of defence: had parity missed output_cache, would the bench's re-check on
    fresh inputs after the timing loop catch it? The bench stage's library, run directly on it."""
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    variant, forward = built_forward("output_cache", tmp_path)
    result = run_bench(variant, forward, gpu_test_config)
    print("output_cache bench:", result["status"], rechecks(result))
    assert result["status"] == "fail"
    assert "output wrong on fresh inputs" in result["reasons"][0]
    assert set(rechecks(result).values()) == {"fail"}, rechecks(result)


@pytest.mark.gpu
def test_bench_catches_a_forward_that_skips_repeated_identical_calls(gpu_test_config, tmp_path):
    """A gamed forward the suite's output_cache does not cover: it returns at once when called
    again with exactly the arguments of its last call (same q, k, v and out), leaving in `out`
    what the last launch wrote. Parity never repeats all four pointers (two outputs per case);
    the eager timing loop does on every call (seen: 1.3 us a call, a 6x "speedup" over SDPA on
    the S=64 shape, no sanity flag); only the re-check can catch it."""
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    variant, honest = built_forward("v1_scalar", tmp_path)
    last = {}

    def skipping(q, k, v, out, causal, scale):
        key = (q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), tuple(q.shape), causal, scale)
        if last.get("key") == key:
            return
        last["key"] = key
        honest(q, k, v, out, causal, scale)

    result = run_bench(variant, skipping, gpu_test_config)
    eager = {f"{c['label']} {c['dtype']}": round(c["modes"]["eager"]["speedup_p50"], 2)
             for c in result["cases"] if c["status"] == "measured"}
    print("skip-repeat bench:", result["status"], rechecks(result), "eager speedups:", eager)
    assert result["status"] == "fail"
    assert set(rechecks(result).values()) == {"fail"}, rechecks(result)
