"""The CUDA build stage around nvcc: several translation units compiled in parallel and linked,
linker flags, the CUTLASS include folder (build.requires) and the SASS check (build.sass_expect).
The compiles are real (nvcc, no GPU); each is skipped where nvcc is absent."""
from __future__ import annotations

import ctypes
import dataclasses
import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from evo_sdpa import build, sass
from evo_sdpa.build import build_cuda, check_sass, cutlass_include_dir, installed_cutlass_include, run_parallel
from evo_sdpa.errors import StageError
from evo_sdpa.nvcc import arch_gencode, compile_command
from evo_sdpa.variants import KERNELS_DIR, SHARED_DIR, load_variant

REPO = Path(__file__).resolve().parents[1]
SASS_LISTING = REPO / "tests" / "fixtures" / "sass" / "hopper_ops_sm90a.sass"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")

ENTRY_CU = """\
#include "scale.cuh"
__global__ void unit_entry_kernel(float* x) { x[threadIdx.x] += 1.0f; }
extern "C" int unit_entry(float* x, int n) {
    unit_entry_kernel<<<1, 32>>>(x);
    launch_scale(x, n);  // defined in the other translation unit
    return 0;
}
"""
SCALE_CUH = "#pragma once\nvoid launch_scale(float* x, int n);\n"
SCALE_CU = """\
#include "scale.cuh"
__global__ void unit_scale_kernel(float* x, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= 2.0f;
}
void launch_scale(float* x, int n) { unit_scale_kernel<<<(n + 127) / 128, 128>>>(x, n); }
"""
SINGLE_CU = """\
__global__ void single_kernel(float* x) { x[threadIdx.x] += 1.0f; }
extern "C" int single_entry(float* x) { single_kernel<<<1, 32>>>(x); return 0; }
"""


def make_cuda_variant(root: Path, name: str, files: dict[str, str], sources: list[str], build_meta: dict | None = None):
    folder = root / "kernels" / name
    folder.mkdir(parents=True)
    for file_name, text in files.items():
        (folder / file_name).write_text(text)
    meta = {"name": name, "kind": "cuda", "description": "a build-stage test variant", "sources": sources,
            "support": {"dtypes": ["fp16"], "head_dims": [64], "causal": [False]},
            "build": {"nvcc_flags": ["-O3", "-std=c++17"], **(build_meta or {})}}
    (folder / "variant.yaml").write_text(yaml.safe_dump(meta))
    return load_variant(folder)


def two_unit_variant(tmp_path: Path, build_meta: dict | None = None, scale_cu: str = SCALE_CU):
    return make_cuda_variant(tmp_path, "two_units", {"entry.cu": ENTRY_CU, "scale.cuh": SCALE_CUH, "scale.cu": scale_cu},
                             ["entry.cu", "scale.cuh", "scale.cu"], build_meta)


def single_variant(tmp_path: Path, build_meta: dict | None = None):
    return make_cuda_variant(tmp_path, "single", {"kernel.cu": SINGLE_CU, "helper.cuh": "#pragma once\n"},
                             ["kernel.cu", "helper.cuh"], build_meta)


def out_dir(tmp_path: Path) -> Path:
    path = tmp_path / "results" / "build"
    path.mkdir(parents=True)
    return path


def stub_library(tmp_path: Path, name: str) -> Path:
    """A shared library lib<name>.so, so a -l<name> link resolves on a host without it."""
    folder = tmp_path / "stubs"
    folder.mkdir(exist_ok=True)
    source = folder / "stub.c"
    source.write_text("int evo_sdpa_stub(void) { return 0; }\n")
    compiler = shutil.which("cc") or shutil.which("gcc")
    subprocess.run([compiler, "-shared", "-fPIC", str(source), "-o", str(folder / f"lib{name}.so")], check=True)
    return folder


# --- several translation units ---------------------------------------------------------------


@needs_nvcc
def test_two_units_compile_to_objects_and_link_into_one_library(tmp_path: Path) -> None:
    variant = two_unit_variant(tmp_path)
    outdir = out_dir(tmp_path)
    verdict, resources, log_text = build_cuda(variant, "9.0", outdir)
    assert verdict["status"] == "pass", verdict["reasons"]
    artifact = outdir / "libtwo_units.so"
    assert verdict["artifact"] == str(artifact) and artifact.stat().st_size > 0
    assert [unit["source"] for unit in verdict["units"]] == [str(variant.folder / "entry.cu"),
                                                               str(variant.folder / "scale.cu")]
    assert all(unit["returncode"] == 0 and unit["seconds"] >= 0 for unit in verdict["units"])
    assert all("-c" in unit["command"] and "-shared" not in unit["command"] for unit in verdict["units"])
    assert verdict["link"]["returncode"] == 0
    assert verdict["command"] == verdict["link"]["command"]
    assert verdict["command"][-2:] == ["-o", str(artifact)]
    assert verdict["compile_seconds"] >= max(unit["seconds"] for unit in verdict["units"])
    # both units' ptxas resources reach the report, in source order
    kernels = [record["kernel"] for record in resources]
    assert kernels == ["_Z17unit_entry_kernelPf", "_Z17unit_scale_kernelPfi"]
    assert all(record["arch"] == "sm_90a" for record in resources)
    commands = [line for line in log_text.splitlines() if line.startswith("$ ")]
    assert len(commands) == 3
    assert commands[0].endswith(f"entry.cu -o {commands[0].split(' -o ')[-1]}") and "scale.cu" in commands[1]
    assert " -shared " in commands[2]
    assert log_text.count("Compiling entry function") == 2
    assert not list(outdir.glob(".objects-*")), "the objects' scratch folder is removed"
    library = ctypes.CDLL(str(artifact))  # the entry's call into the other unit resolved at link
    assert hasattr(library, "unit_entry")


def test_units_merge_in_runs_only_where_the_variant_allows_and_threads_are_short() -> None:
    units = ["k.cu", "a.cu", "b.cu", "c.cu", "d.cu"]
    assert build.unit_groups(units, 1, True) == [units]
    assert build.unit_groups(units, 2, True) == [["k.cu", "a.cu", "b.cu"], ["c.cu", "d.cu"]]
    assert build.unit_groups(units, 4, True) == [["k.cu", "a.cu"], ["b.cu"], ["c.cu"], ["d.cu"]]
    assert build.unit_groups(units, 5, True) == build.unit_groups(units, 8, True) == [[unit] for unit in units]
    assert build.unit_groups(units, 1, False) == [[unit] for unit in units]


@needs_nvcc
def test_merged_units_build_one_library_from_one_compile(tmp_path: Path) -> None:
    variant = two_unit_variant(tmp_path, {"merge_units": True})
    outdir = out_dir(tmp_path)
    stale = outdir / "merged_unit_7.cu"
    stale.write_text("#error a merged unit of an earlier build\n")
    verdict, resources, log_text = build_cuda(variant, "9.0", outdir, jobs=1)
    assert verdict["status"] == "pass", verdict["reasons"]
    merged = outdir / "merged_unit_0.cu"
    sources = [str(variant.folder / "entry.cu"), str(variant.folder / "scale.cu")]
    assert merged.read_text() == "".join(f'#include "{source}"\n' for source in sources)
    assert not stale.exists()
    assert [(unit["source"], unit["merges"]) for unit in verdict["units"]] == [(str(merged), sources)]
    assert verdict["link"] is None and verdict["command"][-2:] == ["-o", str(outdir / "libtwo_units.so")]
    assert sorted(record["kernel"] for record in resources) == ["_Z17unit_entry_kernelPf", "_Z17unit_scale_kernelPfi"]
    assert hasattr(ctypes.CDLL(verdict["artifact"]), "unit_entry")
    # with a thread per unit the same variant compiles them apart, and no merged unit is left
    verdict, _, _ = build_cuda(variant, "9.0", outdir, jobs=2)
    assert [unit["source"] for unit in verdict["units"]] == sources and "merges" not in verdict["units"][0]
    assert not merged.exists()


@needs_nvcc
def test_an_error_in_a_merged_unit_names_the_file_it_is_in(tmp_path: Path) -> None:
    variant = two_unit_variant(tmp_path, {"merge_units": True}, scale_cu=SCALE_CU + "\nthis_is_not_cuda;\n")
    verdict, _, _ = build_cuda(variant, "9.0", out_dir(tmp_path), jobs=1)
    assert verdict["status"] == "fail" and verdict["artifact"] is None
    assert "scale.cu(" in verdict["first_error"] and "error" in verdict["first_error"]


@needs_nvcc
def test_single_unit_builds_with_todays_one_command(tmp_path: Path) -> None:
    variant = single_variant(tmp_path)
    outdir = out_dir(tmp_path)
    verdict, resources, log_text = build_cuda(variant, "9.0", outdir)
    assert verdict["status"] == "pass", verdict["reasons"]
    expected = compile_command(shutil.which("nvcc"), [str(variant.folder / "kernel.cu")], str(outdir / "libsingle.so"),
                               arch_gencode("9.0"), ["-O3", "-std=c++17"],
                               [str(KERNELS_DIR / SHARED_DIR), str(variant.folder)])
    assert verdict["command"] == expected
    assert verdict["units"] == [{"source": str(variant.folder / "kernel.cu"), "seconds": verdict["units"][0]["seconds"],
                                 "returncode": 0, "command": expected}]
    assert verdict["link"] is None and verdict["sass"] is None
    assert log_text.splitlines()[0] == "$ " + " ".join(expected)
    assert [record["kernel"] for record in resources] == ["_Z13single_kernelPf"]


@needs_nvcc
def test_a_failing_unit_fails_the_verdict_and_skips_the_link(tmp_path: Path) -> None:
    variant = two_unit_variant(tmp_path, scale_cu=SCALE_CU + "\nthis_is_not_cuda;\n")
    outdir = out_dir(tmp_path)
    verdict, resources, log_text = build_cuda(variant, "9.0", outdir)
    assert verdict["status"] == "fail"
    assert [unit["returncode"] == 0 for unit in verdict["units"]] == [True, False]
    assert verdict["link"] is None and verdict["command"] is None and verdict["artifact"] is None
    assert "scale.cu(" in verdict["first_error"] and "error" in verdict["first_error"]
    assert verdict["reasons"][0].startswith("nvcc exited with status ")
    assert "this_is_not_cuda" in log_text
    assert [record["kernel"] for record in resources] == ["_Z17unit_entry_kernelPf"]
    assert not (outdir / "libtwo_units.so").exists()


def test_run_parallel_runs_the_commands_at_once_and_keeps_their_order(tmp_path: Path) -> None:
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: the units run one after another")
    # Each command marks itself started, then waits for the other's mark: run one after the
    # other, the first would wait out its 20 s and fail.
    def waiter(me: str, other: str) -> list[str]:
        return ["sh", "-c", f"touch {tmp_path / me}; i=0; while [ ! -e {tmp_path / other} ] && [ $i -lt 200 ]; "
                            f"do sleep 0.1; i=$((i+1)); done; [ -e {tmp_path / other} ] && echo {me}"]
    steps = run_parallel([waiter("a", "b"), waiter("b", "a"), ["sh", "-c", "echo c"]])
    assert [(step.returncode, step.output) for step in steps] == [(0, "a\n"), (0, "b\n"), (0, "c\n")]


def test_run_parallel_keeps_to_the_jobs_it_was_given(tmp_path: Path) -> None:
    """With one job (`snakemake --cores 1` gives the build one thread) the units run one after
    another: each sees no other running."""
    def alone(me: str) -> list[str]:
        return ["sh", "-c", f"ls {tmp_path} | grep -q running && echo overlap; touch {tmp_path}/{me}.running; "
                            f"sleep 0.3; rm {tmp_path}/{me}.running; echo {me}"]
    steps = run_parallel([alone("a"), alone("b"), alone("c")], jobs=1)
    assert [step.output for step in steps] == ["a\n", "b\n", "c\n"]


# --- linker flags --------------------------------------------------------------------------------


@needs_nvcc
@pytest.mark.parametrize("make", [single_variant, two_unit_variant], ids=["one command", "compile and link"])
def test_a_library_flag_in_nvcc_flags_reaches_the_link(tmp_path: Path, make) -> None:
    stubs = stub_library(tmp_path, "cuda")  # the host has no driver: a stand-in libcuda.so
    variant = make(tmp_path, {"nvcc_flags": ["-O3", "-std=c++17", f"-L{stubs}", "-lcuda"]})
    verdict, _, _ = build_cuda(variant, "9.0", out_dir(tmp_path))
    assert verdict["status"] == "pass", verdict["reasons"]
    assert all("-lcuda" in unit["command"] for unit in verdict["units"])  # harmless to nvcc -c


@needs_nvcc
@pytest.mark.parametrize("make", [single_variant, two_unit_variant], ids=["one command", "compile and link"])
def test_a_missing_library_fails_at_the_link_with_the_linker_line(tmp_path: Path, make) -> None:
    variant = make(tmp_path, {"nvcc_flags": ["-O3", "-levo_sdpa_no_such_lib"]})
    verdict, _, _ = build_cuda(variant, "9.0", out_dir(tmp_path))
    assert verdict["status"] == "fail"
    if make is two_unit_variant:  # the objects compiled; the link failed
        assert [unit["returncode"] for unit in verdict["units"]] == [0, 0] and verdict["link"]["returncode"] != 0
    assert "cannot find -levo_sdpa_no_such_lib" in verdict["first_error"]
    assert verdict["artifact"] is None


# --- CUTLASS headers (build.requires) ------------------------------------------------------------


def fake_include(root: Path) -> Path:
    (root / "cute").mkdir(parents=True)
    (root / "cute" / "tensor.hpp").write_text("#pragma once\n")
    (root / "cutlass").mkdir()
    (root / "cutlass" / "version.h").write_text("#pragma once\n#define CUTLASS_MAJOR 99\n")
    return root


def test_config_key_wins_over_the_package(tmp_path: Path) -> None:
    configured = fake_include(tmp_path / "mine")
    assert cutlass_include_dir(str(configured), fake_include(tmp_path / "pkg")) == configured
    assert cutlass_include_dir(str(configured), None) == configured


def test_config_key_relative_to_the_repository(tmp_path: Path, monkeypatch) -> None:
    fake_include(tmp_path / "third_party" / "cutlass" / "include")
    monkeypatch.setattr(build, "REPO", tmp_path)
    assert cutlass_include_dir("third_party/cutlass/include", None) == tmp_path / "third_party/cutlass/include"


def test_config_key_without_cute_is_one_line_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(StageError) as info:
        cutlass_include_dir(str(tmp_path), fake_include(tmp_path / "pkg"))
    assert str(info.value) == (f"config: key 'build.cutlass_include': {str(tmp_path)!r} holds no cute/tensor.hpp "
                               "(point it at the folder holding cute/ and cutlass/)")


def test_package_include_found_without_importing_it(tmp_path: Path, monkeypatch) -> None:
    package = tmp_path / "site-packages" / "cutlass_library"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    fake_include(package / "source" / "include")
    spec = importlib.machinery.ModuleSpec("cutlass_library", None, origin=str(package / "__init__.py"),
                                          is_package=True)
    spec.submodule_search_locations = [str(package)]
    monkeypatch.setattr(build.importlib.util, "find_spec",
                        lambda name: spec if name == "cutlass_library" else None)
    assert installed_cutlass_include() == package / "source" / "include"
    assert cutlass_include_dir(None, installed_cutlass_include()) == package / "source" / "include"


def test_no_package_is_one_line_naming_the_fix(monkeypatch) -> None:
    monkeypatch.setattr(build.importlib.util, "find_spec", lambda name: None)
    assert installed_cutlass_include() is None
    with pytest.raises(StageError) as info:
        cutlass_include_dir(None, None)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("CUTLASS headers not found (no cutlass_library package in ")
    assert message.endswith(": pip install nvidia-cutlass==4.2.0.0 (headers only; --no-deps is enough) "
                            "or set build.cutlass_include")


def test_package_without_headers_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(StageError, match=r"cute/tensor\.hpp missing\): pip install nvidia-cutlass==4\.2\.0\.0"):
        cutlass_include_dir(None, tmp_path / "source" / "include")


def test_the_installed_nvidia_cutlass_holds_cute() -> None:
    import importlib.util

    if importlib.util.find_spec("cutlass_library") is None:
        pytest.skip("nvidia-cutlass not installed")
    include = installed_cutlass_include()
    assert (include / "cute" / "tensor.hpp").is_file() and (include / "cutlass" / "cutlass.h").is_file()
    assert "cutlass_library" not in sys.modules


CUTLASS_CU = """\
#include <cutlass/version.h>
static_assert(CUTLASS_MAJOR == EXPECTED_MAJOR, "the include folder of the test");
__global__ void cutlass_probe_kernel(float* x) { x[threadIdx.x] = CUTLASS_MAJOR; }
"""


@needs_nvcc
def test_requires_cutlass_puts_the_configured_folder_on_the_include_path(tmp_path: Path) -> None:
    include = fake_include(tmp_path / "include")
    variant = make_cuda_variant(tmp_path, "cutlass_probe", {"kernel.cu": CUTLASS_CU}, ["kernel.cu"],
                                {"requires": ["cutlass"], "nvcc_flags": ["-O3", "-DEXPECTED_MAJOR=99"]})
    verdict, _, _ = build_cuda(variant, "9.0", out_dir(tmp_path), str(include))
    assert verdict["status"] == "pass", verdict["reasons"]
    assert verdict["command"][verdict["command"].index(f"-I{variant.folder}") + 1] == f"-I{include}"


@needs_nvcc
def test_requires_cutlass_builds_against_the_installed_package(tmp_path: Path) -> None:
    import importlib.util

    if importlib.util.find_spec("cutlass_library") is None:
        pytest.skip("nvidia-cutlass not installed")
    variant = make_cuda_variant(tmp_path, "cutlass_probe", {"kernel.cu": CUTLASS_CU}, ["kernel.cu"],
                                {"requires": ["cutlass"], "nvcc_flags": ["-O3", "-DEXPECTED_MAJOR=4"]})
    verdict, _, _ = build_cuda(variant, "9.0", out_dir(tmp_path))
    assert verdict["status"] == "pass", verdict["reasons"]
    assert f"-I{installed_cutlass_include()}" in verdict["command"]


@needs_nvcc
def test_requires_cutlass_without_headers_stops_before_compiling(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(build, "installed_cutlass_include", lambda: None)
    variant = make_cuda_variant(tmp_path, "cutlass_probe", {"kernel.cu": CUTLASS_CU}, ["kernel.cu"],
                                {"requires": ["cutlass"]})
    outdir = out_dir(tmp_path)
    with pytest.raises(StageError, match="or set build.cutlass_include$"):
        build_cuda(variant, "9.0", outdir)
    assert list(outdir.iterdir()) == []


def test_without_requires_no_lookup(monkeypatch) -> None:
    monkeypatch.setattr(build, "installed_cutlass_include", lambda: pytest.fail("looked up"))
    assert build.required_include_dirs([], None) == []


# --- the SASS check (build.sass_expect) ----------------------------------------------------------


def fixture_check(tmp_path: Path, monkeypatch, expected: list[str]) -> tuple[dict, str]:
    """check_sass on the captured Hopper listing, as if cuobjdump had printed it."""
    monkeypatch.setattr(sass, "dump_sass", lambda tools, artifact: (["cuobjdump", "-sass", str(artifact)],
                                                                   SASS_LISTING.read_text()))
    verdict = {"status": "pass", "reasons": []}
    text = check_sass(verdict, sass.SassTools("cuobjdump", "nvdisasm"), tmp_path / "libv.so", expected)
    return verdict, text


def test_sass_expect_met_passes_with_the_counts(tmp_path: Path, monkeypatch) -> None:
    verdict, text = fixture_check(tmp_path, monkeypatch, ["HGMMA", "UTMALDG", "SYNCS"])
    assert verdict["status"] == "pass" and verdict["reasons"] == []
    assert verdict["sass"] == {"HGMMA": 1, "UTMALDG": 1, "SYNCS": 4}
    assert Path(verdict["sass_dump"]) == tmp_path / "libv.sass"
    assert (tmp_path / "libv.sass").read_text() == SASS_LISTING.read_text()
    assert text.endswith("SASS opcodes expected by build.sass_expect: HGMMA 1, UTMALDG 1, SYNCS 4\n")


def test_sass_expect_unmet_fails_the_verdict(tmp_path: Path, monkeypatch) -> None:
    verdict, _ = fixture_check(tmp_path, monkeypatch, ["HGMMA", "HMMA"])
    assert verdict["status"] == "fail"
    assert verdict["sass"] == {"HGMMA": 1, "HMMA": 0}
    assert verdict["reasons"] == ["SASS holds no HMMA instruction (expected by build.sass_expect)"]


def sass_tools_or_skip() -> None:
    try:
        sass.find_sass_tools()
    except StageError:
        pytest.skip("no cuobjdump/nvdisasm (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")


@needs_nvcc
def test_real_build_without_hopper_instructions_fails_sass_expect(tmp_path: Path) -> None:
    sass_tools_or_skip()
    variant = two_unit_variant(tmp_path, {"sass_expect": ["FADD", "EXIT", "HGMMA"]})
    outdir = out_dir(tmp_path)
    verdict, _, log_text = build_cuda(variant, "9.0", outdir)
    assert verdict["status"] == "fail"
    assert verdict["reasons"] == ["SASS holds no HGMMA instruction (expected by build.sass_expect)"]
    assert verdict["sass"]["HGMMA"] == 0 and verdict["sass"]["FADD"] >= 1 and verdict["sass"]["EXIT"] >= 2
    assert verdict["artifact"] == str(outdir / "libtwo_units.so")  # built; judged by its SASS
    assert "Function : _Z17unit_scale_kernelPfi" in (outdir / "libtwo_units.sass").read_text()
    assert "-sass" in log_text.splitlines()[-2] and "HGMMA 0" in log_text.splitlines()[-1]


@needs_nvcc
def test_sass_expect_without_tools_stops_before_compiling(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sass, "find_tool", lambda name: None)
    monkeypatch.setattr(sass, "packaged_tool", lambda name: None)
    variant = single_variant(tmp_path, {"sass_expect": ["HGMMA"]})
    outdir = out_dir(tmp_path)
    with pytest.raises(StageError, match=r"^build.sass_expect needs cuobjdump and nvdisasm .*pip install "
                                         r"nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm"):
        build_cuda(variant, "9.0", outdir)
    assert list(outdir.iterdir()) == []


@needs_nvcc
def test_no_sass_expect_needs_no_tools(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(sass, "find_sass_tools", lambda: pytest.fail("looked for cuobjdump"))
    verdict, _, _ = build_cuda(single_variant(tmp_path), "9.0", out_dir(tmp_path))
    assert verdict["status"] == "pass" and verdict["sass"] is None


# --- the stage script: the config reaches the build ------------------------------------------------


@needs_nvcc
def test_stage_script_passes_build_cutlass_include_from_the_config(tmp_path: Path) -> None:
    from pipeline_helpers import CPU_ENV, copy_tree

    (tmp_path / "repo").mkdir()
    root = copy_tree(tmp_path / "repo", kernels=[])
    make_cuda_variant(root, "cutlass_probe", {"kernel.cu": CUTLASS_CU}, ["kernel.cu"], {"requires": ["cutlass"]})
    config = {"build": {"default_compute_capability": "9.0", "cutlass_include": str(tmp_path / "nowhere")}}
    proc = subprocess.run([sys.executable, "scripts/build_variant.py", "--variant", "cutlass_probe",
                           "--compute-capability", "9.0", "--config-json", json.dumps(config),
                           "--verdict", "out/v.json", "--resources", "out/r.json", "--compiler-log", "out/c.log"],
                          cwd=root, env=CPU_ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"evo-sdpa: config: key 'build.cutlass_include': {str(tmp_path / 'nowhere')!r} holds no cute/tensor.hpp "
        "(point it at the folder holding cute/ and cutlass/)")


# --- tunables: variant.yaml's values reach the compile as -D ----------------------------------------

TUNABLE_CU = """\
#ifndef TUNED_WIDTH
#error "TUNED_WIDTH undefined: the build passes it from variant.yaml (tunables.width)"
#endif
static_assert(TUNED_WIDTH == 32 || TUNED_WIDTH == 64, "a declared value");
__global__ void tuned_kernel(float* x) { float r[TUNED_WIDTH / 32]; r[0] = x[0];
    for (int i = 1; i < TUNED_WIDTH / 32; ++i) r[i] = r[i - 1] * 2.0f; x[threadIdx.x] = r[TUNED_WIDTH / 32 - 1]; }
"""


def tuned_variant(tmp_path: Path):
    folder = tmp_path / "kernels" / "tuned"
    folder.mkdir(parents=True)
    (folder / "kernel.cu").write_text(TUNABLE_CU)
    meta = {"name": "tuned", "kind": "cuda", "description": "a tunable test variant", "sources": ["kernel.cu"],
            "support": {"dtypes": ["fp16"], "head_dims": [64], "causal": [False]},
            "build": {"nvcc_flags": ["-O3"]},
            "tunables": {"width": {"values": [32, 64], "default": 64, "define": "TUNED_WIDTH"}}}
    (folder / "variant.yaml").write_text(yaml.safe_dump(meta))
    return load_variant(folder)


@needs_nvcc
def test_the_build_passes_every_tunable_and_records_the_values(tmp_path: Path) -> None:
    variant = tuned_variant(tmp_path)
    verdict, _, log_text = build_cuda(variant, "9.0", out_dir(tmp_path))
    assert verdict["status"] == "pass", verdict["reasons"]
    assert verdict["tunables"] == {"width": 64}
    assert verdict["command"][1:3] == ["-O3", "-DTUNED_WIDTH=64"]
    outdir = tmp_path / "override"
    outdir.mkdir()
    verdict, _, _ = build_cuda(variant, "9.0", outdir, tunable_values={"width": 32})
    assert verdict["status"] == "pass" and verdict["tunables"] == {"width": 32}
    assert "-DTUNED_WIDTH=32" in verdict["command"] and "-DTUNED_WIDTH=64" not in verdict["command"]


@needs_nvcc
def test_an_undeclared_value_stops_before_compiling(tmp_path: Path) -> None:
    outdir = out_dir(tmp_path)
    with pytest.raises(StageError, match=r"^tuned: tunable width=48 is not one of its declared values \[32, 64\]"):
        build_cuda(tuned_variant(tmp_path), "9.0", outdir, tunable_values={"width": 48})
    assert list(outdir.iterdir()) == []


@needs_nvcc
def test_a_source_built_without_its_tunables_stops_at_the_error_guard(tmp_path: Path) -> None:
    variant = tuned_variant(tmp_path)
    bare = dataclasses.replace(variant, meta={**variant.meta, "tunables": {}})
    verdict, _, _ = build_cuda(bare, "9.0", out_dir(tmp_path))
    assert verdict["status"] == "fail"
    assert "TUNED_WIDTH undefined: the build passes it from variant.yaml (tunables.width)" in verdict["first_error"]


@needs_nvcc
def test_evolution_candidates_build_with_their_values_once(tmp_path: Path, monkeypatch) -> None:
    """The evolution's evaluator builds candidates in parallel through the build stage's code, each
    into its own folder, and reads a finished build back instead of compiling it again."""
    import logging

    from evo_sdpa import candidates as candidates_lib
    from evo_sdpa.candidates import PipelineEvaluator, StageConfig
    from evo_sdpa.evolve import Candidate, Store

    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    store = Store(tmp_path / "search")
    evaluator = PipelineEvaluator(tuned_variant(tmp_path), store, StageConfig("9.0", cfg), str(tmp_path / "env.json"),
                                  2, logging.getLogger("test"))
    wide, narrow = Candidate("g00-c00", 0, {"width": 64}, "defaults"), Candidate("g00-c01", 0, {"width": 32}, "mutation")
    bad = Candidate("g00-c02", 0, {"width": 48}, "mutation")
    verdicts = evaluator.build([wide, narrow, bad])
    assert verdicts["g00-c00"]["tunables"] == {"width": 64} and verdicts["g00-c01"]["tunables"] == {"width": 32}
    assert verdicts["g00-c01"]["artifact"] == str(store.candidate_dir("g00-c01") / "build" / "libtuned.so")
    assert verdicts["g00-c02"]["status"] == "fail"
    assert verdicts["g00-c02"]["reasons"] == ["tuned: tunable width=48 is not one of its declared values [32, 64] "
                                              "(extend `values` in variant.yaml to try it)"]
    assert (store.candidate_dir("g00-c01") / "build" / "compiler.log").read_text().count("-DTUNED_WIDTH=32") == 1
    monkeypatch.setattr(candidates_lib, "build_into", lambda *a, **k: pytest.fail("rebuilt"))
    assert evaluator.build([narrow])["g00-c01"]["tunables"] == {"width": 32}


def test_nvcc_stopped_by_a_signal_marks_the_verdict_interrupted(tmp_path: Path, monkeypatch) -> None:
    """A timeout or a cancel kills nvcc (the whole process group gets SIGTERM): the verdict fails
    and says it was interrupted, so a search that caches verdicts builds it again on resume."""
    variant = two_unit_variant(tmp_path)
    monkeypatch.setattr(build, "require_tool", lambda name: "/usr/bin/nvcc")
    killed = build.Step(["nvcc", "-c", "entry.cu"], -15, "", 0.5)
    done = build.Step(["nvcc", "-c", "scale.cu"], 0, "", 0.5)
    monkeypatch.setattr(build, "run_nvcc", lambda *args: ([killed, done], None))
    verdict, _, _ = build_cuda(variant, "9.0", out_dir(tmp_path))
    assert verdict["status"] == "fail" and verdict["interrupted"] is True
    assert any("stopped by signal 15" in reason for reason in verdict["reasons"])
    monkeypatch.setattr(build, "run_nvcc", lambda *args: ([build.Step(["nvcc"], 2, "error: planted", 0.1), done], None))
    refused, _, _ = build_cuda(variant, "9.0", tmp_path / "again")
    assert refused["status"] == "fail" and "interrupted" not in refused


def test_the_triton_build_compiles_every_seq_len_specialisation(monkeypatch) -> None:
    """Triton compiles one binary per S == 1, S % 16 == 0 and other S: the build launches each
    (dtype, D, causal) at all three, so a spill in the S=17 binary alone fails the build (on an
    H100 a 128-key D=128 configuration spilled 224 bytes at S=17 and none at S=128)."""
    import types

    import torch

    from evo_sdpa import inputs, runners

    launched = []

    def forward(q, k, v, out, causal, scale, tunables=None):
        launched.append((q.dtype, q.shape[-1], causal, q.shape[2]))

    def compiled_resources():
        spills = 224 if any(s % 16 and s != 1 for *_, s in launched) else 0
        return [{"kernel": "_triton_flash_fwd", "registers": 255, "spill_bytes": spills, "tunables": values}]

    module = types.SimpleNamespace(forward=forward, compiled_resources=compiled_resources)
    variant = load_variant(KERNELS_DIR / "triton_flash")
    values = {name: knob["default"] for name, knob in variant.meta["tunables"].items()}
    monkeypatch.setattr(build, "cuda_available", lambda: True)
    monkeypatch.setattr(runners, "load_triton_module", lambda v: module)
    monkeypatch.setattr(inputs, "make_qkv", lambda B, H, S, D, dtype, device, seed: tuple(
        torch.zeros(B, H, S, D, dtype=dtype) for _ in range(3)))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    verdict, resources, log = build.build_triton(variant, allow_spills=False)
    support = variant.support
    cases = len(support["dtypes"]) * len(support["head_dims"]) * len(support["causal"])
    assert sorted({s for *_, s in launched}) == [1, 17, 128] and len(launched) == 3 * cases
    assert verdict["status"] == "fail" and verdict["reasons"] == ["register spills in _triton_flash_fwd"]
