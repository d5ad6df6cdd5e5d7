"""Stage gating, compute-sanitizer report parsing, CI gates, the final summary and library-input lists."""
from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path

import pytest

from evo_sdpa import bench, gates, gating, report, sanitizer
from evo_sdpa.baseline import _row, _stats_row
from evo_sdpa.bottlenecks import analyze
from evo_sdpa.deps import library_inputs
from pipeline_helpers import layout_of
from evo_sdpa.device import NO_DEVICE_REASON
from evo_sdpa.errors import StageError
from evo_sdpa.io import read_json, write_json
from evo_sdpa.ncu import read_raw_csv
from evo_sdpa.parity import ParityCase, run_case
from evo_sdpa.parity import verdict as parity_verdict
from evo_sdpa.shapes import Shape
from evo_sdpa.timing import _results
from evo_sdpa.tolerance import ToleranceRule
from evo_sdpa.variants import Variant

FIXTURES = Path(__file__).parent / "fixtures"
NCU_CSV = FIXTURES / "h100_sdpa_cudnn_b2h8s512d64_raw.csv"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write(path: Path, record: dict) -> str:
    write_json(path, record)
    return str(path)


# ================================================================ gating


def test_blocked_by_passes_pass_and_measured(tmp_path):
    assert gating.blocked_by(build=write(tmp_path / "b.json", {"status": "pass", "reasons": []}),
                             bench=write(tmp_path / "m.json", {"status": "measured", "reasons": []})) is None


def test_blocked_by_names_the_failing_stage_and_reason(tmp_path):
    build = write(tmp_path / "b.json", {"status": "fail", "reasons": ["3 warnings", "12 bytes spilled"]})
    cause = gating.blocked_by(build=build)
    assert cause == {"stage": "build", "status": "fail", "reason": "3 warnings; 12 bytes spilled"}
    assert gating.describe(cause) == "build failed (3 warnings; 12 bytes spilled)"


def test_blocked_by_reads_every_record_before_it_stops(tmp_path):
    """A damaged parity record stops the stage although the sanitizer before it did not pass."""
    san = write(tmp_path / "s.json", {"status": "skipped", "reasons": ["not run: no CUDA device on this host"]})
    par = tmp_path / "p.json"
    par.write_text('{"status": "pass", "rea')
    with pytest.raises(StageError, match="p.json: not valid JSON"):
        gating.blocked_by(sanitizer=san, parity=str(par))


def test_blocked_by_takes_the_first_stage_in_argument_order(tmp_path):
    build = write(tmp_path / "b.json", {"status": "pass", "reasons": []})
    san = write(tmp_path / "s.json", {"status": "fail", "reasons": ["memcheck: 1 error(s)"]})
    par = write(tmp_path / "p.json", {"status": "fail", "reasons": ["2 of 4 cases failed"]})
    assert gating.blocked_by(build=build, sanitizer=san, parity=par)["stage"] == "sanitizer"
    assert gating.blocked_by(build=build, parity=par, sanitizer=san)["stage"] == "parity"


def test_skipped_stage_blocks_with_its_own_reason(tmp_path):
    san = write(tmp_path / "s.json", gating.skipped(f"not run: {NO_DEVICE_REASON}"))
    cause = gating.blocked_by(sanitizer=san)
    assert cause["stage"] == "sanitizer" and cause["status"] == "skipped"
    assert NO_DEVICE_REASON in cause["reason"]
    assert gating.describe(cause).startswith("sanitizer skipped (not run: ")


def test_a_failed_upstream_stage_outranks_a_missing_device_and_a_skip_does_not(tmp_path):
    failed_build = gating.blocked_by(build=write(tmp_path / "b.json", {"status": "fail", "reasons": ["1 error"]}))
    no_gpu_skip = gating.blocked_by(sanitizer=write(tmp_path / "s.json", gating.skipped(f"not run: {NO_DEVICE_REASON}")))
    assert gating.cannot_run("not measured", failed_build, NO_DEVICE_REASON)["reasons"] == [
        "not measured: build failed (1 error)"]
    assert gating.cannot_run("not measured", no_gpu_skip, NO_DEVICE_REASON)["reasons"] == [
        f"not measured: {NO_DEVICE_REASON}"]
    assert gating.cannot_run("not measured", no_gpu_skip, None)["cause"]["stage"] == "sanitizer"
    assert gating.cannot_run("not measured", None, None) is None


def test_disabled_sanitizer_does_not_block(tmp_path):
    build = write(tmp_path / "b.json", {"status": "pass", "reasons": []})
    san = write(tmp_path / "s.json", gating.skipped("disabled in the config (stages.sanitizer: false)",
                                                     disabled=True))
    par = write(tmp_path / "p.json", {"status": "pass", "reasons": []})
    assert gating.blocked_by(build=build, sanitizer=san, parity=par) is None


def test_disabled_flag_only_excuses_the_sanitizer(tmp_path):
    par = write(tmp_path / "p.json", gating.skipped("whatever", disabled=True))
    assert gating.blocked_by(parity=par)["stage"] == "parity"


def test_root_cause_propagates_through_a_chain_of_skipped_records(tmp_path):
    build = write(tmp_path / "build.json", {"status": "pass", "reasons": []})
    san = write(tmp_path / "san.json", {"status": "pass", "reasons": []})
    par = write(tmp_path / "parity.json", {"status": "fail",
                                           "reasons": ["1 of 8 cases failed; first: x: NaN"]})
    bench_cause = gating.blocked_by(build=build, sanitizer=san, parity=par)
    bench_record = gating.skipped_for("not measured", bench_cause)
    assert bench_record["status"] == "skipped"
    assert bench_record["reasons"] == ["not measured: parity failed (1 of 8 cases failed; first: x: NaN)"]
    bench_path = write(tmp_path / "bench.json", bench_record)

    ncu_cause = gating.blocked_by(bench=bench_path)
    assert ncu_cause == {"stage": "parity", "status": "fail", "reason": "1 of 8 cases failed; first: x: NaN"}
    ncu_record = gating.skipped_for("not profiled", ncu_cause, entry="v")
    assert ncu_record["entry"] == "v"
    ncu_path = write(tmp_path / "ncu.json", ncu_record)

    analysis_cause = gating.root_cause("ncu", read_json(ncu_path))
    assert analysis_cause["stage"] == "parity"
    assert gating.skipped_for("not analysed", analysis_cause)["reasons"][0].startswith("not analysed: parity failed")


def test_skipped_without_cause_has_no_cause_key():
    record = gating.skipped("not run: reason", variant="v")
    assert record == {"status": "skipped", "reasons": ["not run: reason"], "variant": "v"}


# ================================================================ sanitizer

CLEAN_MEMCHECK = """\
========= COMPUTE-SANITIZER
========= ERROR SUMMARY: 0 errors
"""

MEMCHECK_WRITE = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at v1_scalar_attention_fwd<__half, 64>(const __half *, const __half *, const __half *, __half *, int, int, float)+0x1a70 in kernel.cu:142
=========     by thread (31,0,0) in block (16,1,0)
=========     Address 0x7f3a1e000c00 is out of bounds
=========     and is 1 bytes after the nearest allocation at 0x7f3a1e000000 of size 3072 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========     Host Frame: [0x2f285f]
=========                in /lib/x86_64-linux-gnu/libcuda.so.1
=========     Host Frame:evo_sdpa_forward [0x1b2c]
=========                in libv1_scalar.so
=========
========= Invalid __global__ write of size 4 bytes
=========     at v1_scalar_attention_fwd<__half, 64>(const __half *, const __half *, const __half *, __half *, int, int, float)+0x1a70 in kernel.cu:142
=========     by thread (0,0,0) in block (17,1,0)
=========     Address 0x7f3a1e000c80 is out of bounds
=========
========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API call to cudaStreamSynchronize.
=========     Saved host backtrace up to driver entry point at error
=========
========= Target application returned an error
========= ERROR SUMMARY: 3 errors
"""

RACECHECK_HAZARD = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at smem_tile_fwd(const __half *, __half *)+0x3d0 in tile.cu:51
=========     and Read access at smem_tile_fwd(const __half *, __half *)+0x450 in tile.cu:58 [1024 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
"""

RACECHECK_CLEAN = """\
========= COMPUTE-SANITIZER
========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)
"""


def test_parse_clean_memcheck():
    assert sanitizer.parse_report(CLEAN_MEMCHECK) == {"errors": 0, "first_error": None}


def test_parse_memcheck_invalid_write():
    parsed = sanitizer.parse_report(MEMCHECK_WRITE)
    assert parsed == {"errors": 3, "first_error": "Invalid __global__ write of size 4 bytes"}


def test_parse_racecheck_hazard():
    parsed = sanitizer.parse_report(RACECHECK_HAZARD)
    assert parsed["errors"] == 1
    assert parsed["first_error"].startswith("Error: Race reported between Write access")


def test_parse_clean_racecheck():
    assert sanitizer.parse_report(RACECHECK_CLEAN) == {"errors": 0, "first_error": None}


API_ERROR_ONLY = """\
========= COMPUTE-SANITIZER
========= Program hit cudaErrorInvalidValue (error 1) due to "invalid argument" on CUDA API call to cudaMemcpyAsync.
=========     Saved host backtrace up to driver entry point at error
=========     Host Frame: [0x2f285f]
=========                in /lib/x86_64-linux-gnu/libcuda.so.1
=========
========= ERROR SUMMARY: 1 error
"""


def test_parse_api_error_only_names_the_api_error_not_a_frame():
    parsed = sanitizer.parse_report(API_ERROR_ONLY)
    assert parsed["errors"] == 1
    assert parsed["first_error"].startswith("Program hit cudaErrorInvalidValue")


def test_parse_prefers_a_device_error_over_an_earlier_api_error():
    text = API_ERROR_ONLY.replace("========= ERROR SUMMARY: 1 error\n", "") + \
        MEMCHECK_WRITE.split("\n", 1)[1].replace("3 errors", "4 errors")
    parsed = sanitizer.parse_report(text)
    assert parsed == {"errors": 4, "first_error": "Invalid __global__ write of size 4 bytes"}


def test_parse_missing_summary():
    assert sanitizer.parse_report("") == {"errors": None, "first_error": None}
    truncated = MEMCHECK_WRITE.split("========= ERROR SUMMARY")[0]
    assert sanitizer.parse_report(truncated)["errors"] is None


def test_judge_outcomes():
    log = "results/sanitizer/v/memcheck.log"
    clean = sanitizer.judge("memcheck", 0, sanitizer.parse_report(CLEAN_MEMCHECK), log)
    assert clean == {"tool": "memcheck", "status": "pass", "errors": 0, "log": log, "reason": ""}

    found = sanitizer.judge("memcheck", 1, sanitizer.parse_report(MEMCHECK_WRITE), log)
    assert found["status"] == "fail" and found["errors"] == 3
    assert found["reason"] == "3 error(s); first: Invalid __global__ write of size 4 bytes"

    race = sanitizer.judge("racecheck", 0, sanitizer.parse_report(RACECHECK_HAZARD), log)
    assert race["status"] == "fail" and "Race reported" in race["reason"]

    missing = sanitizer.judge("initcheck", -9, sanitizer.parse_report(""), log)
    assert missing["status"] == "fail" and missing["errors"] is None
    assert "no summary" in missing["reason"] and "-9" in missing["reason"] and log in missing["reason"]

    crashed = sanitizer.judge("synccheck", 134, sanitizer.parse_report(CLEAN_MEMCHECK), log)
    assert crashed["status"] == "fail" and crashed["errors"] == 0
    assert "exited 134" in crashed["reason"]


def test_sanitizer_verdict_lists_each_failing_tool():
    results = [sanitizer.judge("memcheck", 0, sanitizer.parse_report(CLEAN_MEMCHECK), "m.log"),
               sanitizer.judge("racecheck", 0, sanitizer.parse_report(RACECHECK_HAZARD), "r.log")]
    result = sanitizer.verdict(results)
    assert result["status"] == "fail"
    assert len(result["reasons"]) == 1 and result["reasons"][0].startswith("racecheck: 1 error(s)")
    assert sanitizer.verdict(results[:1])["status"] == "pass"


def test_tool_command_adds_padding_only_for_memcheck():
    target = ["python", "target.py", "--S", "67"]
    for tool in ("memcheck", "racecheck", "initcheck", "synccheck"):
        argv = sanitizer.tool_command("compute-sanitizer", tool, 256, f"/tmp/{tool}.log", target)
        assert argv[0] == "compute-sanitizer"
        assert argv[argv.index("--tool") + 1] == tool
        assert argv[argv.index("--log-file") + 1] == f"/tmp/{tool}.log"
        assert argv[-len(target):] == target, "the target comes last"
        if tool == "memcheck":
            assert argv[argv.index("--padding") + 1] == "256"
        else:
            assert "--padding" not in argv
        assert ("--racecheck-report" in argv) == (tool == "racecheck")


FAKE_SANITIZER = """#!{python}
import os, sys
log = sys.argv[sys.argv.index("--log-file") + 1]
target = sys.argv[sys.argv.index("--print-limit") + 2:]
while target[0].startswith("--"):   # a tool's own options, then the target
    target = target[2:]
errors = [name + "=" + os.environ.get(name, "") for name in ("PYTORCH_NO_CUDA_MEMORY_CACHING", "CUDA_LAUNCH_BLOCKING")
          if os.environ.get(name) != "1"]
with open(log, "w") as out:
    for error in errors:
        out.write("========= the target ran with " + error + "\\n")
    out.write("========= ERROR SUMMARY: %d errors\\n" % len(errors))
sys.exit(os.spawnv(os.P_WAIT, target[0], target))
"""


def test_every_sanitizer_tool_runs_its_target_without_the_caching_allocator(tmp_path, monkeypatch):
    assert sanitizer.SANITIZER_ENV["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"
    fake = tmp_path / "compute-sanitizer"
    fake.write_text(FAKE_SANITIZER.format(python=sys.executable))
    fake.chmod(0o755)
    target = [sys.executable, "-c", "pass"]
    monkeypatch.setenv("PYTORCH_NO_CUDA_MEMORY_CACHING", "0")   # what the caller's shell had
    results = sanitizer.run_tools(str(fake), ["memcheck", "racecheck", "initcheck", "synccheck"], 256, target, tmp_path)
    assert [(r["tool"], r["status"]) for r in results] == [
        ("memcheck", "pass"), ("racecheck", "pass"), ("initcheck", "pass"), ("synccheck", "pass")]
    monkeypatch.setattr(sanitizer, "SANITIZER_ENV", {"CUDA_LAUNCH_BLOCKING": "1"})   # the setting dropped
    (dropped,) = sanitizer.run_tools(str(fake), ["memcheck"], 256, target, tmp_path)
    assert dropped["status"] == "fail" and dropped["reason"] == (
        "1 error(s); first: the target ran with PYTORCH_NO_CUDA_MEMORY_CACHING=0")


# ================================================================ a fake results/ tree

H100 = "NVIDIA H100 80GB HBM3"
CEILINGS = {"copy_gbps": 2900.0, "copy_bytes": 1 << 30, "matmul_tflops": {"fp16": 720.0, "bf16": 730.0},
            "matmul_n": 8192}
PROFILE = {"shape": {"B": 2, "H": 8, "S": 512, "D": 64, "causal": False}, "dtype": "fp16", "launch_count": 4}
CFG = {"bench_suite": "canonical", "profile": PROFILE}
RULE = ToleranceRule(4.0, {"fp16": 1e-3, "bf16": 8e-3})
SMALL = Shape(2, 8, 512, 64, False, graph=True)
LARGE = Shape(4, 16, 2048, 128, True)
WIDE = Shape(1, 8, 512, 256, False)          # D=256: outside the variants' support
SUITE = [SMALL, LARGE, WIDE]
# p50 microseconds (variant, sdpa) per shape and timing mode.
TIMES = {SMALL.label: {"eager": (50.0, 45.0), "graph": (5.0, 10.0)},
         LARGE.label: {"eager": (200.0, 144.0)}}
SUPPORT = {"dtypes": ["fp16", "bf16"], "head_dims": [64, 128], "causal": [True, False],
           "layouts": ["bhsd"], "min_compute_capability": "8.0", "max_seq_len": None}


def series(p50_us: float) -> list[float]:
    """Samples whose median is p50_us, with a tail (p90 > p50)."""
    return [p50_us * (1 + 0.004 * (i - 15)) for i in range(31)]


def fake_time_shape(factories, shape, dtype, timing, seed=0):
    """Canned timings; like the real one it makes each callable on an input set first."""
    import torch

    assert set(factories) == {"variant", "sdpa"}
    qkv = [torch.randn(shape.B, shape.H, shape.S, shape.D) for _ in range(3)]
    for make in factories.values():
        make(*qkv)
    result = {}
    for mode, (variant_us, sdpa_us) in TIMES[shape.label].items():
        label = "eager" if mode == "eager" else f"graph x{timing['graph_calls']}"
        result[mode] = _results({"variant": series(variant_us), "sdpa": series(sdpa_us)}, "converged",
                                mode=label, cache="L2 flushed before each call")
    return result


def sdpa_forward(q, k, v, out, causal, scale):
    import torch.nn.functional as F

    out.copy_(F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale))


def wrong_scale_forward(q, k, v, out, causal, scale):
    sdpa_forward(q, k, v, out, causal, 2 * scale)


def analysis_record(entry: str) -> dict:
    shape = Shape.from_dict(PROFILE["shape"])
    result = analyze(read_raw_csv(NCU_CSV), flops=shape.flops, ceilings=CEILINGS,
                     min_bytes=shape.min_bytes("fp16"), dtype="fp16")
    result.update(entry=entry, status="analysed", reasons=[], shape=shape.to_dict(), dtype="fp16", device=H100)
    return result


def parity_record(name: str, forward) -> dict:
    cases = [ParityCase("fp16", 1, 2, 17, 64, causal, "normal", 0) for causal in (False, True)]
    records = [run_case(case, forward, RULE, "cpu") for case in cases]
    result = parity_verdict(records, f"python scripts/run_parity.py --variant {name}")
    result.update(variant=name, device="cuda", tier="quick", gpu_tier="quick", interpreter=False,
                  records=records)
    return result


def sanitizer_record(name: str) -> dict:
    tools = ["memcheck", "racecheck", "initcheck", "synccheck"]
    results = [sanitizer.judge(t, 0, sanitizer.parse_report(RACECHECK_CLEAN if t == "racecheck"
                                                            else CLEAN_MEMCHECK), f"{t}.log") for t in tools]
    return {**sanitizer.verdict(results), "variant": name}


def write_common(results: Path, cuda: bool, baseline_note: str | None) -> None:
    env = {"host": "h", "git": {"commit": "0123456789abcdef0123", "dirty": True},
           "versions": {"torch": "2.11.0", "triton": "3.5.0"}}
    if cuda:
        env.update(cuda=True, device={"name": H100, "compute_capability": "9.0"}, ceilings=CEILINGS)
    else:
        env.update(cuda=False, device=None, ceilings=None,
                   not_measured=f"device properties and ceilings: {NO_DEVICE_REASON}")
    write_json(results / "env" / "environment.json", env)
    measured = {**_row(SMALL, "fp16", "default", "cuda"), "picked_backend": "cudnn",
                **_stats_row(_results({"default": series(9.3)}, "converged", "eager", "L2 flushed")["default"],
                             SMALL, "fp16")}
    unsupported = {**_row(WIDE, "fp16", "flash", "cuda"), "mode": "eager", "status": "unsupported",
                   "reason": "No available kernel"}
    write_json(results / "baseline" / "sdpa.json", {"device": H100 if cuda else "cpu", "suite": "canonical",
                                                    "note": baseline_note, "rows": [measured, unsupported]})


def write_stages(results: Path, name: str, records: dict) -> None:
    for stage, path in report.stage_paths(layout_of(results), name).items():
        if stage in records:
            write_json(path, records[stage])
    if "build" in records:  # what the build read off the compiled kernels (none when it compiled nothing)
        kernels = [] if records["build"].get("note") else [KERNEL_RESOURCES]
        write_json(layout_of(results).path("resources", name), {"variant": name, "kernels": kernels})


KERNEL_RESOURCES = {"kernel": "attention_fwd", "registers": 96, "spill_store_bytes": 0, "spill_load_bytes": 0}
IMPORTED_ONLY = ("imported only; Triton compiles at first launch and the kernel resources are read on a "
                 f"GPU host ({NO_DEVICE_REASON})")


def build_record(name: str, kind: str, compiled: bool = True) -> dict:
    record = {"status": "pass", "reasons": [], "artifact": f"results/build/{name}/lib{name}.so",
              "variant": name, "kind": kind, "compute_capability": "9.0"}
    return record if compiled else {**record, "note": IMPORTED_ONLY}


@pytest.fixture
def gpu_tree(tmp_path, monkeypatch) -> Path:
    """results/ after a GPU run: 'good' (cuda) measured end to end, 'bad' (triton) failed parity."""
    results = tmp_path / "results"
    write_common(results, cuda=True, baseline_note=None)
    write_json(results / "analysis" / "sdpa" / "bottlenecks.json", analysis_record("sdpa"))

    monkeypatch.setattr(bench, "time_shape", fake_time_shape)
    monkeypatch.setattr(bench, "recheck", lambda *a: {"status": "pass", "max_abs": 1e-4,
                                                      "sdpa_max_abs": 1e-4, "bound": 1.4e-3})
    monkeypatch.setattr(bench, "sm_clock_mhz", lambda: 1980)
    monkeypatch.setattr(bench, "spin_up_clock", lambda: {"status": "at clock"})
    good = Variant("good", tmp_path / "kernels" / "good",
                   {"name": "good", "kind": "cuda", "support": SUPPORT, "sources": ["kernel.cu"]})
    timing = {"warmup_ms": 5, "min_samples": 5, "min_time_ms": 5, "max_time_ms": 200, "rel_spread": 0.2,
              "l2_flush": True, "graph_calls": 32}
    bench_result = bench.run(good, sdpa_forward, SUITE, ["fp16"], timing, RULE, CEILINGS,
                             logging.getLogger("test"))
    bench_result.update(device=H100, variant="good")
    write_stages(results, "good", {
        "build": build_record("good", "cuda"),
        "sanitizer": sanitizer_record("good"),
        "parity": parity_record("good", sdpa_forward),
        "bench": bench_result,
        "ncu": {"status": "measured", "reasons": [], "entry": "good"},
        "analysis": analysis_record("good"),
    })

    paths = report.stage_paths(layout_of(results), "bad")
    write_stages(results, "bad", {"build": build_record("bad", "triton"), "sanitizer": sanitizer_record("bad"),
                                  "parity": parity_record("bad", wrong_scale_forward)})
    cause = gating.blocked_by(build=str(paths["build"]), sanitizer=str(paths["sanitizer"]),
                              parity=str(paths["parity"]))
    write_json(paths["bench"], gating.skipped_for("not measured", cause, variant="bad"))
    ncu_record = gating.skipped_for("not profiled", gating.blocked_by(bench=str(paths["bench"])), entry="bad")
    write_json(paths["ncu"], ncu_record)
    write_json(paths["analysis"], gating.skipped_for("not analysed", gating.root_cause("ncu", ncu_record),
                                                     entry="bad"))
    return results


@pytest.fixture
def gpu_leaderboard(gpu_tree) -> dict:
    return report.build_leaderboard(layout_of(gpu_tree), ["bad", "good"], CFG, [s.label for s in SUITE])


def by_name(leaderboard: dict) -> dict:
    return {entry["name"]: entry for entry in leaderboard["variants"]}


# ---------------------------------------------------------------- the bench records the report reads


def test_bench_run_writes_the_modes_the_report_reads(gpu_tree):
    bench_result = read_json(gpu_tree / "bench" / "good.json")
    assert bench_result["status"] == "measured" and bench_result["sanity_flags"] == []
    statuses = {(c["label"], c["dtype"]): c["status"] for c in bench_result["cases"]}
    assert statuses == {(SMALL.label, "fp16"): "measured", (LARGE.label, "fp16"): "measured",
                        (WIDE.label, "fp16"): "skipped"}
    small = next(c for c in bench_result["cases"] if c["label"] == SMALL.label)
    assert small["primary_mode"] == "graph" and set(small["modes"]) == {"eager", "graph"}
    assert small["modes"]["graph"]["speedup_p50"] == pytest.approx(2.0)
    assert small["modes"]["eager"]["speedup_p50"] == pytest.approx(0.9)


# ---------------------------------------------------------------- leaderboard


def test_leaderboard_funnel_and_fell_out_at(gpu_leaderboard):
    entries = by_name(gpu_leaderboard)
    assert gpu_leaderboard["device"] == H100
    assert [e["name"] for e in gpu_leaderboard["variants"]] == ["good", "bad"], "ranked by geomean speedup"
    good, bad = entries["good"], entries["bad"]
    assert good["funnel"] == {"build": "pass", "sanitizer": "pass", "parity": "pass", "bench": "measured",
                              "ncu": "measured", "analysis": "analysed"}
    assert good["fell_out_at"] is None and good["not_run_here"] == [] and good["reasons"] == {}
    assert good["kind"] == "cuda" and bad["kind"] == "triton"
    assert bad["funnel"] == {"build": "pass", "sanitizer": "pass", "parity": "fail", "bench": "skipped",
                             "ncu": "skipped", "analysis": "skipped"}
    assert bad["fell_out_at"] == "parity" and bad["not_run_here"] == [], "skipped for a failure: not 'not run'"
    # Only parity's own reason: the stages skipped because of it add nothing.
    assert list(bad["reasons"]) == ["parity"]
    assert "above bound" in bad["reasons"]["parity"]
    assert bad["parity"]["failed"] == 2 and "--case fp16-B1H2S17D64-full" in bad["parity"]["first_failure"]["repro"]
    assert bad["speedups"] == [] and bad["geomean_speedup_p50"] is None
    assert bad["bottlenecks"] == []


def test_leaderboard_speedup_rows_and_geomean(gpu_leaderboard):
    good = by_name(gpu_leaderboard)["good"]
    rows = {r["shape"]: r for r in good["speedups"]}
    assert set(rows) == {SMALL.label, LARGE.label}, "the skipped D=256 case makes no row"
    small, large = rows[SMALL.label], rows[LARGE.label]
    assert small["mode"] == "graph x32", "a graph shape reports its graph-replay number"
    assert small["speedup_p50"] == pytest.approx(2.0)
    assert small["variant_p50_us"] == pytest.approx(5.0) and small["sdpa_p50_us"] == pytest.approx(10.0)
    assert small["variant_p90_us"] > small["variant_p50_us"]
    assert small["speedup_p90"] == pytest.approx(small["sdpa_p90_us"] / small["variant_p90_us"])
    assert large["mode"] == "eager" and large["speedup_p50"] == pytest.approx(0.72)
    assert large["variant_tflops"] == pytest.approx(LARGE.flops / 200e-6 / 1e12)
    assert small["recheck"] == "pass" and small["sanity_flag"] is None and small["ended_by"] == "converged"
    assert good["geomean_speedup_p50"] == pytest.approx(math.sqrt(2.0 * 0.72))
    assert good["bottlenecks"] and {"title", "metric", "value", "lever"} <= set(good["bottlenecks"][0])


def test_leaderboard_criteria(gpu_leaderboard):
    entries = by_name(gpu_leaderboard)
    good = {c["criterion"]: c["result"] for c in entries["good"]["criteria"]}
    bad = {c["criterion"]: c["result"] for c in entries["bad"]["criteria"]}
    assert good["builds without warnings or spills"] == "met"
    assert good["memory-safe and race-free (compute-sanitizer)"] == "met"
    assert good["correct on its whole declared support (parity)"] == "met"
    assert good["faster than SDPA (p50) on at least one bench shape"] == "met"
    assert good["faster than SDPA (p50) on every bench shape"] == "not met"
    assert bad["correct on its whole declared support (parity)"] == "not met"
    assert bad["faster than SDPA (p50) on at least one bench shape"] == "not checked"
    assert bad["faster than SDPA (p50) on every bench shape"] == "not checked"
    details = {c["criterion"]: c["detail"] for c in entries["bad"]["criteria"]}
    assert details["faster than SDPA (p50) on every bench shape"] == "parity failed"
    assert {c["criterion"]: c["detail"] for c in entries["good"]["criteria"]}[
        "correct on its whole declared support (parity)"] == "tier quick on cuda"


def test_criteria_faster_everywhere():
    funnel = dict.fromkeys(report.STAGES, "pass")
    entry = {"funnel": {**funnel, "sanitizer": "skipped"}, "build_unchecked": None,
             "not_run_because": {"sanitizer": "disabled in the config (stages.sanitizer: false)"},
             "parity": {"tier": "quick", "gpu_tier": "quick", "interpreter": False, "device": "cuda"},
             "speedups": [{"shape": "A", "speedup_p50": 1.1}, {"shape": "B", "speedup_p50": 1.01}]}
    result = {c["criterion"]: c["result"] for c in report.criteria(entry, ["A", "B"])}
    assert result["faster than SDPA (p50) on every bench shape"] == "met"
    assert result["memory-safe and race-free (compute-sanitizer)"] == "not checked"
    result = {c["criterion"]: c["result"] for c in report.criteria(entry, ["A", "B", "C"])}
    assert result["faster than SDPA (p50) on every bench shape"] == "not met"
    # B is faster in fp16 and slower in bf16: not a shape it beats SDPA on
    entry["speedups"] = [{"shape": "A", "dtype": "fp16", "speedup_p50": 1.2}, {"shape": "A", "dtype": "bf16", "speedup_p50": 1.15},
                         {"shape": "B", "dtype": "fp16", "speedup_p50": 1.2}, {"shape": "B", "dtype": "bf16", "speedup_p50": 0.8}]
    result = {c["criterion"]: c["result"] for c in report.criteria(entry, ["A", "B"])}
    assert result["faster than SDPA (p50) on every bench shape"] == "not met"
    assert result["faster than SDPA (p50) on at least one bench shape"] == "met"
    entry["speedups"] = [r for r in entry["speedups"] if r["shape"] == "B"]
    result = {c["criterion"]: c["result"] for c in report.criteria(entry, ["A", "B"])}
    assert result["faster than SDPA (p50) on at least one bench shape"] == "not met"


def test_leaderboard_sdpa_baseline_and_not_run(gpu_leaderboard):
    assert gpu_leaderboard["not_run"] == []
    assert gpu_leaderboard["sdpa"]["status"] == "analysed" and gpu_leaderboard["sdpa"]["bottlenecks"]
    assert [r["status"] for r in gpu_leaderboard["baseline"]] == ["measured"], "unsupported rows dropped"
    assert gpu_leaderboard["bench_suite"] == "canonical" and gpu_leaderboard["profile"] == PROFILE
    json.dumps(gpu_leaderboard)  # the stage writes it as JSON


def test_bench_records_how_firmly_it_pinned_each_speedup(gpu_tree, gpu_leaderboard):
    small = next(c for c in read_json(gpu_tree / "bench" / "good.json")["cases"] if c["label"] == SMALL.label)
    graph = small["modes"]["graph"]
    lo, hi = graph["speedup_p50_ci95"]
    assert lo <= 2.0 <= hi and graph["speedup_p50_halves"] == pytest.approx([2.0, 2.0], rel=0.01)
    assert graph["repeat_flag"] is None
    good = by_name(gpu_leaderboard)["good"]
    assert good["repeat_flags"] == [] and all(r["repeat_flag"] is None for r in good["speedups"])


def test_summary_marks_a_speedup_the_run_could_not_pin(gpu_leaderboard):
    good = by_name(gpu_leaderboard)["good"]
    flag = "speedup not pinned to 2%: first and second half of the rounds give 1.950 and 2.050"
    good["speedups"][0]["repeat_flag"] = flag
    good["repeat_flags"] = [f"{SMALL.label} fp16 [graph x32]: {flag}"]
    text = report.render(gpu_leaderboard)
    assert "| 2.000 ⚠ |" in text
    assert f"- ⚠ good, {SMALL.label} fp16 [graph x32]: {flag} (a rerun may not repeat this ratio)" in text


def test_summary_gives_each_eager_timing_its_host_time_and_marks_the_host_bound(gpu_leaderboard):
    """Gated, an eager p50 is GPU time; the host time per call stands beside it, for the shapes
    timed in graph mode too (issue 8 compares eager calls from Python), and a side slower on the
    host than on the GPU is marked host-bound without the ratio being marked as unsteady."""
    good = by_name(gpu_leaderboard)["good"]
    assert [(r["shape"], r["primary"]) for r in good["eager"]] == [(SMALL.label, False), (LARGE.label, True)]
    small = good["eager"][0]
    assert small["speedup_p50"] == pytest.approx(0.9) and small["variant_host_us"] is None
    small.update(variant_host_us=4.0, sdpa_host_us=61.5)  # SDPA slower on the host than on the GPU
    row = next(r for r in good["speedups"] if r["shape"] == SMALL.label)
    row["host_flag"] = "host-bound from Python: SDPA's call takes 62 µs of host time against 45 µs on the GPU"
    text = report.render(gpu_leaderboard)
    assert "### Eager calls: GPU time and host time per call" in text
    section = text.split("### Eager calls")[1]
    line = next(l for l in section.splitlines() if l.startswith(f"| good | {SMALL.label} | fp16 |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[4] == "4.0" and cells[6] == "61.5 (host-bound)" and cells[7] == "0.900"
    main = next(l for l in text.splitlines() if l.startswith(f"| good | {SMALL.label} | fp16 | graph"))
    assert "⚠" not in main


def test_render_gpu_summary(gpu_leaderboard):
    text = report.render(gpu_leaderboard)
    assert "| variant | kind | build | sanitizer | parity | bench | ncu | analysis | outcome | measured at |" in text
    assert "| good | cuda | pass | pass | pass (quick) | measured | measured | analysed | — |" in text
    assert "| bad | triton | pass | pass | fail (quick) | skipped | skipped | skipped | failed at parity |" in text
    assert "| variant p50 µs | variant p90 µs | SDPA p50 µs | SDPA p90 µs | speedup p50 | speedup p90 |" in text
    assert f"| good | {SMALL.label} | fp16 | graph x32 | 5.00 |" in text
    assert "| 2.000 |" in text and "| 0.720 |" in text
    assert "Geometric-mean speedup (p50): good 1.200." in text
    reason = by_name(gpu_leaderboard)["bad"]["reasons"]["parity"]
    assert f"- **bad / parity**: {reason}" in text
    assert "**SDPA default (the bar)**" in text
    assert "**bad**\n\nNot analysed (parity failed)." in text
    assert "| good | faster than SDPA (p50) on every bench shape | not met |" in text
    assert "git 0123456789ab (dirty)" in text
    assert "Every stage ran." in text
    assert "No speedup was measured" not in text


# ---------------------------------------------------------------- a host without a GPU


@pytest.fixture
def cpu_leaderboard(tmp_path) -> dict:
    results = tmp_path / "results"
    note = f"GPU backends not run: {NO_DEVICE_REASON}; rows are torch's CPU SDPA"
    write_common(results, cuda=False, baseline_note=note)
    no_ncu = gating.skipped(f"not profiled: {NO_DEVICE_REASON}", entry="sdpa")
    write_json(results / "analysis" / "sdpa" / "bottlenecks.json",
               gating.skipped_for("not analysed", gating.root_cause("ncu", no_ncu), entry="sdpa"))
    ncu_record = gating.skipped(f"not profiled: {NO_DEVICE_REASON}", entry="tri")
    write_stages(results, "tri", {
        "build": build_record("tri", "triton", compiled=False),
        "sanitizer": gating.skipped(f"not run: {NO_DEVICE_REASON}", variant="tri"),
        "parity": {**parity_record("tri", sdpa_forward), "device": "cpu", "tier": "tiny", "interpreter": True},
        "bench": gating.skipped(f"not measured: {NO_DEVICE_REASON}", variant="tri"),
        "ncu": ncu_record,
        "analysis": gating.skipped_for("not analysed", gating.root_cause("ncu", ncu_record), entry="tri"),
    })
    return report.build_leaderboard(layout_of(results), ["tri"], CFG, [s.label for s in SUITE])


def test_cpu_host_says_what_did_not_run(cpu_leaderboard):
    entry = cpu_leaderboard["variants"][0]
    assert cpu_leaderboard["device"] == "cpu (no CUDA device)"
    assert entry["fell_out_at"] is None and entry["not_run_here"] == ["sanitizer", "bench", "ncu"]
    lines = cpu_leaderboard["not_run"]
    assert lines[0] == f"Environment: device properties and ceilings: {NO_DEVICE_REASON}."
    assert lines[1].startswith("Baseline: GPU backends not run")
    assert f"{NO_DEVICE_REASON}: tri (sanitizer, bench, ncu)" in lines, "one line per reason"
    assert not any("analysis" in line for line in lines), "skipped for ncu: nothing new"
    text = report.render(cpu_leaderboard)
    assert "No speedup was measured on this host." in text
    assert "SDPA default" in text
    assert f"- {NO_DEVICE_REASON}: tri (sanitizer, bench, ncu)" in text


# ---------------------------------------------------------------- plot


def test_plot_speedups_with_rows(gpu_leaderboard, tmp_path, drawn):
    from matplotlib.container import BarContainer

    path = tmp_path / "speedup.png"
    report.plot_speedups(gpu_leaderboard, str(path))
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    assert not list(tmp_path.glob("*.partial.png"))
    (ax,) = drawn[-1].axes
    rows = {(e["name"], f"{r['shape']} {r['dtype']}"): r for e in gpu_leaderboard["variants"] for r in e["speedups"]}
    labels = sorted({label for _, label in rows})
    assert rows and [t.get_text() for t in ax.get_xticklabels()] == labels
    bars = {c.get_label(): c for c in ax.containers if isinstance(c, BarContainer)}
    assert sorted(bars) == sorted({name for name, _ in rows})
    for name, container in bars.items():
        heights = [patch.get_height() for patch in container.patches]
        for label, height in zip(labels, heights):
            if (name, label) in rows:
                assert height == pytest.approx(rows[name, label]["speedup_p50"]), (name, label)
            else:
                assert height != height, (name, label)   # nan: no bar where the variant has no row
    assert ax.get_yscale() == "log" and gpu_leaderboard["device"] in ax.get_title()
    assert not ax.texts


def test_plot_speedups_without_rows(cpu_leaderboard, tmp_path, drawn):
    path = tmp_path / "empty.png"
    report.plot_speedups(cpu_leaderboard, str(path))
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    (ax,) = drawn[-1].axes
    assert not ax.containers
    assert [t.get_text() for t in ax.texts] == [
        f"No speedup measured on {cpu_leaderboard['device']}.\n{cpu_leaderboard['not_run'][0]}"]
    no_lines = {**cpu_leaderboard, "not_run": []}
    report.plot_speedups(no_lines, str(tmp_path / "empty2.png"))
    assert (tmp_path / "empty2.png").read_bytes()[:8] == PNG_SIGNATURE


# ================================================================ gates


def test_gates_pass_for_a_passing_required_variant(gpu_leaderboard):
    assert gates.evaluate(gpu_leaderboard, {"required_variants": [], "min_speedup": 5.0}) == []
    assert gates.evaluate(gpu_leaderboard, {"required_variants": ["good"], "min_speedup": None}) == []
    assert gates.evaluate(gpu_leaderboard, {"required_variants": ["good"], "min_speedup": 0.7}) == []


def test_gates_min_speedup(gpu_leaderboard):
    failures = gates.evaluate(gpu_leaderboard, {"required_variants": ["good"], "min_speedup": 1.0})
    assert failures == [f"good {LARGE.label} fp16: speedup 0.720 below 1.0"]


def test_gates_required_variant_failing_parity(gpu_leaderboard):
    failures = gates.evaluate(gpu_leaderboard, {"required_variants": ["bad"], "min_speedup": 1.0})
    assert failures[0].startswith("bad parity: fail (")
    assert "above bound" in failures[0]
    assert failures[1] == "bad: no speedup measured, min_speedup 1.0 cannot be checked"
    assert len(failures) == 2


def test_gates_unknown_required_variant(gpu_leaderboard):
    assert gates.evaluate(gpu_leaderboard, {"required_variants": ["ghost"], "min_speedup": None}) == [
        "required variant 'ghost' is not in the leaderboard"]


# ================================================================ deps


def test_library_inputs_of_run_bench():
    inputs = library_inputs("scripts/run_bench.py")
    for needed in ("scripts/evo_sdpa/__init__.py", "scripts/evo_sdpa/bench.py", "scripts/evo_sdpa/timing.py",
                   "scripts/evo_sdpa/stats.py", "scripts/evo_sdpa/gating.py", "scripts/evo_sdpa/variants.py",
                   "scripts/evo_sdpa/runners.py", "scripts/evo_sdpa/schema.py",
                   "workflow/schemas/variant.schema.yaml"):
        assert needed in inputs, needed
    assert "scripts/evo_sdpa/report.py" not in inputs
    assert "scripts/evo_sdpa/templates/final_summary.md.j2" not in inputs
    assert len(inputs) == len(set(inputs))
    repo = Path(__file__).resolve().parents[1]
    assert all((repo / p).is_file() for p in inputs)


def test_library_inputs_of_summarize_include_the_template():
    inputs = library_inputs("scripts/summarize.py")
    assert "scripts/evo_sdpa/report.py" in inputs
    assert "scripts/evo_sdpa/templates/final_summary.md.j2" in inputs
    assert "scripts/evo_sdpa/bench.py" not in inputs


# ================================================================ what the summary promises (issue 12)


def test_cpu_criteria_not_checked_say_so(cpu_leaderboard):
    """Nothing compiled (Triton imported only) and the small CPU tier under the interpreter: the
    criteria say "not checked" and why, never "met"."""
    criteria = {c["criterion"]: c for c in cpu_leaderboard["variants"][0]["criteria"]}
    build = criteria["builds without warnings or spills"]
    assert build["result"] == "not checked" and build["detail"] == IMPORTED_ONLY
    parity = criteria["correct on its whole declared support (parity)"]
    assert parity["result"] == "not checked"
    assert "tier tiny under the Triton interpreter" in parity["detail"] and "tier quick" in parity["detail"]
    assert all(c["result"] != "met" for c in criteria.values())
    text = report.render(cpu_leaderboard)
    assert "| tri | builds without warnings or spills | not checked: imported only" in text
    assert "| tri | correct on its whole declared support (parity) | not checked: passed tier tiny" in text
    assert "| pass (tiny, interpreted) |" in text, "the funnel names the parity tier and the interpreter"


def test_funnel_tells_not_run_from_failed(cpu_leaderboard):
    text = report.render(cpu_leaderboard)
    assert "| not run here: sanitizer, bench, ncu |" in text
    assert "fell out" not in text and "stopped at" not in text and "failed at" not in text
    assert "**tri**\n\nNot analysed (ncu did not run)." in text


def test_what_could_not_run_does_not_repeat_the_funnel(cpu_leaderboard):
    text = report.render(cpu_leaderboard)
    assert "- **tri / sanitizer**" not in text and "- **tri / bench**" not in text, "skips are listed once, below"
    assert "tri sanitizer: not run" not in text and "tri bench: not measured" not in text
    assert text.count(f"{NO_DEVICE_REASON}: tri (sanitizer, bench, ncu)") == 1
    assert text.count("GPU backends not run: ") == 1, "the baseline note once, under its table"


def cpu_row(shape: Shape, samples: list[float], ended_by: str) -> dict:
    result = _results({"default": samples}, ended_by, "cpu wall clock", "not flushed")["default"]
    return {**_row(shape, "fp16", "default", "cpu"), **_stats_row(result, shape, "fp16")}


def test_baseline_marks_loose_rows_and_lists_skipped_shapes(cpu_leaderboard, tmp_path):
    steady = cpu_row(SMALL, series(900.0), "converged")
    capped = cpu_row(SMALL, [100.0, 900.0, 5000.0, 300.0, 2000.0], "time cap")
    skipped = {**_row(LARGE, "fp16", "default", "cpu"), "mode": "cpu", "status": "skipped",
               "reason": "8.6 GFLOP is above cpu_baseline_max_gflop (1.0) on a host without a CUDA device"}
    baseline = {"device": "cpu", "suite": "canonical", "note": "CPU rows", "rel_spread_bound": 0.1,
                "rows": [steady, capped, skipped]}
    rows = report.baseline_rows(baseline)
    assert rows[0]["flag"] is None
    assert rows[1]["flag"].startswith("sampling ended by time cap, spread ") and rows[1]["flag"].endswith(
        "above the bound 0.1")
    assert report.sampling_flag(steady, 0.05) == "spread 0.06 above the bound 0.05"
    pinned = {**steady, "ended_by": "p50 pinned", "rel_spread": 0.3}
    assert report.sampling_flag(pinned, 0.05) is None, "a wide row whose p50 is pinned is firm"
    assert "| p50 pinned |" in report.render({**cpu_leaderboard, "baseline": report.baseline_rows(
        {**baseline, "rows": [pinned]}), "baseline_not_measured": []})
    assert report.baseline_not_measured(baseline) == [f"B4 H16 S2048 D128 causal fp16 default: skipped, {skipped['reason']}"]
    text = report.render({**cpu_leaderboard, "baseline": rows, "baseline_not_measured": report.baseline_not_measured(baseline)})
    assert "| ⚠ sampling ended by time cap, spread " in text and "| converged |" in text
    assert "Not measured:\n\n- B4 H16 S2048 D128 causal fp16 default: skipped, 8.6 GFLOP is above" in text


def stamped(record: dict, dirty: bool, sources: str = "1a2b3c4d5e6f7a8b", card: dict | None = None,
            host: str = "gpu-host-a") -> dict:
    return {**record, "measured_at": {"git": {"commit": "0123456789abcdef0123", "dirty": dirty},
                                      "sources": sources, "card": card, "host": host}}


H100_CARD = {"name": H100, "uuid": "GPU-11111111-2222-3333-4444-555555555555", "compute_capability": "9.0"}
H200_CARD = {"name": "NVIDIA H200", "uuid": "GPU-99999999-2222-3333-4444-555555555555", "compute_capability": "9.0"}


def restamp(results: Path, name: str, dirty: bool, card: dict | None = None, stages=report.STAMPED) -> None:
    for stage in stages:
        path = report.stage_paths(layout_of(results), name)[stage]
        write_json(path, stamped(read_json(path), dirty, card=card if stage in ("bench", "ncu") else None))


def test_summary_shows_each_evolution_run(gpu_tree):
    assert "No evolution has run" in report.render(
        report.build_leaderboard(layout_of(gpu_tree), ["bad", "good"], CFG, [s.label for s in SUITE]))
    best = {
        "variant": "good", "status": "pass", "reasons": [],
        "stop": {"condition": "wall_time", "detail": "7.3 of 6 wall minutes spent", "generation": 1, "midway": True},
        "candidates": {"proposed": 10, "measured": 6, "rejected_by": {"build": 2, "parity": 1}, "not_reached": 1},
        "defaults": {"id": "g00-c00", "fitness": 0.8},
        "final_checks": [{"id": "g01-c02", "status": "pass", "reasons": []}],
        "wall_seconds": 438.2, "gpu_seconds": 331.4, "settings": {"suite": "large"},
        "winner": {"id": "g01-c02", "fitness": 0.88, "over_defaults": 1.1, "source_dir": None,
                   "changed_from_defaults": {"block": 128, "stages": 3},
                   "lineage": [{"id": "g00-c00", "origin": "defaults", "changed": {}, "lever": None, "fitness": 0.8},
                               {"id": "g00-c03", "origin": "mutation", "changed": {"block": [64, 128]},
                                "lever": {"knob": "block", "finding": "underfilled_grid"}, "fitness": 0.84},
                               {"id": "g01-c02", "origin": "mutation", "changed": {"stages": [2, 3]},
                                "lever": {"knob": "stages", "finding": "stall_long_scoreboard"}, "fitness": 0.88}]},
        "promote": "python3 scripts/promote_tunables.py --variant good --best results/evolve/good/best.json",
    }
    write_json(layout_of(gpu_tree).path("evolve_best", "good"), best)
    text = report.render(report.build_leaderboard(layout_of(gpu_tree), ["bad", "good"], CFG, [s.label for s in SUITE]))
    assert "### good (suite `large`)" in text
    assert ("Stopped by wall_time (7.3 of 6 wall minutes spent), midway through generation 1. Candidates: 10 proposed, "
            "6 measured, 2 rejected by the build gate, 1 rejected by the parity gate, 1 not reached.") in text
    assert "Winner **g01-c02**: fitness 0.880, 1.100x the defaults; lever values changed from the defaults: " \
           "`block=128`, `stages=3`." in text
    assert "| g00-c03 | mutation | block 64 -> 128 | underfilled_grid | 0.840 |" in text
    assert "| g01-c02 | mutation | stages 2 -> 3 | stall_long_scoreboard | 0.880 |" in text
    assert "Final check of g01-c02 (full parity tier and every sanitizer tool): pass." in text
    assert f"Promote the winner into the variant's defaults: `{best['promote']}`" in text
    assert "### bad" not in text
    assert "Wall 438 s, GPU 331 s." in text   # a record from before the phases were kept
    write_json(layout_of(gpu_tree).path("evolve_best", "good"),
               {**best, "gpu_seconds_by_phase": {"search": 250.2, "confirm": 41.0, "final_checks": 40.2}})
    text = report.render(report.build_leaderboard(layout_of(gpu_tree), ["bad", "good"], CFG, [s.label for s in SUITE]))
    assert "Wall 438 s, GPU 331 s (search 250, re-timing the leaders 41, final checks 40)." in text


def test_summary_prints_the_state_each_variant_was_measured_at(gpu_tree):
    """The environment record says clean; good's chain was rerun after a kernel edit (dirty):
    the summary prints good's own state and says it differs from the header's."""
    env = read_json(gpu_tree / "env" / "environment.json")
    write_json(gpu_tree / "env" / "environment.json", {**env, "git": {"commit": "0123456789abcdef0123", "dirty": False}})
    restamp(gpu_tree, "good", dirty=True)
    leaderboard = report.build_leaderboard(layout_of(gpu_tree), ["bad", "good"], CFG, [s.label for s in SUITE])
    good = by_name(leaderboard)["good"]
    assert good["measured_at"] == [{"commit": "0123456789abcdef0123", "dirty": True, "sources": "1a2b3c4d5e6f7a8b",
                                    "stages": list(report.STAMPED)}]
    assert leaderboard["state_notes"] == ["good: measured at git 0123456789ab (dirty) (build, sanitizer, parity, "
                                          "bench, ncu), not at the environment record's git 0123456789ab (clean)"]
    text = report.render(leaderboard)
    assert "environment record: git 0123456789ab ·" in text
    assert "| git 0123456789ab (dirty) src 1a2b3c4d5e6f7a8b |" in text
    assert "Not every number below was measured at the environment record's state" in text


def test_summary_flags_stages_on_different_sources(gpu_tree):
    restamp(gpu_tree, "good", dirty=True)
    bench = gpu_tree / "bench" / "good.json"
    write_json(bench, stamped(read_json(bench), dirty=True, sources="ffffffffffffffff"))
    leaderboard = report.build_leaderboard(layout_of(gpu_tree), ["good"], CFG, [s.label for s in SUITE])
    assert any("ran on different sources" in note and "ffffffffffffffff" in note for note in leaderboard["state_notes"])


def test_results_from_another_card_model_are_flagged_and_fail_the_gates(gpu_tree):
    env = read_json(gpu_tree / "env" / "environment.json")
    write_json(gpu_tree / "env" / "environment.json", {**env, "card": H100_CARD})
    restamp(gpu_tree, "good", dirty=True, card=H200_CARD)
    leaderboard = report.build_leaderboard(layout_of(gpu_tree), ["bad", "good"], CFG, [s.label for s in SUITE])
    assert leaderboard["card_mismatches"] == [
        f"good {stage} was measured on NVIDIA H200 ({H200_CARD['uuid']}), the environment record on "
        f"{H100} ({H100_CARD['uuid']})" for stage in ("bench", "ncu")]
    assert "Results from different cards are combined here" in report.render(leaderboard)
    failures = gates.evaluate(leaderboard, {"required_variants": [], "min_speedup": None})
    assert len(failures) == 2 and failures[0].startswith("mixed cards: good bench was measured on NVIDIA H200")


def test_another_card_of_the_same_model_is_not_a_mismatch(gpu_tree):
    env = read_json(gpu_tree / "env" / "environment.json")
    write_json(gpu_tree / "env" / "environment.json", {**env, "card": H100_CARD})
    restamp(gpu_tree, "good", dirty=True, card={**H100_CARD, "uuid": "GPU-other"})
    leaderboard = report.build_leaderboard(layout_of(gpu_tree), ["good"], CFG, [s.label for s in SUITE])
    assert leaderboard["card_mismatches"] == []
    assert by_name(leaderboard)["good"]["cards"]["bench"]["uuid"] == "GPU-other"


def test_summary_names_the_host_and_card_of_every_result(gpu_tree):
    """A two-GPU run: the baseline and good's bench on one card, good's ncu on another of the same
    model. The summary numbers the cards, names each one's host and UUID, points every result at
    its card and says several are present."""
    other = {**H100_CARD, "uuid": "GPU-22222222-2222-3333-4444-555555555555"}
    baseline_path = gpu_tree / "baseline" / "sdpa.json"
    write_json(baseline_path, stamped(read_json(baseline_path), dirty=False, card=H100_CARD))
    restamp(gpu_tree, "good", dirty=False, card=H100_CARD)
    ncu = report.stage_paths(layout_of(gpu_tree), "good")["ncu"]
    write_json(ncu, stamped(read_json(ncu), dirty=False, card=other, host="gpu-host-b"))
    leaderboard = report.build_leaderboard(layout_of(gpu_tree), ["bad", "good"], CFG, [s.label for s in SUITE])
    where = leaderboard["where"]
    assert where["several"] and where["baseline"] == "card 1"
    assert [(c["label"], c["host"], c["uuid"]) for c in where["cards"]] == [
        ("card 1", "gpu-host-a", H100_CARD["uuid"]), ("card 2", "gpu-host-b", other["uuid"])]
    assert {r["name"]: r["cells"] for r in where["rows"]}["good"] == {"bench": "card 1", "ncu": "card 2"}
    text = report.render(leaderboard)
    assert "Results from **2 devices** are present." in text
    assert f"- **card 2**: {H100} ({other['uuid']}) on host gpu-host-b\n" in text  # one card per line
    assert "| SDPA baseline | — | — | — | card 1 | — |" in text
    assert "| good | — | — | — | card 1 | card 2 |" in text


def test_a_host_without_a_gpu_is_named_as_its_cpu():
    stamp = {"card": {"name": "cpu", "uuid": None}, "host": "laptop"}
    where = report.where_measured({"measured_at": stamp}, [{"name": "triton_flash", "cards": {"parity": {**stamp["card"], "host": "laptop"}}}])
    assert where["baseline"] == "CPU of laptop" and not where["several"]
    assert where["rows"] == [{"name": "triton_flash", "cells": {"parity": "CPU of laptop"}}]
    assert where["cards"][0]["cpu"]


def test_summary_says_when_one_card_gave_every_result(gpu_tree):
    restamp(gpu_tree, "good", dirty=False, card=H100_CARD)
    leaderboard = report.build_leaderboard(layout_of(gpu_tree), ["good"], CFG, [s.label for s in SUITE])
    assert not leaderboard["where"]["several"]
    text = report.render(leaderboard)
    assert "Every result comes from one device." in text and "Results from **" not in text
    assert f"- **card 1**: {H100} ({H100_CARD['uuid']}) on host gpu-host-a" in text


def test_a_damaged_result_stops_the_summary_with_one_line_naming_it(gpu_tree):
    parity = gpu_tree / "parity" / "good.json"
    parity.write_text(parity.read_text()[:200])
    with pytest.raises(StageError) as excinfo:
        report.build_leaderboard(layout_of(gpu_tree), ["good"], CFG, [s.label for s in SUITE])
    message = str(excinfo.value)
    assert "\n" not in message
    assert message.startswith(f"{parity}: not valid JSON (")
    assert f"--forcerun {parity}" in message


def test_imports_cache_reparses_only_an_edited_file(tmp_path, monkeypatch):
    from evo_sdpa import deps

    source = tmp_path / "run_x.py"
    source.write_text("from evo_sdpa.io import read_json\n")
    cache = deps.ImportsCache(tmp_path / "imports.json")
    assert cache.imports(source, False) == ["io"]
    cache.save()
    again = deps.ImportsCache(tmp_path / "imports.json")
    monkeypatch.setattr(deps, "_parse_imports", lambda *a: pytest.fail("an unchanged file was parsed"))
    assert again.imports(source, False) == ["io"]
    monkeypatch.undo()
    source.write_text("from evo_sdpa.io import read_json\nfrom evo_sdpa.report import render\n")
    assert again.imports(source, False) == ["io", "report"]
    (tmp_path / "imports.json").write_text("{damaged")
    assert deps.ImportsCache(tmp_path / "imports.json").imports(source, False) == ["io", "report"]


def fake_sanitizer(folder):
    """A compute-sanitizer stand-in that finds nothing and prints the command line it was given."""
    fake = folder / "compute-sanitizer"
    fake.write_text("#!/usr/bin/env python3\nimport json, sys\n"
                    "log = sys.argv[sys.argv.index('--log-file') + 1]\n"
                    "open(log, 'w').write('========= ERROR SUMMARY: 0 errors\\n')\n"
                    "print(json.dumps(sys.argv[1:]))\n")
    fake.chmod(0o755)
    return fake


def test_check_variant_runs_every_tool_on_the_target_with_the_variants_shapes(tmp_path):
    """One call per tool, each over sanitizer_target.py with the config's shape and the variant's
    folder (whose sanitizer_shapes the target adds); the verdict records both kinds of shape."""
    from evo_sdpa.variants import KERNELS_DIR, load_variant

    fake = fake_sanitizer(tmp_path)
    v5 = load_variant(KERNELS_DIR / "v5_hopper")
    cfg = {"tools": ["memcheck", "racecheck"], "padding_bytes": 256, "shape": {"B": 1, "H": 2, "S": 67}}
    result = sanitizer.check_variant(str(fake), cfg, v5, tmp_path / "verdict.json", tmp_path / "logs",
                                     tmp_path / "logs" / "card.json")
    assert result["status"] == "pass" and [t["tool"] for t in result["tools"]] == ["memcheck", "racecheck"]
    assert result["shape"] == cfg["shape"] and result["variant_shapes"] == v5.sanitizer_shapes
    assert result["environment"] == sanitizer.ALLOCATION["cuda"], "v5's target allocates through the driver"
    assert {"B": 1, "H": 2, "S": 520} in v5.sanitizer_shapes
    argv = json.loads((tmp_path / "logs" / "memcheck.stdout.log").read_text())
    target = argv[argv.index(str(sanitizer.TARGET)):]
    assert target[target.index("--variant-dir") + 1] == str(v5.folder)
    assert target[target.index("--S") + 1] == "67"
    assert target[target.index("--card") + 1] == str(tmp_path / "logs" / "card.json")
    assert target[target.index("--shapes") + 1] == ";".join(f"{s['B']},{s['H']},{s['S']}" for s in v5.sanitizer_shapes)


def test_check_variant_passes_shapes_the_variant_object_was_given(tmp_path):
    """A variant whose sanitizer_shapes were replaced in memory (a GPU test's chosen grid) has those
    shapes run, not variant.yaml's: the target once read them from the folder, so the verdict recorded
    shapes that never ran (NOTES.md of v5_hopper, run 220)."""
    import dataclasses

    from evo_sdpa.variants import KERNELS_DIR, load_variant

    fake = fake_sanitizer(tmp_path)
    v5 = load_variant(KERNELS_DIR / "v5_hopper")
    for chosen, text in (([{"B": 2, "H": 8, "S": 512}], "2,8,512"), ([], "")):
        variant = dataclasses.replace(v5, meta={**v5.meta, "sanitizer_shapes": chosen})
        cfg = {"tools": ["memcheck"], "padding_bytes": 256, "shape": {"B": 1, "H": 2, "S": 67}}
        logs = tmp_path / f"logs{len(chosen)}"
        result = sanitizer.check_variant(str(fake), cfg, variant, tmp_path / "verdict.json", logs)
        argv = json.loads((logs / "memcheck.stdout.log").read_text())
        assert argv[argv.index("--shapes") + 1] == text
        assert result["variant_shapes"] == chosen


def test_the_sanitizer_target_runs_the_shapes_it_is_given():
    """--shapes replaces the variant's sanitizer_shapes (empty: the small shape alone); a malformed
    list is refused with the form it expects."""
    import argparse

    import sanitizer_target
    from evo_sdpa.variants import KERNELS_DIR, load_variant

    v5 = load_variant(KERNELS_DIR / "v5_hopper")
    assert sanitizer_target.parse_shapes("2,8,512;1,2,520") == [{"B": 2, "H": 8, "S": 512}, {"B": 1, "H": 2, "S": 520}]
    assert sanitizer_target.parse_shapes("") == []
    with pytest.raises(argparse.ArgumentTypeError, match="B,H,S shapes joined by ';'"):
        sanitizer_target.parse_shapes("2,8")
    per_shape = len(v5.support["dtypes"]) * len(v5.support["head_dims"]) * len(v5.support["causal"])
    ran = [shape for shape, *_ in sanitizer_target.configurations(v5, 1, 2, 67, [{"B": 2, "H": 8, "S": 512}])]
    assert ran == [{"B": 1, "H": 2, "S": 67}] * per_shape + [{"B": 2, "H": 8, "S": 512}] * per_shape
