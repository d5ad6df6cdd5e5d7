"""The A/B tools beside the pipeline (scripts/ab_sweep.py, scripts/ab_profile.py), on the CPU:
their command lines, the one-line failures before any GPU work, and the build folder the sweep
leaves and the profiler reads. (The tunables side of ab_sweep's --set is in test_tunables.py.)"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from evo_sdpa.errors import StageError
from evo_sdpa.variants import KERNELS_DIR, load_variant

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "scripts" / "ab_profile.py"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def touch(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x7fELF")
    return path


# ---------------------------------------------------------------- ab_profile.py


def test_ab_profile_help_runs():
    proc = subprocess.run([sys.executable, str(PROFILE), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "--libs" in proc.stdout and "--sweep-dir" in proc.stdout and "--shape" in proc.stdout


def test_ab_profile_without_ncu_is_one_line(tmp_path):
    lib = touch(tmp_path / "libv4_pipelined.so")
    env = {"PATH": str(Path(sys.executable).parent), "CUDA_HOME": str(tmp_path / "none"), "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(PROFILE), "--libs", str(lib), "--shape", "2,8,512,64,0"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"evo-sdpa: ncu not found on PATH or in {tmp_path / 'none' / 'bin'}: install Nsight Compute (it ships with "
        "the CUDA toolkit) and put ncu on PATH"]
    assert proc.stdout == ""


def test_ab_profile_prints_the_busiest_and_mean_sm_active_cycles(tmp_path, monkeypatch, capsys):
    """ncu itself stubbed: its export is the real v4 mission-shape profile (v4 NOTES.md, run 11)."""
    module = load_script("ab_profile")
    exported = (REPO / "tests" / "fixtures" / "h100_v4_pipelined_b1h8s512d64_raw.csv").read_text()
    calls = []

    def fake_run(argv, **kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout=exported if "--import" in argv else "", stderr="")

    monkeypatch.setattr(module.subprocess, "run", fake_run)
    monkeypatch.setattr(module, "find_tool", lambda name: "/opt/ncu")
    monkeypatch.setattr(module, "WORK_DIR", tmp_path / "work")
    lib = touch(tmp_path / "libv4_pipelined.so")
    monkeypatch.setattr(sys, "argv", ["ab_profile.py", "--libs", f"v4={lib}", "--shape", "1,8,512,64,0",
                                      "--out", str(tmp_path / "p.json")])
    module.main()
    out = capsys.readouterr().out
    assert out.startswith("v4: 8.2 us") and "SM active (busiest / mean / elapsed cycles) 10264 / 9707 / 14382" in out
    assert len(calls) == 2


def test_ab_profile_sweep_dir_names_each_library_by_its_folder(tmp_path):
    module = load_script("ab_profile")
    touch(tmp_path / "v4_pipelined" / "default" / "libv4_pipelined.so")
    touch(tmp_path / "v4_pipelined" / "s2" / "libv4_pipelined.so")
    touch(tmp_path / "v3_mma" / "default" / "libv3_mma.so")
    (tmp_path / "v4_pipelined" / "default" / "compiler.log").write_text("ptxas info\n")
    parser = module.argument_parser()

    args = parser.parse_args(["--sweep-dir", str(tmp_path), "--shape", "4,16,2048,128,1"])
    assert module.resolve_libs(args) == [
        ("v3_mma/default", str(tmp_path / "v3_mma" / "default" / "libv3_mma.so")),
        ("v4_pipelined/default", str(tmp_path / "v4_pipelined" / "default" / "libv4_pipelined.so")),
        ("v4_pipelined/s2", str(tmp_path / "v4_pipelined" / "s2" / "libv4_pipelined.so"))]

    args = parser.parse_args(["--sweep-dir", str(tmp_path / "v4_pipelined"), "--shape", "4,16,2048,128,1"])
    assert [name for name, _ in module.resolve_libs(args)] == ["default", "s2"]

    args = parser.parse_args(["--sweep-dir", str(tmp_path / "v3_mma" / "default"), "--shape", "1,1,1,64,0"])
    assert [name for name, _ in module.resolve_libs(args)] == ["libv3_mma"]


def test_ab_profile_sweep_dir_alone_is_the_sweeps_build_folder():
    module = load_script("ab_profile")
    args = module.argument_parser().parse_args(["--sweep-dir", "--shape", "4,16,2048,128,1"])
    assert args.sweep_dir == str(load_script("ab_sweep").BUILD_DIR)
    assert module.WORK_DIR == Path("/tmp/evo_sdpa_ab_profile")


def test_ab_profile_libs_take_names_or_paths(tmp_path):
    module = load_script("ab_profile")
    v3 = touch(tmp_path / "a" / "libv3_mma.so")
    v4 = touch(tmp_path / "b" / "libv4_pipelined.so")
    args = module.argument_parser().parse_args(["--libs", f"v3={v3},{v4}", "--shape", "2,8,512,64,0"])
    assert module.resolve_libs(args) == [("v3", str(v3)), ("libv4_pipelined", str(v4))]


@pytest.mark.parametrize("argv, message", [
    (["--libs", "{root}/missing.so"], "no such file"),
    (["--libs", "{root}/a/libx.so,{root}/b/libx.so"], "two libraries named 'libx'"),
    (["--sweep-dir", "{root}/nowhere"], "no such folder"),
    (["--sweep-dir", "{root}/empty"], "no .so below it"),
    ([], "name the libraries to profile"),
])
def test_ab_profile_bad_library_lists_stop_before_ncu(tmp_path, argv, message):
    module = load_script("ab_profile")
    touch(tmp_path / "a" / "libx.so")
    touch(tmp_path / "b" / "libx.so")
    (tmp_path / "empty").mkdir()
    args = module.argument_parser().parse_args([a.format(root=tmp_path) for a in argv] + ["--shape", "1,1,1,64,0"])
    with pytest.raises(StageError, match=message):
        module.resolve_libs(args)


def test_ab_profile_libs_and_sweep_dir_exclude_each_other(tmp_path, capsys):
    with pytest.raises(SystemExit):
        load_script("ab_profile").argument_parser().parse_args(
            ["--libs", "x.so", "--sweep-dir", str(tmp_path), "--shape", "1,1,1,64,0"])
    assert "not allowed with argument" in capsys.readouterr().err


# ---------------------------------------------------------------- ab_sweep.py: --compare, --only


def test_ab_sweep_compare_and_only_parse():
    args = load_script("ab_sweep").argument_parser().parse_args(
        ["--variant", "v4_pipelined", "--out", "x.json", "--compare", "v3_mma", "--only", "causal",
         "--config", "default"])
    assert args.compare == ["v3_mma"] and args.only == "causal"


def test_ab_sweep_graph_sets_defaults_to_the_benchs_rotation():
    parser = load_script("ab_sweep").argument_parser()
    base = ["--variant", "v4_pipelined", "--out", "x.json", "--config", "default"]
    assert parser.parse_args(base).graph_sets is None
    assert parser.parse_args([*base, "--graph-sets", "1"]).graph_sets == 1


@pytest.mark.parametrize("calls", ["0", "1025"])
def test_ab_sweep_graph_calls_out_of_bounds_stop_before_any_build(tmp_path, calls):
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "ab_sweep.py"), "--variant", "v4_pipelined",
                           "--out", str(tmp_path / "x.json"), "--config", "default", "--graph-calls", calls],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and f"--graph-calls {calls}: give 1 to 1024 calls" in proc.stderr
    assert not (tmp_path / "x.json").exists()
    parser = load_script("ab_sweep").argument_parser()
    base = ["--variant", "v5_hopper", "--out", "x.json"]
    assert parser.parse_args(base).graph_calls is None   # the config's timing.graph_calls
    assert parser.parse_args([*base, "--graph-calls", "128"]).graph_calls == 128


def test_ab_sweep_graph_sets_below_one_stops_before_any_build(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "ab_sweep.py"), "--variant", "v4_pipelined",
                           "--out", str(tmp_path / "x.json"), "--config", "default", "--graph-sets", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--graph-sets 0: give at least 1 input set" in proc.stderr
    assert not (tmp_path / "x.json").exists()


def test_ab_sweep_compare_takes_other_cuda_variants_only():
    module = load_script("ab_sweep")
    v4 = load_variant(KERNELS_DIR / "v4_pipelined")
    assert [v.name for v in module.compared_variants(v4, ["v3_mma"])] == ["v3_mma"]
    with pytest.raises(StageError, match="is the swept variant"):
        module.compared_variants(v4, ["v4_pipelined"])
    with pytest.raises(StageError, match="only CUDA variants"):
        module.compared_variants(v4, ["triton_flash"])


def test_ab_sweep_names_must_differ():
    module = load_script("ab_sweep")
    module.check_names(["default", "s2", "v3_mma", "old"])
    with pytest.raises(StageError, match="two configurations named 'v3_mma'"):
        module.check_names(["default", "v3_mma", "v3_mma"])


def test_ab_sweep_artifacts_are_name_and_an_existing_file(tmp_path):
    module = load_script("ab_sweep")
    library = touch(tmp_path / "d.so")
    assert module.parse_artifacts([f"d={library}"]) == [("d", str(library))]
    with pytest.raises(StageError, match="--artifact 'd': give NAME=PATH"):
        module.parse_artifacts(["d"])
    with pytest.raises(StageError, match="give NAME=PATH"):
        module.parse_artifacts([f"={library}"])
    with pytest.raises(StageError, match=f"{tmp_path / 'e.so'} is not a file"):
        module.parse_artifacts([f"d={library}", f"e={tmp_path / 'e.so'}"])


def test_ab_sweep_without_a_device_stops_in_one_line_before_any_build(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "ab_sweep.py"), "--variant", "v4_pipelined",
                           "--out", str(tmp_path / "x.json"), "--config", "default"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "EVO_SDPA_FORCE_CPU": "1"})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == ("evo-sdpa: ab_sweep times configurations on a card: no CUDA device on this "
                                   "host; run it on a GPU host")
    assert not (tmp_path / "x.json").exists()


# ---------------------------------------------------------------- ab_sweep.py: --replica


def test_ab_sweep_replicas_name_cuda_libraries_of_the_sweep():
    module = load_script("ab_sweep")
    names = ["default", "s3", "v3_mma", "old"]
    module.check_replicas(["default", "old"], names, "cuda", ["default", "s3"])
    with pytest.raises(StageError, match="--replica nope: no configuration, compared variant or artifact"):
        module.check_replicas(["nope"], names, "cuda", ["default", "s3"])
    with pytest.raises(StageError, match="--replica default: a triton configuration"):
        module.check_replicas(["default"], names, "triton", ["default", "s3"])
    module.check_replicas(["v3_mma"], names, "triton", ["default", "s3"])   # a compared CUDA variant
    with pytest.raises(StageError, match="two configurations named 'old.copy'"):   # --replica old twice
        module.check_names(names + [module.replica_name("old")] * 2)
    with pytest.raises(StageError, match="two configurations named 'old.copy'"):
        module.check_names(names + ["old.copy"] + [module.replica_name("old")])


def test_ab_sweep_unknown_replica_stops_before_any_build(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "ab_sweep.py"), "--variant", "v4_pipelined",
                           "--out", str(tmp_path / "x.json"), "--config", "default", "--replica", "deflt"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].endswith("--replica deflt: no configuration, compared variant "
                                                          "or artifact of that name (names: default)")
    assert not (tmp_path / "x.json").exists()


def test_ab_sweep_replica_is_a_separate_file_with_the_same_bytes(tmp_path, monkeypatch):
    module = load_script("ab_sweep")
    monkeypatch.setattr(module, "BUILD_DIR", tmp_path / "sweep")
    library = touch(tmp_path / "built" / "libv5_hopper.so")
    first, second = module.copy_library(str(library), "def"), module.copy_library(str(library), "def")
    assert first != second != str(library)
    for copy in (first, second):
        assert Path(copy).name == "libv5_hopper.so" and Path(copy).read_bytes() == library.read_bytes()
        assert Path(copy).parent.parent == tmp_path / "sweep" / "replicas"


def test_ab_sweep_replica_deltas_and_the_sweeps_resolution():
    module = load_script("ab_sweep")
    rows = [{"shape": "B1_H8_S512_D64_full", "dtype": "fp16", "mode": "graph x32",
             "p50_us": {"sdpa": 9.9, "def": 5.14, "def.copy": 5.54, "nh": 5.2}},
            {"shape": "B1_H8_S512_D128_full", "dtype": "fp16", "mode": "graph x32",
             "p50_us": {"sdpa": 12.0, "def": 6.6, "def.copy": 6.5, "nh": 6.5}},
            {"shape": "B4_H16_S2048_D128_causal", "dtype": "bf16", "mode": "eager",
             "p50_us": {"sdpa": 150.0, "def": 135.0, "def.copy": 136.35}}]
    for row in rows:
        row["replica_delta_us"] = module.replica_deltas(row["p50_us"], ["def", "nh"])   # nh has no copy
    assert rows[0]["replica_delta_us"] == {"def": pytest.approx(0.40)}
    assert rows[1]["replica_delta_us"] == {"def": pytest.approx(-0.10)}
    worst = module.resolution(rows)
    assert worst["graph x32"]["shape"] == "B1_H8_S512_D64_full"
    assert worst["graph x32"]["relative"] == pytest.approx(0.40 / 5.14)
    assert worst["eager"]["delta_us"] == pytest.approx(1.35) and worst["eager"]["dtype"] == "bf16"
    assert module.resolution([{k: v for k, v in rows[0].items() if k != "replica_delta_us"}]) == {}


def test_ab_sweep_builds_land_where_ab_profile_looks(tmp_path, monkeypatch):
    """build_config puts each build in BUILD_DIR/<variant>/<config>/ (a compared variant's under
    its own name) and records the variant; the build itself is the build stage's build_cuda."""
    module = load_script("ab_sweep")
    calls = []

    def fake_build_cuda(variant, cc, outdir, cutlass_include=None, tunable_values=None):
        calls.append((variant.name, outdir, tunable_values))
        return {"status": "pass", "reasons": [], "artifact": str(touch(outdir / f"lib{variant.name}.so")),
                "tunables": {}}, [], "log\n"

    monkeypatch.setattr(module, "BUILD_DIR", tmp_path)
    monkeypatch.setattr(module, "build_cuda", fake_build_cuda)
    v3 = load_variant(KERNELS_DIR / "v3_mma")
    record = module.build_config(v3, "default", {}, [], "9.0", {})
    assert calls == [("v3_mma", tmp_path / "v3_mma" / "default", {})]
    assert record["variant"] == "v3_mma" and (tmp_path / "v3_mma" / "default" / "compiler.log").is_file()
    profile = load_script("ab_profile")
    args = profile.argument_parser().parse_args(["--sweep-dir", str(tmp_path), "--shape", "1,1,1,64,0"])
    assert [name for name, _ in profile.resolve_libs(args)] == ["v3_mma/default"]


def test_ab_sweep_triton_configurations_are_launch_configurations():
    """A Triton variant's configuration compiles nothing ahead: its tunables are resolved (checked
    against variant.yaml) and bound to the forward; nvcc flags are refused in one line."""
    module = load_script("ab_sweep")
    triton = load_variant(KERNELS_DIR / "triton_flash")
    record = module.build_config(triton, "wide", {"BLOCK_M": 128, "num_warps": 8}, [], "9.0", {})
    assert record["verdict"]["status"] == "pass" and record["set"] == {"BLOCK_M": 128, "num_warps": 8}
    assert record["verdict"]["tunables"]["BLOCK_N"] == triton.meta["tunables"]["BLOCK_N"]["default"]
    with pytest.raises(StageError, match="a Triton variant has no nvcc flags"):
        module.build_config(triton, "x", {}, ["-O0"], "9.0", {})
    with pytest.raises(StageError):
        module.build_config(triton, "x", {"BLOCK_M": 48}, [], "9.0", {})


def test_ab_sweep_triton_configurations_go_through_the_build_stage(monkeypatch):
    """On the GPU a Triton configuration is compiled by the build stage's build_triton before its
    parity: a spilling one comes back failed (so it is never timed) with its registers and spills."""
    module = load_script("ab_sweep")
    triton = load_variant(KERNELS_DIR / "triton_flash")
    record = module.build_config(triton, "n128", {"BLOCK_N": 128}, [], "9.0", {})
    seen = []

    def fake_build_triton(variant, allow_spills, tunable_values):
        seen.append((variant.name, allow_spills, tunable_values))
        return ({"status": "fail", "reasons": ["register spills in _triton_flash_fwd"], "tunables": tunable_values},
                [{"registers": 255, "spill_bytes": 224, "tunables": tunable_values}], "")

    monkeypatch.setattr(module, "build_triton", fake_build_triton)
    module.triton_build(record, triton, False)
    assert seen == [("triton_flash", False, record["verdict"]["tunables"])]
    assert record["verdict"]["status"] == "fail" and record["spill_bytes"] == 224 and record["registers"] == [255]


# ---------------------------------------------------------------- tools live in scripts/


def test_no_cuda_variant_folder_holds_a_python_tool():
    """Tools that drive the pipeline's library live in scripts/, not beside a kernel's sources."""
    for meta_path in sorted(KERNELS_DIR.glob("*/variant.yaml")):
        if (yaml.safe_load(meta_path.read_text()) or {}).get("kind") == "cuda":
            tools = sorted(p.name for p in meta_path.parent.glob("*.py"))
            assert not tools, f"{meta_path.parent.name}: {tools}: Python tools belong in scripts/"


# ---------------------------------------------------------------- source-page hotspots

SOURCE_PAGE = Path(__file__).parent / "fixtures" / "h100_v5_causal_source_page.csv"


def test_source_page_of_a_real_report_names_the_wgmma_wait_as_the_top_instruction():
    """An excerpt of ncu's source page for v5_hopper on 4,16,2048,128 causal (H100): the top
    instruction is the wgmma wait after the softmax, whose samples ncu files under 'barrier'."""
    from evo_sdpa.hotspots import hotspots, parse_source_page

    kernels = parse_source_page(SOURCE_PAGE.read_text())
    assert len(kernels) == 1 and kernels[0]["name"].startswith("void v5_hopper::v5_hopper_attention_fwd")
    assert len(kernels[0]["instructions"]) == 62
    spots = hotspots(kernels[0], top=3)
    first = spots["top"][0]
    assert first["sass"] == "WARPGROUP.DEPBAR.LE gsb0, 0x0" and first["reasons"][0]["reason"] == "barrier"
    assert first["previous"].startswith("ULDC")
    assert sum(i["samples"] for i in kernels[0]["instructions"]) == spots["samples"]
    assert abs(sum(o["share"] for o in spots["by_opcode"]) - 1.0) < 1e-9
    assert spots["by_opcode"][0]["opcode"] == "WARPGROUP.DEPBAR"
    # The guard predicate is not the opcode; the sleep of a barrier try-wait is its own opcode.
    assert "NANOSLEEP" in [o["opcode"] for o in spots["by_opcode"]]


def test_opcode_keeps_the_barrier_kind_and_drops_the_predicate():
    from evo_sdpa.hotspots import opcode

    assert opcode("@!P0  NANOSLEEP.SYNCS 0x989680") == "NANOSLEEP"
    assert opcode("BAR.SYNC.DEFER_BLOCKING R0, 0x100") == "BAR.SYNC"
    assert opcode("@!P2  BAR.ARV R11, 0x100") == "BAR.ARV"
    assert opcode("HGMMA.64x128x16.F32 R24, R152, gdesc[UR12].tnspB, R24") == "HGMMA"
    assert opcode("@UP1 SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R3+URZ+0x30040], R0") == "SYNCS.PHASECHK"


def test_a_page_without_source_counters_says_so():
    from evo_sdpa.hotspots import parse_source_page

    with pytest.raises(ValueError, match="SourceCounters"):
        parse_source_page('"Kernel Name","k"\n')
