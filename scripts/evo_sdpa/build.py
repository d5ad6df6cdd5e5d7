"""Building a variant: nvcc into a shared library for CUDA variants (resources from ptxas),
a compile-by-launch for Triton variants on a GPU (resources from the compiled kernel)."""
from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import nvcc as nvcc_lib
from . import sass as sass_lib
from . import tunables as tunables_lib
from .device import NO_DEVICE_REASON, cuda_available, require_tool
from .errors import StageError
from .variants import KERNELS_DIR, REPO, SHARED_DIR, Variant

NVCC_TIMEOUT_S = 600


def cc_tuple(cc: str) -> tuple[int, int]:
    major, minor = cc.split(".")
    return int(major), int(minor)


def below_min_cc(variant: Variant, cc: str) -> str | None:
    need = variant.support["min_compute_capability"]
    if cc_tuple(cc) < cc_tuple(need):
        return f"the target's compute capability {cc} is below the variant's minimum {need}"
    return None


def build_variant(variant: Variant, cc: str, outdir: Path, cutlass_include: str | None = None,
                  tunable_values: dict[str, int] | None = None, jobs: int | None = None) -> tuple[dict, list[dict], str]:
    """The build stage's (verdict, per-kernel resources, compiler log) for a variant of either
    kind, with its tunables (defaults unless overridden); skipped below its minimum capability."""
    skip = below_min_cc(variant, cc)
    if skip:
        verdict, resources, text = {"status": "skipped", "reasons": [skip], "artifact": None,
                                    "tunables": tunables_lib.resolve(variant, tunable_values)}, [], skip
    elif variant.kind == "cuda":
        verdict, resources, text = build_cuda(variant, cc, outdir, cutlass_include, tunable_values, jobs)
    else:
        verdict, resources, text = build_triton(variant, variant.meta["build"]["allow_spills"], tunable_values)
    verdict.update(variant=variant.name, kind=variant.kind, compute_capability=cc)
    return verdict, resources, text


# --- header libraries a variant may require (build.requires) -------------------------------

CUTLASS_PACKAGE = "nvidia-cutlass==4.2.0.0"   # the pin of envs/requirements.txt
CUTLASS_MODULE = "cutlass_library"             # its importable package; the headers lie under it
CUTLASS_PROBE = Path("cute") / "tensor.hpp"
CUTLASS_FIX = (f"pip install {CUTLASS_PACKAGE} (headers only; --no-deps is enough) "
               "or set build.cutlass_include")


def installed_cutlass_include() -> Path | None:
    """<site-packages>/cutlass_library/source/include of the installed nvidia-cutlass, found
    without importing the package (its import pulls in heavy dependencies)."""
    spec = importlib.util.find_spec(CUTLASS_MODULE)
    if spec is None:
        return None
    if spec.submodule_search_locations:
        package_dir = Path(next(iter(spec.submodule_search_locations)))
    elif spec.origin:
        package_dir = Path(spec.origin).parent
    else:
        return None
    return package_dir / "source" / "include"


def cutlass_include_dir(configured: str | None, installed: Path | None) -> Path:
    """The folder holding cute/ and cutlass/: config key build.cutlass_include when set (relative
    to the repository root), else the installed package's; one line naming the fix when neither
    holds cute/tensor.hpp."""
    if configured:
        path = Path(configured)
        path = path if path.is_absolute() else REPO / path
        if not (path / CUTLASS_PROBE).is_file():
            raise StageError(f"config: key 'build.cutlass_include': {configured!r} holds no {CUTLASS_PROBE} "
                             "(point it at the folder holding cute/ and cutlass/)")
        return path
    if installed is None:
        raise StageError(f"CUTLASS headers not found (no {CUTLASS_MODULE} package in {sys.executable}'s "
                         f"environment): {CUTLASS_FIX}")
    if not (installed / CUTLASS_PROBE).is_file():
        raise StageError(f"CUTLASS headers not found ({installed / CUTLASS_PROBE} missing): {CUTLASS_FIX}")
    return installed


def required_include_dirs(requires: list[str], cutlass_include: str | None) -> list[Path]:
    """Include folders of the header libraries a variant lists under build.requires."""
    dirs = []
    if "cutlass" in requires:
        dirs.append(cutlass_include_dir(cutlass_include, installed_cutlass_include()))
    return dirs


# --- running nvcc -------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One compiler run: a translation unit's compile, the link, or the whole single-command build."""
    command: list[str]
    returncode: int
    output: str          # stdout then stderr
    seconds: float

    @property
    def log(self) -> str:
        return f"$ {' '.join(self.command)}\n{self.output}"


def run_step(argv: list[str]) -> Step:
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=NVCC_TIMEOUT_S)
    return Step(argv, proc.returncode, proc.stdout + proc.stderr, time.perf_counter() - started)


def run_parallel(commands: list[list[str]], jobs: int | None = None) -> list[Step]:
    """Up to `jobs` commands at once (the cores the caller was given; None: one per core); the
    steps come back in the commands' order."""
    workers = max(1, min(len(commands), jobs or os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(run_step, commands))


def compile_and_link(nvcc: str, sources: list[str], artifact: Path, gencode: str, flags: list[str],
                     include_dirs: list[str], workdir: Path, jobs: int | None = None) -> tuple[list[Step], Step | None]:
    """Each source to an object in parallel, then one link; no link when a unit failed."""
    objects = [str(workdir / f"{index:02d}_{Path(source).stem}.o") for index, source in enumerate(sources)]
    units = run_parallel([nvcc_lib.object_command(nvcc, source, obj, gencode, flags, include_dirs)
                          for source, obj in zip(sources, objects)], jobs)
    if any(unit.returncode != 0 for unit in units):
        return units, None
    return units, run_step(nvcc_lib.link_command(nvcc, objects, str(artifact), gencode, flags))


MERGED_UNIT_PREFIX = "merged_unit_"


def unit_groups(sources: list[str], jobs: int | None, merge: bool) -> list[list[str]]:
    """The translation units each compile reads: one apiece, or, where the variant's units may be
    merged (build.merge_units) and the build has fewer threads than units, as many runs of
    consecutive units as it has threads. Each unit of a CuTe variant parses the same headers again:
    v5_hopper's five units took 280 s one after another and 120 s as one unit (CPU host)."""
    workers = max(1, jobs or os.cpu_count() or 1)
    if not merge or workers >= len(sources):
        return [[source] for source in sources]
    size, extra = divmod(len(sources), workers)
    groups, start = [], 0
    for index in range(workers):
        end = start + size + (1 if index < extra else 0)
        groups.append(sources[start:end])
        start = end
    return groups


def merged_sources(groups: list[list[str]], outdir: Path) -> list[str]:
    """One file per group: the unit itself, or a file beside the artifact that #includes the group's
    units in order (kept, so the logged command can be run again); an earlier build's are removed."""
    for stale in outdir.glob(f"{MERGED_UNIT_PREFIX}*.cu"):
        stale.unlink()
    compiled = []
    for index, group in enumerate(groups):
        if len(group) == 1:
            compiled.append(group[0])
            continue
        merged = outdir / f"{MERGED_UNIT_PREFIX}{index}.cu"
        merged.write_text("".join(f'#include "{source}"\n' for source in group))
        compiled.append(str(merged))
    return compiled


def run_nvcc(nvcc: str, sources: list[str], artifact: Path, gencode: str, flags: list[str],
             include_dirs: list[str], jobs: int | None = None) -> tuple[list[Step], Step | None]:
    """(one step per translation unit, the link step or None). One .cu file builds in one
    command; several compile in parallel to objects in a scratch folder beside the artifact."""
    if len(sources) == 1:
        return [run_step(nvcc_lib.compile_command(nvcc, sources, str(artifact), gencode, flags, include_dirs))], None
    with tempfile.TemporaryDirectory(dir=artifact.parent, prefix=".objects-") as workdir:
        return compile_and_link(nvcc, sources, artifact, gencode, flags, include_dirs, Path(workdir), jobs)


def step_record(step: Step) -> dict:
    return {"seconds": round(step.seconds, 2), "returncode": step.returncode, "command": step.command}


def compile_inputs(variant: Variant, values: dict[str, int], cutlass_include: str | None = None) -> tuple[list[str], list[str]]:
    """(nvcc flags, include folders) of a CUDA variant built with tunable `values`: its own flags,
    one -D per tunable, kernels/common, its folder and the header libraries it requires."""
    build = variant.meta["build"]
    flags = list(build["nvcc_flags"]) + tunables_lib.define_flags(variant, values)
    include_dirs = [str(KERNELS_DIR / SHARED_DIR), str(variant.folder)] + \
        [str(path) for path in required_include_dirs(build["requires"], cutlass_include)]
    return flags, include_dirs


def build_cuda(variant: Variant, cc: str, outdir: Path, cutlass_include: str | None = None,
               tunable_values: dict[str, int] | None = None, jobs: int | None = None) -> tuple[dict, list[dict], str]:
    """Compile with nvcc; return (verdict, per-kernel resources, full compiler log).

    Every tunable reaches the kernel as -D<define>=<value>: its variant.yaml default unless
    `tunable_values` overrides it (each override checked against the knob's declared values); the
    verdict records the values under `tunables`. `cutlass_include` is config key
    build.cutlass_include (used when the variant requires cutlass). With build.sass_expect, the
    built library's SASS must hold each listed opcode. `jobs`: translation units compiled at once
    (the threads the job was given; None: one per core)."""
    build = variant.meta["build"]
    values = tunables_lib.resolve(variant, tunable_values)
    flags, include_dirs = compile_inputs(variant, values, cutlass_include)
    nvcc = require_tool("nvcc")
    sass_tools = sass_lib.find_sass_tools() if build["sass_expect"] else None
    gencode = nvcc_lib.arch_gencode(cc)
    artifact = outdir / f"lib{variant.name}.so"
    outdir.mkdir(parents=True, exist_ok=True)
    groups = unit_groups([str(p) for p in variant.translation_units], jobs, build["merge_units"])
    cu_sources = merged_sources(groups, outdir)
    started = time.perf_counter()
    units, link = run_nvcc(nvcc, cu_sources, artifact, gencode, flags, include_dirs, jobs)
    seconds = time.perf_counter() - started
    steps = units + ([link] if link else [])
    returncode = next((step.returncode for step in steps if step.returncode != 0), 0)
    output = "".join(step.output for step in steps)
    resources = nvcc_lib.parse_ptxas_resources(output)
    verdict = nvcc_lib.build_verdict(returncode, output, resources, build["allow_warnings"], build["allow_spills"])
    if returncode != 0 and artifact.exists():
        artifact.unlink()
    verdict.update(artifact=str(artifact) if returncode == 0 else None, arch=gencode,
                   compile_seconds=round(seconds, 2),
                   command=link.command if link else (units[0].command if len(units) == 1 else None),
                   units=[{"source": source, **({"merges": group} if len(group) > 1 else {}), **step_record(unit)}
                          for source, group, unit in zip(cu_sources, groups, units)],
                   link=step_record(link) if link else None, sass=None, sass_dump=None, tunables=values)
    if any(step.returncode < 0 for step in steps):
        # nvcc was stopped by a signal (a timeout, a cancel): the kernel did not fail, the build did
        # not finish; a caller that caches verdicts must not keep this one.
        verdict["interrupted"] = True
        verdict["reasons"].append(f"nvcc was stopped by signal {-min(step.returncode for step in steps)}: "
                                  "the build was interrupted, not refused")
    log_text = "".join(step.log for step in steps)
    if sass_tools is not None and returncode == 0:
        log_text += check_sass(verdict, sass_tools, artifact, build["sass_expect"])
    return verdict, resources, log_text


def check_sass(verdict: dict, tools: sass_lib.SassTools, artifact: Path, expected: list[str]) -> str:
    """Count the expected opcodes in the library's SASS (the dump is written beside it) and fail
    the verdict on any absent one; returns the lines it adds to the compiler log."""
    argv, listing = sass_lib.dump_sass(tools, artifact)
    dump = artifact.with_suffix(".sass")
    dump.write_text(listing)
    counts = sass_lib.count_opcodes(listing, expected)
    verdict["sass"] = counts
    verdict["sass_dump"] = str(dump)
    verdict["reasons"].extend(sass_lib.missing_opcode_reasons(counts))
    verdict["status"] = "fail" if verdict["reasons"] else "pass"
    summary = ", ".join(f"{opcode} {count}" for opcode, count in counts.items())
    return f"$ {' '.join(argv)} > {dump}\nSASS opcodes expected by build.sass_expect: {summary}\n"


def build_triton(variant: Variant, allow_spills: bool,
                 tunable_values: dict[str, int] | None = None) -> tuple[dict, list[dict], str]:
    """Import the module; on a GPU, launch each supported configuration once so Triton compiles
    it, then read registers, spills and shared memory off the compiled kernels. The tunables (the
    variant.yaml defaults unless `tunable_values` overrides them) reach forward() as its
    `tunables` argument; the verdict records them."""
    values = tunables_lib.resolve(variant, tunable_values)
    verdict, resources, text = _build_triton(variant, allow_spills, values)
    verdict["tunables"] = values
    return verdict, resources, text


# Triton specialises an integer argument equal to 1 and one divisible by 16, so one kernel source
# compiles to up to three binaries per configuration, each with its own registers and spills. One
# launch per case compiles each: at S=128 alone, a 128-key D=128 configuration measured no spills
# while its S=17 binary spilled 224 bytes on an H100 (ab_sweep, this session).
TRITON_PROBE_SEQ_LENS = (1, 17, 128)


def _build_triton(variant: Variant, allow_spills: bool, values: dict[str, int]) -> tuple[dict, list[dict], str]:
    import traceback

    if not cuda_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from .runners import bind_tunables, load_triton_module

    try:
        module = load_triton_module(variant)
    except Exception as exc:
        text = traceback.format_exc()
        return ({"status": "fail", "reasons": [f"import failed: {type(exc).__name__}: {exc}"],
                 "first_error": str(exc), "artifact": None}, [], text)
    if not callable(getattr(module, "forward", None)):
        return ({"status": "fail", "reasons": [f"{variant.sources[0].name} defines no forward()"],
                 "artifact": None}, [], "")
    if not cuda_available():
        return ({"status": "pass", "reasons": [], "artifact": str(variant.sources[0]),
                 "note": f"imported only; Triton compiles at first launch and the kernel resources "
                         f"are read on a GPU host ({NO_DEVICE_REASON})"}, [], "imported under the "
                "Triton interpreter\n")
    forward = bind_tunables(variant, module.forward, values)
    import torch

    from .inputs import make_qkv
    from .shapes import torch_dtype

    log_lines = []
    started = time.perf_counter()
    s = variant.support
    try:
        for dtype in s["dtypes"]:
            for D in s["head_dims"]:
                for causal in s["causal"]:
                    for seq_len in TRITON_PROBE_SEQ_LENS:
                        q, k, v = make_qkv(1, 1, seq_len, D, torch_dtype(dtype), "cuda", 0)
                        forward(q, k, v, torch.empty_like(q), causal, 1.0 / math.sqrt(D))
                    log_lines.append(f"compiled {dtype} D={D} causal={causal} "
                                     f"(S={', '.join(map(str, TRITON_PROBE_SEQ_LENS))})")
        torch.cuda.synchronize()
    except Exception as exc:
        text = traceback.format_exc()
        return ({"status": "fail", "reasons": [f"compile/launch failed: {type(exc).__name__}: "
                                               f"{str(exc).splitlines()[0] if str(exc) else ''}"],
                 "first_error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                 "artifact": None}, [], "\n".join(log_lines) + "\n" + text)
    resources = list(module.compiled_resources()) if hasattr(module, "compiled_resources") else []
    # this process may have launched other configurations before (an evolution's candidates)
    resources = [r for r in resources if r.get("tunables", values) == values]
    spilling = [r["kernel"] for r in resources if r.get("spill_bytes")]
    reasons = [] if allow_spills or not spilling else [f"register spills in {', '.join(spilling)}"]
    verdict = {"status": "fail" if reasons else "pass", "reasons": reasons,
               "spilling_kernels": spilling, "artifact": str(variant.sources[0]),
               "compile_seconds": round(time.perf_counter() - started, 2)}
    return verdict, resources, "\n".join(log_lines) + "\n"
