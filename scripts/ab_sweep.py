"""A/B sweep of one variant's configurations, in one process on one GPU.

Not a pipeline stage: the pipeline gates and measures a variant as its variant.yaml builds it.
This builds (or loads) several configurations of one variant: tunable overrides (`--set`, checked
against each knob's declared values; the rest keep their variant.yaml defaults) built by the build
stage's own code (a Triton variant's are its launch configuration, bound to its forward as the
runner binds them: Triton compiles each at its first launch), raw nvcc flags as an escape hatch
for CUDA variants (`--flags`; a -D of a tunable's macro becomes that tunable's override), or
prebuilt libraries; `--compare` adds other CUDA variants as their
variant.yaml builds them (the rung below, say). It runs each through a parity tier of the config
(the parity stage's own cases for the build's variant and its tolerance rule; every failure is
listed), then times every configuration that passed and SDPA's default backend interleaved in one
process with the bench stage's timing code. Every ratio comes from one run on one card.

    python3 scripts/ab_sweep.py --variant v5_hopper --out $OUT/sweep.json --suite large --tier quick \\
        --config default --config stages3 --set stages=3 --set tma_epilogue=0 --set q_buffers=1
    python3 scripts/ab_sweep.py --variant v4_pipelined --compare v3_mma --out $OUT/sweep.json --dtypes fp16 \\
        --only causal --config default --config stages2 --set stages=2

`--replica NAME` times a second copy of NAME's library (a copied file, loaded as a module of its
own) beside it under NAME.copy, and every timed row prints the copy's p50 less the original's: the
sweep's own resolution, measured where the comparison is. Two identical v5 libraries have differed
by up to 0.4 us per call on a 5 us graph-replayed shape (v5_hopper NOTES.md, run 48), more than
most of the differences a sweep is asked to decide.

Each --set and --flags applies to the --config named before it. Builds land in
/tmp/evo_sdpa_ab_sweep/<variant>/<config>/ (a --compare variant's in <variant>/default/), where
scripts/ab_profile.py --sweep-dir finds them for Nsight Compute.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from evo_sdpa.build import build_cuda, build_triton  # noqa: E402
from evo_sdpa.config import load_repo_config  # noqa: E402
from evo_sdpa.device import NO_DEVICE_REASON, cuda_available  # noqa: E402
from evo_sdpa.errors import StageError  # noqa: E402
from evo_sdpa.parity import build_matrix, run_case  # noqa: E402
from evo_sdpa.runners import load_forward, sdpa_call  # noqa: E402
from evo_sdpa.timing import MAX_GRAPH_CALLS  # noqa: E402
from evo_sdpa.tolerance import ToleranceRule  # noqa: E402
from evo_sdpa.tunables import changed, parse_assignments, resolve, split_define_flags  # noqa: E402
from evo_sdpa.variants import KERNELS_DIR, Variant, load_variant, with_flags  # noqa: E402

BUILD_DIR = Path("/tmp/evo_sdpa_ab_sweep")


def timing_factories(forwards: dict, shape) -> dict:
    """time_shape's factories: SDPA's default as users call it, and each forward into its own output."""
    import torch

    scale = 1.0 / math.sqrt(shape.D)
    factories = {"sdpa": lambda q, k, v: (lambda: sdpa_call(q, k, v, shape.causal, scale))}
    for name, forward in forwards.items():
        def make(q, k, v, forward=forward):
            out = torch.empty_like(q)
            return lambda: forward(q, k, v, out, shape.causal, scale)
        factories[name] = make
    return factories


class ConfigAction(argparse.Action):
    """--config NAME starts a configuration; --set and --flags add to the last one started."""

    def __call__(self, parser, namespace, value, option_string=None):
        configs = getattr(namespace, "configs", None) or []
        if option_string == "--config":
            configs.append({"name": value, "set": [], "flags": []})
        elif not configs:
            parser.error(f"{option_string} {value!r} comes before any --config NAME")
        elif option_string == "--set":
            configs[-1]["set"].append(value)
        else:
            configs[-1]["flags"].extend(value.split())
        namespace.configs = configs


def overrides_of(variant: Variant, spec: dict) -> tuple[dict[str, int], list[str]]:
    """A configuration's tunable overrides (--set, then any -D of a tunable's macro in --flags)
    and the raw flags left; an unknown knob or undeclared value stops here, before any build."""
    from_flags, flags = split_define_flags(variant, spec["flags"])
    overrides = {**from_flags, **parse_assignments(spec["set"])}
    resolve(variant, overrides)
    return overrides, flags


def build_config(variant: Variant, name: str, overrides: dict[str, int], flags: list[str], cc: str,
                 build_cfg: dict, allow_spills: bool = False) -> dict:
    if variant.kind == "triton":
        if flags:
            raise StageError(f"--flags {' '.join(flags)!r} for {variant.name}: a Triton variant has no nvcc "
                             f"flags; its launch configuration is its tunables (--set)")
        # Compiled on the GPU before parity, one configuration at a time (triton_build).
        values = resolve(variant, overrides)
        return {"name": name, "variant": variant.name, "set": changed(variant, values), "flags": [],
                "verdict": {"status": "pass", "reasons": [], "tunables": values}, "registers": [], "spill_bytes": 0}
    outdir = BUILD_DIR / variant.name / name
    outdir.mkdir(parents=True, exist_ok=True)
    verdict, resources, log = build_cuda(with_flags(variant, flags, allow_spills), cc, outdir,
                                         build_cfg.get("cutlass_include"), tunable_values=overrides)
    (outdir / "compiler.log").write_text(log)
    regs = sorted({r["registers"] for r in resources})
    spills = sum(r["spill_store_bytes"] + r["spill_load_bytes"] for r in resources)
    return {"name": name, "variant": variant.name, "set": changed(variant, verdict.get("tunables", {})), "flags": flags,
            "verdict": verdict, "registers": regs, "spill_bytes": spills}


def triton_build(build: dict, variant: Variant, allow_spills: bool) -> None:
    """The build stage's Triton build of one configuration, on this GPU: every supported
    specialisation compiled by one launch, its registers and spills read back (spills fail it,
    as the build gate would, unless allow_spills). One at a time: each launches kernels."""
    verdict, resources, _ = build_triton(variant, allow_spills, build["verdict"]["tunables"])
    build["verdict"] = verdict
    build["registers"] = sorted({r["registers"] for r in resources if r.get("registers") is not None})
    build["spill_bytes"] = sum(r.get("spill_bytes") or 0 for r in resources)


def parity(forward, variant: Variant, tier: dict, rule: ToleranceRule) -> dict:
    records = [run_case(case, forward, rule, "cuda") for case in build_matrix(variant, tier)]
    failed = [r for r in records if r["status"] != "pass"]
    return {"cases": len(records), "failed": failed}


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--config", action=ConfigAction, help="start a configuration named NAME (the defaults "
                        "of variant.yaml unless --set / --flags follow)")
    parser.add_argument("--set", action=ConfigAction, metavar="TUNABLE=VALUE",
                        help="override one tunable of the last --config (one of its declared values)")
    parser.add_argument("--flags", action=ConfigAction, metavar="'NVCC FLAGS'",
                        help="escape hatch: extra nvcc flags for the last --config (space-separated)")
    parser.add_argument("--artifact", action="append", default=[], help="name=path of a prebuilt library")
    parser.add_argument("--compare", action="append", default=[], metavar="VARIANT",
                        help="also build another CUDA variant as its variant.yaml builds it, named by the "
                             "variant, checked on its own parity cases and timed on the shapes it supports")
    parser.add_argument("--tier", default="quick", help="parity tier of config.yaml ('none' skips parity)")
    parser.add_argument("--suite", default="large", help="shape suite of config.yaml to time")
    parser.add_argument("--dtypes", default="fp16,bf16")
    parser.add_argument("--only", default="", metavar="TEXT", help="time only the suite's shapes whose label "
                        "contains TEXT (labels read B4_H16_S2048_D128_causal)")
    parser.add_argument("--allow-spills", action="store_true",
                        help="time configurations that spill (exploration only: the build gate forbids them)")
    parser.add_argument("--recheck-max-gflop", type=float, default=200.0,
                        help="after timing a shape, check every configuration's output on it against "
                             "the float64 reference (the bench stage's re-check), up to this size")
    parser.add_argument("--graph-calls", type=int, default=None, metavar="N",
                        help="at least N calls per replayed graph instead of the config's timing.graph_calls "
                             "(a graph grows past it to read every set its shape rotates: enough to outgrow "
                             "twice the L2, unless --graph-sets says how many)")
    parser.add_argument("--graph-sets", type=int, default=None, metavar="N",
                        help="graph-timed shapes rotate N input sets instead of enough to exceed L2 "
                             "(1 keeps the inputs in L2: how much of a call is DRAM latency)")
    parser.add_argument("--replica", action="append", default=[], metavar="NAME",
                        help="also time a copy of NAME's library (loaded on its own, as NAME.copy): each row "
                             "then gives copy - original, the sweep's resolution (repeatable)")
    parser.add_argument("--budget-s", type=float, default=240.0, help="stop timing new shapes once timing has taken this long (builds and parity not counted)")
    return parser


def compared_variants(variant: Variant, names: list[str]) -> list[Variant]:
    """The --compare variants: CUDA variants other than the one swept."""
    others = []
    for name in names:
        if name == variant.name:
            raise StageError(f"--compare {name} is the swept variant: add --config default instead")
        other = load_variant(KERNELS_DIR / name)
        if other.kind != "cuda":
            raise StageError(f"--compare {name}: a {other.kind} variant; only CUDA variants are built here")
        others.append(other)
    return others


def replica_name(name: str) -> str:
    return f"{name}.copy"


def check_replicas(replicas: list[str], names: list[str], kind: str, config_names: list[str]) -> None:
    """Each --replica names a CUDA library of this sweep: a configuration of a CUDA variant, a
    compared variant or an artifact (a Triton configuration is a Python module: it has no file to
    load twice). A name given twice is check_names' to refuse (its copy's name comes twice)."""
    for name in replicas:
        if name not in names:
            raise StageError(f"--replica {name}: no configuration, compared variant or artifact of that name "
                             f"(names: {', '.join(names) or 'none'})")
        if kind != "cuda" and name in config_names:
            raise StageError(f"--replica {name}: a {kind} configuration; only a CUDA library can be loaded twice")


def copy_library(path: str, name: str) -> str:
    """A copy of the library at `path` in a folder of its own under BUILD_DIR/replicas: a second
    dlopen of the same path would return the module already loaded."""
    folder = BUILD_DIR / "replicas"
    folder.mkdir(parents=True, exist_ok=True)
    copy = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=folder)) / Path(path).name
    shutil.copy2(path, copy)
    return str(copy)


def replica_deltas(p50_us: dict[str, float], replicas: list[str]) -> dict[str, float]:
    """For each replicated name timed in this row: the copy's p50 less the original's, in us."""
    return {name: p50_us[replica_name(name)] - p50_us[name] for name in replicas
            if name in p50_us and replica_name(name) in p50_us}


def resolution(timings: list[dict]) -> dict[str, dict]:
    """Per timing mode, the largest |copy - original| over the sweep's rows, with its row."""
    worst: dict[str, dict] = {}
    for row in timings:
        for name, delta in row.get("replica_delta_us", {}).items():
            relative = abs(delta) / row["p50_us"][name]
            if relative > worst.get(row["mode"], {}).get("relative", -1.0):
                worst[row["mode"]] = {"name": name, "shape": row["shape"], "dtype": row["dtype"],
                                      "delta_us": delta, "relative": relative}
    return worst


def parse_artifacts(specs: list[str]) -> list[tuple[str, str]]:
    """Each --artifact as (name, path), checked before anything is built: NAME=PATH of a file."""
    artifacts = []
    for spec in specs:
        name, equals, path = spec.partition("=")
        if not equals or not name or not path:
            raise StageError(f"--artifact {spec!r}: give NAME=PATH (a name for the sweep's rows, then the built library)")
        if not Path(path).is_file():
            raise StageError(f"--artifact {spec!r}: {path} is not a file; build the library first")
        artifacts.append((name, path))
    return artifacts


def check_names(names: list[str]) -> None:
    """Each configuration, compared variant and artifact needs a name of its own (results are keyed by it)."""
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise StageError(f"two configurations named {twice[0]!r} (--config, --compare and --artifact names "
                         f"must differ)")


def main() -> int:
    parser = argument_parser()
    args = parser.parse_args()
    if args.graph_sets is not None and args.graph_sets < 1:
        parser.error(f"--graph-sets {args.graph_sets}: give at least 1 input set")
    if args.graph_calls is not None and not 1 <= args.graph_calls <= MAX_GRAPH_CALLS:
        parser.error(f"--graph-calls {args.graph_calls}: give 1 to {MAX_GRAPH_CALLS} calls (the config schema's bounds)")
    variant = load_variant(KERNELS_DIR / args.variant)
    others = compared_variants(variant, args.compare)
    if args.artifact and variant.kind != "cuda":
        raise StageError(f"--artifact: {variant.name} is a {variant.kind} variant; prebuilt libraries are CUDA's")
    # (variant, name, overrides, flags); a compared variant builds its defaults under <its name>/default
    jobs = [(variant, spec["name"], *overrides_of(variant, spec)) for spec in getattr(args, "configs", None) or []]
    artifacts = parse_artifacts(args.artifact)
    names = [job[1] for job in jobs] + [other.name for other in others] + [name for name, _ in artifacts]
    check_names(names + [replica_name(name) for name in args.replica])
    check_replicas(args.replica, names, variant.kind, [job[1] for job in jobs])
    jobs += [(other, "default", {}, []) for other in others]
    if not cuda_available():
        raise StageError(f"ab_sweep times configurations on a card: {NO_DEVICE_REASON}; run it on a GPU host")

    import torch

    from evo_sdpa.bench import recheck
    from evo_sdpa.cuda_abi import CudaVariant
    from evo_sdpa.inputs import make_qkv
    from evo_sdpa.shapes import Shape, torch_dtype
    from evo_sdpa.stats import tflops
    from evo_sdpa.timing import sweep_timing, time_shape

    started = time.perf_counter()
    config = load_repo_config()
    rule = ToleranceRule.from_config(config["tolerance"])
    major, minor = torch.cuda.get_device_capability()
    cc = f"{major}.{minor}"
    with ThreadPoolExecutor(max_workers=4) as pool:
        builds = list(pool.map(lambda job: build_config(job[0], job[1], job[2], job[3], cc, config["build"],
                                                         args.allow_spills), jobs))
    for b, other in zip(builds[len(builds) - len(others):], others):
        b["name"] = other.name
    for name, path in artifacts:
        builds.append({"name": name, "variant": variant.name, "set": {}, "flags": [],
                       "verdict": {"status": "pass", "reasons": [], "artifact": path},
                       "registers": [], "spill_bytes": 0})
    by_variant = {v.name: v for v in [variant, *others]}
    owners = {b["name"]: by_variant[b["variant"]] for b in builds}
    report = {"device": torch.cuda.get_device_name(), "variant": variant.name, "builds": builds,
              "parity": {}, "timings": []}

    for b in builds:
        if owners[b["name"]].kind == "triton":
            triton_build(b, owners[b["name"]], args.allow_spills)
    forwards = {}
    for b in builds:
        verdict = b["verdict"]
        print(f"{b['name']:>14}: build {verdict['status']} {'; '.join(verdict['reasons'])[:300]} "
              f"regs {b['registers']} spills {b['spill_bytes']} B sass {verdict.get('sass', {})} {verdict.get('compile_seconds', '')}s")
        if verdict["status"] != "pass":
            continue
        owner = owners[b["name"]]
        forward = (load_forward(owner, None, verdict["tunables"]) if owner.kind == "triton"
                   else CudaVariant(verdict["artifact"]))
        if args.tier != "none":
            result = parity(forward, owner, config["parity"]["tiers"][args.tier], rule)
            report["parity"][b["name"]] = result
            print(f"{b['name']:>14}: parity {result['cases'] - len(result['failed'])}/{result['cases']} pass")
            for r in result["failed"][:12]:
                print(f"      FAIL {r['id']}: {r.get('reason') or r.get('error') or r.get('max_abs_err')}")
            if result["failed"]:
                continue
        forwards[b["name"]] = forward
    for name in args.replica:
        if name not in forwards:
            print(f"{replica_name(name):>14}: not timed ({name} did not pass its build or parity)")
            continue
        build = next(b for b in builds if b["name"] == name)
        copy = copy_library(build["verdict"]["artifact"], name)
        forwards[replica_name(name)] = CudaVariant(copy)
        owners[replica_name(name)] = owners[name]
        print(f"{replica_name(name):>14}: a copy of {name}'s library, {copy}")

    timing = sweep_timing(config["timing"])
    if args.graph_calls is not None:
        timing["graph_calls"] = args.graph_calls
    timing_started = time.perf_counter()   # the budget is the timing's: a full parity tier must not spend it
    for dtype in args.dtypes.split(","):
        for shape_dict in config["shape_suites"][args.suite]:
            if time.perf_counter() - timing_started > args.budget_s:
                print("budget spent: stopping")
                break
            shape = Shape.from_dict(shape_dict)
            if args.only and args.only not in shape.label:
                continue
            timed = {n: f for n, f in forwards.items() if owners[n].supports(dtype, shape.D, shape.causal)}
            if not variant.supports(dtype, shape.D, shape.causal) or not timed:
                continue
            for mode, by_name in time_shape(timing_factories(timed, shape), shape, dtype, timing,
                                              graph_sets=args.graph_sets).items():
                row = {"shape": shape.label, "dtype": dtype, "mode": by_name["sdpa"]["mode"],
                       "cache": by_name["sdpa"]["cache"],
                       "p50_us": {n: r["stats"]["p50_us"] for n, r in by_name.items()},
                       "p90_us": {n: r["stats"]["p90_us"] for n, r in by_name.items()},
                       "tflops": {n: tflops(shape.flops, r["stats"]["p50_us"]) for n, r in by_name.items()}}
                report["timings"].append(row)
                sdpa_us = row["p50_us"]["sdpa"]
                cells = "  ".join(f"{n} {us:8.2f} ({sdpa_us / us:4.2f}x, p90 {row['p90_us']['sdpa'] / row['p90_us'][n]:4.2f}x)"
                                  for n, us in row["p50_us"].items() if n != "sdpa")
                print(f"{shape.label:>26} {dtype} {row['mode']:>9}: sdpa {sdpa_us:8.2f} us "
                      f"{row['tflops']['sdpa']:5.0f} TF/s | {cells}")
                deltas = replica_deltas(row["p50_us"], args.replica)
                if deltas:
                    row["replica_delta_us"] = deltas
                    print(f"{'':>26} copy - original: " + "  ".join(
                        f"{n} {d:+.2f} us ({d / row['p50_us'][n]:+.1%})" for n, d in deltas.items()))
            if shape.flops <= args.recheck_max_gflop * 1e9:
                # recheck() refills q, k, v with fresh values and re-poisons out for each forward
                q, k, v = make_qkv(shape.B, shape.H, shape.S, shape.D, torch_dtype(dtype), "cuda", 0)
                buffers = (q, k, v, torch.empty_like(q))
                for name, forward in timed.items():
                    check = recheck(forward, buffers, shape, dtype, rule)
                    report["timings"][-1].setdefault("recheck", {})[name] = check
                    print(f"{'':>26} recheck {name}: {check['status']} max_abs {check['max_abs']:.3g} "
                          f"(bound {check['bound']:.3g})")
    if args.replica:
        report["resolution"] = resolution(report["timings"])
        for mode, worst in report["resolution"].items():
            print(f"resolution ({mode}): copies of one library differed by up to {abs(worst['delta_us']):.2f} us "
                  f"({worst['relative']:.1%}, {worst['name']} on {worst['shape']} {worst['dtype']}); "
                  f"a difference between builds below that is not shown by this sweep")
    Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    print(f"sweep done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    from evo_sdpa.errors import run_stage

    run_stage(main)
