"""Benchmark of one variant against SDPA, timed in the same process, with a re-check of the
output on fresh inputs after the timing loop."""
from __future__ import annotations

import math
from contextlib import nullcontext

from .inputs import make_qkv, reference
from .runners import sdpa_call
from .shapes import Shape, torch_dtype
from .stats import gbps, speedup_interval, tflops
from .timing import drop_input_sets, sm_clock_mhz, spin_up_clock, time_shape
from .tolerance import ToleranceRule, error_stats, sdpa_error
from .variants import Variant

# Seeds for the post-timing re-check: never the inputs the timing loop saw.
RECHECK_SEED = 10_000
# A speedup implying more than this fraction of the measured matmul ceiling is not believed.
CEILING_SLACK = 1.05


def recheck(forward, timed: tuple, shape: Shape, dtype: str, rule: ToleranceRule) -> dict:
    """Refill the very tensors the timing loop used with fresh values, re-poison the output and
    run the variant once more: a kernel that caches results by address, skips repeated calls or
    special-cases the timed inputs fails here (new allocations could land elsewhere and miss it)."""
    import torch

    scale = 1.0 / math.sqrt(shape.D)
    q, k, v, out = timed
    fresh = make_qkv(shape.B, shape.H, shape.S, shape.D, torch_dtype(dtype), "cuda", RECHECK_SEED,
                     draw_on_device=True)
    for buffer, values in zip((q, k, v), fresh):
        buffer.copy_(values)
    drop_input_sets()  # the timed sets no longer hold what their seeds drew
    out.fill_(float("nan"))
    forward(q, k, v, out, shape.causal, scale)
    torch.cuda.synchronize()
    ref = reference(q, k, v, shape.causal, scale)
    err = error_stats(out, ref)["max_abs"]
    sdpa_err = sdpa_error(q, k, v, ref, shape.causal, scale)
    passed, bound = rule.judge(dtype, err, sdpa_err)
    del fresh, ref
    return {"status": "pass" if passed else "fail", "max_abs": err, "sdpa_max_abs": sdpa_err,
            "bound": bound, "on": "the timed buffers, refilled in place"}


def ceiling_flag(achieved_tflops: float, achieved_gbps: float, ceilings: dict | None,
                 dtype: str) -> str | None:
    """Faster than the roofline means the measurement is wrong, not the kernel fast."""
    if not ceilings:
        return None
    flops_ceiling = ceilings["matmul_tflops"].get(dtype)
    if flops_ceiling and achieved_tflops > CEILING_SLACK * flops_ceiling:
        return (f"{achieved_tflops:.0f} TFLOP/s is above the measured {dtype} matmul ceiling "
                f"({flops_ceiling:.0f}): the measurement is wrong, not the kernel fast")
    copy_ceiling = ceilings.get("copy_gbps")
    if copy_ceiling and achieved_gbps > CEILING_SLACK * copy_ceiling:
        return (f"{achieved_gbps:.0f} GB/s of compulsory traffic is above the measured copy "
                f"bandwidth ({copy_ceiling:.0f}): inputs were served from cache, not memory")
    return None


def host_flag(variant_host_us: float | None, sdpa_host_us: float | None,
              variant_p50_us: float, sdpa_p50_us: float) -> str | None:
    """An eager call that takes longer on the host than on the GPU is host-bound when called
    from Python: back to back, such calls run at the host's pace. The timing gates the stream, so
    the p50s are GPU time either way and the ratio stands; the flag says whose eager calls the host
    would limit. Either side may be; None when neither is (or host time was not measured)."""
    sides = [(who, host, p50) for who, host, p50 in (("the variant", variant_host_us, variant_p50_us),
                                                     ("SDPA", sdpa_host_us, sdpa_p50_us))
             if host is not None and host > p50]
    if not sides:
        return None
    return "host-bound from Python: " + "; ".join(
        f"{who}'s call takes {host:.0f} µs of host time against {p50:.0f} µs on the GPU"
        for who, host, p50 in sides)


def bench_case(variant_forward, shape: Shape, dtype: str, timing: dict, rule: ToleranceRule,
               ceilings: dict | None) -> dict:
    import torch

    scale = 1.0 / math.sqrt(shape.D)

    # The (q, k, v, out) of the variant's last call from Python (before any call: the last set
    # made), for the re-check: a forward that caches by address or skips a repeated call keys on
    # its last call, which in graph mode is the capture's last call (input set graph_calls-1 mod
    # sets), not the first set.
    last_called = []

    def make_variant(q, k, v):
        out = torch.empty_like(q)
        buffers = (q, k, v, out)
        last_called[:] = [buffers]

        def call() -> None:
            last_called[:] = [buffers]
            variant_forward(q, k, v, out, shape.causal, scale)

        return call

    def make_sdpa(q, k, v):
        return lambda: sdpa_call(q, k, v, shape.causal, scale)

    clock_before = sm_clock_mhz()
    measured = time_shape({"variant": make_variant, "sdpa": make_sdpa}, shape, dtype, timing)
    clock_after = sm_clock_mhz()
    modes = {}
    for mode, by_name in measured.items():
        variant, sdpa = by_name["variant"], by_name["sdpa"]
        v_stats, s_stats = variant["stats"], sdpa["stats"]
        achieved = tflops(shape.flops, v_stats["p50_us"])
        achieved_gbps = gbps(shape.min_bytes(dtype), v_stats["p50_us"])
        firmness = speedup_interval(sdpa["samples_us"], variant["samples_us"])
        host_us, sdpa_host_us = variant.get("host_p50_us"), sdpa.get("host_p50_us")
        modes[mode] = {
            "label": variant["mode"],
            "cache": variant["cache"],
            "ended_by": variant["ended_by"],
            "variant": v_stats,
            "sdpa": s_stats,
            "speedup_p50": s_stats["p50_us"] / v_stats["p50_us"],
            "speedup_p90": s_stats["p90_us"] / v_stats["p90_us"],
            "speedup_p50_ci95": firmness["ci95"],
            "speedup_p50_halves": firmness["halves"],
            "repeat_flag": firmness["flag"],
            "variant_tflops": achieved,
            "sdpa_tflops": tflops(shape.flops, s_stats["p50_us"]),
            "variant_gbps": achieved_gbps,
            "sanity_flag": ceiling_flag(achieved, achieved_gbps, ceilings, dtype),
            "variant_host_us": host_us,
            "sdpa_host_us": sdpa_host_us,
            "host_flag": host_flag(host_us, sdpa_host_us, v_stats["p50_us"], s_stats["p50_us"]),
        }
    check = recheck(variant_forward, last_called[0], shape, dtype, rule)
    del last_called
    torch.cuda.empty_cache()
    return {"shape": shape.to_dict(), "label": shape.label, "dtype": dtype, "status": "measured",
            "flops": shape.flops, "modes": modes, "primary_mode": "graph" if shape.graph else "eager",
            "recheck": check, "sm_clock_mhz_before": clock_before, "sm_clock_mhz_after": clock_after}


# A case that has not returned after this long is taken for a hung kernel (a case's timing is
# capped at max_time_ms per mode, seconds in all).
CASE_LIMIT_S = 300.0


def run(variant: Variant, forward, shapes: list[Shape], dtypes: list[str], timing: dict,
        rule: ToleranceRule, ceilings: dict | None, log, watchdog=None) -> dict:
    """Every supported (shape, dtype) of the suite, each inside `watchdog.step(<label> <dtype>)`
    when a watchdog (evo_sdpa.watchdog.StepWatchdog) is given."""
    spin_up = spin_up_clock()
    log.info("clock before timing: %s", spin_up)
    cases = []
    for shape in shapes:
        for dtype in dtypes:
            why = variant.unsupported_reason(dtype, shape.D, shape.causal, shape.S)
            if why:
                cases.append({"shape": shape.to_dict(), "label": shape.label, "dtype": dtype,
                              "status": "skipped", "reason": f"outside the variant's support: {why}"})
                continue
            with watchdog.step(f"{shape.label} {dtype}") if watchdog else nullcontext():
                case = bench_case(forward, shape, dtype, timing, rule, ceilings)
            primary = case["modes"][case["primary_mode"]]
            log.info("%s %s [%s]: variant p50 %.2f us, sdpa p50 %.2f us, speedup %.3f, recheck %s",
                     shape.label, dtype, primary["label"], primary["variant"]["p50_us"],
                     primary["sdpa"]["p50_us"], primary["speedup_p50"], case["recheck"]["status"])
            cases.append(case)
    rechecks_failed = [c["label"] + " " + c["dtype"] for c in cases
                       if c["status"] == "measured" and c["recheck"]["status"] != "pass"]
    flags = [c["label"] + " " + c["dtype"] + ": " + m["sanity_flag"] for c in cases
             if c["status"] == "measured" for m in c["modes"].values() if m["sanity_flag"]]
    status = "fail" if rechecks_failed else "measured"
    reasons = [f"output wrong on fresh inputs after timing: {', '.join(rechecks_failed)}"] if rechecks_failed else []
    return {"status": status, "reasons": reasons, "sanity_flags": flags,
            "repeat_flags": mode_flags(cases, "repeat_flag"), "host_flags": mode_flags(cases, "host_flag"),
            "clock_spin_up": spin_up, "cases": cases}


def mode_flags(cases: list[dict], key: str) -> list[str]:
    """Every measured case's timing modes that raised the flag `key`, each labelled with its case and mode."""
    return [c["label"] + " " + c["dtype"] + f" [{m['label']}]: " + m[key] for c in cases
            if c["status"] == "measured" for m in c["modes"].values() if m.get(key)]
