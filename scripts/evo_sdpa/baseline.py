"""The SDPA baseline: every backend on the configured shapes and dtypes, and what the default picks."""
from __future__ import annotations

import math
import time

from .runners import SDPA_BACKENDS, sdpa_backend, sdpa_call
from .shapes import Shape, torch_dtype
from .stats import StopRule, gbps, summarize, tflops


def default_backend_choice(q, k, v, causal: bool, scale: float) -> str:
    """The backend SDPA's dispatcher picks for these inputs (torch's private chooser)."""
    import torch
    from torch.nn.attention import SDPBackend

    chooser = getattr(torch, "_fused_sdp_choice", None)
    if chooser is None:
        return "unknown (torch has no _fused_sdp_choice)"
    index = chooser(q, k, v, None, 0.0, causal, scale=scale)
    names = {SDPBackend.FLASH_ATTENTION: "flash", SDPBackend.EFFICIENT_ATTENTION: "efficient",
             SDPBackend.CUDNN_ATTENTION: "cudnn", SDPBackend.MATH: "math"}
    for backend, name in names.items():
        if int(backend.value) == int(index):
            return name
    return f"unknown ({index})"


def _row(shape: Shape, dtype: str, backend: str, device: str) -> dict:
    return {"dtype": dtype, "B": shape.B, "H": shape.H, "S": shape.S, "D": shape.D,
            "causal": shape.causal, "backend": backend, "device": device}


def gpu_cases(shapes: list[Shape], dtypes: list[str], timing: dict, log) -> list[dict]:
    from .timing import input_set, sm_clock_mhz, spin_up_clock, time_shape

    log.info("clock before timing: %s", spin_up_clock())
    rows = []
    for shape in shapes:
        scale = 1.0 / math.sqrt(shape.D)
        for dtype in dtypes:
            picked = default_backend_choice(*input_set(shape, dtype), shape.causal, scale)
            for backend in SDPA_BACKENDS:
                base = _row(shape, dtype, backend, "cuda")
                if backend == "default":
                    base["picked_backend"] = picked
                factory = {backend: lambda q, k, v: (lambda: sdpa_call(q, k, v, shape.causal, scale))}
                clock_before = sm_clock_mhz()
                try:
                    if backend == "default":
                        measured = time_shape(factory, shape, dtype, timing)
                    else:
                        with sdpa_backend(backend):
                            measured = time_shape(factory, shape, dtype, timing)
                except RuntimeError as exc:  # a backend that cannot run this case says so
                    rows.append({**base, "mode": "eager", "status": "unsupported",
                                 "reason": str(exc).splitlines()[0][:300]})
                    log.info("%s %s %s: unsupported", shape.label, dtype, backend)
                    continue
                clock_after = sm_clock_mhz()
                for mode, by_name in measured.items():
                    result = by_name[backend]
                    rows.append({**base, **_stats_row(result, shape, dtype),
                                 "sm_clock_mhz_before": clock_before, "sm_clock_mhz_after": clock_after})
                log.info("%s %s %s: p50 %.2f us", shape.label, dtype, backend,
                         measured["eager"][backend]["stats"]["p50_us"])
    return rows


def _stats_row(result: dict, shape: Shape, dtype: str) -> dict:
    stats = result["stats"]
    return {"status": "measured", "mode": result["mode"], "cache": result["cache"],
            "ended_by": result["ended_by"], **{k: stats[k] for k in (
                "n", "min_us", "p50_us", "p90_us", "p99_us", "iqr_us", "rel_spread")},
            "tflops": tflops(shape.flops, stats["p50_us"]),
            "gbps": gbps(shape.min_bytes(dtype), stats["p50_us"])}


def cpu_cases(shapes: list[Shape], dtypes: list[str], timing: dict, max_gflop: float, log) -> list[dict]:
    """Torch's CPU SDPA on the shapes small enough for this host, labelled as CPU numbers."""
    import torch

    from .inputs import make_qkv

    rule = StopRule(min_samples=3, min_time_ms=0.0, max_time_ms=timing["max_time_ms"],
                    rel_spread=timing["rel_spread"])
    rows = []
    for shape in shapes:
        scale = 1.0 / math.sqrt(shape.D)
        for dtype in dtypes:
            base = _row(shape, dtype, "default", "cpu")
            if shape.flops / 1e9 > max_gflop:
                rows.append({**base, "mode": "cpu", "status": "skipped",
                             "reason": f"{shape.flops / 1e9:.1f} GFLOP is above cpu_baseline_max_gflop "
                                       f"({max_gflop}) on a host without a CUDA device"})
                continue
            q, k, v = make_qkv(shape.B, shape.H, shape.S, shape.D, torch_dtype(dtype), "cpu", 0)
            sdpa_call(q, k, v, shape.causal, scale)
            samples: list[float] = []
            start = time.perf_counter()
            ended_by = None
            while ended_by is None:
                t0 = time.perf_counter()
                sdpa_call(q, k, v, shape.causal, scale)
                samples.append((time.perf_counter() - t0) * 1e6)
                ended_by = rule.check([samples], (time.perf_counter() - start) * 1e3)
            result = {"stats": summarize(samples), "mode": "cpu wall clock",
                      "cache": "not flushed", "ended_by": ended_by}
            rows.append({**base, **_stats_row(result, shape, dtype),
                         "torch_threads": torch.get_num_threads()})
            log.info("%s %s cpu: p50 %.1f us", shape.label, dtype, result["stats"]["p50_us"])
    return rows
