# Input functions, wildcard constraints and the helpers that turn config into file lists.
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "scripts"))

from evo_sdpa.config import check_config
from evo_sdpa.deps import library_inputs
from evo_sdpa.device import device_id, query_gpu
from evo_sdpa.errors import StageError
from evo_sdpa.variants import RESERVED, discover, select, variant_files

ABI_HEADER = "kernels/common/evo_sdpa_abi.h"
# Every shell command ends in `|| (tail -n 1 {log} >&2; exit 1)`: a stage that cannot reach a
# verdict ends its log with one line naming the problem and the fix, and that line is repeated
# on the console so it is not buried behind Snakemake's error report.
SDPA_ENTRY = "sdpa"  # the reference entry beside the variants in the profile and analysis stages


def stop(message):
    """One line naming the problem and the fix, then stop before any job runs."""
    print(f"evo-sdpa: {message}", file=sys.stderr)
    sys.exit(1)


try:
    check_config(config, "config")
    VARIANTS = discover()
    SELECTED = select(VARIANTS, config["variants"])
except StageError as exc:
    stop(str(exc))

GPU = query_gpu()
DEVICE_ID = device_id(GPU)
BUILD_CC = GPU.compute_capability if GPU else config["build"]["default_compute_capability"]


def known_variant(variant):
    if variant not in VARIANTS:
        stop(f"unknown variant {variant!r}: known variants are "
             f"{', '.join(sorted(VARIANTS)) or 'none'} (folders under kernels/ with a variant.yaml)")
    return VARIANTS[variant]


def stage_inputs(script, *extra):
    """A stage script, the library files it imports and any extra scripts it starts."""
    files = {"script": script, "lib": library_inputs(script)}
    for i, path in enumerate(extra):
        files[f"extra{i}"] = path
        files["lib"] = sorted(set(files["lib"]) | set(library_inputs(path)))
    return files


def config_json(*keys):
    """The config slices a job reads, as one JSON param (changing them reruns its jobs)."""
    return json.dumps({key: config[key] for key in keys}, sort_keys=True)


def get_variant_sources(wildcards):
    variant = known_variant(wildcards.variant)
    files = [str(p.relative_to(Path(workflow.basedir))) for p in variant_files(variant)]
    return files + ([ABI_HEADER] if variant.kind == "cuda" else [])


def build_gpu_slots(wildcards):
    """Triton compiles by running, so its build holds the GPU; nvcc does not need one."""
    return 1 if GPU and known_variant(wildcards.variant).kind == "triton" else 0


def get_profile_inputs(wildcards):
    """SDPA's profile needs only the environment; a variant's needs its whole gated chain."""
    if wildcards.variant == SDPA_ENTRY:
        return {"env": rules.env_capture.output.json}
    known_variant(wildcards.variant)
    return {
        "env": rules.env_capture.output.json,
        "build": rules.build_variant.output.verdict.format(variant=wildcards.variant),
        "bench": rules.bench.output.json.format(variant=wildcards.variant),
        "sources": get_variant_sources(wildcards),
    }


def profile_entries():
    return SELECTED + [SDPA_ENTRY]


def summary_inputs():
    return {
        "env": rules.env_capture.output.json,
        "baseline": rules.sdpa_baseline.output.json,
        "builds": expand(rules.build_variant.output.verdict, variant=SELECTED),
        "sanitizers": expand(rules.sanitizer.output.verdict, variant=SELECTED),
        "parities": expand(rules.parity.output.json, variant=SELECTED),
        "benches": expand(rules.bench.output.json, variant=SELECTED),
        "profiles": expand(rules.ncu.output.status, variant=profile_entries()),
        "analyses": expand(rules.analysis.output.json, variant=profile_entries()),
    }


def limit_gpu_jobs():
    """One job holds the GPU at a time unless --resources gpu=N (or a profile) says otherwise,
    so `snakemake --cores 8` never overlaps two timing jobs on one card."""
    if "gpu" not in workflow.global_resources:
        workflow.register_resource("gpu", 1)


limit_gpu_jobs()
