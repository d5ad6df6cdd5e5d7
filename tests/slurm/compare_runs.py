"""The check of tests/slurm/run_slurm_test.sh: a run through SLURM made the same result files as
a local run of the same tree, with the same verdicts (status and reasons of every stage record,
each variant's criteria in the leaderboard), and its GPU jobs ran with the card SLURM gave them
(CUDA_VISIBLE_DEVICES set, as the jobs' logs say) while CPU jobs asked for none. Timings differ between runs and are not
compared. The run's snakemake.log must show every job but the local rules' submitted to SLURM. Exit 1 with one line per difference."""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

GPU_STAGE_LOGS = ["env_capture.log", "sdpa_baseline.log", "sanitizer/*.log", "parity/*.log", "bench/*.log",
                  "ncu/*.log"]
CPU_RULES = {"analysis", "final_summary", "gates"}
# The workflow's localrules (summary.smk): they run on the submitting host, never through SLURM.
LOCAL_RULE_LOGS = {"results/logs/final_summary.log", "results/logs/gates.log"}
SUBMITTED = re.compile(r"has been submitted with SLURM jobid (\d+)")
STAGE_LOGS = re.compile(r"^results/logs/.*\.log$", re.M)  # one per job
VISIBLE = re.compile(r"CUDA_VISIBLE_DEVICES=(\S+?)\)?$", re.M)


STAMP = re.compile(r"\d{8}T\d+")  # the history names each run's files by its time


def result_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in (root / "results").rglob("*") if p.is_file()}


def by_kind(names: set[str]) -> dict[str, str]:
    """Each file under its name with run times masked: two runs' histories hold the same kinds."""
    return {STAMP.sub("<time>", name): name for name in names}


def verdicts(path: Path):
    """What of a JSON result must match between runs (None for files that hold only numbers)."""
    try:
        record = json.loads(path.read_text())
    except ValueError:
        return None
    if isinstance(record, dict) and "status" in record:
        return {"status": record["status"], "reasons": record.get("reasons")}
    if isinstance(record, dict) and isinstance(record.get("variants"), list):  # the leaderboard
        return sorted((v.get("name"), json.dumps(v.get("criteria"), sort_keys=True)) for v in record["variants"])
    return None


def gpu_requests(log_text: str) -> list[tuple[str, str, int]]:
    """(rule, variant, gpu count) of every job the run's snakemake.log lists."""
    jobs = []
    for block in re.split(r"^(?=rule \w+:)", log_text, flags=re.M)[1:]:
        rule = re.match(r"rule (\w+):", block).group(1)
        variant = re.search(r"^\s+wildcards: variant=(\w+)", block, re.M)
        gpu = re.search(r"^\s+resources: .*\bgpu=(\d+)", block, re.M)
        jobs.append((rule, variant.group(1) if variant else "", int(gpu.group(1)) if gpu else 0))
    return jobs


def wrong_gpu_requests(slurm: Path, log_text: str) -> list[str]:
    """GPU stages (and a Triton build, which compiles by launching) ask for one GPU; nvcc builds,
    the analysis and the summary for none."""
    problems = []
    for rule, variant, gpu in gpu_requests(log_text):
        if rule == "build_variant":
            kind = re.search(r"^kind:\s*(\w+)", (slurm / "kernels" / variant / "variant.yaml").read_text(), re.M)
            wanted = 1 if kind and kind.group(1) == "triton" else 0
        else:
            wanted = 0 if rule in CPU_RULES else 1
        if gpu != wanted:
            problems.append(f"{rule} {variant}: asked SLURM for gpu={gpu}, should ask for {wanted}")
    return problems


def differences(local: Path, slurm: Path) -> list[str]:
    problems = []
    local_files, slurm_files = by_kind(result_files(local)), by_kind(result_files(slurm))
    for name in sorted(local_files.keys() - slurm_files.keys()):
        problems.append(f"{local_files[name]}: made locally, not through SLURM")
    for name in sorted(slurm_files.keys() - local_files.keys()):
        problems.append(f"{slurm_files[name]}: made through SLURM, not locally")
    for name in sorted(n for n in local_files.keys() & slurm_files.keys() if n.endswith(".json")):
        mine, theirs = verdicts(local / local_files[name]), verdicts(slurm / slurm_files[name])
        if mine != theirs:
            problems.append(f"{slurm_files[name]}: local {mine} but through SLURM {theirs}")
    for pattern in GPU_STAGE_LOGS:
        for log in sorted((slurm / "results" / "logs").glob(pattern)):
            seen = VISIBLE.findall(log.read_text())
            if not seen or seen[0] in ("", "unset"):
                problems.append(f"{log.relative_to(slurm)}: the GPU job ran without a card from SLURM "
                                f"(CUDA_VISIBLE_DEVICES={seen[0] if seen else 'not logged'})")
    log_text = (slurm / "snakemake.log").read_text()
    problems.extend(wrong_gpu_requests(slurm, log_text))
    submitted = SUBMITTED.findall(log_text)
    remote = [log for log in STAGE_LOGS.findall("\n".join(sorted(slurm_files))) if log not in LOCAL_RULE_LOGS]
    if len(submitted) < len(remote):
        problems.append(f"only {len(submitted)} jobs were submitted to SLURM (snakemake.log)")
    return problems


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--local", type=Path, required=True)
    p.add_argument("--slurm", type=Path, required=True)
    args = p.parse_args()
    problems = differences(args.local, args.slurm)
    for problem in problems:
        print(f"evo-sdpa: {problem}", file=sys.stderr)
    if problems:
        sys.exit(1)
    print(f"same {len(result_files(args.local))} result files and verdicts; every job but the summary's "
          f"and the gates' (local rules) went through SLURM, every GPU job with a card from it")


if __name__ == "__main__":
    main()
