"""The step watchdog (evo_sdpa.watchdog) and the parity stage's use of it: a case that never
returns (a hung kernel cannot be interrupted from Python) ends the stage with a verdict naming
it, instead of a job that waits forever."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from evo_sdpa.watchdog import StepWatchdog

REPO = Path(__file__).resolve().parents[1]


def test_a_step_that_overruns_is_reported_once_by_name():
    fired = []
    done = threading.Event()
    watchdog = StepWatchdog(0.2, lambda name, limit: (fired.append((name, limit)), done.set()))
    started = time.monotonic()
    with watchdog.step("case-b"):
        assert done.wait(5.0)
        elapsed = time.monotonic() - started
        time.sleep(0.3)  # still inside the step: no second report
    assert fired == [("case-b", 0.2)]
    assert 0.15 < elapsed < 2.0


def test_steps_that_end_in_time_are_never_reported_and_each_gets_the_whole_limit():
    fired = []
    watchdog = StepWatchdog(0.3, lambda name, limit: fired.append(name))
    for name in ("a", "b", "c", "d"):
        with watchdog.step(name):
            time.sleep(0.15)  # four steps, 0.6 s in all: twice the limit, none over it
    time.sleep(0.4)  # and nothing fires once no step is running
    assert fired == []


DRIVER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, "scripts")
    import run_parity

    calls = []

    def run_case(case, forward, rule, device, sdpa_max_abs=None):
        calls.append(case.case_id)
        if len(calls) == 2:
            time.sleep(120)  # a kernel that never returns
        return {"id": case.case_id, "status": "pass", "reason": "", "max_abs": 0.0}

    run_parity.run_case = run_case
    run_parity.oracle_records = lambda variant, forward, device: []
    run_parity.load_built = lambda variant, build: None
    run_parity.cuda_available = lambda: False
    run_parity.interpreter_blocker = lambda: None
    run_parity.CASE_LIMIT_S = 1.0
    sys.argv = ["run_parity.py", *sys.argv[1:]]
    run_parity.run_stage(run_parity.main)
""")


def run_parity_driver(tmp_path: Path, driver: str, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    """The parity stage's main under `driver`, on a two-case CPU tier of triton_flash."""
    build = tmp_path / "build.json"
    build.write_text(json.dumps({"status": "pass", "reasons": []}))
    out = tmp_path / "parity.json"
    tier = {"seq_lens": [1, 17], "batch_heads": [[1, 2]], "seeds": [0], "distributions": ["normal"]}
    cfg = {"parity": {"tier": "quick", "cpu_tier": "t", "tiers": {"t": tier}},
           "tolerance": {"sdpa_multiple": 4.0, "atol": {"fp16": 1e-3, "bf16": 8e-3}}}
    proc = subprocess.run([sys.executable, "-c", driver, "--variant", "triton_flash", "--build", str(build),
                           "--config-json", json.dumps(cfg), "--out", str(out), *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    return proc, out


def test_parity_stage_records_a_hung_case_and_ends(tmp_path):
    started = time.monotonic()
    proc, out = run_parity_driver(tmp_path, DRIVER)
    assert time.monotonic() - started < 30, "the stage waited for the hung case"
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["status"] == "fail" and result["cases"] == 2 and result["passed"] == 1
    hung = result["records"][-1]
    assert hung["status"] == "fail" and "did not return within 1 s" in hung["reason"]
    assert result["first_failure"]["id"] == hung["id"] and result["first_failure"]["repro"].endswith(
        f"--case {hung['id']}")
    assert f"{hung['id']} did not return within 1 s" in proc.stderr and f"--case {hung['id']}" in proc.stderr


BENCH_DRIVER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, "scripts")
    import run_bench
    from evo_sdpa import bench, runners

    calls = []

    def bench_case(forward, shape, dtype, timing, rule, ceilings):
        calls.append(shape.label)
        if len(calls) == 2:
            time.sleep(120)  # a kernel that never returns
        mode = {"label": "eager", "variant": {"p50_us": 2.0}, "sdpa": {"p50_us": 1.0}, "speedup_p50": 0.5}
        return {"status": "measured", "label": shape.label, "dtype": dtype, "primary_mode": "eager",
                "modes": {"eager": mode}, "recheck": {"status": "pass"}}

    bench.bench_case = bench_case
    bench.spin_up_clock = lambda: {"status": "no clock reading"}
    bench.CASE_LIMIT_S = 1.0
    runners.load_built = lambda variant, build: None
    run_bench.cuda_available = lambda: True
    run_bench.blocked_by = lambda **paths: None
    sys.argv = ["run_bench.py", *sys.argv[1:]]
    run_bench.run_stage(run_bench.main)
""")


def test_bench_stage_records_a_hung_case_and_ends(tmp_path):
    for name in ("build", "sanitizer", "parity"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"status": "pass", "reasons": []}))
    (tmp_path / "env.json").write_text(json.dumps({"device": None, "ceilings": None}))
    out = tmp_path / "bench.json"
    shapes = [{"B": 1, "H": 2, "S": 64, "D": 64, "causal": False}, {"B": 1, "H": 2, "S": 128, "D": 64, "causal": True}]
    cfg = {"shape_suites": {"s": shapes}, "bench_suite": "s", "dtypes": ["fp16"], "timing": {},
           "tolerance": {"sdpa_multiple": 4.0, "atol": {"fp16": 1e-3, "bf16": 8e-3}}}
    argv = ["--variant", "v1_scalar", "--config-json", json.dumps(cfg), "--out", str(out)]
    for name in ("env", "build", "sanitizer", "parity"):
        argv += [f"--{name}", str(tmp_path / f"{name}.json")]
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", BENCH_DRIVER, *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert time.monotonic() - started < 30, "the stage waited for the hung case"
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["status"] == "fail" and result["variant"] == "v1_scalar"
    assert result["reasons"] == ["B1_H2_S128_D64_causal fp16 did not return within 1 s: the kernel hangs or is far "
                                 "too slow"]
    assert "B1_H2_S128_D64_causal fp16 did not return within 1 s" in proc.stderr


def test_a_hang_in_the_oracle_names_a_repro_that_runs_only_the_oracle(tmp_path):
    """`--case oracle` runs just the oracle's cases: the repro that a hang among them (one watchdog step) names."""
    driver = DRIVER.replace("run_parity.oracle_records = lambda variant, forward, device: []",
                            "run_parity.oracle_records = lambda variant, forward, device: "
                            "[{'id': 'oracle-a', 'status': 'pass', 'reason': ''}]")
    proc, out = run_parity_driver(tmp_path, driver, "--case", "oracle")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert [r["id"] for r in result["records"]] == ["oracle-a"] and result["status"] == "pass"
