"""A/B sweep for v4_pipelined's compile-time knobs, in one process on one GPU.

Not a pipeline stage: the pipeline gates and measures the variant as variant.yaml builds it.
This script builds a few -D configurations of the same sources (plus v3_mma, the rung below)
into /tmp, checks each on a small correctness set (fp64 reference, NaN-poisoned output, the
pipeline's tolerance rule), then times all of them and SDPA interleaved in one process with the
pipeline's own timing code (CUDA events, L2 flush / rotated inputs, graph replay on the small
shapes). So each knob is measured against the others and against SDPA on the same card in the
same run, one knob per row.

    python3 kernels/v4_pipelined/ab_sweep.py --out $OUT/sweep.json \
        --config stages3= --config stages2=-DV4_PIPELINED_STAGES=2
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

from ab_sweep import SWEEP_TIMING, load_config, timing_factories  # noqa: E402  (scripts/ab_sweep.py)
from evo_sdpa.cuda_abi import CudaVariant  # noqa: E402
from evo_sdpa.nvcc import ALWAYS_FLAGS, arch_gencode, parse_ptxas_resources  # noqa: E402
from evo_sdpa.parity import ParityCase, run_case  # noqa: E402
from evo_sdpa.shapes import Shape  # noqa: E402
from evo_sdpa.stats import tflops  # noqa: E402
from evo_sdpa.timing import time_shape  # noqa: E402
from evo_sdpa.tolerance import ToleranceRule  # noqa: E402
from evo_sdpa.tunables import define_flags, resolve, split_define_flags  # noqa: E402
from evo_sdpa.variants import load_variant  # noqa: E402

BUILD_DIR = Path("/tmp/v4_ab_sweep")
CHECK_SEED = 7

# (B, H, S, D, causal, dtype, distribution): small grids (the key-split path), ragged S, both
# head dims, both dtypes, and one grid larger than the GPU (the plain path).
CHECK_CASES = [
    (1, 2, 1, 64, False, "fp16", "normal"),
    (1, 2, 17, 64, True, "fp16", "normal"),
    (1, 2, 67, 64, False, "bf16", "large"),
    (2, 3, 127, 64, True, "fp16", "dominant_key"),
    (2, 3, 200, 64, False, "fp16", "near_constant"),
    (1, 2, 1000, 64, True, "bf16", "normal"),
    (1, 2, 1000, 64, False, "fp16", "large"),
    (2, 8, 512, 64, False, "fp16", "normal"),
    (4, 8, 2048, 64, True, "fp16", "normal"),
    (1, 2, 129, 128, True, "fp16", "normal"),
    (2, 3, 1000, 128, False, "bf16", "large"),
    (1, 4, 1000, 128, True, "fp16", "near_constant"),
    (1, 2, 65, 128, False, "bf16", "dominant_key"),
    (1, 2, 2048, 128, True, "fp16", "normal"),
]


def build(name: str, flags: list[str], sources_dir: Path, gencode: str) -> dict:
    # every tunable's -D from variant.yaml (a -D of a tunable's macro in `flags` overrides it)
    variant = load_variant(sources_dir)
    overrides, flags = split_define_flags(variant, flags)
    flags = define_flags(variant, resolve(variant, overrides)) + flags
    out = BUILD_DIR / f"lib{name}.so"
    argv = ["nvcc", "-O3", "-std=c++17", *ALWAYS_FLAGS, gencode, f"-I{REPO / 'kernels/common'}",
            f"-I{sources_dir}", *flags, str(sources_dir / "kernel.cu"), "-o", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    resources = [{"kernel": r["kernel"].split("TileTraitsI", 1)[-1].split("EEEE", 1)[0], "registers": r["registers"],
                  "spill_bytes": r["spill_store_bytes"] + r["spill_load_bytes"],
                  "stack": r["stack_frame_bytes"]} for r in parse_ptxas_resources(log)]
    warnings = [line for line in log.splitlines() if "warning" in line.lower()]
    return {"name": name, "flags": flags, "ok": proc.returncode == 0, "artifact": str(out),
            "resources": resources, "warnings": warnings, "log_tail": log[-2000:] if proc.returncode else ""}


def check(forward, cases, rule: ToleranceRule) -> list[dict]:
    """The parity stage's run_case on each case (seed 7): twice into NaN-poisoned outputs against
    the float64 reference, judged by the pipeline's tolerance rule."""
    return [run_case(ParityCase(dtype, B, H, S, D, causal, dist, CHECK_SEED), forward, rule, "cuda")
            for B, H, S, D, causal, dtype, dist in cases]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--config", action="append", default=[], help="name=space-separated nvcc -D flags")
    parser.add_argument("--with-v3", action="store_true", help="also build and time kernels/v3_mma")
    parser.add_argument("--dtypes", default="fp16")
    parser.add_argument("--only", default="", help="time only shapes whose label contains this")
    parser.add_argument("--budget-s", type=float, default=120.0, help="stop timing new shapes after this")
    args = parser.parse_args()

    import torch

    started = time.perf_counter()
    config = load_config()
    major, minor = torch.cuda.get_device_capability()
    gencode = arch_gencode(f"{major}.{minor}")
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    jobs = [(spec.split("=", 1)[0], spec.split("=", 1)[1].split(), REPO / "kernels/v4_pipelined")
            for spec in args.config]
    if args.with_v3:
        jobs.insert(0, ("v3_mma", [], REPO / "kernels/v3_mma"))
    with ThreadPoolExecutor(max_workers=8) as pool:
        builds = list(pool.map(lambda job: build(job[0], job[1], job[2], gencode), jobs))
    report = {"device": torch.cuda.get_device_name(), "gencode": gencode, "builds": builds,
              "checks": {}, "timings": []}

    forwards = {}
    for b in builds:
        if not b["ok"]:
            print(f"BUILD FAIL {b['name']}: {b['log_tail'][-400:]}")
            continue
        forward = CudaVariant(b["artifact"])
        try:
            checks = check(forward, CHECK_CASES, ToleranceRule.from_config(config["tolerance"]))
        except RuntimeError as exc:  # a launch error: report it, keep the other configurations
            print(f"{b['name']:>16}: ERROR {exc}")
            report["checks"][b["name"]] = [{"error": str(exc)}]
            continue
        report["checks"][b["name"]] = checks
        failed = [c for c in checks if c["status"] != "pass"]
        regs = sorted({r["registers"] for r in b["resources"]})
        print(f"{b['name']:>16}: check {len(checks) - len(failed)}/{len(checks)} pass; regs {regs}; "
              f"spills {sum(r['spill_bytes'] for r in b['resources'])}; warnings {len(b['warnings'])}")
        for c in failed:
            print(f"    FAIL {c['id']}: {c['reason']}")
        if not failed:
            forwards[b["name"]] = forward

    timing = dict(config["timing"], **SWEEP_TIMING)
    suite = config["shape_suites"][config["bench_suite"]]
    for dtype in args.dtypes.split(","):
        for shape_dict in suite:
            if time.perf_counter() - started > args.budget_s:
                print("budget spent: stopping")
                break
            shape = Shape.from_dict(shape_dict)
            if args.only and args.only not in shape.label:
                continue
            measured = time_shape(timing_factories(forwards, shape), shape, dtype, timing)
            for mode, by_name in measured.items():
                row = {"shape": shape.label, "dtype": dtype, "mode": by_name["sdpa"]["mode"],
                       "p50_us": {n: r["stats"]["p50_us"] for n, r in by_name.items()},
                       "rel_spread": {n: r["stats"]["rel_spread"] for n, r in by_name.items()}}
                report["timings"].append(row)
                sdpa_us = row["p50_us"]["sdpa"]
                cells = "  ".join(f"{n} {us:7.2f} ({sdpa_us / us:4.2f}x)" for n, us in row["p50_us"].items()
                                  if n != "sdpa")
                print(f"{shape.label:>26} {dtype} {row['mode']:>9}: sdpa {sdpa_us:7.2f} us | {cells}")
                if mode == "eager":
                    row["tflops"] = {n: tflops(shape.flops, us) for n, us in row["p50_us"].items()}
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"sweep done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
