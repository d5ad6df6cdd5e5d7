"""evo_sdpa.sass: opcode counts on a real cuobjdump listing (tests/fixtures/sass/, re-captured by
capture.py there) and where cuobjdump and nvdisasm are found."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from evo_sdpa import sass
from evo_sdpa.errors import StageError
from evo_sdpa.sass import count_opcodes, mnemonics, missing_opcode_reasons

REPO = Path(__file__).resolve().parents[1]
LISTING = (REPO / "tests" / "fixtures" / "sass" / "hopper_ops_sm90a.sass").read_text()


# --- counting --------------------------------------------------------------------------------


def test_mnemonics_reads_every_instruction_with_its_modifiers() -> None:
    found = mnemonics(LISTING)
    assert len(found) == 72  # one per /*addr*/ line; the encoding lines and headers are not instructions
    assert "HGMMA.64x8x16.F32" in found
    assert "UTMALDG.2D" in found
    assert found[:4] == ["LDC", "S2R", "BSSY", "ISETP.NE.AND"]


def test_hopper_opcodes_counted() -> None:
    assert count_opcodes(LISTING, ["HGMMA", "UTMALDG", "SYNCS"]) == {"HGMMA": 1, "UTMALDG": 1, "SYNCS": 4}


def test_prefix_is_dot_separated() -> None:
    counts = count_opcodes(LISTING, ["SYNCS.PHASECHK", "SYNCS.ARRIVE.TRANS64", "UTMALDG.2D", "HGMM", "HGMMA.64x8x16"])
    assert counts == {"SYNCS.PHASECHK": 2, "SYNCS.ARRIVE.TRANS64": 1, "UTMALDG.2D": 1, "HGMM": 0, "HGMMA.64x8x16": 1}


def test_predicated_instructions_count() -> None:
    # @P0 BRA, @!P0 BRA (twice), BRA.U.ANY and two unpredicated BRA
    assert count_opcodes(LISTING, ["BRA"]) == {"BRA": 6}
    assert count_opcodes(LISTING, ["ELECT", "PLOP3"]) == {"ELECT": 1, "PLOP3": 3}


def test_absent_opcode_is_zero_and_a_reason() -> None:
    counts = count_opcodes(LISTING, ["HGMMA", "UTMASTG", "HMMA"])
    assert counts == {"HGMMA": 1, "UTMASTG": 0, "HMMA": 0}
    assert missing_opcode_reasons(counts) == [
        "SASS holds no UTMASTG instruction (expected by build.sass_expect)",
        "SASS holds no HMMA instruction (expected by build.sass_expect)",
    ]


def test_empty_listing_counts_nothing() -> None:
    assert count_opcodes("", ["HGMMA"]) == {"HGMMA": 0}
    assert missing_opcode_reasons({"HGMMA": 2}) == []


def test_encoding_and_header_lines_are_not_instructions() -> None:
    text = ("\t.headerflags\t@\"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)\"\n"
            "        /*0320*/                   HGMMA.64x8x16.F32 R24, gdesc[UR4], RZ, !UPT, gsb0 ;  /* 0x00000000041879f0 */\n"
            "                                                                                        /* 0x000fe20008000000 */\n"
            "\t\tFunction : HGMMA_kernel\n")
    assert mnemonics(text) == ["HGMMA.64x8x16.F32"]


# --- the tools -------------------------------------------------------------------------------


def fake_tool(folder: Path, name: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return str(path)


def test_tools_on_path_come_first(tmp_path, monkeypatch) -> None:
    cuobjdump = fake_tool(tmp_path / "bin", "cuobjdump")
    nvdisasm = fake_tool(tmp_path / "bin", "nvdisasm")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "none"))
    monkeypatch.setattr(sass, "packaged_tool", lambda name: pytest.fail("pip packages asked before PATH"))
    tools = sass.find_sass_tools()
    assert (tools.cuobjdump, tools.nvdisasm) == (cuobjdump, nvdisasm)
    assert tools.env()["PATH"].split(os.pathsep)[0] == str(tmp_path / "bin")


def test_tools_from_the_pip_packages_when_not_on_path(tmp_path, monkeypatch) -> None:
    packaged = {"cuobjdump": fake_tool(tmp_path / "cuobjdump_pkg", "cuobjdump"),
                "nvdisasm": fake_tool(tmp_path / "nvdisasm_pkg", "nvdisasm")}
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "none"))
    monkeypatch.setattr(sass, "packaged_tool", packaged.get)
    tools = sass.find_sass_tools()
    assert (tools.cuobjdump, tools.nvdisasm) == (packaged["cuobjdump"], packaged["nvdisasm"])
    # cuobjdump finds nvdisasm through PATH when it does not lie beside it
    assert tools.env()["PATH"].split(os.pathsep)[0] == str(tmp_path / "nvdisasm_pkg")


def test_nvdisasm_beside_cuobjdump_wins(tmp_path, monkeypatch) -> None:
    cuobjdump = fake_tool(tmp_path / "cuda" / "bin", "cuobjdump")
    nvdisasm = fake_tool(tmp_path / "cuda" / "bin", "nvdisasm")
    fake_tool(tmp_path / "other", "nvdisasm")
    monkeypatch.setenv("PATH", os.pathsep.join([str(tmp_path / "other"), str(tmp_path / "empty")]))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    assert sass.find_sass_tools() == sass.SassTools(cuobjdump, nvdisasm)


@pytest.mark.parametrize(("have", "missing"), [((), "cuobjdump and nvdisasm"), (("cuobjdump",), "nvdisasm"),
                                               (("nvdisasm",), "cuobjdump")])
def test_missing_tools_are_one_line_naming_the_fix(tmp_path, monkeypatch, have, missing) -> None:
    for name in have:
        fake_tool(tmp_path / f"{name}_pkg", name)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "none"))
    monkeypatch.setattr(sass, "packaged_tool",
                        lambda name: str(tmp_path / f"{name}_pkg" / name) if name in have else None)
    with pytest.raises(StageError) as info:
        sass.find_sass_tools()
    message = str(info.value)
    assert "\n" not in message
    assert message == (f"build.sass_expect needs {missing} to read the built library's SASS, and none is on PATH "
                       "or installed by pip: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm "
                       "(or put the CUDA toolkit's bin/ on PATH)")


def test_packaged_tool_of_an_absent_package_is_none(monkeypatch) -> None:
    monkeypatch.setitem(sass.TOOL_PACKAGES, "cuobjdump", "evo-sdpa-no-such-package")
    assert sass.packaged_tool("cuobjdump") is None


def test_packaged_tool_finds_the_installed_wheel_binary() -> None:
    import importlib.metadata

    try:
        importlib.metadata.distribution("nvidia-cuda-cuobjdump")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("nvidia-cuda-cuobjdump not installed")
    path = sass.packaged_tool("cuobjdump")
    assert path is not None and Path(path).name == "cuobjdump" and os.access(path, os.X_OK)
