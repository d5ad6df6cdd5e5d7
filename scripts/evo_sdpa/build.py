"""Building a variant: nvcc into a shared library for CUDA variants (resources from ptxas),
a compile-by-launch for Triton variants on a GPU (resources from the compiled kernel)."""
from __future__ import annotations

import math
import os
import subprocess
import time
from pathlib import Path

from .device import NO_DEVICE_REASON, cuda_available, require_tool
from .variants import KERNELS_DIR, SHARED_DIR, Variant

NVCC_TIMEOUT_S = 600


def cc_tuple(cc: str) -> tuple[int, int]:
    major, minor = cc.split(".")
    return int(major), int(minor)


def below_min_cc(variant: Variant, cc: str) -> str | None:
    need = variant.support["min_compute_capability"]
    if cc_tuple(cc) < cc_tuple(need):
        return f"the target's compute capability {cc} is below the variant's minimum {need}"
    return None


def build_cuda(variant: Variant, cc: str, outdir: Path) -> tuple[dict, list[dict], str]:
    """Compile with nvcc; return (verdict, per-kernel resources, full compiler log)."""
    from . import nvcc as nvcc_lib

    nvcc = require_tool("nvcc")
    gencode = nvcc_lib.arch_gencode(cc)
    artifact = outdir / f"lib{variant.name}.so"
    cu_sources = [str(p) for p in variant.sources if p.suffix == ".cu"]
    argv = nvcc_lib.compile_command(nvcc, cu_sources, str(artifact), gencode,
                                    list(variant.meta["build"]["nvcc_flags"]),
                                    [str(KERNELS_DIR / SHARED_DIR), str(variant.folder)])
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=NVCC_TIMEOUT_S)
    seconds = time.perf_counter() - started
    log_text = f"$ {' '.join(argv)}\n{proc.stdout}{proc.stderr}"
    resources = nvcc_lib.parse_ptxas_resources(proc.stdout + proc.stderr)
    build = variant.meta["build"]
    verdict = nvcc_lib.build_verdict(proc.returncode, proc.stdout + proc.stderr, resources,
                                     build["allow_warnings"], build["allow_spills"])
    if proc.returncode != 0 and artifact.exists():
        artifact.unlink()
    verdict.update(artifact=str(artifact) if proc.returncode == 0 else None, arch=gencode,
                   compile_seconds=round(seconds, 2), command=argv)
    return verdict, resources, log_text


def build_triton(variant: Variant, allow_spills: bool) -> tuple[dict, list[dict], str]:
    """Import the module; on a GPU, launch each supported configuration once so Triton compiles
    it, then read registers, spills and shared memory off the compiled kernels."""
    import traceback

    if not cuda_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from .runners import load_triton_module

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
                    q, k, v = make_qkv(1, 1, 128, D, torch_dtype(dtype), "cuda", 0)
                    module.forward(q, k, v, torch.empty_like(q), causal, 1.0 / math.sqrt(D))
                    log_lines.append(f"compiled {dtype} D={D} causal={causal}")
        torch.cuda.synchronize()
    except Exception as exc:
        text = traceback.format_exc()
        return ({"status": "fail", "reasons": [f"compile/launch failed: {type(exc).__name__}: "
                                               f"{str(exc).splitlines()[0] if str(exc) else ''}"],
                 "first_error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                 "artifact": None}, [], "\n".join(log_lines) + "\n" + text)
    resources = list(module.compiled_resources()) if hasattr(module, "compiled_resources") else []
    spilling = [r["kernel"] for r in resources if r.get("spill_bytes")]
    reasons = [] if allow_spills or not spilling else [f"register spills in {', '.join(spilling)}"]
    verdict = {"status": "fail" if reasons else "pass", "reasons": reasons,
               "spilling_kernels": spilling, "artifact": str(variant.sources[0]),
               "compile_seconds": round(time.perf_counter() - started, 2)}
    return verdict, resources, "\n".join(log_lines) + "\n"
