"""Where a v5_hopper call's time goes, CTA by CTA: replays a CUDA graph of calls (the bench's
graph timing: input sets rotated past L2) on a diagnostic build (`-DV5_HOPPER_TRACE=1`, see
kernels/v5_hopper/trace.cuh) and prints each step's median over the CTAs and the calls.

    python3 scripts/trace_v5.py --shape 1,8,512,64 [--set split_block_m=64 ...] [--lib built.so]

Without --lib it builds the traced library (tunables as --set gives them) into --build-dir.
The probes cost a few stores per CTA, so the period is a little longer than the bench's figure
for the same build, which the script also times (untraced builds are what the bench measures)."""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from evo_sdpa import timeline  # noqa: E402
from evo_sdpa.config import load_repo_config  # noqa: E402
from evo_sdpa.device import NO_DEVICE_REASON, cuda_available  # noqa: E402
from evo_sdpa.errors import StageError, run_stage  # noqa: E402
from evo_sdpa.stats import StopRule  # noqa: E402
from evo_sdpa.tunables import parse_assignments  # noqa: E402
from evo_sdpa.variants import KERNELS_DIR, load_variant, with_flags  # noqa: E402

TRACE_FLAG = "-DV5_HOPPER_TRACE=1"


def build(build_dir: Path, tunable_values) -> Path:
    import torch

    from evo_sdpa.build import build_cuda

    major, minor = torch.cuda.get_device_capability()
    # The probes' registers may tip a kernel at its limit into a few bytes of spills: a diagnostic
    # build allows them and says where.
    variant = with_flags(load_variant(KERNELS_DIR / "v5_hopper"), [TRACE_FLAG], allow_spills=True)
    verdict, resources, log = build_cuda(variant, f"{major}.{minor}", build_dir,
                                         tunable_values=tunable_values)
    (build_dir / "build.log").write_text(log)
    if verdict["status"] != "pass":
        raise StageError(f"the traced build failed ({build_dir / 'build.log'})")
    for kernel in resources:
        if kernel["spill_store_bytes"] or kernel["spill_load_bytes"]:
            print(f"trace_v5: the traced {kernel['kernel']} spills {kernel['spill_store_bytes']} B "
                  f"(the pipeline build gate forbids spills; this one is only for the timeline)")
    return Path(verdict["artifact"])


def shape_arg(text: str) -> tuple[int, int, int, int]:
    try:
        shape = tuple(int(x) for x in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 4 or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give B,H,S,D, four positive integers (e.g. 1,8,512,64)")
    return shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", required=True, type=shape_arg, help="B,H,S,D")
    parser.add_argument("--dtype", default="fp16", choices=["fp16", "bf16"])
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--lib", type=Path, help="a library built with -DV5_HOPPER_TRACE=1 (or the lighter "
                                                  "levels 2 and 3, kernels/v5_hopper/trace.cuh)")
    parser.add_argument("--untraced", type=Path,
                        help="the same build without the probes: its graph is timed beside the traced one")
    parser.add_argument("--set", action="append", default=[], metavar="TUNABLE=VALUE")
    parser.add_argument("--build-dir", type=Path, default=Path("/tmp/evo_sdpa_trace_v5"))
    parser.add_argument("--graph-calls", type=int, default=32)
    parser.add_argument("--json", type=Path, help="write the per-call summaries here")
    parser.add_argument("--raw", type=Path,
                        help="write the summarised calls' stamps here (.npz: ns and cycles per call, CTA and point)")
    args = parser.parse_args()
    if not 2 <= args.graph_calls < timeline.CALLS:
        parser.error(f"--graph-calls must be 2 to {timeline.CALLS - 1}: a period needs two calls, and trace.cuh "
                     f"keeps {timeline.CALLS} rows")
    if args.lib is not None and not args.lib.is_file():
        raise StageError(f"--lib {args.lib}: no such library; build it with {TRACE_FLAG}, or leave --lib out "
                         "to build the traced one here")
    if args.untraced is not None and not args.untraced.is_file():
        raise StageError(f"--untraced {args.untraced}: no such library; build the variant without {TRACE_FLAG} first")
    tunable_values = parse_assignments(args.set)
    if not cuda_available():
        raise StageError(f"trace_v5 replays the kernel on a card: {NO_DEVICE_REASON}; run it on a Hopper GPU host")

    import torch

    from evo_sdpa.cuda_abi import CudaVariant
    from evo_sdpa.inputs import make_qkv
    from evo_sdpa.shapes import torch_dtype
    from evo_sdpa.timing import capture_graph, input_sets_beyond_l2, sweep_timing, time_graph

    lib = args.lib or build(args.build_dir, tunable_values)
    forward = CudaVariant(lib)
    # v5_hopper_trace_next_call: the host picks each launch's row (a library from before that counted
    # CTAs on the device, and its buffer's first word means something else).
    for name in ("v5_hopper_trace_bytes", "v5_hopper_trace_copy", "v5_hopper_trace_reset", "v5_hopper_trace_next_call",
                 "v5_hopper_trace_launches"):
        if not hasattr(forward.lib, name):
            raise StageError(f"{lib} has no {name}: build it from this checkout with {TRACE_FLAG}")
    forward.lib.v5_hopper_trace_bytes.restype = ctypes.c_size_t
    forward.lib.v5_hopper_trace_launches.restype = ctypes.c_ulonglong
    if forward.lib.v5_hopper_trace_bytes() != timeline.buffer_bytes():
        raise StageError(f"{lib}'s trace buffer does not match scripts/evo_sdpa/timeline.py: rebuild it")

    B, H, S, D = args.shape
    shape_text = ",".join(str(x) for x in args.shape)
    dtype = torch_dtype(args.dtype)
    first = make_qkv(B, H, S, D, dtype, "cuda", 0)
    set_bytes = 4 * first[0].numel() * first[0].element_size()
    n_sets = input_sets_beyond_l2(set_bytes, args.graph_calls)
    sets = [first] + [make_qkv(B, H, S, D, dtype, "cuda", i) for i in range(1, n_sets)]
    outs = [torch.empty_like(qkv[0]) for qkv in sets]
    scale = 1 / math.sqrt(D)

    def call_of(fn):
        def call(i: int) -> None:
            q, k, v = sets[i][:3]
            fn(q, k, v, outs[i], args.causal, scale)
        return call

    calls = {"traced": call_of(forward)}
    if args.untraced:
        calls["untraced"] = call_of(CudaVariant(args.untraced))
    # The graph's per-call time, sampled as ab_sweep.py samples it (interleaved with the untraced build's).
    timing = sweep_timing(load_repo_config()["timing"])
    timed = time_graph(calls, n_sets, args.graph_calls, StopRule.from_config(timing), timing["warmup_ms"], set_bytes)
    per_call_us = {name: result["stats"]["p50_us"] for name, result in timed.items()}
    # The summary pairs consecutive launches as consecutive calls: a call of two launches (a long
    # call's tail split, tail_split.cuh) would pair its own two kernels.
    if forward.lib.v5_hopper_trace_reset() != 0:
        raise StageError(f"{lib}: v5_hopper_trace_reset failed (a CUDA error on the card); check it with nvidia-smi and rerun")
    calls["traced"](0)
    torch.cuda.synchronize()
    launches = forward.lib.v5_hopper_trace_launches()
    if launches != 1:
        raise StageError(f"a call of {shape_text} makes {launches} launches (a tail split?); the timeline "
                 "reads one launch a call, so trace a shape that launches once")
    # A launch's row is fixed when it is captured: reset first, so the last graph_calls rows
    # launched since (after capture_graph's warm-up calls) are this graph's calls in order.
    if forward.lib.v5_hopper_trace_reset() != 0:
        raise StageError(f"{lib}: v5_hopper_trace_reset failed (a CUDA error on the card); check it with nvidia-smi and rerun")
    graph = capture_graph(calls["traced"], n_sets, args.graph_calls)
    graph.replay()
    graph.replay()
    torch.cuda.synchronize()
    raw = ctypes.create_string_buffer(timeline.buffer_bytes())
    if forward.lib.v5_hopper_trace_copy(raw) != 0:
        raise StageError(f"{lib}: v5_hopper_trace_copy failed (a CUDA error on the card); check it with nvidia-smi and rerun")
    trace = timeline.parse(raw.raw)
    summary = timeline.summarize(trace, args.graph_calls - 1)
    summary["graph_per_call_us"] = per_call_us["traced"]
    summary["untraced_graph_per_call_us"] = per_call_us.get("untraced")
    print(f"{shape_text} {args.dtype}{' causal' if args.causal else ''}: graph x{args.graph_calls}, "
          f"{n_sets} input sets, " + ", ".join(f"{name} {us:.2f} us per call" for name, us in per_call_us.items()))
    print(timeline.render(summary))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    if args.raw:
        timeline.save_calls(args.raw, trace, args.graph_calls)


if __name__ == "__main__":
    run_stage(main)
