"""What GPU this host has (asked of nvidia-smi and remembered, torch only where nvidia-smi is
missing) and where the CUDA tools are."""
from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import StageError
from .io import write_text

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
    uuid: str | None = None      # "GPU-8f3c..." when the driver says

    @property
    def device_id(self) -> str:
        """The identity measuring rules take as a param: results never cross card models (the
        job that measures records the very card, UUID included; the summary checks it)."""
        return f"{self.name} (cc {self.compute_capability})"


def cuda_bin() -> str:
    return os.path.join(os.environ.get("CUDA_HOME") or "/usr/local/cuda", "bin")


def find_tool(name: str) -> str | None:
    """A tool on PATH, else in the CUDA toolkit's bin/ ($CUDA_HOME, else /usr/local/cuda)."""
    path = shutil.which(name)
    if path:
        return path
    candidate = os.path.join(cuda_bin(), name)
    return candidate if os.access(candidate, os.X_OK) else None


def require_tool(name: str) -> str:
    path = find_tool(name)
    if path is None:
        raise StageError(f"{name} not found on PATH or in {cuda_bin()}: {TOOL_HINTS.get(name, 'install it')}")
    return path


def normalise_uuid(text: str) -> str:
    """nvidia-smi writes GPU-<uuid>; torch writes the bare uuid."""
    text = text.strip()
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def parse_smi_gpus(text: str) -> list[GpuIdentity]:
    """`nvidia-smi --query-gpu=index,uuid,name,compute_cap --format=csv,noheader` lines."""
    gpus = []
    for line in text.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) >= 4 and parts[0].isdigit():
            index, uuid, cap = int(parts[0]), parts[1], parts[-1]
            gpus.append(GpuIdentity(name=",".join(parts[2:-1]), compute_capability=cap, index=index,
                                    uuid=uuid or None))
    return gpus


def mig_parents(listing: str) -> dict[str, int]:
    """MIG instance UUID -> index of its GPU, from `nvidia-smi -L`."""
    parents, current = {}, None
    for line in listing.splitlines():
        gpu = re.match(r"GPU (\d+):", line.strip())
        if gpu:
            current = int(gpu.group(1))
        mig = re.search(r"UUID: (MIG-[^)\s]+)", line)
        if mig and current is not None:
            parents[mig.group(1)] = current
    return parents


def pick_visible(gpus: list[GpuIdentity], visible: str | None,
                 mig_listing: str | None = None) -> GpuIdentity | None:
    """The GPU a CUDA process sees first under CUDA_VISIBLE_DEVICES: an index, a GPU UUID (or a
    unique prefix of one, as CUDA accepts), a MIG instance's UUID; None when none is visible."""
    if not gpus:
        return None
    if visible is None:
        return gpus[0]
    first = visible.split(",")[0].strip()
    if first.isdigit():
        return next((g for g in gpus if g.index == int(first)), None)
    if first.startswith("MIG-"):
        parent = mig_parents(mig_listing or "").get(first)
        gpu = next((g for g in gpus if g.index == parent), None)
        return GpuIdentity(gpu.name, gpu.compute_capability, gpu.index, first) if gpu else None
    matches = [g for g in gpus if g.uuid and g.uuid.startswith(normalise_uuid(first))] if first else []
    return matches[0] if len(matches) == 1 else None


def command_output(argv: list[str], timeout_s: float) -> str | None:
    """A command's stdout, or None when it is missing, fails or runs past the timeout."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None


SMI_QUERY = ["--query-gpu=index,uuid,name,compute_cap", "--format=csv,noheader"]


def smi_gpus(timeout_s: float = 10.0) -> list[GpuIdentity] | None:
    """Every GPU nvidia-smi lists, in its order; None when nvidia-smi is missing or fails."""
    smi = find_tool("nvidia-smi")
    out = command_output([smi, *SMI_QUERY], timeout_s) if smi else None
    return parse_smi_gpus(out) if out is not None else None


def nvidia_driver_present() -> bool:
    """A cheap sign of an NVIDIA driver (no torch import): its proc entry or control node."""
    return os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidiactl")


def torch_gpu() -> GpuIdentity | None:
    """The first GPU torch sees (for a host whose nvidia-smi is missing or broken)."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        props = torch.cuda.get_device_properties(0)
    except Exception:  # a broken CUDA install answers "no GPU" here; the jobs say why
        return None
    uuid = normalise_uuid(str(props.uuid)) if getattr(props, "uuid", None) else None
    return GpuIdentity(name=props.name, compute_capability=f"{props.major}.{props.minor}", uuid=uuid)


def query_gpu(timeout_s: float = 10.0) -> GpuIdentity | None:
    """The first GPU a CUDA process here sees, or None on a host without one. Asked of
    nvidia-smi (cheap), else of torch when a driver is present but nvidia-smi is not."""
    if os.environ.get("EVO_SDPA_FORCE_CPU") == "1":
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = smi_gpus(timeout_s)
    if gpus is None:
        return torch_gpu() if nvidia_driver_present() else None
    mig = visible and visible.strip().startswith("MIG-")
    listing = command_output([find_tool("nvidia-smi"), "-L"], timeout_s) if mig else None
    return pick_visible(gpus, visible, listing)


def identity_key() -> str:
    """Everything the visible GPU set depends on: boot, host, the visibility variables, the
    device nodes. A cached identity is reused only while this is unchanged."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = None
    nodes = sorted(str(p) for p in Path("/dev").glob("nvidia[0-9]*"))
    return json.dumps([boot, platform.node(), os.environ.get("CUDA_VISIBLE_DEVICES"),
                       os.environ.get("NVIDIA_VISIBLE_DEVICES"), find_tool("nvidia-smi"), nodes])


def query_gpu_cached(cache: Path) -> GpuIdentity | None:
    """query_gpu(), remembered in `cache` while identity_key() holds: nvidia-smi (or torch) is
    the slowest step of building the DAG on a GPU host. Measuring jobs record the card they ran
    on whatever this says, so a stale identity is caught where results are combined."""
    if os.environ.get("EVO_SDPA_FORCE_CPU") == "1":
        return None
    if find_tool("nvidia-smi") is None and not nvidia_driver_present():
        return None
    key = identity_key()
    try:
        cached = json.loads(cache.read_text())
        if cached["key"] == key:
            return GpuIdentity(**cached["gpu"]) if cached["gpu"] else None
    except (OSError, ValueError, KeyError, TypeError):
        pass
    gpu = query_gpu()
    try:
        write_text(cache, json.dumps({"key": key, "gpu": asdict(gpu) if gpu else None}))
    except OSError:
        pass  # a read-only checkout only loses the cache
    return gpu


def device_id(gpu: GpuIdentity | None) -> str:
    return gpu.device_id if gpu else CPU_DEVICE_ID


def gpu_visible() -> bool:
    """Whether a CUDA device is visible here, asked of the driver's tools (nvidia-smi) rather than
    torch: for a stage whose own process runs nothing on the card but starts a target that does
    (ncu, the sanitizer), and so need not pay torch's import (3-5 s a job on an H100 host). The
    target reports the card torch gives it (provenance.report_card)."""
    return query_gpu() is not None


def stage_tool(name: str) -> str | None:
    """The tool a stage runs its target under, once gpu_visible(): its path; None when it is
    missing and torch sees no CUDA device either (a driver without a GPU torch can use: the stage
    records a skip, as on a host without one); one line naming the fix (StageError) when it is
    missing on a host that could run it. Only the missing tool's path imports torch."""
    path = find_tool(name)
    if path is None and not cuda_available():
        return None
    return path or require_tool(name)


def cuda_available() -> bool:
    """True when torch can use a CUDA device here (stage scripts, not the DAG, ask this)."""
    if os.environ.get("EVO_SDPA_FORCE_CPU") == "1":
        return False
    import torch

    return torch.cuda.is_available()


NO_DEVICE_REASON = "no CUDA device on this host"
TORCH_SEES_NO_DEVICE = f"{NO_DEVICE_REASON} (the driver lists a GPU; torch sees none)"
