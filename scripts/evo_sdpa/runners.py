"""Turn a variant (or SDPA) into one callable: forward(q, k, v, out, causal, scale) -> None."""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import sys
from pathlib import Path
from typing import Callable

from .variants import KERNELS_DIR, Variant

Forward = Callable[..., None]


def load_triton_module(variant: Variant):
    """The variant's module, imported once per process; a copy of a variant in another folder (an
    evolution candidate) is its own module."""
    entry = variant.sources[0]
    module_name = f"evo_sdpa_variant_{variant.name}"
    if variant.folder.resolve() != (KERNELS_DIR / variant.name).resolve():
        module_name += "_" + hashlib.sha1(str(variant.folder.resolve()).encode()).hexdigest()[:10]
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, entry)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


# Seen: Triton 3.6's interpreter turns scalar kernel arguments into 1-element arrays, which
# NumPy 2.3+ refuses to use as loop bounds; Triton 3.9's interpreter runs the same kernels.
INTERPRETER_MIN_TRITON = (3, 9)
INTERPRETER_NUMPY_BREAKS = (2, 3)


def _version(text: str) -> tuple[int, int]:
    major, minor = (text.split("+")[0].split(".") + ["0"])[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def interpreter_blocker() -> str | None:
    """Why the Triton interpreter cannot run the variants here, or None when it can."""
    import importlib.metadata as md

    triton, numpy = md.version("triton"), md.version("numpy")
    if _version(triton) < INTERPRETER_MIN_TRITON and _version(numpy) >= INTERPRETER_NUMPY_BREAKS:
        return (f"the Triton {triton} interpreter fails with NumPy {numpy} (scalar loop bounds); "
                f"install triton>={'.'.join(map(str, INTERPRETER_MIN_TRITON))} for CPU parity")
    return None


def bind_tunables(variant: Variant, forward: Forward, values: dict[str, int]) -> Forward:
    """A Triton forward with its tunables bound (forward(..., tunables=values)); a variant that
    declares none is called as it is."""
    if not variant.meta.get("tunables"):
        return forward
    return functools.partial(forward, tunables=dict(values))


def load_forward(variant: Variant, artifact: str | Path | None,
                 tunable_values: dict[str, int] | None = None) -> Forward:
    """The variant's forward: a CUDA variant through its built library (its tunables are compiled
    in), Triton by import with its tunables bound (variant.yaml's defaults unless given)."""
    if variant.kind == "cuda":
        from .cuda_abi import CudaVariant

        if artifact is None:
            raise ValueError(f"{variant.name}: a CUDA variant needs its built library")
        return CudaVariant(artifact)
    from .tunables import resolve

    return bind_tunables(variant, load_triton_module(variant).forward, resolve(variant, tunable_values))


def load_built(variant: Variant, build_verdict: dict) -> Forward:
    """The forward a build verdict describes: its artifact and the tunable values it built with."""
    return load_forward(variant, build_verdict.get("artifact"), build_verdict.get("tunables"))


def sdpa_forward() -> Forward:
    """SDPA writing into `out` (backend: the default's pick, or the one an enclosing
    sdpa_backend() context forces)."""
    import torch.nn.functional as F

    def forward(q, k, v, out, causal: bool, scale: float) -> None:
        out.copy_(F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale))

    return forward


def sdpa_call(q, k, v, causal: bool, scale: float):
    """SDPA as users call it (it allocates its output): what the bench times."""
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)


SDPA_BACKENDS = ("default", "flash", "efficient", "cudnn", "math")


def sdpa_backend(name: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    table = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
             "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    return sdpa_kernel(table[name])
