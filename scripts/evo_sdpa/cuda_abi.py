"""The one binding to every CUDA variant: ctypes over the C ABI in kernels/common/evo_sdpa_abi.h."""
from __future__ import annotations

import ctypes
from pathlib import Path

from .errors import StageError

ABI_VERSION = 1
DTYPE_CODES = {"float16": 0, "bfloat16": 1}
ERR_UNSUPPORTED = -1


class CudaVariant:
    """Calls evo_sdpa_forward of a variant's shared library on torch's current stream."""

    def __init__(self, library: str | Path):
        self.path = Path(library)
        try:
            self.lib = ctypes.CDLL(str(self.path))
        except OSError as exc:
            raise StageError(f"{self.path}: cannot load the built variant ({exc})") from exc
        version = self.lib.evo_sdpa_abi_version()
        if version != ABI_VERSION:
            raise StageError(f"{self.path}: ABI version {version}, the pipeline speaks {ABI_VERSION}; "
                             "rebuild against kernels/common/evo_sdpa_abi.h")
        self._forward = self.lib.evo_sdpa_forward
        self._forward.restype = ctypes.c_int
        self._forward.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 5 + [
            ctypes.c_float, ctypes.c_int, ctypes.c_void_p]
        self.lib.evo_sdpa_error_string.restype = ctypes.c_char_p
        self.lib.evo_sdpa_error_string.argtypes = [ctypes.c_int]

    def __call__(self, q, k, v, out, causal: bool, scale: float) -> None:
        import torch

        B, H, S, D = q.shape
        dtype = str(q.dtype).removeprefix("torch.")
        for t in (q, k, v, out):
            if not t.is_contiguous() or t.shape != q.shape or t.dtype != q.dtype:
                raise ValueError("q, k, v, out must be contiguous [B,H,S,D] tensors of one dtype")
        if dtype not in DTYPE_CODES:
            raise ValueError(f"dtype {dtype} is not part of the ABI")
        stream = torch.cuda.current_stream(q.device).cuda_stream
        self.launch(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), (B, H, S, D), causal, scale,
                    dtype, stream)

    def launch(self, q: int, k: int, v: int, out: int, shape: tuple[int, int, int, int], causal: bool,
               scale: float, dtype: str, stream: int | None = None) -> None:
        """The forward on device pointers (contiguous [B, H, S, D] buffers of `dtype`, 'float16' or
        'bfloat16'); stream None is the legacy default stream."""
        B, H, S, D = shape
        code = self._forward(q, k, v, out, B, H, S, D, int(causal), float(scale), DTYPE_CODES[dtype], stream)
        if code != 0:
            text = self.lib.evo_sdpa_error_string(code).decode(errors="replace")
            raise RuntimeError(f"{self.path.name}: evo_sdpa_forward returned {code}: {text}")
