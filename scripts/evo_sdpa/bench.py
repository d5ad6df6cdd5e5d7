"""Benchmark of one variant against SDPA, timed in the same process, with a re-check of the
output on fresh inputs after the timing loop."""
from __future__ import annotations

import math

from .inputs import make_qkv, poisoned_like, reference
from .runners import sdpa_call
from .shapes import Shape, torch_dtype
from .stats import gbps, tflops
from .timing import sm_clock_mhz, time_shape
from .tolerance import ToleranceRule, error_stats
from .variants import Variant

# Seeds for the post-timing re-check: never the inputs the timing loop saw.
RECHECK_SEED = 10_000
# A speedup implying more than this fraction of the measured matmul ceiling is not believed.
CEILING_SLACK = 1.05


def recheck(forward, shape: Shape, dtype: str, rule: ToleranceRule) -> dict:
    """Run the variant on fresh inputs into a poisoned buffer: a kernel that cached an earlier
    output or special-cased the timed inputs fails here."""
    import torch
    import torch.nn.functional as F

    scale = 1.0 / math.sqrt(shape.D)
    q, k, v = make_qkv(shape.B, shape.H, shape.S, shape.D, torch_dtype(dtype), "cuda", RECHECK_SEED)
    out = poisoned_like(q)
    forward(q, k, v, out, shape.causal, scale)
    torch.cuda.synchronize()
    ref = reference(q, k, v, shape.causal, scale)
    err = error_stats(out, ref)["max_abs"]
    sdpa_err = error_stats(F.scaled_dot_product_attention(q, k, v, is_causal=shape.causal, scale=scale), ref)["max_abs"]
    passed, bound = rule.judge(dtype, err, sdpa_err)
    del q, k, v, out, ref
    torch.cuda.empty_cache()
    return {"status": "pass" if passed else "fail", "max_abs": err, "sdpa_max_abs": sdpa_err, "bound": bound}


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


def bench_case(variant_forward, shape: Shape, dtype: str, timing: dict, rule: ToleranceRule,
               ceilings: dict | None) -> dict:
    import torch

    scale = 1.0 / math.sqrt(shape.D)

    def make_variant(q, k, v):
        out = torch.empty_like(q)
        return lambda: variant_forward(q, k, v, out, shape.causal, scale)

    def make_sdpa(q, k, v):
        return lambda: sdpa_call(q, k, v, shape.causal, scale)

    clock_before = sm_clock_mhz()
    measured = time_shape({"variant": make_variant, "sdpa": make_sdpa}, shape, dtype, timing)
    clock_after = sm_clock_mhz()
    modes = {}
    for mode, by_name in measured.items():
        v_stats, s_stats = by_name["variant"]["stats"], by_name["sdpa"]["stats"]
        achieved = tflops(shape.flops, v_stats["p50_us"])
        achieved_gbps = gbps(shape.min_bytes(dtype), v_stats["p50_us"])
        modes[mode] = {
            "label": by_name["variant"]["mode"],
            "cache": by_name["variant"]["cache"],
            "ended_by": by_name["variant"]["ended_by"],
            "variant": v_stats,
            "sdpa": s_stats,
            "speedup_p50": s_stats["p50_us"] / v_stats["p50_us"],
            "speedup_p90": s_stats["p90_us"] / v_stats["p90_us"],
            "variant_tflops": achieved,
            "sdpa_tflops": tflops(shape.flops, s_stats["p50_us"]),
            "variant_gbps": achieved_gbps,
            "sanity_flag": ceiling_flag(achieved, achieved_gbps, ceilings, dtype),
        }
    check = recheck(variant_forward, shape, dtype, rule)
    return {"shape": shape.to_dict(), "label": shape.label, "dtype": dtype, "status": "measured",
            "flops": shape.flops, "modes": modes, "primary_mode": "graph" if shape.graph else "eager",
            "recheck": check, "sm_clock_mhz_before": clock_before, "sm_clock_mhz_after": clock_after}


def run(variant: Variant, forward, shapes: list[Shape], dtypes: list[str], timing: dict,
        rule: ToleranceRule, ceilings: dict | None, log) -> dict:
    cases = []
    for shape in shapes:
        for dtype in dtypes:
            why = variant.unsupported_reason(dtype, shape.D, shape.causal, shape.S)
            if why:
                cases.append({"shape": shape.to_dict(), "label": shape.label, "dtype": dtype,
                              "status": "skipped", "reason": f"outside the variant's support: {why}"})
                continue
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
    return {"status": status, "reasons": reasons, "sanity_flags": flags, "cases": cases}
