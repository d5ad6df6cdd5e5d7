# Input functions, wildcard constraints and the helpers that turn config into file lists.
import json
import os
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError

sys.path.insert(0, str(Path(workflow.basedir) / "scripts"))

from evo_sdpa.config import check_config
from evo_sdpa.deps import library_inputs, variant_inputs
from evo_sdpa.device import device_id, query_gpu_cached
from evo_sdpa.errors import StageError
from evo_sdpa.hostshare import QUIET_HOST, build_shares, timing_shares
from evo_sdpa.io import rebuild_hint
from evo_sdpa.pycache import use_bytecode_cache
from evo_sdpa.variants import RESERVED, SDPA_ENTRY, discover, select

# Every rule's shell command goes through logged(). A stage writes everything to its log; one
# that cannot reach a verdict ends the log with one line naming the problem and the fix
# (FAIL_TAIL repeats it on the console, so it is not buried behind Snakemake's error report). A
# stage that reaches a verdict with something to say (a skipped profile) also repeats its
# `evo-sdpa:` lines.
FAIL_TAIL = " || (tail -n 1 {log} >&2; exit 1)"
NOTICES_TO_CONSOLE = "; grep '^evo-sdpa: ' {log} >&2 || true"


def logged(command, notices=False, stdout=True):
    """A rule's shell command with its output sent to {log} (stderr only with stdout=False) and
    the failure tail; notices=True also repeats the log's `evo-sdpa:` lines after a success."""
    redirect = " > {log} 2>&1" if stdout else " 2> {log}"
    return "".join([command, redirect, FAIL_TAIL, NOTICES_TO_CONSOLE if notices else ""])


HISTORY = "results/history"  # every run's leaderboard by card; written by the summary, owned by no rule


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

# Jobs inherit this environment: on a host without bytecode, give them a cache of their own.
use_bytecode_cache(os.environ, config["python_bytecode_cache"])

# Remembered under .snakemake/ (nvidia-smi is slow on some hosts); the identity of the submitting
# host: every measuring job records the card it really ran on, and the summary checks those.
GPU = query_gpu_cached(Path(".snakemake") / "evo_sdpa" / "gpu_identity.json")
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
    return [str(p.relative_to(Path(workflow.basedir))) for p in variant_inputs(variant)]


def gpu_slots(wildcards=None):
    """A GPU job asks for one card where there is one to run on: this host's GPU, or a cluster's
    GPU node whatever the submitting host has (a login node often has none). Asked when the DAG
    is built, once the executor is known (not yet when the Snakefile is read). Which card the job
    gets is its own business: it locks a free one (evo_sdpa.cardlock) and sees only that one."""
    return 1 if GPU or not workflow.local_exec else 0


def gpu_request():
    """The resources of a GPU job: the `gpu` count (the SLURM executor turns it into --gpus) and,
    where config names a GPU model, the constraint that picks its nodes (ignored locally)."""
    request = {"gpu": gpu_slots}
    model = config.get("cluster", {}).get("gpu_model")
    if model:
        request["constraint"] = model
    return request


def gpu_job_limit():
    """How many GPU jobs may run at once (--resources gpu=N, else the 1 limit_gpu_jobs sets)."""
    limit = workflow.global_resources.get("gpu")
    limit = getattr(limit, "value", limit)  # Snakemake 9 wraps it in a Resource
    return max(1, int(limit)) if isinstance(limit, (int, float)) else 1


def timing_request():
    """A timing job's resources (the baseline, the bench, an evolution): its GPU and, when run on
    this host, its share of `quiet_host` (evo_sdpa.hostshare): no CUDA build runs beside it."""
    return {**gpu_request(), "quiet_host": lambda wildcards: timing_shares(gpu_job_limit()) if workflow.local_exec else 0}


def build_quiet_shares(wildcards):
    """An nvcc build's share of `quiet_host` on this host; a Triton build holds the GPU instead."""
    if known_variant(wildcards.variant).kind != "cuda" or not workflow.local_exec:
        return 0
    return build_shares(gpu_job_limit())


def host_threads():
    """The threads of a job that may use a whole host: --cores here; on a cluster executor, which
    has no --cores, what the profile's set-threads gives it (else one node's worth, 16)."""
    try:
        return workflow.cores
    except WorkflowError:
        return 16


def build_threads(wildcards):
    """One per translation unit a CUDA build compiles at once, within --cores less one when run
    here: the card's jobs need a core too, and at --cores 2 v5's build took both and left the card
    idle for 70 s (NOTES.md, run 96)."""
    variant = known_variant(wildcards.variant)
    units = max(1, len(variant.translation_units)) if variant.kind == "cuda" else 1
    return max(1, min(units, host_threads() - 1)) if workflow.local_exec else units


def build_gpu_slots(wildcards):
    """Triton compiles by running, so its build holds the GPU; nvcc does not need one."""
    return gpu_slots() if known_variant(wildcards.variant).kind == "triton" else 0


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


def get_evolve_inputs(wildcards):
    """The variant's chain up to its bottleneck analysis (the insight that guides the first
    mutations), the environment (the measured ceilings) and its sources."""
    known_variant(wildcards.variant)
    return {
        "env": rules.env_capture.output.json,
        "analysis": rules.analysis.output.json.format(variant=wildcards.variant),
        "sources": get_variant_sources(wildcards),
    }


def profile_entries():
    return SELECTED + [SDPA_ENTRY]


def results_layout():
    """Where the result files the summary reads live, as the rules declare them ({variant} left
    open): the summarize script takes this instead of rebuilding the layout."""
    return json.dumps({
        "env": rules.env_capture.output.json,
        "baseline": rules.sdpa_baseline.output.json,
        "patterns": {
            "build": rules.build_variant.output.verdict,
            "resources": rules.build_variant.output.resources,
            "sanitizer": rules.sanitizer.output.verdict,
            "parity": rules.parity.output.json,
            "bench": rules.bench.output.json,
            "ncu": rules.ncu.output.status,
            "analysis": rules.analysis.output.json,
            "evolve_curve": rules.evolve.output.curve,
            "evolve_best": rules.evolve.output.best,
        },
    }, sort_keys=True)


def summary_inputs():
    inputs = {
        "env": rules.env_capture.output.json,
        "baseline": rules.sdpa_baseline.output.json,
        "builds": expand(rules.build_variant.output.verdict, variant=SELECTED),
        "build_resources": expand(rules.build_variant.output.resources, variant=SELECTED),
        "sanitizers": expand(rules.sanitizer.output.verdict, variant=SELECTED),
        "parities": expand(rules.parity.output.json, variant=SELECTED),
        "benches": expand(rules.bench.output.json, variant=SELECTED),
        "profiles": expand(rules.ncu.output.status, variant=profile_entries()),
        "analyses": expand(rules.analysis.output.json, variant=profile_entries()),
    }
    # What the summary does not read, each with the inputs made from it or beside it: deleted
    # while those stand, it is as lost as they would be.
    made_from = {rules.sdpa_parity.output.json: inputs["parities"],
                 rules.sdpa_baseline.output.csv: [inputs["baseline"]]}
    for variant in SELECTED:
        made_from[rules.build_variant.output.compiler_log.format(variant=variant)] = [
            rules.build_variant.output.verdict.format(variant=variant)]
    for entry in profile_entries():
        made_from[rules.ncu.output.csv.format(variant=entry)] = [rules.ncu.output.status.format(variant=entry)]
    warn_missing_intermediates(inputs, made_from, rules.final_summary.output.md)
    return inputs


def failed_rules():
    """The rules of the jobs that failed on their last attempt, as the scheduler records them (a
    retried job that then passed is not among them); none where no job was scheduled."""
    failed = getattr(getattr(workflow, "scheduler", None), "failed", None) or []
    return {j.rule.name for job in failed for j in getattr(job, "jobs", [job])}


def date_restored_summary(rule_name, outputs):
    """Snakemake restores a failed summary job's update() outputs, but with the time of the restore
    and with the failed job's record of its inputs' checksums: the next run takes the restored
    summary as made from results it does not hold (a bench rerun beside the failure) and leaves
    it stale. Date the outputs to the epoch's first second and drop that record (what `snakemake
    --cleanup-metadata` does), so the next run makes them again. Only when the summary job is the
    one that failed: a later job's failure leaves a good summary as it is."""
    if rule_name not in failed_rules():
        return
    for path in outputs:
        if Path(path).exists():
            os.utime(path, (1, 1))   # not 0: Snakemake takes a zero time as none
            workflow.persistence.cleanup_metadata(path)


_warned_missing = False


def warn_missing_intermediates(inputs, made_from, product):
    """Snakemake 9 does not rebuild a deleted intermediate while what was made from it is up to
    date (it treats it like a temp file); say so once, with the command that does. Only files the
    existing product was made from (its recorded inputs, and the files those were made from): a
    variant new to the config has no files yet, and Snakemake makes them."""
    global _warned_missing
    if _warned_missing or not Path(product).exists():
        return
    read = set(workflow.persistence.input(product) or [])
    files = [f for value in inputs.values() for f in ([value] if isinstance(value, str) else value)]
    missing = [f for f in files if f in read and not Path(f).exists()]
    missing += [f for f, made in made_from.items()
                if not Path(f).exists() and any(m in read and Path(m).exists() for m in made)]
    if missing:
        _warned_missing = True
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        print(f"evo-sdpa: {missing[0]}{more} is missing but {product} exists, so Snakemake "
              f"will not rebuild it on its own; rebuild it: "
              f"{rebuild_hint(' '.join(missing))}", file=sys.stderr)


def limit_gpu_jobs():
    """One job holds the GPU at a time unless --resources gpu=N (or a profile) says otherwise,
    so `snakemake --cores 8` never overlaps two timing jobs on one card; and no CUDA build runs
    beside a timing job (timing_request, build_quiet_shares)."""
    if "gpu" not in workflow.global_resources:
        workflow.register_resource("gpu", 1)
    if "quiet_host" not in workflow.global_resources:
        workflow.register_resource("quiet_host", QUIET_HOST)


limit_gpu_jobs()
