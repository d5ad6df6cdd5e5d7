"""What GPU this host has (asked cheaply, without importing torch) and where the CUDA tools are."""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from .errors import StageError

TOOL_HINTS = {
    "nvcc": "install the CUDA toolkit (12.4 or newer) and put its bin/ on PATH",
    "ncu": "install Nsight Compute (it ships with the CUDA toolkit) and put ncu on PATH, "
           "or set stages.ncu: false in the config",
    "compute-sanitizer": "install the CUDA toolkit's compute-sanitizer and put it on PATH, "
                         "or set stages.sanitizer: false in the config",
    "nvidia-smi": "install the NVIDIA driver utilities",
}

CPU_DEVICE_ID = "cpu"


@dataclass(frozen=True)
class GpuIdentity:
    name: str
    compute_capability: str      # "9.0"
    index: int = 0

    @property
    def device_id(self) -> str:
        """The identity measuring rules take as a param: results never cross cards."""
        return f"{self.name} (cc {self.compute_capability})"


def find_tool(name: str) -> str | None:
    path = shutil.which(name)
    if path:
        return path
    cuda_home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    candidate = os.path.join(cuda_home, "bin", name)
    return candidate if os.access(candidate, os.X_OK) else None


def require_tool(name: str) -> str:
    path = find_tool(name)
    if path is None:
        raise StageError(f"{name} not found on PATH: {TOOL_HINTS.get(name, 'install it')}")
    return path


def query_gpu(timeout_s: float = 10.0) -> GpuIdentity | None:
    """The first visible GPU from nvidia-smi, or None on a host without one."""
    if os.environ.get("EVO_SDPA_FORCE_CPU") == "1":
        return None
    smi = find_tool("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=timeout_s, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    lines = [line for line in out.splitlines() if line.strip()]
    if not lines or visible == "":
        return None
    index = int(visible.split(",")[0]) if visible and visible.split(",")[0].isdigit() else 0
    index = min(index, len(lines) - 1)
    name, cap = (part.strip() for part in lines[index].split(",", 1))
    return GpuIdentity(name=name, compute_capability=cap, index=index)


def device_id(gpu: GpuIdentity | None) -> str:
    return gpu.device_id if gpu else CPU_DEVICE_ID


def cuda_available() -> bool:
    """True when torch can use a CUDA device here (stage scripts, not the DAG, ask this)."""
    if os.environ.get("EVO_SDPA_FORCE_CPU") == "1":
        return False
    import torch

    return torch.cuda.is_available()


NO_DEVICE_REASON = "no CUDA device on this host"
