"""A built CUDA variant run without torch: the driver API (driver.py) for context and buffers, the
C ABI (cuda_abi.py) for the launch, NumPy for the inputs. The processes compute-sanitizer and
Nsight Compute watch use it for CUDA variants: torch's import and CUDA start-up took most of those
jobs' time, and each buffer is then exactly one allocation."""
from __future__ import annotations

import math
from pathlib import Path

from .cuda_abi import CudaVariant
from .driver import CudaDriver
from .errors import StageError
from .inputs import NAN_BITS, all_finite_bits, host_qkv
from .provenance import NO_CARD, report_card
from .shapes import TORCH_DTYPE_NAMES


def open_device(card_path: str | Path | None) -> CudaDriver:
    """The driver with device 0's primary context current. Writes the card to `card_path` when
    given; with no usable CUDA device, reports that there and exits TARGET_NO_DEVICE_EXIT, as a
    torch target does (provenance.report_card)."""
    try:
        driver = CudaDriver()
    except (RuntimeError, StageError):
        if card_path is None:
            raise
        driver = None
    if card_path is not None:
        report_card(card_path, driver.card() if driver else dict(NO_CARD))  # no card: exits here
    return driver


class BareCall:
    """One configuration of a variant on device buffers: q, k, v drawn once (seeded), the output
    filled with NaN so an element the kernel never writes stays visible."""

    def __init__(self, driver: CudaDriver, variant: CudaVariant, B: int, H: int, S: int, D: int, dtype: str,
                 causal: bool, seed: int = 0):
        import numpy as np

        self.driver, self.variant, self.dtype = driver, variant, dtype
        self.shape, self.causal, self.scale = (B, H, S, D), causal, 1.0 / math.sqrt(D)
        self.host_out = np.full((B, H, S, D), NAN_BITS[dtype], dtype=np.uint16)
        self.buffers = [driver.upload(x) for x in host_qkv(B, H, S, D, dtype, seed)]
        self.buffers.append(driver.upload(self.host_out))

    def __call__(self) -> None:
        q, k, v, out = self.buffers
        self.variant.launch(q, k, v, out, self.shape, self.causal, self.scale, TORCH_DTYPE_NAMES[self.dtype])

    def output_finite(self) -> bool:
        """Whether every output element is finite (synchronises: the copy waits for the kernel)."""
        self.driver.download(self.buffers[3], self.host_out)
        return all_finite_bits(self.host_out, self.dtype)

    def free(self) -> None:
        for ptr in self.buffers:
            self.driver.free(ptr)
        self.buffers = []
