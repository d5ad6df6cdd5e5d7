"""Evolution candidates through the pipeline's own stage code: the build stage's build_variant with
tunable overrides (in parallel on CPU cores), the parity stage's oracle and matrix, the bench
stage's run() against SDPA in one process, the sanitizer stage's tools; and the external
proposer's protocol (a JSON request in, a child variant folder out). Each candidate's files live
under <search>/candidates/<id>/."""
from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .build import build_variant
from .deps import variant_inputs
from .errors import StageError
from .evolve import Candidate, ChildMaker, Insight, Store, bench_speedups
from .io import read_json, write_json, write_text
from .parity import run_tier
from .parity import verdict as parity_verdict
from .provenance import sources_digest
from .tunables import defaults
from .variants import KERNELS_DIR, REPO, Variant, load_variant, variant_files

CANDIDATE_TARGET = Path(__file__).resolve().parents[1] / "evolve_candidate.py"
PROTOCOL_VERSION = 1
PROPOSER_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class StageConfig:
    """The config slices the evolution stage reads, as its stages read them."""
    cc: str
    cfg: dict

    @property
    def evolve(self) -> dict:
        return self.cfg["evolve"]

    def tier(self, key: str) -> dict:
        return self.cfg["parity"]["tiers"][self.evolve[key]]


def fingerprint(variant: Variant, device: str, stage: StageConfig) -> dict:
    """What a stored search was measured under; a stored search under any other is not resumed.
    Budgets and the generation count are left out, so raising them continues a search."""
    evolve = {k: v for k, v in stage.evolve.items() if k not in ("budgets", "generations")}
    return {"device": device, "compute_capability": stage.cc, "variant": sources_digest(variant_inputs(variant)),
            "evolve": evolve,
            "shapes": stage.cfg["shape_suites"][stage.evolve["suite"]], "timing": stage.cfg["timing"],
            "tolerance": stage.cfg["tolerance"], "gate_tier": stage.tier("gate_tier"),
            "final_tier": stage.tier("final_tier"),
            # the final check runs the sanitizer as the pipeline's stage is configured
            "sanitizer": stage.cfg.get("sanitizer"), "sanitizer_stage": stage.cfg.get("stages", {}).get("sanitizer")}


def root_insight(analysis_path: str) -> Insight:
    """The defaults' bottleneck findings: the analysis stage's bottlenecks.json of the variant."""
    analysis = read_json(analysis_path)
    if analysis.get("status") != "analysed":
        reason = "; ".join(analysis.get("reasons") or []) or str(analysis.get("status"))
        return Insight((), f"{analysis_path} ({reason})")
    return Insight(tuple(analysis.get("findings") or ()), f"{analysis_path} (the defaults' profile)")


# ---------------------------------------------------------------- one candidate's steps
# What runs in a candidate's own process (scripts/evolve_candidate.py) or, for a CUDA build, in
# the search's: each writes its evidence beside the candidate and returns one record.


def build_into(variant: Variant, tunables: dict[str, int], outdir: Path, stage: StageConfig,
               jobs: int | None = None) -> dict:
    """The build stage's verdict, resources and log for these tunable values, written to outdir
    (`jobs`: translation units compiled at once)."""
    try:
        verdict, resources, text = build_variant(variant, stage.cc, outdir,
                                                 stage.cfg["build"].get("cutlass_include"), tunables, jobs)
    except StageError as exc:  # an undeclared value, a header library missing
        verdict, resources, text = {"status": "fail", "reasons": [str(exc)], "artifact": None}, [], str(exc)
    verdict["compiler_log"] = str(outdir / "compiler.log")
    write_text(outdir / "compiler.log", text)
    write_json(outdir / "resources.json", {"variant": variant.name, "kernels": resources})
    if verdict.get("interrupted"):
        (outdir / "verdict.json").unlink(missing_ok=True)   # a resumed search builds it again
    else:
        write_json(outdir / "verdict.json", verdict)
    return verdict


def parity_step(variant: Variant, build: dict, stage: StageConfig, tier_key: str) -> dict:
    """The parity stage's oracle and matrix of one tier, judged by its tolerance rule."""
    from .runners import load_built
    from .tolerance import ToleranceRule

    tier = stage.evolve[tier_key]
    records = run_tier(variant, load_built(variant, build), stage.tier(tier_key),
                       ToleranceRule.from_config(stage.cfg["tolerance"]), "cuda")
    result = parity_verdict(records, repro=f"the {tier} tier of this candidate")
    result.update(tier=tier, records=records)
    return result


def measure_step(variant: Variant, build: dict, stage: StageConfig, ceilings: dict | None, log) -> dict:
    """The bench stage's run() on the evolve suite: the candidate and SDPA's default interleaved."""
    from .bench import run as bench_run
    from .config import suite_shapes
    from .runners import load_built
    from .tolerance import ToleranceRule

    return bench_run(variant, load_built(variant, build), suite_shapes(stage.cfg, stage.evolve["suite"]),
                     stage.evolve["dtypes"], stage.cfg["timing"], ToleranceRule.from_config(stage.cfg["tolerance"]),
                     ceilings, log)


# ---------------------------------------------------------------- the evaluator


# One step of one candidate (a Triton build, a parity tier, the timing) gets this long.
STEP_TIMEOUT_S = 3600.0


class PipelineEvaluator:
    """evolve.Evaluator over the stages' code. CUDA candidates build here, in parallel (`jobs` at
    once); everything that runs a candidate's kernel runs in a process of its own
    (scripts/evolve_candidate.py), so a kernel that faults ends that process, not the search.
    `env_path` is the env stage's record (its measured ceilings feed the bench's sanity flag)."""

    def __init__(self, base: Variant, store: Store, stage: StageConfig, env_path: str, jobs: int, log):
        self.base, self.store, self.stage, self.env_path, self.jobs, self.log = base, store, stage, env_path, jobs, log

    def variant_of(self, candidate: Candidate) -> Variant:
        return self.base if candidate.source_dir is None else load_variant(Path(candidate.source_dir))

    def build_dir(self, candidate: Candidate) -> Path:
        return self.store.candidate_dir(candidate.id) / "build"

    def build_one(self, candidate: Candidate, jobs: int | None = None) -> dict:
        """A finished build is read back; a Triton one compiles by launching, so in its own process."""
        verdict_path = self.build_dir(candidate) / "verdict.json"
        if verdict_path.is_file():
            verdict = read_json(verdict_path)
            if verdict.get("kind") != "cuda" or not verdict.get("artifact") or Path(verdict["artifact"]).exists():
                return verdict
        try:
            variant = self.variant_of(candidate)
        except StageError as exc:
            verdict = {"status": "fail", "reasons": [str(exc)], "artifact": None}
        else:
            if variant.kind == "cuda":
                verdict = build_into(variant, candidate.tunables, self.build_dir(candidate), self.stage, jobs)
            else:
                verdict = self.isolated(candidate, "build")
        self.log.info("build %s: %s %s", candidate.id, verdict["status"], "; ".join(verdict.get("reasons") or []))
        return verdict

    def build(self, candidates: list[Candidate]) -> dict[str, dict]:
        """Up to `jobs` candidates at once, sharing the job's threads between their compiles."""
        at_once = max(1, min(self.jobs, len(candidates)))
        each = max(1, self.jobs // at_once)
        with ThreadPoolExecutor(max_workers=at_once) as pool:
            return dict(zip([c.id for c in candidates], pool.map(lambda c: self.build_one(c, each), candidates)))

    def isolated(self, candidate: Candidate, step: str) -> dict:
        """Run one step in the candidate's own process; a process that dies is the step's failure."""
        folder = self.store.candidate_dir(candidate.id)
        out = folder / f"{step}.json"
        out.unlink(missing_ok=True)
        variant = self.variant_of(candidate)
        argv = [sys.executable, str(CANDIDATE_TARGET), "--step", step, "--variant", variant.name,
                "--variant-dir", str(variant.folder), "--tunables", json.dumps(candidate.tunables),
                "--build", str(self.build_dir(candidate) / "verdict.json"), "--env", self.env_path,
                "--compute-capability", self.stage.cc, "--config-json", json.dumps(self.stage.cfg),
                "--out", str(out)]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=STEP_TIMEOUT_S)
            output, code = proc.stdout + proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            output, code = f"{exc.stdout or ''}{exc.stderr or ''}", f"killed after {STEP_TIMEOUT_S:.0f} s"
        write_text(folder / f"{step}.log", f"$ {shlex.join(argv)}\n{output}")
        if out.is_file():
            return read_json(out)
        last = next((line for line in reversed(output.strip().splitlines()) if line.strip()), "no output")
        return {"status": "fail", "reasons": [f"the candidate's {step} process ended ({code}) without a record: {last}"],
                "artifact": None}

    def gate(self, candidate: Candidate, build: dict) -> dict:
        result = self.isolated(candidate, "gate")
        return {"status": result["status"], "reason": "; ".join(result.get("reasons") or [])}

    def measure(self, candidate: Candidate, build: dict) -> dict:
        result = self.isolated(candidate, "measure")
        if result.get("status") == "measured":
            return {"status": "measured", "speedups": bench_speedups(result)}
        gate = "recheck" if result.get("cases") else "timing"  # run() measured, then its re-check failed
        return {"status": "fail", "gate": gate, "reason": "; ".join(result.get("reasons") or [])}

    def sanitizer(self, candidate: Candidate) -> dict:
        from .device import require_tool
        from .gating import skipped
        from .sanitizer import check_variant

        cfg = self.stage.cfg["sanitizer"]
        if not self.stage.cfg["stages"]["sanitizer"]:
            return skipped("disabled in the config (stages.sanitizer: false)", disabled=True)
        return check_variant(require_tool("compute-sanitizer"), cfg, self.variant_of(candidate),
                             self.build_dir(candidate) / "verdict.json",
                             self.store.candidate_dir(candidate.id) / "sanitizer")

    def final_check(self, candidate: Candidate, build: dict) -> dict:
        parity = self.isolated(candidate, "final")
        sanitizer = self.sanitizer(candidate)
        write_json(self.store.candidate_dir(candidate.id) / "sanitizer" / "verdict.json", sanitizer)
        sanitizer_ok = sanitizer["status"] == "pass" or sanitizer.get("disabled")
        reasons = [f"parity ({self.stage.evolve['final_tier']}): {r}" for r in parity.get("reasons") or []] + \
                  ([f"sanitizer: {r}" for r in sanitizer["reasons"]] if not sanitizer_ok else [])
        return {"status": "pass" if parity["status"] == "pass" and sanitizer_ok else "fail", "reasons": reasons,
                "parity": {k: parity.get(k) for k in ("status", "tier", "cases", "passed", "failed")},
                "sanitizer": {"status": sanitizer["status"], "tools": [t["tool"] for t in sanitizer.get("tools", [])]}}


# ---------------------------------------------------------------- the external proposer


def proposer_request(base: Variant, parent: Candidate, parent_variant: Variant, child_id: str,
                     child_dir: Path, generation: int, insight: Insight | None, parent_outcome: dict | None,
                     parent_bench: Path | None) -> dict:
    """What a proposer command reads: the parent's sources and tunables, its bottleneck findings and
    bench results, the search space, and the folder to write the child variant into."""
    return {
        "protocol": PROTOCOL_VERSION,
        "variant": base.name,
        "generation": generation,
        "child_id": child_id,
        "child_dir": str(child_dir),
        "instructions": (f"write a complete variant folder at child_dir (variant.yaml with name "
                         f"{base.name!r} and every source it lists); it is built, gated by parity and timed "
                         "against SDPA like any variant, and must be correct to compete. Sources named "
                         "common/<file> are headers several variants share (kernels/common, read-only): "
                         "list them as they are; to change one, copy it into child_dir under another "
                         "name and include that"),
        "fitness": "geometric-mean p50 speedup against SDPA's default in the same process (higher is better)",
        "parent": {
            "id": parent.id,
            "source_dir": str(parent_variant.folder),
            "tunables": parent.tunables,
            "sources": {relative(parent_variant, path): path.read_text() for path in variant_files(parent_variant)},
            "bottlenecks": {"findings": list(insight.findings), "from": insight.source} if insight else None,
            "bench": {"fitness": (parent_outcome or {}).get("fitness"),
                      "speedups": (parent_outcome or {}).get("speedups"),
                      "file": str(parent_bench) if parent_bench and parent_bench.is_file() else None},
        },
        "tunables": parent_variant.meta.get("tunables") or {},
    }


def command_child_maker(command: str, timeout_s: float | None, base: Variant, store: Store,
                        variant_of, log) -> ChildMaker:
    """Runs `command <request.json>` (from the repository root) for each child and loads the
    folder it writes; a failure becomes the child's recorded reason, not a crash."""

    def make(parent: Candidate, child_id: str, generation: int, insight: Insight | None) -> Candidate:
        folder = store.candidate_dir(child_id)
        child_dir = folder / base.name
        shutil.rmtree(child_dir, ignore_errors=True)
        folder.mkdir(parents=True, exist_ok=True)
        parent_variant = variant_of(parent)
        request = proposer_request(base, parent, parent_variant, child_id, child_dir, generation, insight,
                                   store.outcome(parent.id), store.candidate_dir(parent.id) / "bench.json")
        request_path = folder / "proposal_request.json"
        write_json(request_path, request)
        argv = shlex.split(command) + [str(request_path)]
        lever = {"proposer": command, "finding": None,
                 "findings_given": [f.get("id") for f in (insight.findings if insight else ())]}
        child = Candidate(child_id, generation, dict(parent.tunables), "proposer", [parent.id], {}, lever,
                          str(child_dir))
        try:
            proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True,
                                  timeout=timeout_s or PROPOSER_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            child.proposal_error = f"the proposer command failed: {type(exc).__name__}: {exc}"
            return child
        write_text(folder / "proposer.log", f"$ {shlex.join(argv)}\n{proc.stdout}{proc.stderr}")
        if proc.returncode != 0:
            last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
            child.proposal_error = f"the proposer exited with status {proc.returncode}: {last[0]}"
            return child
        try:
            variant = load_variant(child_dir)
        except StageError as exc:
            child.proposal_error = f"the proposer's child is not a valid variant: {exc}"
            return child
        child.tunables = defaults(variant)
        child.changed = {name: [parent.tunables.get(name), value] for name, value in child.tunables.items()
                         if parent.tunables.get(name) != value}
        lever["edited"] = edited_files(parent_variant, variant)
        child.sources = sources_digest(variant_files(variant))
        log.info("proposer child %s of %s: edited %s", child_id, parent.id, ", ".join(lever["edited"]) or "nothing")
        if not lever["edited"] and not child.changed:
            child.proposal_error = "the proposer's child changes nothing of its parent (no file edited, no default moved)"
        return child

    return make


def relative(variant: Variant, path: Path) -> str:
    """A variant file's name as the variant lists it: relative to its folder, or `common/<file>`
    for a shared header of kernels/common."""
    if path.is_relative_to(variant.folder):
        return str(path.relative_to(variant.folder))
    return str(path.relative_to(KERNELS_DIR))


def edited_files(parent: Variant, child: Variant) -> list[str]:
    """The files of the child that differ from (or are not in) the parent."""
    parent_files = {relative(parent, path): path for path in variant_files(parent)}
    return [name for name, path in ((relative(child, p), p) for p in variant_files(child))
            if name not in parent_files or parent_files[name].read_bytes() != path.read_bytes()]
