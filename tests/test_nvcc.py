"""evo_sdpa.nvcc against real nvcc 13.0 logs (tests/fixtures/nvcc/, re-captured by capture.py there)."""
from __future__ import annotations

import re

import shutil
from pathlib import Path

import pytest

from evo_sdpa.nvcc import (
    arch_gencode,
    build_verdict,
    compile_command,
    demangle_names,
    first_error,
    link_command,
    object_command,
    parse_ptxas_resources,
    run_compile,
    warning_lines,
)

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "nvcc"

V1_FP16_D128 = "_ZN9v1_scalar23v1_scalar_attention_fwdI6__halfLi128EEEvPKT_S4_S4_PS2_iibf"
V1_BF16_D64 = "_ZN9v1_scalar23v1_scalar_attention_fwdI13__nv_bfloat16Li64EEEvPKT_S4_S4_PS2_iibf"
SPILL_KERNEL = "_Z20fixture_spill_kernelPKfPfi"
STACK_KERNEL = "_Z20fixture_stack_kernelPKfPKiPf"


def fixture_log(name: str) -> str:
    return (FIXTURES / name).read_text()


def by_kernel(resources: list[dict]) -> dict[str, dict]:
    return {record["kernel"]: record for record in resources}


# --- arch mapping --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capability", "gencode"),
    [
        ("9.0", "-gencode=arch=compute_90a,code=sm_90a"),
        ("8.9", "-gencode=arch=compute_89,code=sm_89"),
        ("8.0", "-gencode=arch=compute_80,code=sm_80"),
        ("8.6", "-gencode=arch=compute_86,code=sm_86"),
        ("7.5", "-gencode=arch=compute_75,code=sm_75"),
        ("10.0", "-gencode=arch=compute_100a,code=sm_100a"),
        ("12.0", "-gencode=arch=compute_120a,code=sm_120a"),
        (" 9.0 ", "-gencode=arch=compute_90a,code=sm_90a"),
    ],
)
def test_arch_gencode_maps_capability(capability: str, gencode: str) -> None:
    assert arch_gencode(capability) == gencode


@pytest.mark.parametrize("junk", ["", "9", "sm_90", "9.0.1", "nine", "9.10", "0.5", "9,0"])
def test_arch_gencode_rejects_junk(junk: str) -> None:
    with pytest.raises(ValueError, match="compute capability"):
        arch_gencode(junk)


# --- command line --------------------------------------------------------------------------


def test_compile_command_adds_the_fixed_flags_in_order() -> None:
    command = compile_command(
        "/usr/local/cuda/bin/nvcc",
        ["kernels/x/kernel.cu", "kernels/x/extra.cu"],
        "out/x.so",
        "-gencode=arch=compute_90a,code=sm_90a",
        ["-O3", "-std=c++17"],
        ["kernels/common", "kernels/x"],
    )
    assert command == [
        "/usr/local/cuda/bin/nvcc",
        "-O3", "-std=c++17",
        "-shared", "-Xcompiler", "-fPIC",
        "-Xptxas", "-v", "-Xptxas", "-warn-spills", "-Xptxas", "-warn-lmem-usage",
        "-gencode=arch=compute_90a,code=sm_90a",
        "-Ikernels/common", "-Ikernels/x",
        "kernels/x/kernel.cu", "kernels/x/extra.cu",
        "-o", "out/x.so",
    ]


def test_object_command_compiles_one_unit_with_the_same_flags() -> None:
    command = object_command(
        "nvcc", "kernels/x/fp16_d128.cu", "build/01_fp16_d128.o", "-gencode=arch=compute_90a,code=sm_90a",
        ["-O3", "-lcuda"], ["kernels/common", "kernels/x"],
    )
    assert command == [
        "nvcc",
        "-O3", "-lcuda",
        "-c", "-Xcompiler", "-fPIC",
        "-Xptxas", "-v", "-Xptxas", "-warn-spills", "-Xptxas", "-warn-lmem-usage",
        "-gencode=arch=compute_90a,code=sm_90a",
        "-Ikernels/common", "-Ikernels/x",
        "kernels/x/fp16_d128.cu",
        "-o", "build/01_fp16_d128.o",
    ]


def test_link_command_links_the_objects_with_the_variant_flags() -> None:
    command = link_command("nvcc", ["a.o", "b.o"], "out/x.so", "-gencode=arch=compute_90a,code=sm_90a", ["-O3", "-lcuda"])
    assert command == ["nvcc", "-O3", "-lcuda", "-shared", "-Xcompiler", "-fPIC",
                       "-gencode=arch=compute_90a,code=sm_90a", "a.o", "b.o", "-o", "out/x.so"]
    with pytest.raises(ValueError, match="object"):
        link_command("nvcc", [], "x.so", "-gencode=arch=compute_90a,code=sm_90a", [])


def test_first_error_of_a_failed_link_is_the_linker_line() -> None:
    log_text = ("/usr/bin/ld: cannot find -lcuda: No such file or directory\n"
                "collect2: error: ld returned 1 exit status\n")
    assert first_error(log_text) == "/usr/bin/ld: cannot find -lcuda: No such file or directory"


def test_compile_command_needs_a_source() -> None:
    with pytest.raises(ValueError, match="source"):
        compile_command("nvcc", [], "x.so", "-gencode=arch=compute_89,code=sm_89", [], [])


# --- ptxas resources -----------------------------------------------------------------------


def test_parse_v1_sm90a_counts() -> None:
    resources = parse_ptxas_resources(fixture_log("ptxas_v1_sm90a.log"))
    assert len(resources) == 4
    assert {record["arch"] for record in resources} == {"sm_90a"}
    assert [record["registers"] for record in resources] == [48, 32, 48, 32]
    fp16_d128 = by_kernel(resources)[V1_FP16_D128]
    assert fp16_d128 == {
        "kernel": V1_FP16_D128,
        "demangled": V1_FP16_D128,
        "arch": "sm_90a",
        "registers": 48,
        "shared_bytes": 0,
        "stack_frame_bytes": 0,
        "spill_store_bytes": 0,
        "spill_load_bytes": 0,
        "cumulative_stack_bytes": 0,
        "constant_bytes": None,  # sm_90a's line prints no cmem
        "barriers": 0,
    }


def test_parse_v1_sm89_counts_constant_memory() -> None:
    resources = parse_ptxas_resources(fixture_log("ptxas_v1_sm89.log"))
    assert [record["registers"] for record in resources] == [48, 40, 48, 40]
    assert {record["arch"] for record in resources} == {"sm_89"}
    assert {record["constant_bytes"] for record in resources} == {400}
    assert by_kernel(resources)[V1_BF16_D64]["registers"] == 40


def test_parse_spill_log_exact_counts() -> None:
    resources = by_kernel(parse_ptxas_resources(fixture_log("ptxas_spill.log")))
    assert set(resources) == {SPILL_KERNEL, STACK_KERNEL}
    spill = resources[SPILL_KERNEL]
    assert (spill["stack_frame_bytes"], spill["spill_store_bytes"], spill["spill_load_bytes"]) == (208, 376, 428)
    assert spill["registers"] == 32
    assert spill["cumulative_stack_bytes"] == 208
    stack = resources[STACK_KERNEL]
    assert (stack["stack_frame_bytes"], stack["spill_store_bytes"], stack["spill_load_bytes"]) == (256, 0, 0)


def test_parse_smem_barriers_and_skips_device_function_block() -> None:
    resources = parse_ptxas_resources(fixture_log("ptxas_smem_sm89.log"))
    assert len(resources) == 1  # the non-inlined helper's "Function properties" is not a kernel
    record = resources[0]
    assert record["kernel"] == "_Z19fixture_smem_kernelPKfPf"
    assert record["arch"] == "sm_89"
    assert record["registers"] == 24
    assert record["barriers"] == 1
    assert record["shared_bytes"] == 1024
    assert record["stack_frame_bytes"] == 8  # printf's buffer, not overwritten by the helper's 0
    assert record["cumulative_stack_bytes"] == 8
    assert record["constant_bytes"] == 368


def test_parse_two_arches_in_one_log_keeps_both() -> None:
    both = fixture_log("ptxas_v1_sm90a.log") + fixture_log("ptxas_v1_sm89.log")
    resources = parse_ptxas_resources(both)
    fp16_d128 = [record for record in resources if record["kernel"] == V1_FP16_D128]
    assert [record["arch"] for record in fp16_d128] == ["sm_90a", "sm_89"]


def test_parse_compile_error_log_has_no_kernels() -> None:
    assert parse_ptxas_resources(fixture_log("compile_error.log")) == []


def test_parse_uses_the_demangler_it_is_given() -> None:
    resources = parse_ptxas_resources(
        fixture_log("ptxas_spill.log"), demangle=lambda names: {name: name.upper() for name in names}
    )
    assert [record["demangled"] for record in resources] == [STACK_KERNEL.upper(), SPILL_KERNEL.upper()]


@pytest.mark.skipif(shutil.which("cu++filt") is None and shutil.which("c++filt") is None, reason="no demangler")
def test_demangle_names_gives_readable_kernel_names() -> None:
    readable = demangle_names([V1_FP16_D128, SPILL_KERNEL])
    # c++filt prints the template argument as 128, cu++filt (CUDA's own) as (int)128
    assert re.match(r"void v1_scalar::v1_scalar_attention_fwd<__half, (\(int\))?128>\(", readable[V1_FP16_D128])
    # c++filt: "(float const*, float*, int)"; cu++filt: "(const float *, float *, int)"
    spill = readable[SPILL_KERNEL].replace(" ", "")
    assert spill in {"fixture_spill_kernel(floatconst*,float*,int)", "fixture_spill_kernel(constfloat*,float*,int)"}


# --- errors and warnings -------------------------------------------------------------------


def test_first_error_is_the_first_front_end_error() -> None:
    assert first_error(fixture_log("compile_error.log")) == (
        'tests/fixtures/nvcc/sources/compile_error.cu(3): error: identifier "undeclared_value" is undefined'
    )


def test_first_error_of_nvcc_fatal() -> None:
    assert first_error(fixture_log("nvcc_fatal.log")) == "nvcc fatal   : Unsupported gpu architecture 'compute_101a'"


@pytest.mark.parametrize("clean_log", ["ptxas_v1_sm90a.log", "ptxas_v1_sm89.log", "warning.log", "ptxas_spill.log"])
def test_no_error_in_successful_builds(clean_log: str) -> None:
    assert first_error(fixture_log(clean_log)) is None


def test_warning_lines_front_end() -> None:
    assert warning_lines(fixture_log("warning.log")) == [
        'tests/fixtures/nvcc/sources/warning.cu(3): warning #177-D: variable "unused_count" was declared but never referenced'
    ]


def test_warning_lines_host_compiler() -> None:
    warnings = warning_lines(fixture_log("host_warning.log"))
    assert len(warnings) == 3
    assert warnings[0].startswith("tests/fixtures/nvcc/sources/host_warning.cu(4): warning #177-D")
    assert "[-Wtype-limits]" in warnings[1]
    assert "[-Wsign-compare]" in warnings[2]


def test_warning_lines_ptxas_spills_but_not_info_lines() -> None:
    warnings = warning_lines(fixture_log("ptxas_spill.log"))
    assert len(warnings) == 3
    assert all(line.startswith("ptxas warning : ") for line in warnings)
    assert warning_lines(fixture_log("ptxas_v1_sm90a.log")) == []


# --- verdict -------------------------------------------------------------------------------


def verdict_of(log_name: str, returncode: int, allow_warnings: bool = False, allow_spills: bool = False) -> dict:
    log_text = fixture_log(log_name)
    return build_verdict(returncode, log_text, parse_ptxas_resources(log_text), allow_warnings, allow_spills)


def test_verdict_passes_clean_v1_build() -> None:
    verdict = verdict_of("ptxas_v1_sm90a.log", 0)
    assert verdict == {"status": "pass", "reasons": [], "first_error": None, "warnings": [], "spilling_kernels": [],
                       "serialized_wgmma": []}


def test_verdict_fails_on_compile_error_with_the_error_in_the_reason() -> None:
    verdict = verdict_of("compile_error.log", 2)
    assert verdict["status"] == "fail"
    assert verdict["reasons"][0].startswith("nvcc exited with status 2: ")
    assert 'identifier "undeclared_value" is undefined' in verdict["reasons"][0]
    assert verdict["first_error"].endswith('identifier "undeclared_value" is undefined')


def test_verdict_fails_on_nvcc_fatal() -> None:
    verdict = verdict_of("nvcc_fatal.log", 1)
    assert verdict["status"] == "fail"
    assert "Unsupported gpu architecture 'compute_101a'" in verdict["reasons"][0]


def test_verdict_fails_on_warning_unless_allowed() -> None:
    failed = verdict_of("warning.log", 0)
    assert failed["status"] == "fail"
    assert failed["reasons"] == [
        '1 compiler warning(s), first: tests/fixtures/nvcc/sources/warning.cu(3): warning #177-D: '
        'variable "unused_count" was declared but never referenced'
    ]
    allowed = verdict_of("warning.log", 0, allow_warnings=True)
    assert allowed["status"] == "pass"
    assert len(allowed["warnings"]) == 1  # still reported as evidence


def test_verdict_fails_on_host_compiler_warning() -> None:
    assert verdict_of("host_warning.log", 0)["reasons"][0].startswith("3 compiler warning(s)")


def test_verdict_fails_on_spill_and_stack_frame() -> None:
    verdict = verdict_of("ptxas_spill.log", 0)
    assert verdict["status"] == "fail"
    assert verdict["spilling_kernels"] == [STACK_KERNEL, SPILL_KERNEL]
    assert any(
        SPILL_KERNEL in reason and "208 bytes stack frame, 376 bytes spill stores, 428 bytes spill loads" in reason
        for reason in verdict["reasons"]
    )
    assert any(STACK_KERNEL in reason and "256 bytes stack frame" in reason for reason in verdict["reasons"])
    # ptxas's spill warnings are judged by the spill gate, not reported a second time as warnings
    assert not any("compiler warning" in reason for reason in verdict["reasons"])


def test_verdict_allow_spills_passes_spilling_build() -> None:
    verdict = verdict_of("ptxas_spill.log", 0, allow_spills=True)
    assert verdict["status"] == "pass"
    assert verdict["spilling_kernels"] == [STACK_KERNEL, SPILL_KERNEL]  # still reported


def test_verdict_fails_on_local_memory_in_a_kernel() -> None:
    verdict = verdict_of("ptxas_smem_sm89.log", 0)
    assert verdict["status"] == "fail"
    assert verdict["spilling_kernels"] == ["_Z19fixture_smem_kernelPKfPf"]


def test_verdict_fails_on_spill_warning_without_resource_counts() -> None:
    # A spill reported only by ptxas's warning (as in a non-inlined callee) still fails.
    spill_warning = next(line for line in fixture_log("ptxas_spill.log").splitlines() if "Registers are spilled" in line)
    log_text = spill_warning + "\n" + fixture_log("ptxas_v1_sm90a.log")
    verdict = build_verdict(0, log_text, parse_ptxas_resources(log_text), False, False)
    assert verdict["status"] == "fail"
    assert verdict["spilling_kernels"] == [SPILL_KERNEL]
    assert verdict["reasons"] == [spill_warning]


# ptxas 13.0's note on v5_hopper's multicast split kernel while a CUTLASS assertion's __assertfail
# call was left in it (kernels/v5_hopper/NOTES.md, run 39), as the build log printed it.
SERIALIZED_KERNEL = "_ZN9v5_hopper23v5_hopper_attention_fwdINS_12KernelTraitsIN7cutlass6half_tELi64ELi64ELi64ELi2ELb1EEELb0EEEvNT_6ParamsE"
SERIALIZED_LINE = (
    "ptxas info    : (C7510) Potential Performance Loss: wgmma.mma_async instructions are serialized due to wgmma "
    f"pipeline crossing function boundary at a function call in the function '{SERIALIZED_KERNEL}'"
)


def test_verdict_fails_on_serialized_wgmma_whatever_is_allowed() -> None:
    log_text = SERIALIZED_LINE + "\n" + fixture_log("ptxas_v1_sm90a.log")
    for allow in (False, True):
        verdict = build_verdict(0, log_text, parse_ptxas_resources(log_text), allow, allow)
        assert verdict["status"] == "fail"
        assert verdict["serialized_wgmma"] == [SERIALIZED_KERNEL]
        assert verdict["reasons"] == [
            f"wgmma serialised in {SERIALIZED_KERNEL} (due to wgmma pipeline crossing function boundary at a "
            "function call; ptxas C7510): find what ptxas names there (a call left in the kernel, an assertion's "
            "__assertfail included, or a wgmma accumulator touched before its wait, or paths joining with "
            "different wgmma groups pending) and take it out"
        ]
        assert verdict["warnings"] == []   # an info line, not a warning


# ptxas 13.0's other serialisation note, on a look-ahead split kernel whose paths joined with
# different wgmma groups pending (kernels/v5_hopper/NOTES.md, run 44), as the build log printed it.
ACCUMULATOR_LINE = (
    "ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non "
    "wgmma instructions reading accumulator registers of  a wgmma between start and end of the pipeline stage "
    f"in the function '{SERIALIZED_KERNEL}'"
)


def test_verdict_names_the_code_ptxas_printed() -> None:
    log_text = ACCUMULATOR_LINE + "\n" + fixture_log("ptxas_v1_sm90a.log")
    verdict = build_verdict(0, log_text, parse_ptxas_resources(log_text), True, True)
    assert verdict["status"] == "fail"
    assert verdict["serialized_wgmma"] == [SERIALIZED_KERNEL]
    assert len(verdict["reasons"]) == 1
    assert verdict["reasons"][0].startswith(
        f"wgmma serialised in {SERIALIZED_KERNEL} (due to non wgmma instructions reading accumulator registers of "
        "a wgmma between start and end of the pipeline stage; ptxas C7514): ")


def test_verdict_fails_when_success_reports_no_kernels() -> None:
    verdict = build_verdict(0, "", [], False, False)
    assert verdict["status"] == "fail"
    assert "no kernel resources" in verdict["reasons"][0]


# --- the real compiler ---------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_v1_scalar_builds_clean_for_sm90a(tmp_path: Path) -> None:
    from evo_sdpa.tunables import defaults, define_flags
    from evo_sdpa.variants import load_variant

    v1 = load_variant(REPO / "kernels" / "v1_scalar")
    command = compile_command(
        "nvcc",
        ["kernels/v1_scalar/kernel.cu"],
        str(tmp_path / "v1_scalar.so"),
        arch_gencode("9.0"),
        ["-O3", "-std=c++17", *define_flags(v1, defaults(v1))],  # its tunables, as the build passes them
        ["kernels/common"],
    )
    returncode, log_text = run_compile(command, cwd=str(REPO))
    resources = parse_ptxas_resources(log_text)
    verdict = build_verdict(returncode, log_text, resources, allow_warnings=False, allow_spills=False)
    assert verdict["status"] == "pass", verdict["reasons"]
    assert len(resources) == 4  # {fp16, bf16} x {64, 128}
    assert all("v1_scalar" in record["kernel"] and record["arch"] == "sm_90a" for record in resources)
    assert all(record["spill_store_bytes"] == 0 and record["stack_frame_bytes"] == 0 for record in resources)
    assert (tmp_path / "v1_scalar.so").stat().st_size > 0
