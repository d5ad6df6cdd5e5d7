"""The card's clocks through NVML (libnvidia-ml, the library nvidia-smi itself calls), read in
this process: one nvidia-smi run costs about 25 ms, and the timing stages read the clock before
and after every case. Read only: nothing here sets a clock or any other setting of the card."""
from __future__ import annotations

import ctypes

NVML_CLOCK_SM = 1
NVML_SUCCESS = 0


class Nvml:
    """One card, found by its UUID ("GPU-..."), as nvidia-smi and torch write it."""

    def __init__(self, uuid: str):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")  # OSError when the driver's library is absent
        self._check(self.lib.nvmlInit_v2(), "nvmlInit")
        self.handle = ctypes.c_void_p()
        self._check(self.lib.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(self.handle)),
                    f"nvmlDeviceGetHandleByUUID({uuid})")

    def _check(self, code: int, call: str) -> None:
        if code != NVML_SUCCESS:
            raise OSError(f"{call} failed: NVML error {code}")

    def sm_clock_mhz(self) -> int:
        """The SM clock now, as nvidia-smi's clocks.sm."""
        value = ctypes.c_uint()
        self._check(self.lib.nvmlDeviceGetClockInfo(self.handle, NVML_CLOCK_SM, ctypes.byref(value)),
                    "nvmlDeviceGetClockInfo")
        return value.value

    def max_sm_clock_mhz(self) -> int:
        """The SM clock's maximum, as nvidia-smi's clocks.max.sm."""
        value = ctypes.c_uint()
        self._check(self.lib.nvmlDeviceGetMaxClockInfo(self.handle, NVML_CLOCK_SM, ctypes.byref(value)),
                    "nvmlDeviceGetMaxClockInfo")
        return value.value


def open_card(uuid: str | None) -> Nvml | None:
    """NVML for this card, or None where the library, the card or its UUID is not to be had (the
    caller then asks nvidia-smi)."""
    if not uuid:
        return None
    try:
        return Nvml(uuid)
    except (OSError, AttributeError):
        return None
