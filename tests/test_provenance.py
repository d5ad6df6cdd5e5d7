"""Where a result was measured and on which card: reading damaged results, the DAG-time device
identity (CUDA_VISIBLE_DEVICES by index, UUID or MIG; nvidia-smi missing; the cache), and the
stamp every measuring stage adds to its record."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from evo_sdpa import device, provenance
from evo_sdpa.deps import ABI_HEADER, variant_inputs
from evo_sdpa.errors import StageError
from evo_sdpa.io import read_json, read_record, read_verdict, write_json
from evo_sdpa.variants import KERNELS_DIR, load_variant

# ================================================================ damaged results


def test_truncated_json_is_one_line_naming_the_file_and_the_fix(tmp_path):
    path = tmp_path / "results" / "parity" / "v1_scalar.json"
    write_json(path, {"status": "pass", "reasons": [], "cases": 12})
    path.write_text(path.read_text()[:20])
    with pytest.raises(StageError) as excinfo:
        read_json(path)
    message = str(excinfo.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: not valid JSON (")
    assert message.endswith(f"rebuild it: snakemake --cores 1 results/final/final_summary.md --forcerun {path}")


def test_missing_result_names_the_file_and_the_fix(tmp_path):
    path = tmp_path / "bench" / "v1_scalar.json"
    with pytest.raises(StageError, match=r"bench/v1_scalar.json: missing .*--forcerun .*bench/v1_scalar.json$"):
        read_json(path)


def test_a_record_without_status_is_not_a_stage_record(tmp_path):
    path = tmp_path / "r.json"
    write_json(path, ["not", "a", "record"])
    with pytest.raises(StageError, match="not a stage record"):
        read_record(path)
    write_json(path, {"status": "measured", "reasons": []})
    with pytest.raises(StageError, match="not a verdict file"):
        read_verdict(path)


def test_binary_garbage_is_a_damaged_result(tmp_path):
    path = tmp_path / "g.json"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(StageError, match="not valid JSON"):
        read_json(path)


# ================================================================ DAG-time device identity

SMI_TWO = ("0, GPU-aaaaaaaa-1111-2222-3333-444444444444, NVIDIA H100 80GB HBM3, 9.0\n"
           "1, GPU-bbbbbbbb-1111-2222-3333-444444444444, NVIDIA H200, 9.0\n")
SMI_L = ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-aaaaaaaa-1111-2222-3333-444444444444)\n"
         "GPU 1: NVIDIA H200 (UUID: GPU-bbbbbbbb-1111-2222-3333-444444444444)\n"
         "  MIG 1g.18gb     Device  0: (UUID: MIG-cccccccc-1111-2222-3333-444444444444)\n")


@pytest.fixture
def fake_smi(monkeypatch):
    """nvidia-smi on PATH answering SMI_TWO (and SMI_L for -L); records the calls."""
    calls = []

    def run(argv, **kwargs):
        calls.append(argv)
        out = SMI_L if "-L" in argv else SMI_TWO
        return subprocess.CompletedProcess(argv, 0, stdout=out, stderr="")

    monkeypatch.delenv("EVO_SDPA_FORCE_CPU", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(device, "find_tool", lambda name: "/usr/bin/nvidia-smi" if name == "nvidia-smi" else None)
    monkeypatch.setattr(device.subprocess, "run", run)
    return calls


@pytest.mark.parametrize("visible, expected", [
    (None, "NVIDIA H100 80GB HBM3"),
    ("0", "NVIDIA H100 80GB HBM3"),
    ("1", "NVIDIA H200"),
    ("1,0", "NVIDIA H200"),
    ("GPU-bbbbbbbb-1111-2222-3333-444444444444", "NVIDIA H200"),
    ("GPU-bbbbbbbb", "NVIDIA H200"),                       # a unique prefix, as CUDA accepts
    ("bbbbbbbb-1111-2222-3333-444444444444", "NVIDIA H200"),
    ("MIG-cccccccc-1111-2222-3333-444444444444", "NVIDIA H200"),
    ("", None),
    ("-1", None),
    ("7", None),                                            # no such device: CUDA sees none
    ("GPU-", None),                                         # ambiguous prefix: not guessed
])
def test_cuda_visible_devices_picks_the_card_cuda_sees(fake_smi, monkeypatch, visible, expected):
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    gpu = device.query_gpu()
    assert (gpu.name if gpu else None) == expected


def test_uuid_in_cuda_visible_devices_does_not_fall_back_to_index_0(fake_smi, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbbbbbb-1111-2222-3333-444444444444")
    gpu = device.query_gpu()
    assert gpu.index == 1 and gpu.uuid == "GPU-bbbbbbbb-1111-2222-3333-444444444444"
    assert gpu.device_id == "NVIDIA H200 (cc 9.0)"


def test_mig_instance_keeps_its_own_uuid(fake_smi, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-cccccccc-1111-2222-3333-444444444444")
    gpu = device.query_gpu()
    assert gpu.uuid.startswith("MIG-cccccccc") and gpu.index == 1
    assert any("-L" in argv for argv in fake_smi)


def test_without_nvidia_smi_a_gpu_torch_sees_is_not_cpu(monkeypatch):
    monkeypatch.delenv("EVO_SDPA_FORCE_CPU", raising=False)
    monkeypatch.setattr(device, "find_tool", lambda name: None)
    monkeypatch.setattr(device, "nvidia_driver_present", lambda: True)
    monkeypatch.setattr(device, "torch_gpu", lambda: device.GpuIdentity("NVIDIA H100 80GB HBM3", "9.0", 0, "GPU-aaaa"))
    assert device.device_id(device.query_gpu()) == "NVIDIA H100 80GB HBM3 (cc 9.0)"


def test_without_nvidia_smi_or_driver_torch_is_not_imported(monkeypatch):
    monkeypatch.delenv("EVO_SDPA_FORCE_CPU", raising=False)
    monkeypatch.setattr(device, "find_tool", lambda name: None)
    monkeypatch.setattr(device, "nvidia_driver_present", lambda: False)
    monkeypatch.setattr(device, "torch_gpu", lambda: pytest.fail("torch asked on a host without a driver"))
    assert device.query_gpu() is None
    assert device.query_gpu_cached(Path("/nonexistent/cache.json")) is None


def test_force_cpu_wins(fake_smi, monkeypatch):
    monkeypatch.setenv("EVO_SDPA_FORCE_CPU", "1")
    assert device.query_gpu() is None and fake_smi == []


def test_identity_is_cached_until_the_visible_set_changes(fake_smi, monkeypatch, tmp_path):
    cache = tmp_path / ".snakemake" / "evo_sdpa" / "gpu_identity.json"
    first = device.query_gpu_cached(cache)
    assert first.name == "NVIDIA H100 80GB HBM3" and len(fake_smi) == 1
    assert device.query_gpu_cached(cache) == first and len(fake_smi) == 1, "the second build asks nobody"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert device.query_gpu_cached(cache).name == "NVIDIA H200" and len(fake_smi) == 2
    cache.write_text("{broken")
    assert device.query_gpu_cached(cache).name == "NVIDIA H200", "a damaged cache is asked again"
    assert json.loads(cache.read_text())["gpu"]["uuid"].startswith("GPU-bbbbbbbb")


# ================================================================ the stamp


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_git_state_sees_an_uncommitted_edit(tmp_path):
    git(tmp_path, "init", "-q")
    (tmp_path / "kernel.cu").write_text("// v1\n")
    git(tmp_path, "add", "kernel.cu")
    git(tmp_path, "-c", "user.email=a@b", "-c", "user.name=t", "commit", "-qm", "v1")
    clean = provenance.git_state(tmp_path)
    assert len(clean["commit"]) == 40 and clean["dirty"] is False
    (tmp_path / "kernel.cu").write_text("// v2\n")
    assert provenance.git_state(tmp_path) == {**clean, "dirty": True}


def test_git_state_outside_a_repository_is_unknown(tmp_path):
    assert provenance.git_state(tmp_path) == {"commit": None, "dirty": None}


def test_sources_digest_changes_with_any_source(tmp_path):
    a, b = tmp_path / "kernel.cu", tmp_path / "tile.cuh"
    a.write_text("x")
    b.write_text("y")
    before = provenance.sources_digest([a, b])
    assert before == provenance.sources_digest([b, a]) and len(before) == provenance.DIGEST_CHARS
    b.write_text("y // edited")
    assert provenance.sources_digest([a, b]) != before


def test_variant_inputs_are_what_the_rules_list():
    cuda = load_variant(KERNELS_DIR / "v1_scalar")
    assert variant_inputs(cuda)[0].name == "variant.yaml" and variant_inputs(cuda)[-1] == ABI_HEADER
    assert set(cuda.sources) <= set(variant_inputs(cuda))
    assert ABI_HEADER not in variant_inputs(load_variant(KERNELS_DIR / "triton_flash"))


def test_stamp_records_git_sources_and_card(monkeypatch):
    monkeypatch.setenv("EVO_SDPA_FORCE_CPU", "1")
    variant = load_variant(KERNELS_DIR / "v1_scalar")
    record = provenance.stamp({"status": "pass"}, variant_inputs(variant), measured_on_card=True)
    stamp = record["measured_at"]
    assert set(stamp["git"]) == {"commit", "dirty"}
    assert stamp["sources"] == provenance.sources_digest(variant_inputs(variant))
    assert stamp["card"] == {"name": "cpu", "uuid": None, "compute_capability": None}
    assert provenance.stamp({"status": "skipped"})["measured_at"]["card"] is None


def test_card_reads_the_uuid_torch_gives(monkeypatch):
    class Props:
        name, major, minor, uuid = "NVIDIA H100 80GB HBM3", 9, 0, "aaaaaaaa-1111-2222-3333-444444444444"

    import torch

    monkeypatch.setattr(provenance, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Props())
    assert provenance.card() == {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-aaaaaaaa-1111-2222-3333-444444444444",
                                 "compute_capability": "9.0"}


def test_damaged_ncu_csv_is_one_line_naming_it(tmp_path):
    from evo_sdpa.ncu import read_raw_csv

    path = tmp_path / "report.csv"
    path.write_text('==PROF== Connected to process 4242\n"Kernel Na')
    with pytest.raises(StageError) as excinfo:
        read_raw_csv(path)
    assert str(excinfo.value).startswith(f"{path}: not an ncu raw-page CSV (") and "--forcerun" in str(excinfo.value)
    with pytest.raises(StageError, match="not an ncu raw-page CSV"):
        read_raw_csv(tmp_path / "absent.csv")


# ================================================================ the card a target process reports

def test_a_target_reports_its_card_and_exits_when_torch_sees_none(tmp_path, monkeypatch):
    """The ncu and sanitizer stages run their work in a target process; it writes the card torch
    gives it, and on a host whose driver lists a GPU but whose torch sees none it exits with
    TARGET_NO_DEVICE_EXIT after saying so."""
    path = tmp_path / "card.json"
    monkeypatch.setenv("EVO_SDPA_FORCE_CPU", "1")
    with pytest.raises(SystemExit) as excinfo:
        provenance.report_card(path)
    assert excinfo.value.code == provenance.TARGET_NO_DEVICE_EXIT
    assert provenance.target_found_no_device(path)
    h100 = {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-aaaaaaaa", "compute_capability": "9.0"}
    monkeypatch.setattr(provenance, "card", lambda: h100)
    provenance.report_card(path)
    assert provenance.target_card(path) == h100 and not provenance.target_found_no_device(path)
    assert provenance.fresh_target_card(tmp_path) == path and not path.exists()  # a stage's start drops it


def test_a_target_that_wrote_no_card_leaves_the_record_without_one(tmp_path):
    """A target that failed before reporting: the record names no card rather than a guess (the
    driver's name for the card differs from torch's under MIG, which would read as a mismatch)."""
    absent = tmp_path / "card.json"
    assert provenance.target_card(absent) is None and not provenance.target_found_no_device(absent)
    absent.write_text("{trunc")
    assert provenance.target_card(absent) is None


def test_stamp_takes_the_card_a_target_reported_and_the_lock(monkeypatch):
    from evo_sdpa import cardlock

    monkeypatch.setattr(provenance, "card", lambda: pytest.fail("the stage's own process asked torch"))
    lease = {"card": "GPU-aaaaaaaa", "visible": "GPU-aaaaaaaa", "job": "ncu sdpa"}
    monkeypatch.setenv(cardlock.HELD_ENV, json.dumps(lease))
    reported = {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-aaaaaaaa", "compute_capability": "9.0"}
    stamp = provenance.stamp({"status": "pass"}, measured_on_card=True, card_of=lambda: reported)["measured_at"]
    assert stamp["card"] == reported and stamp["lock"] == {**lease, "inherited": True}
    unmeasured = provenance.stamp({"status": "skipped"}, card_of=lambda: reported)["measured_at"]
    assert unmeasured["card"] is None and unmeasured["lock"] is None


FAKE_SMI = "#!/bin/sh\necho '0, GPU-aaaaaaaa-1111-2222-3333-444444444444, NVIDIA H100 80GB HBM3, 9.0'\n"
H100 = {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-aaaaaaaa-1111-2222-3333-444444444444", "compute_capability": "9.0"}
# A tool (ncu, compute-sanitizer) that either runs its target (`run`: here torch sees no CUDA device,
# so the target reports the CPU and exits 3) or stands in for a target that reported an H100 and
# then failed (`fail`). Its target command follows `--` for ncu, and starts at the Python binary
# for compute-sanitizer.
FAKE_TOOL = """#!{python}
import json, os, sys
argv = sys.argv[1:]
target = argv[argv.index("--") + 1:] if "--" in argv else argv[next(i for i, a in enumerate(argv) if a == {python!r}):]
if "{mode}" == "run":
    os.execv(target[0], target)
card = target[target.index("--card") + 1]
open(card, "w").write(json.dumps({h100}))
print("tool: the target failed", file=sys.stderr)
sys.exit(1)
"""


def stage_host(tmp_path, mode: str, tool: str) -> dict:
    """A fake GPU host for one stage process: nvidia-smi lists an H100, `tool` behaves as `mode` says."""
    import os
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvidia-smi").write_text(FAKE_SMI)
    (bin_dir / tool).write_text(FAKE_TOOL.format(python=sys.executable, mode=mode, h100=H100))
    for name in ("nvidia-smi", tool):
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("EVO_SDPA_FORCE_CPU", "CUDA_VISIBLE_DEVICES")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", EVO_SDPA_LOCK_DIR=str(tmp_path / "locks"))
    return env


def run_stage_script(script: str, args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    """A stage script with -X importtime: its stderr lists every module its own process imported."""
    import sys

    scripts = Path(provenance.__file__).resolve().parents[1]
    return subprocess.run([sys.executable, "-X", "importtime", str(scripts / script), *args], env=env,
                          capture_output=True, text=True, cwd=cwd)


def imported(proc: subprocess.CompletedProcess) -> set[str]:
    return {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("mode", ["fail", "run"])
def test_ncu_stage_never_imports_torch_in_its_own_process(tmp_path, mode):
    """On a GPU host the ncu stage's own process only starts ncu over the target, so it must not pay
    torch's import (3-5 s a job on an H100 host): it asks the driver whether a GPU is visible and takes
    the card from the target. `fail`: the target reported an H100, then ncu failed: a failure stamped
    with that card and the stage's lock. `run`: the target's torch sees no CUDA device: a skip that
    says so, stamped with no card."""
    out = tmp_path / "nsight" / "sdpa"
    cfg = {"profile": {"shape": {"B": 1, "H": 2, "S": 128, "D": 64, "causal": False}, "dtype": "fp16",
                       "launch_count": 1}}
    proc = run_stage_script("run_ncu.py", ["--entry", "sdpa", "--enabled", "true", "--config-json", json.dumps(cfg),
                                           "--csv", str(out / "report.csv"), "--status", str(out / "status.json")],
                            stage_host(tmp_path, mode, "ncu"), tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    status = json.loads((out / "status.json").read_text())
    stamp = status["measured_at"]
    if mode == "fail":
        assert status["status"] == "fail" and "the target failed" in status["reasons"][0]
        assert stamp["card"] == H100 and stamp["lock"]["card"] == H100["uuid"]
    else:
        assert status["status"] == "skipped" and status["reasons"] == [f"not profiled: {device.TORCH_SEES_NO_DEVICE}"]
        assert stamp["card"] is None and (out / "report.csv").read_text() == ""
    assert "evo_sdpa.profiling" in imported(proc) and "torch" not in imported(proc)


@pytest.mark.parametrize("mode", ["fail", "run"])
def test_sanitizer_stage_never_imports_torch_in_its_own_process(tmp_path, mode):
    """The sanitizer stage likewise: four tools over the target, the card from the target."""
    build = tmp_path / "build" / "verdict.json"
    write_json(build, {"status": "pass", "reasons": []})
    verdict_path = tmp_path / "sanitizer" / "v1_scalar" / "verdict.json"
    cfg = {"sanitizer": {"tools": ["memcheck", "racecheck"], "padding_bytes": 256, "shape": {"B": 1, "H": 2, "S": 67}}}
    proc = run_stage_script("run_sanitizer.py", ["--variant", "v1_scalar", "--build", str(build), "--enabled", "true",
                                                 "--config-json", json.dumps(cfg), "--verdict", str(verdict_path)],
                            stage_host(tmp_path, mode, "compute-sanitizer"), tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdict = json.loads(verdict_path.read_text())
    stamp = verdict["measured_at"]
    if mode == "fail":
        assert verdict["status"] == "fail" and [t["tool"] for t in verdict["tools"]] == ["memcheck", "racecheck"]
        assert stamp["card"] == H100 and stamp["lock"]["card"] == H100["uuid"]
    else:
        assert verdict["status"] == "skipped" and verdict["reasons"] == [f"not run: {device.TORCH_SEES_NO_DEVICE}"]
        assert stamp["card"] is None
    assert "evo_sdpa.sanitizer" in imported(proc) and "torch" not in imported(proc)


def test_a_stage_without_its_tool_skips_where_torch_sees_no_device(tmp_path):
    """The driver lists a GPU, torch sees none and ncu is not installed: the same skip as on a host
    without a GPU, not a missing-tool failure (only this path imports torch, to ask)."""
    import os

    env = stage_host(tmp_path, "run", "ncu")
    (tmp_path / "bin" / "ncu").unlink()
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if "cuda" not in p.lower())
    out = tmp_path / "nsight" / "sdpa"
    cfg = {"profile": {"shape": {"B": 1, "H": 2, "S": 128, "D": 64, "causal": False}, "dtype": "fp16",
                       "launch_count": 1}}
    env["CUDA_HOME"] = str(tmp_path / "no-cuda")
    proc = run_stage_script("run_ncu.py", ["--entry", "sdpa", "--enabled", "true", "--config-json", json.dumps(cfg),
                                           "--csv", str(out / "report.csv"), "--status", str(out / "status.json")],
                            env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((out / "status.json").read_text())["reasons"] == [f"not profiled: {device.TORCH_SEES_NO_DEVICE}"]
