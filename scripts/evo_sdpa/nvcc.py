"""nvcc for the build stage: the architecture flag, the command line, and the reading of its log.

Everything here but `run_compile` and `demangle_names` is pure text in, data out, so the tests
run on real captured logs (tests/fixtures/nvcc/) without a compiler.

Log format (nvcc 13.0, `-Xptxas -v`), one block per kernel and architecture:

    ptxas info    : Compiling entry function '_Z6kernelPf' for 'sm_90a'
    ptxas info    : Function properties for _Z6kernelPf
        0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 32 registers, used 0 barriers, 1024 bytes smem, 400 bytes cmem[0]

The "Used" line lists only what is non-zero among cumulative stack, smem and cmem (sm_90a
prints no cmem for a kernel whose sm_89 build shows `400 bytes cmem[0]`). A "Function
properties" block with no "Compiling entry function" before it belongs to a non-inlined
device function, not a kernel.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Iterable

# Flags the build always passes: a shared library for ctypes, the per-kernel resource report,
# and ptxas warnings for spills and local memory (valid ptxas options in nvcc 13.0), so a spill
# in a non-inlined callee, which no kernel's own counts show, still reaches the log.
PIC_FLAGS: tuple[str, ...] = ("-Xcompiler", "-fPIC")
PTXAS_FLAGS: tuple[str, ...] = (
    "-Xptxas", "-v",
    "-Xptxas", "-warn-spills",
    "-Xptxas", "-warn-lmem-usage",
)
ALWAYS_FLAGS: tuple[str, ...] = ("-shared", *PIC_FLAGS, *PTXAS_FLAGS)
# A variant with several .cu files compiles each to an object (same flags, no relocatable device
# code: each object keeps its own kernels), then links them into the library in one step.
OBJECT_FLAGS: tuple[str, ...] = ("-c", *PIC_FLAGS, *PTXAS_FLAGS)

# From Hopper on, each architecture has an arch-specific target ("a") that unlocks its own
# instructions (wgmma and setmaxnreg on sm_90a, tcgen05 on sm_100a); code built for it runs only
# on that exact compute capability, which is the one the build detected.
FIRST_ARCH_SPECIFIC_MAJOR = 9

_COMPUTE_CAPABILITY = re.compile(r"(\d{1,2})\.(\d)")


def arch_gencode(compute_capability: str) -> str:
    """The nvcc -gencode flag for a device's compute capability ("9.0" -> sm_90a, "8.9" -> sm_89)."""
    text = compute_capability.strip() if isinstance(compute_capability, str) else ""
    match = _COMPUTE_CAPABILITY.fullmatch(text)
    if match is None:
        raise ValueError(
            f"compute capability {compute_capability!r} is not of the form MAJOR.MINOR (e.g. '9.0', '8.9')"
        )
    major, minor = int(match.group(1)), int(match.group(2))
    if major < 1:
        raise ValueError(f"compute capability {compute_capability!r} has major version 0")
    suffix = "a" if major >= FIRST_ARCH_SPECIFIC_MAJOR else ""
    arch = f"{major}{minor}{suffix}"
    return f"-gencode=arch=compute_{arch},code=sm_{arch}"


def compile_command(
    nvcc: str,
    sources: list[str],
    out_path: str,
    gencode: str,
    flags: list[str],
    include_dirs: list[str],
) -> list[str]:
    """The argv that builds `sources` into the shared library `out_path`."""
    if not sources:
        raise ValueError("compile_command needs at least one source file")
    include_flags = [f"-I{directory}" for directory in include_dirs]
    return [nvcc, *flags, *ALWAYS_FLAGS, gencode, *include_flags, *sources, "-o", out_path]


def object_command(
    nvcc: str,
    source: str,
    out_path: str,
    gencode: str,
    flags: list[str],
    include_dirs: list[str],
) -> list[str]:
    """The argv that compiles one translation unit `source` to the object `out_path`."""
    include_flags = [f"-I{directory}" for directory in include_dirs]
    return [nvcc, *flags, *OBJECT_FLAGS, gencode, *include_flags, source, "-o", out_path]


def link_command(nvcc: str, objects: list[str], out_path: str, gencode: str, flags: list[str]) -> list[str]:
    """The argv that links objects into the shared library `out_path`. The variant's flags come
    along, so a library flag among them (-lcuda, -L...) reaches the link; the compile-only ones
    are ignored there."""
    if not objects:
        raise ValueError("link_command needs at least one object file")
    return [nvcc, *flags, "-shared", *PIC_FLAGS, gencode, *objects, "-o", out_path]


def run_compile(command: list[str], cwd: str | None = None) -> tuple[int, str]:
    """Runs a compile command; returns its exit status and stdout+stderr interleaved as printed."""
    completed = subprocess.run(
        command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False
    )
    return completed.returncode, completed.stdout


# --- the ptxas resource report ------------------------------------------------------------

_ENTRY = re.compile(r"ptxas info\s*: Compiling entry function '(?P<name>[^']+)' for '(?P<arch>[^']+)'")
_PROPERTIES = re.compile(r"ptxas info\s*: Function properties for (?P<name>\S+)")
_FRAME = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores, (?P<loads>\d+) bytes spill loads"
)
_USED = re.compile(r"ptxas info\s*: Used (?P<registers>\d+) registers")
_BARRIERS = re.compile(r"used (\d+) barriers")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[\d+\]")
_CUMULATIVE_STACK = re.compile(r"(\d+) bytes cumulative stack size")


def _new_record(kernel: str, arch: str) -> dict:
    return {
        "kernel": kernel,
        "demangled": kernel,
        "arch": arch,
        "registers": 0,
        "shared_bytes": 0,
        "stack_frame_bytes": 0,
        "spill_store_bytes": 0,
        "spill_load_bytes": 0,
        "cumulative_stack_bytes": 0,
        "constant_bytes": None,
        "barriers": None,
    }


def _apply_used_line(record: dict, line: str) -> None:
    record["registers"] = int(_USED.search(line).group("registers"))
    barriers = _BARRIERS.search(line)
    record["barriers"] = int(barriers.group(1)) if barriers else None
    smem = _SMEM.search(line)
    record["shared_bytes"] = int(smem.group(1)) if smem else 0
    cumulative = _CUMULATIVE_STACK.search(line)
    record["cumulative_stack_bytes"] = int(cumulative.group(1)) if cumulative else 0
    cmem_banks = [int(size) for size in _CMEM.findall(line)]
    record["constant_bytes"] = sum(cmem_banks) if cmem_banks else None


def parse_ptxas_resources(
    log_text: str, demangle: Callable[[list[str]], dict[str, str]] | None = None
) -> list[dict]:
    """One dict per (kernel, arch) compiled, in log order.

    Keys: kernel (mangled), demangled, arch, registers, shared_bytes (static smem),
    stack_frame_bytes, spill_store_bytes, spill_load_bytes, cumulative_stack_bytes (own frame
    plus callees'), constant_bytes (sum of the cmem banks printed, None if none), barriers
    (None if not printed). `demangle` maps mangled names to readable ones (`demangle_names`);
    without it `demangled` repeats the mangled name.
    """
    records: list[dict] = []
    current: dict | None = None  # the entry compiled last; its "Used" line is still to come
    frame_target: dict | None = None  # the entry the next "bytes stack frame" line belongs to
    for line in log_text.splitlines():
        if entry := _ENTRY.search(line):
            current = _new_record(entry.group("name"), entry.group("arch"))
            records.append(current)
            frame_target = None
        elif properties := _PROPERTIES.search(line):
            # A device function's block (another name) leaves the entry's counts alone.
            is_entry = current is not None and properties.group("name") == current["kernel"]
            frame_target = current if is_entry else None
        elif frame := _FRAME.search(line):
            if frame_target is not None:
                frame_target["stack_frame_bytes"] = int(frame.group("stack"))
                frame_target["spill_store_bytes"] = int(frame.group("stores"))
                frame_target["spill_load_bytes"] = int(frame.group("loads"))
            frame_target = None
        elif _USED.search(line) and current is not None:
            _apply_used_line(current, line)
            current = None  # one "Used" line per entry
    if demangle is not None and records:
        readable = demangle(sorted({record["kernel"] for record in records}))
        for record in records:
            record["demangled"] = readable.get(record["kernel"], record["kernel"])
    return records


def demangle_names(mangled_names: list[str]) -> dict[str, str]:
    """Readable names through cu++filt (or c++filt); names map to themselves without either."""
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    identity = {name: name for name in mangled_names}
    if tool is None or not mangled_names:
        return identity
    completed = subprocess.run(
        [tool], input="\n".join(mangled_names) + "\n", capture_output=True, text=True, check=False
    )
    readable = completed.stdout.splitlines()
    if completed.returncode != 0 or len(readable) != len(mangled_names):
        return identity
    return dict(zip(mangled_names, readable))


# --- errors and warnings ------------------------------------------------------------------

_ERROR_LINES = (
    re.compile(r"^\S.*\(\d+\): (catastrophic )?error\b"),  # EDG front end: file.cu(12): error: ...
    re.compile(r"^\S.*:\d+:(\d+:)? (fatal )?error:"),  # host compiler: file.cpp:12:5: error: ...
    re.compile(r"^(nvcc|ptxas|nvlink|fatbinary|cicc|cudafe\+\+)\s+(error|fatal)\s*:"),  # CUDA tools
    re.compile(r"^[^\s:]+: (fatal )?error:"),  # drivers: collect2: error: ..., cc1plus: error: ...
    re.compile(r"^\S*\bld(\.\w+)?: (cannot find |.*undefined reference to )"),  # /usr/bin/ld: cannot find -lcuda
)

_WARNING_LINES = (
    re.compile(r"^\S.*\(\d+\): warning\b"),  # EDG: file.cu(3): warning #177-D: ...
    re.compile(r"^\S.*:\d+:(\d+:)? warning:"),  # host compiler
    re.compile(r"^(nvcc|ptxas|nvlink|fatbinary|cicc|cudafe\+\+)\s+warning\s*:"),  # CUDA tools
    re.compile(r"^[^\s:]+: warning:"),  # drivers
)

# ptxas's -warn-spills / -warn-lmem-usage lines: judged by the spill gate, not the warning gate.
_SPILL_WARNING = re.compile(
    r"^ptxas warning\s*: (Registers are spilled to local memory in function|Local memory used for function) "
    r"'(?P<name>[^']+)'"
)


# ptxas's serialisation notes ("info" lines, so no warning gate sees them): a kernel whose wgmma
# pipeline ptxas could not prove safe has every wgmma wait for the one before. C7510: across a call
# left in it (an assertion's __assertfail; v5_hopper's split kernels lost 1.5-2.3 us per call so,
# kernels/v5_hopper/NOTES.md, run 39); C7514: an accumulator read while its wgmma may be in flight
# (run 44). Matched on the message, whatever the code.
_SERIALIZED_WGMMA = re.compile(
    r"(?:\((?P<code>C\d+)\) )?Potential Performance Loss: wgmma\.mma_async instructions are serialized "
    r"(?P<why>.*?) in the function '(?P<name>[^']+)'"
)


def serialized_wgmma(log_text: str) -> list[tuple[str, str, str]]:
    """(kernel, ptxas's reason, its note code) for each kernel whose wgmma instructions ptxas serialised."""
    found = (_SERIALIZED_WGMMA.search(line) for line in log_text.splitlines())
    return list(dict.fromkeys((match.group("name"), " ".join(match.group("why").split()), match.group("code") or "note")
                              for match in found if match))


def _matching_lines(log_text: str, patterns: Iterable[re.Pattern[str]]) -> list[str]:
    return [line.rstrip() for line in log_text.splitlines() if any(p.search(line) for p in patterns)]


def first_error(log_text: str) -> str | None:
    """The first line the compiler toolchain reported as an error, or None."""
    errors = _matching_lines(log_text, _ERROR_LINES)
    return errors[0] if errors else None


def warning_lines(log_text: str) -> list[str]:
    """Compiler, host-compiler and ptxas warnings (not ptxas's informational resource lines)."""
    return _matching_lines(log_text, _WARNING_LINES)


def _spill_warning_kernels(warnings: list[str]) -> list[str]:
    return [match.group("name") for line in warnings if (match := _SPILL_WARNING.search(line))]


def _uses_local_memory(record: dict) -> bool:
    return any(
        record[key] > 0
        for key in ("stack_frame_bytes", "spill_store_bytes", "spill_load_bytes", "cumulative_stack_bytes")
    )


def _unique(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(names))


def build_verdict(
    returncode: int,
    log_text: str,
    resources: list[dict],
    allow_warnings: bool,
    allow_spills: bool,
) -> dict:
    """Pass or fail, with one reason line per failed check and the evidence.

    Fails on a nonzero exit status (the reason carries the first error), on any warning unless
    allowed, on register spills or local memory (stack frame) unless allowed, on wgmma
    instructions ptxas serialised (always: the kernel then runs, correct and slow), and on a
    successful build whose log holds no kernel resources (nothing to judge: -Xptxas -v missing).
    ptxas's own spill and local-memory warnings count under spills, not under warnings.
    """
    error = first_error(log_text)
    warnings = warning_lines(log_text)
    spill_warnings = [w for w in warnings if _SPILL_WARNING.search(w)]
    other_warnings = [w for w in warnings if not _SPILL_WARNING.search(w)]
    spilling_records = [record for record in resources if _uses_local_memory(record)]
    spilling_kernels = _unique(
        [record["kernel"] for record in spilling_records] + _spill_warning_kernels(warnings)
    )

    serialized = serialized_wgmma(log_text)
    reasons: list[str] = []
    if returncode != 0:
        reasons.append(f"nvcc exited with status {returncode}: {error or 'no error line found in the log'}")
    elif not resources:
        reasons.append("no kernel resources in the log (no 'Compiling entry function' line; was -Xptxas -v passed?)")
    if other_warnings and not allow_warnings:
        reasons.append(f"{len(other_warnings)} compiler warning(s), first: {other_warnings[0]}")
    if spilling_kernels and not allow_spills:
        for record in spilling_records:
            reasons.append(
                f"local memory in {record['kernel']} ({record['arch']}): "
                f"{record['stack_frame_bytes']} bytes stack frame, {record['spill_store_bytes']} bytes spill stores, "
                f"{record['spill_load_bytes']} bytes spill loads, {record['cumulative_stack_bytes']} bytes cumulative stack"
            )
        reported = {record["kernel"] for record in spilling_records}
        for line in spill_warnings:
            if _SPILL_WARNING.search(line).group("name") not in reported:
                reasons.append(line)
    for name, why, code in serialized:
        reasons.append(f"wgmma serialised in {name} ({why}; ptxas {code}): find what ptxas names there "
                       "(a call left in the kernel, an assertion's __assertfail included, or a wgmma "
                       "accumulator touched before its wait, or paths joining with different wgmma "
                       "groups pending) and take it out")
    return {
        "status": "fail" if reasons else "pass",
        "reasons": reasons,
        "first_error": error,
        "warnings": warnings,
        "spilling_kernels": spilling_kernels,
        "serialized_wgmma": [name for name, _, _ in serialized],
    }
