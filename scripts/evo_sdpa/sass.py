"""The SASS check of the build stage: which instructions the built library really holds.

`count_opcodes` and `missing_opcode_reasons` are pure text in, data out, so the tests run on a
real captured dump (tests/fixtures/sass/) without a compiler. `cuobjdump -sass` prints one
instruction a line, after its address; a predicate may stand before the mnemonic:

            /*0190*/                   SYNCS.ARRIVE.TRANS64 RZ, [UR9], R0 ;     /* 0x00000000ffff79a7 */
            /*01b0*/                   UTMALDG.2D [UR8], [UR4] ;                /* 0x00000008040075b4 */
            /*01e0*/               @P0 BRA.U.ANY 0x1a0 ;                        /* 0xfffffffd00ec0947 */

An expected opcode is a dot-separated prefix of the mnemonic: HGMMA counts HGMMA.64x128x16.F32,
SYNCS.ARRIVE counts SYNCS.ARRIVE.TRANS64, HGMM counts nothing.

cuobjdump disassembles through nvdisasm, which it looks for beside itself or on PATH. Both come
with the CUDA toolkit, or from pip: nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm.
"""
from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .device import find_tool
from .errors import StageError

SASS_TIMEOUT_S = 300
TOOL_PACKAGES = {"cuobjdump": "nvidia-cuda-cuobjdump", "nvdisasm": "nvidia-cuda-nvdisasm"}
SASS_TOOLS_FIX = ("pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm "
                  "(or put the CUDA toolkit's bin/ on PATH)")

# /*0a30*/  [@P0 | @!UP1 ]MNEMONIC.MODIFIERS operands ;
_INSTRUCTION = re.compile(
    r"^\s*/\*[0-9a-fA-F]+\*/\s+(?:@!?U?P(?:[0-9]|T)\s+)?(?P<mnemonic>[A-Z][A-Z0-9_]*(?:\.[^\s;]+)?)"
)


def mnemonics(sass_text: str) -> list[str]:
    """Every instruction's mnemonic with its modifiers (e.g. 'HGMMA.64x8x16.F32'), in dump order."""
    return [match.group("mnemonic") for line in sass_text.splitlines() if (match := _INSTRUCTION.match(line))]


def _has_prefix(mnemonic: str, opcode: str) -> bool:
    return mnemonic == opcode or mnemonic.startswith(opcode + ".")


def count_opcodes(sass_text: str, expected: Iterable[str]) -> dict[str, int]:
    """How many instructions of the dump each expected opcode (a dot-separated prefix) matches."""
    found = mnemonics(sass_text)
    return {opcode: sum(_has_prefix(mnemonic, opcode) for mnemonic in found) for opcode in expected}


def missing_opcode_reasons(counts: dict[str, int]) -> list[str]:
    """One verdict reason per expected opcode the dump does not hold."""
    return [f"SASS holds no {opcode} instruction (expected by build.sass_expect)"
            for opcode, count in counts.items() if count == 0]


# --- the tools ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SassTools:
    cuobjdump: str
    nvdisasm: str

    def env(self) -> dict[str, str]:
        """The environment cuobjdump runs in: nvdisasm's folder first on PATH."""
        path = os.environ.get("PATH", "")
        return {**os.environ, "PATH": os.pathsep.join([str(Path(self.nvdisasm).parent), path])}


def packaged_tool(name: str) -> str | None:
    """The executable `name` shipped by its pip package (TOOL_PACKAGES), wherever its wheel put it."""
    try:
        files = importlib.metadata.files(TOOL_PACKAGES[name]) or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for entry in files:
        if entry.name == name:
            path = Path(entry.locate())
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
    return None


def find_sass_tools() -> SassTools:
    """cuobjdump and nvdisasm from PATH (or CUDA_HOME), else from their pip packages."""
    cuobjdump = find_tool("cuobjdump") or packaged_tool("cuobjdump")
    beside = Path(cuobjdump).parent / "nvdisasm" if cuobjdump else None
    nvdisasm = (str(beside) if beside and os.access(beside, os.X_OK) else None) \
        or find_tool("nvdisasm") or packaged_tool("nvdisasm")
    missing = [name for name, path in (("cuobjdump", cuobjdump), ("nvdisasm", nvdisasm)) if path is None]
    if missing:
        raise StageError(f"build.sass_expect needs {' and '.join(missing)} to read the built library's "
                         f"SASS, and none is on PATH or installed by pip: {SASS_TOOLS_FIX}")
    return SassTools(cuobjdump, nvdisasm)


def dump_sass(tools: SassTools, artifact: Path) -> tuple[list[str], str]:
    """(the command, its SASS listing) for a built library; a failed dump stops the stage."""
    argv = [tools.cuobjdump, "-sass", str(artifact)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=tools.env(), timeout=SASS_TIMEOUT_S)
    if proc.returncode != 0:
        lines = [line for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
        detail = lines[-1].strip() if lines else "no output"
        raise StageError(f"cuobjdump -sass {artifact.name} exited with status {proc.returncode} ({detail}): "
                         f"check the tools, or {SASS_TOOLS_FIX}")
    return argv, proc.stdout
