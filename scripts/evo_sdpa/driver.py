"""The CUDA driver API through ctypes: just enough to run a built CUDA variant without torch (the
primary context, device buffers, the card's identity, the profiler's start and stop). For the
processes Nsight Compute and compute-sanitizer watch, where torch's import and CUDA start-up
would be most of the job."""
from __future__ import annotations

import ctypes

from .errors import StageError

CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76


def load_libcuda(without_it: str) -> ctypes.CDLL:
    """The CUDA driver library, or one line saying it cannot be loaded and what that stops."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise StageError(f"libcuda.so.1: cannot load the CUDA driver ({exc}); {without_it}") from exc


def error_name(lib, code: int) -> str:
    """The driver's name for a CUresult (CUDA_ERROR_...)."""
    name = ctypes.c_char_p()
    lib.cuGetErrorName(code, ctypes.byref(name))
    return name.value.decode() if name.value else f"error {code}"


class CudaDriver:
    """Device 0 of this process's visible devices, its primary context current on this thread:
    the context the CUDA runtime inside a variant's library uses too."""

    def __init__(self):
        self.lib = load_libcuda("is an NVIDIA driver installed?")
        self.lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
        self.lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        self.lib.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
        self.lib.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
        self._check(self.lib.cuInit(0), "cuInit")
        self.device = ctypes.c_int()
        self._check(self.lib.cuDeviceGet(ctypes.byref(self.device), 0), "cuDeviceGet")
        self.context = ctypes.c_void_p()
        self._check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.context), self.device),
                    "cuDevicePrimaryCtxRetain")
        self._check(self.lib.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def _check(self, code: int, call: str) -> None:
        if code != 0:
            raise RuntimeError(f"{call} failed: {error_name(self.lib, code)}")

    def alloc(self, nbytes: int) -> int:
        """A device buffer of exactly `nbytes` (no pool: the sanitizer sees its true bounds)."""
        ptr = ctypes.c_uint64()
        self._check(self.lib.cuMemAlloc_v2(ctypes.byref(ptr), nbytes), "cuMemAlloc")
        return ptr.value

    def free(self, ptr: int) -> None:
        self._check(self.lib.cuMemFree_v2(ptr), "cuMemFree")

    def upload(self, host) -> int:
        """A new device buffer holding the bytes of a contiguous numpy array."""
        ptr = self.alloc(host.nbytes)
        self._check(self.lib.cuMemcpyHtoD_v2(ptr, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")
        return ptr

    def download(self, ptr: int, host) -> None:
        """Fill a contiguous numpy array from the device buffer at `ptr` (synchronous)."""
        self._check(self.lib.cuMemcpyDtoH_v2(host.ctypes.data, ptr, host.nbytes), "cuMemcpyDtoH")

    def synchronize(self) -> None:
        self._check(self.lib.cuCtxSynchronize(), "cuCtxSynchronize")

    def profiler_start(self) -> None:
        self._check(self.lib.cuProfilerStart(), "cuProfilerStart")

    def profiler_stop(self) -> None:
        self._check(self.lib.cuProfilerStop(), "cuProfilerStop")

    def card(self) -> dict:
        """The card as provenance.card() names it: name, GPU-UUID, compute capability."""
        name = ctypes.create_string_buffer(256)
        self._check(self.lib.cuDeviceGetName(name, len(name), self.device), "cuDeviceGetName")
        uuid = ctypes.create_string_buffer(16)
        self._check(self.lib.cuDeviceGetUuid_v2(uuid, self.device), "cuDeviceGetUuid")
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.cuDeviceGetAttribute(ctypes.byref(major), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                                  self.device), "cuDeviceGetAttribute")
        self._check(self.lib.cuDeviceGetAttribute(ctypes.byref(minor), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                                  self.device), "cuDeviceGetAttribute")
        return {"name": name.value.decode(), "uuid": format_uuid(uuid.raw),
                "compute_capability": f"{major.value}.{minor.value}"}


def format_uuid(raw: bytes) -> str:
    """16 bytes as nvidia-smi and torch write a GPU's UUID: GPU-8-4-4-4-12 hex digits."""
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
