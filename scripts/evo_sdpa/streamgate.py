"""A gate on a CUDA stream: work queued behind it waits until the host opens it. Closed before a
timed call's begin event and opened after its end event is queued, it keeps the GPU from reaching
the call before the host has queued all of it, so no host time, however long, lands between the
call's events (NOTES.md of v5_hopper, run 101: an L2 flush queued before the call hid 1-23 µs of
it, and the eager p50 held the rest). Driver API through ctypes, on a host word mapped for the
device: a stream memory operation (cuStreamWaitValue64) is the wait.

A call that waits for the GPU inside itself (a synchronise, a `.item()`, a cudaFree) would wait
for a gate only the host can open: a watcher thread opens a gate left closed for FORCE_OPEN_S and
counts it, and the timing that saw it fails naming the call."""
from __future__ import annotations

import ctypes
import threading
import time

from .driver import error_name, load_libcuda
from .errors import StageError

CU_MEMHOSTALLOC_PORTABLE = 0x01
CU_MEMHOSTALLOC_DEVICEMAP = 0x02
CU_STREAM_WAIT_VALUE_GEQ = 0x0

# No timed call takes this long on the host; one still inside after this is waiting on the GPU.
FORCE_OPEN_S = 2.0


def _load_driver():
    driver = load_libcuda("the timed stream cannot be gated without it")
    driver.cuMemHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
    driver.cuMemHostGetDevicePointer_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_uint]
    driver.cuStreamWaitValue64_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint]
    driver.cuMemFreeHost.argtypes = [ctypes.c_void_p]
    return driver


class StreamGate:
    """One gate on one stream. Each close() queues a wait for the next count; open() writes it."""

    def __init__(self, stream_handle: int, driver=None):
        self.driver = driver or _load_driver()
        self.stream = ctypes.c_void_p(stream_handle)
        self.host_word = ctypes.c_void_p()
        self._check(self.driver.cuMemHostAlloc(ctypes.byref(self.host_word), 8,
                                               CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP),
                    "cuMemHostAlloc")
        self.word = ctypes.c_uint64.from_address(self.host_word.value)
        self.word.value = 0
        self.device_word = ctypes.c_uint64()
        self._check(self.driver.cuMemHostGetDevicePointer_v2(ctypes.byref(self.device_word), self.host_word, 0),
                    "cuMemHostGetDevicePointer")
        self.count = 0
        self.forced = 0
        self._closed_at: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="stream-gate-watcher", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        while not self._stop.wait(FORCE_OPEN_S / 10):
            with self._lock:
                if self._closed_at is not None and time.perf_counter() - self._closed_at > FORCE_OPEN_S:
                    self.forced += 1
                    self._open()

    def _check(self, code: int, call: str) -> None:
        if code != 0:
            raise StageError(f"{call} failed ({error_name(self.driver, code)}): the timed stream cannot be "
                             "gated on this driver")

    def close(self) -> None:
        """Work queued on the stream from here on waits until the next open()."""
        with self._lock:
            self.count += 1
            self._check(self.driver.cuStreamWaitValue64_v2(self.stream, self.device_word.value, self.count,
                                                           CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue64")
            self._closed_at = time.perf_counter()

    def open(self) -> None:
        with self._lock:
            self._open()

    def _open(self) -> None:
        self.word.value = self.count
        self._closed_at = None

    def release(self) -> None:
        """Stop the watcher, open for good and free the host word once the stream has drained."""
        self._stop.set()
        self._watcher.join()
        if self.host_word.value:
            self.open()
            self.driver.cuCtxSynchronize()
            self.driver.cuMemFreeHost(self.host_word)
            self.host_word = ctypes.c_void_p()
