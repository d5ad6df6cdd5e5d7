"""The evolution: a search that makes a variant faster by itself (EvoEngineer-style).

A small population of correct candidates; children change one or two levers of a parent
(mutation) or mix two parents (crossover); rank-based selection; the top K (elites) kept across
generations; bottleneck findings choose which lever a mutation changes (the parent's where its
outcome carries a profile, else its nearest ancestor's: with the pipeline's evaluator, which times
candidates without profiling them, the variant's own analysis). A proposer
command may write children as whole variant folders (code, not only numbers).

This module is the search alone. What touches the machine comes in as arguments: an `Evaluator`
builds candidates (in parallel) and gates, times and re-checks them one at a time; a `ChildMaker`
runs an external proposer; a `Store` keeps one file per candidate outcome and per generation, so
an interrupted search resumes without re-measuring what it has. Given the seed and the same
measurements, the same candidates are proposed.
"""
from __future__ import annotations

import math
import random
import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Protocol, Sequence

from .io import read_json, write_json
from .report import geomean as _geomean
from .tunables import ruled_out

# ---------------------------------------------------------------- insight: findings -> levers

# A bottleneck finding (scripts/evo_sdpa/bottlenecks.py ids) -> the problem tag a tunable lists
# under `addresses` when changing it can move that problem (workflow/schemas/variant.schema.yaml).
FINDING_TAGS: dict[str, str] = {
    "underfilled_grid": "grid_fill",          # tile size or split
    "tail_effect": "grid_fill",               # tile count, split count, CTAs per SM
    "launch_bound": "latency",                # fixed per-CTA costs, serial chain per CTA
    "ramp_and_drain": "latency",              # fixed costs at launch and exit, overlap with neighbours
    "low_occupancy": "occupancy",             # registers or tile size
    "register_spills": "registers",
    "shared_bank_conflicts": "bank_conflicts",  # layout or padding
    "uncoalesced_global": "coalescing",
    "no_kv_reuse": "data_reuse",
    "low_tensor_pipe": "tensor_pipe",
    "stall_long_scoreboard": "memory_stalls",  # stages
    "stall_lg_throttle": "memory_stalls",
    "stall_barrier": "sync_stalls",
    "stall_membar": "sync_stalls",
    "stall_mio_throttle": "shared_memory_stalls",
    "stall_short_scoreboard": "shared_memory_stalls",
    "stall_math_pipe_throttle": "math_pipe",
    "stall_wait": "latency",
    "stall_gmma": "latency",
    "stall_dispatch_stall": "latency",
    "stall_branch_resolving": "latency",
    "stall_no_instruction": "code_size",
    "stall_imc_miss": "code_size",
    "stall_tex_throttle": "coalescing",
}

# A finding's weight when a lever is drawn among the findings that name one (severity 0 still counts).
MIN_FINDING_WEIGHT = 0.05
# Attempts at drawing a child not proposed before, before the generation gives up on that slot.
MAX_DRAWS = 64

DEFAULTS_ID = "g00-c00"


@dataclass(frozen=True)
class Knob:
    """One tunable of the search space."""
    name: str
    values: tuple[int, ...]
    default: int
    addresses: tuple[str, ...] = ()

    @property
    def movable(self) -> bool:
        return len(self.values) > 1


def space_of(tunables: dict[str, dict]) -> tuple[Knob, ...]:
    """The search space of a variant.yaml `tunables:` mapping, in declaration order; a knob marked
    `evolve: false` keeps its default (one value: never moved)."""
    return tuple(Knob(name, tuple(spec["values"]) if spec.get("evolve", True) else (spec["default"],),
                      spec["default"], tuple(spec.get("addresses") or ()))
                 for name, spec in tunables.items())


@dataclass(frozen=True)
class Insight:
    """A candidate's bottleneck findings (ranked, bottlenecks.json rows) and where they came from."""
    findings: tuple[dict, ...]
    source: str


# ---------------------------------------------------------------- settings


@dataclass(frozen=True)
class Settings:
    population: int
    elites: int
    generations: int
    seed: int
    crossover_rate: float
    max_levers: int
    insight_rate: float
    min_gain: float
    wall_s: float | None
    gpu_s: float | None
    patience: int | None

    @classmethod
    def from_config(cls, evolve: dict) -> "Settings":
        budgets = evolve["budgets"]
        minutes = lambda value: None if value is None else 60.0 * value  # noqa: E731
        return cls(evolve["population"], evolve["elites"], evolve["generations"], evolve["seed"],
                   evolve["crossover_rate"], evolve["max_levers"], evolve["insight_rate"], evolve["min_gain"],
                   minutes(budgets["wall_minutes"]), minutes(budgets["gpu_minutes"]),
                   budgets["no_improvement_generations"])


# ---------------------------------------------------------------- candidates


@dataclass
class Candidate:
    id: str
    generation: int
    tunables: dict[str, int]
    origin: str                           # defaults, mutation, crossover, proposer
    parents: list[str] = field(default_factory=list)
    changed: dict[str, list] = field(default_factory=dict)   # knob -> [parent's value, child's]
    lever: dict | None = None             # which finding chose the mutated knob (or why none did)
    source_dir: str | None = None         # None: the variant's own folder; else a proposer's child
    proposal_error: str | None = None     # the proposer could not write this child
    sources: str | None = None            # a proposer child's sources digest (each has a folder of its own)

    @property
    def key(self) -> tuple:
        """What makes two candidates the same experiment: the same code (a proposer child's by its
        sources, not its folder) with the same tunables."""
        return (self.sources or self.source_dir or "", tuple(sorted(self.tunables.items())))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Candidate":
        return cls(**data)


def candidate_id(generation: int, index: int) -> str:
    return f"g{generation:02d}-c{index:02d}"


def defaults_candidate(space: tuple[Knob, ...]) -> Candidate:
    return Candidate(DEFAULTS_ID, 0, {knob.name: knob.default for knob in space}, "defaults")


# ---------------------------------------------------------------- fitness and ranking


def geomean(values: list[float]) -> float | None:
    """The report's geometric mean, or None when a value is missing, not positive or not finite."""
    if not all(v and v > 0 and math.isfinite(v) for v in values):
        return None
    return _geomean(values)


def bench_speedups(bench_result: dict) -> dict[str, float]:
    """'<shape label> <dtype>' -> p50 speedup against SDPA's default in the primary timing mode,
    for every case the bench stage's run() measured."""
    speedups = {}
    for case in bench_result.get("cases", []):
        if case.get("status") == "measured":
            mode = case["modes"][case["primary_mode"]]
            speedups[f"{case['label']} {case['dtype']}"] = mode["speedup_p50"]
    return speedups


def fitness_of(speedups: dict[str, float]) -> float | None:
    """Geometric-mean speedup over the measured cases (None when there are none)."""
    return geomean(list(speedups.values()))


def ranked(outcomes: dict[str, dict]) -> list[str]:
    """Measured candidate ids, best fitness first (the id breaks ties, so the order is stable)."""
    measured = [(cid, o["fitness"]) for cid, o in outcomes.items()
                if o.get("status") == "measured" and o.get("fitness") is not None]
    return [cid for cid, _ in sorted(measured, key=lambda item: (-item[1], item[0]))]


def rank_select(ids: list[str], rng: random.Random) -> str:
    """Rank-based selection: the i-th best of n is drawn with weight n - i."""
    n = len(ids)
    return rng.choices(ids, weights=[n - i for i in range(n)])[0]


# ---------------------------------------------------------------- proposals


def choose_lever(movable: list[Knob], insight: Insight | None, rng: random.Random,
                 insight_rate: float) -> tuple[Knob, dict]:
    """The knob a mutation changes first, and why: drawn among the knobs whose `addresses` match a
    finding of the parent's analysis (findings weighted by severity), or at random when no finding
    names one or for exploration (1 - insight_rate of the time)."""
    guided = []
    for finding in (insight.findings if insight else ()):
        tag = FINDING_TAGS.get(finding.get("id", ""))
        knobs = [knob for knob in movable if tag and tag in knob.addresses]
        if knobs:
            guided.append((finding, tag, knobs))
    if guided and rng.random() < insight_rate:
        weights = [max(float(f.get("severity") or 0.0), MIN_FINDING_WEIGHT) for f, _, _ in guided]
        finding, tag, knobs = rng.choices(guided, weights=weights)[0]
        knob = rng.choice(knobs)
        return knob, {"knob": knob.name, "finding": finding["id"], "title": finding.get("title"),
                      "severity": finding.get("severity"), "tag": tag, "analysis": insight.source}
    knob = rng.choice(movable)
    if not insight or not insight.findings:
        why = "no bottleneck analysis of the parent"
    elif not guided:
        why = "no finding of the parent's analysis names a knob of this variant"
    else:
        why = "exploration (a random knob, 1 - insight_rate of the time)"
    return knob, {"knob": knob.name, "finding": None, "why": why,
                  "analysis": insight.source if insight else None}


def mutate(parent: Candidate, space: tuple[Knob, ...], insight: Insight | None, rng: random.Random,
           settings: Settings, child: str, generation: int) -> Candidate | None:
    """A child changing 1..max_levers knobs of the parent, the first chosen by the insight."""
    movable = [knob for knob in space if knob.movable]
    if not movable:
        return None
    first, lever = choose_lever(movable, insight, rng, settings.insight_rate)
    count = rng.randint(1, min(settings.max_levers, len(movable)))
    others = [knob for knob in movable if knob.name != first.name]
    knobs = [first] + rng.sample(others, count - 1)
    tunables = dict(parent.tunables)
    changed = {}
    for knob in knobs:
        value = rng.choice([v for v in knob.values if v != tunables[knob.name]])
        changed[knob.name] = [tunables[knob.name], value]
        tunables[knob.name] = value
    return Candidate(child, generation, tunables, "mutation", [parent.id], changed, lever, parent.source_dir)


def crossover(a: Candidate, b: Candidate, space: tuple[Knob, ...], rng: random.Random,
              child: str, generation: int) -> Candidate:
    """Each knob from one parent or the other, with equal odds."""
    tunables = {knob.name: (a if rng.random() < 0.5 else b).tunables[knob.name] for knob in space}
    changed = {name: [a.tunables[name], value] for name, value in tunables.items() if a.tunables[name] != value}
    return Candidate(child, generation, tunables, "crossover", [a.id, b.id], changed, None, a.source_dir)


class Proposer(Protocol):
    """Children of one generation: `count` candidates, new ids from `first_index` on."""

    def __call__(self, generation: int, first_index: int, count: int, pool: list[Candidate],
                 insight_of: Callable[[Candidate], Insight | None], seen: set[tuple],
                 rng: random.Random) -> list[Candidate]: ...


def builtin_proposer(space: tuple[Knob, ...], settings: Settings, constraints: Sequence[dict] = ()) -> Proposer:
    """The lever search: crossover of two rank-selected parents (crossover_rate of the time, when
    two parents of one source exist), else a mutation of one; never a configuration seen before,
    nor one the variant's `tunable_constraints` rule out (it could not build)."""

    def propose(generation, first_index, count, pool, insight_of, seen, rng):
        by_id = {c.id: c for c in pool}
        ids = [c.id for c in pool]
        children: list[Candidate] = []
        for _ in range(count):
            child_id = candidate_id(generation, first_index + len(children))
            for _ in range(MAX_DRAWS):
                if len(ids) >= 2 and rng.random() < settings.crossover_rate:
                    a = by_id[rank_select(ids, rng)]
                    mates = [i for i in ids if i != a.id and by_id[i].source_dir == a.source_dir]
                    if not mates:
                        continue
                    child = crossover(a, by_id[rank_select(mates, rng)], space, rng, child_id, generation)
                else:
                    parent = by_id[rank_select(ids, rng)]
                    child = mutate(parent, space, insight_of(parent), rng, settings, child_id, generation)
                if child is None or child.key in seen:
                    continue
                seen.add(child.key)
                if ruled_out(constraints, child.tunables) is None:
                    children.append(child)
                    break
        return children

    return propose


ChildMaker = Callable[[Candidate, str, int, "Insight | None"], Candidate]


def command_proposer(make_child: ChildMaker) -> Proposer:
    """An external proposer: for each child a rank-selected parent and a call of `make_child`
    (which runs the command and loads the folder it wrote); its children go through the same gates."""

    def propose(generation, first_index, count, pool, insight_of, seen, rng):
        ids = [c.id for c in pool]
        by_id = {c.id: c for c in pool}
        children = []
        for index in range(first_index, first_index + count):
            parent = by_id[rank_select(ids, rng)]
            child = make_child(parent, candidate_id(generation, index), generation, insight_of(parent))
            if child.proposal_error is None and child.key in seen:
                child.proposal_error = "the proposer wrote a child identical to an earlier candidate"
            seen.add(child.key)
            children.append(child)
        return children

    return propose


def generation_rng(seed: int, generation: int) -> random.Random:
    """One generator per generation, so a resumed search draws what an uninterrupted one would."""
    return random.Random(f"evo-sdpa:{seed}:{generation}")


# ---------------------------------------------------------------- files


class Store:
    """One folder per search: search.json (what the records were measured under),
    generations/gen_NN.json (its candidates, then its result), candidates/<id>/outcome.json."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.meta_path = self.root / "search.json"

    @staticmethod
    def _read(path: Path) -> dict | None:
        return read_json(path) if path.is_file() else None

    def candidate_dir(self, cid: str) -> Path:
        return self.root / "candidates" / cid

    def generation_path(self, generation: int) -> Path:
        return self.root / "generations" / f"gen_{generation:02d}.json"

    def open(self, fingerprint: dict) -> str | None:
        """Keep the records measured under `fingerprint`; clear any others (returns why)."""
        stored = self._read(self.meta_path)
        reason = None
        if stored is not None and stored.get("fingerprint") != fingerprint:
            keys = sorted(k for k in set(fingerprint) | set(stored.get("fingerprint", {}))
                          if fingerprint.get(k) != stored.get("fingerprint", {}).get(k))
            reason = f"the stored search was measured under other settings ({', '.join(keys)}): starting afresh"
            for sub in ("candidates", "generations"):
                shutil.rmtree(self.root / sub, ignore_errors=True)
            stored = None
        if stored is None:
            write_json(self.meta_path, {"fingerprint": fingerprint, "wall_seconds": 0.0})
        return reason

    def wall_seconds(self) -> float:
        return (self._read(self.meta_path) or {}).get("wall_seconds", 0.0)

    def add_wall_seconds(self, seconds: float) -> None:
        data = self._read(self.meta_path)
        if data is None:   # a store never opened holds no search to add to
            return
        data["wall_seconds"] = data.get("wall_seconds", 0.0) + seconds
        write_json(self.meta_path, data)

    def generation(self, generation: int) -> dict | None:
        return self._read(self.generation_path(generation))

    def save_generation(self, generation: int, record: dict) -> None:
        write_json(self.generation_path(generation), record)

    def outcome(self, cid: str) -> dict | None:
        return self._read(self.candidate_dir(cid) / "outcome.json")

    def save_outcome(self, candidate: Candidate, outcome: dict) -> None:
        write_json(self.candidate_dir(candidate.id) / "outcome.json", {"candidate": candidate.to_dict(), **outcome})

    def final(self, cid: str) -> dict | None:
        return self._read(self.candidate_dir(cid) / "final.json")

    def save_final(self, cid: str, record: dict) -> None:
        write_json(self.candidate_dir(cid) / "final.json", record)

    def retimings(self, cid: str) -> list[dict]:
        return (self._read(self.candidate_dir(cid) / "retimed.json") or {}).get("timings", [])

    def save_retimings(self, cid: str, timings: list[dict]) -> None:
        write_json(self.candidate_dir(cid) / "retimed.json", {"timings": timings})


# ---------------------------------------------------------------- evaluation


class Evaluator(Protocol):
    """The stages' code around one candidate. Every method returns a record with `status`."""

    def build(self, candidates: list[Candidate]) -> dict[str, dict]:
        """Build every candidate (in parallel; one already built is read back): id -> the build
        stage's verdict."""

    def gate(self, candidate: Candidate, build: dict) -> dict:
        """The gate parity tier on the GPU: {status: pass|fail, reason}."""

    def measure(self, candidate: Candidate, build: dict) -> dict:
        """Timed against SDPA in one process: {status: measured|fail, gate, reason, speedups,
        findings (optional: the candidate's own bottleneck findings)}."""

    def final_check(self, candidate: Candidate, build: dict) -> dict:
        """The final parity tier and every sanitizer tool: {status: pass|fail, reasons}."""


def rejected(gate: str, reason: str, **extra) -> dict:
    return {"status": "rejected", "gate": gate, "reason": reason, "fitness": None, **extra}


def evaluate(candidate: Candidate, build: dict, evaluator: Evaluator, clock: Callable[[], float]) -> dict:
    """One candidate through the gates in order: proposer, build, parity, then timed (the timing's
    own re-check on fresh inputs is a gate too). A failure stays in the record with its reason."""
    if candidate.proposal_error:
        return rejected("proposer", candidate.proposal_error, gpu_seconds=0.0)
    if build.get("status") != "pass":
        return rejected("build", "; ".join(build.get("reasons") or []) or f"build {build.get('status')}",
                        gpu_seconds=0.0)
    started = clock()
    gate = evaluator.gate(candidate, build)
    if gate["status"] != "pass":
        return rejected("parity", gate.get("reason", ""), gpu_seconds=clock() - started)
    measured = evaluator.measure(candidate, build)
    gpu_seconds = clock() - started
    if measured["status"] != "measured":
        return rejected(measured.get("gate", "timing"), measured.get("reason", ""), gpu_seconds=gpu_seconds)
    speedups = measured["speedups"]
    fitness = fitness_of(speedups)
    if fitness is None:
        return rejected("timing", "no case measured", gpu_seconds=gpu_seconds)
    return {"status": "measured", "gate": None, "reason": "", "fitness": fitness, "speedups": speedups,
            "gpu_seconds": gpu_seconds, **({"findings": measured["findings"]} if measured.get("findings") else {})}


# ---------------------------------------------------------------- stop conditions


def improvement_generations(best_by_generation: list[float | None], min_gain: float) -> list[int]:
    """The generations whose best fitness beat the best before them by more than min_gain."""
    improved, best = [], None
    for generation, value in enumerate(best_by_generation):
        if value is not None and (best is None or value > best * (1.0 + min_gain)):
            improved.append(generation)
            best = value
    return improved


def stop_reason(settings: Settings, generation: int, best_by_generation: list[float | None],
                wall_s: float, gpu_s: float, exhausted: bool) -> dict | None:
    """Why the search stops after `generation` (0-based), or None to go on."""
    if exhausted:
        return {"condition": "exhausted", "detail": "no untried configuration could be drawn from the ranked parents "
                                                    "(their one- and two-knob changes and crossovers)"}
    spent = budget_spent(settings, wall_s, gpu_s)
    if spent:
        return spent
    if settings.patience is not None:
        improved = improvement_generations(best_by_generation, settings.min_gain)
        last = improved[-1] if improved else 0
        if generation - last >= settings.patience:
            return {"condition": "no_improvement",
                    "detail": f"no gain above {settings.min_gain:.0%} for {generation - last} generations "
                              f"(last at generation {last})"}
    if generation + 1 >= settings.generations:
        return {"condition": "generations", "detail": f"{settings.generations} generations run"}
    return None


def budget_spent(settings: Settings, wall_s: float, gpu_s: float) -> dict | None:
    """The wall-time or GPU-time budget once it is spent, else None."""
    if settings.wall_s is not None and wall_s >= settings.wall_s:
        return {"condition": "wall_time", "detail": f"{wall_s / 60:.1f} of {settings.wall_s / 60:g} wall minutes spent"}
    if settings.gpu_s is not None and gpu_s >= settings.gpu_s:
        return {"condition": "gpu_time", "detail": f"{gpu_s / 60:.1f} of {settings.gpu_s / 60:g} GPU minutes spent"}
    return None


# ---------------------------------------------------------------- the loop


@dataclass
class SearchState:
    candidates: dict[str, Candidate] = field(default_factory=dict)
    outcomes: dict[str, dict] = field(default_factory=dict)
    generations: list[dict] = field(default_factory=list)
    stop: dict | None = None

    def gpu_seconds(self) -> float:
        return sum(o.get("gpu_seconds") or 0.0 for o in self.outcomes.values())


def lineage(state: SearchState, cid: str) -> list[str]:
    """The candidate's ancestors by first parent, the root first."""
    chain = [cid]
    while state.candidates[chain[-1]].parents:
        chain.append(state.candidates[chain[-1]].parents[0])
    return chain[::-1]


def insight_lookup(state: SearchState, root: Insight | None) -> Callable[[Candidate], Insight | None]:
    """A candidate's own findings when its outcome carries them, else its nearest ancestor's; the
    defaults' are the variant's analysis (`root`)."""

    def insight_of(candidate: Candidate) -> Insight | None:
        cid = candidate.id
        while True:
            outcome = state.outcomes.get(cid) or {}
            if outcome.get("findings"):
                return Insight(tuple(outcome["findings"]), f"candidate {cid}'s profile")
            parents = state.candidates[cid].parents if cid in state.candidates else []
            if not parents:
                return root if cid == DEFAULTS_ID else None
            cid = parents[0]

    return insight_of


def propose_generation(generation: int, state: SearchState, space: tuple[Knob, ...], settings: Settings,
                       proposer: Proposer, root: Insight | None) -> tuple[list[Candidate], list[str]]:
    """(new children, elites carried over). Generation 0 is the defaults and children around them."""
    rng = generation_rng(settings.seed, generation)
    seen = {c.key for c in state.candidates.values()}
    insight_of = insight_lookup(state, root)
    if generation == 0:
        defaults = defaults_candidate(space)
        seen.add(defaults.key)
        state.candidates[defaults.id] = defaults
        return [defaults] + proposer(0, 1, settings.population - 1, [defaults], insight_of, seen, rng), []
    order = ranked(state.outcomes)
    elites = order[:settings.elites]
    pool = [state.candidates[cid] for cid in order[:settings.population]]
    if not pool:
        return [], []
    children = proposer(generation, 0, settings.population - len(elites), pool, insight_of, seen, rng)
    return children, elites


def run_generation(generation: int, candidates: list[Candidate], state: SearchState, settings: Settings,
                   evaluator: Evaluator, store: Store, clock: Callable[[], float],
                   wall: Callable[[], float], log) -> dict | None:
    """Build what has no outcome yet, then gate and time one at a time. Returns the budget that
    stopped it midway, or None when every candidate has its outcome."""
    for candidate in candidates:
        stored = None if candidate.id in state.outcomes else store.outcome(candidate.id)
        if stored is not None:
            state.outcomes[candidate.id] = {k: v for k, v in stored.items() if k != "candidate"}
    todo = [c for c in candidates if c.id not in state.outcomes]
    if not todo:
        return None
    spent = budget_spent(settings, wall(), state.gpu_seconds())
    if spent:
        return spent
    builds = evaluator.build([c for c in todo if not c.proposal_error])

    def record(candidate: Candidate) -> None:
        outcome = evaluate(candidate, builds.get(candidate.id, {}), evaluator, clock)
        state.outcomes[candidate.id] = outcome
        store.save_outcome(candidate, outcome)
        log(f"{candidate.id} {candidate.origin} {candidate.changed or candidate.tunables}: "
            + (f"fitness {outcome['fitness']:.4f}" if outcome["status"] == "measured"
               else f"rejected by {outcome['gate']}: {outcome['reason']}"))

    # What the proposer or the build already rejected costs no GPU time: recorded first, so a
    # budget that stops the generation midway leaves no known failure out of the record.
    built = []
    for candidate in todo:
        if candidate.proposal_error or builds.get(candidate.id, {}).get("status") != "pass":
            record(candidate)
        else:
            built.append(candidate)
    for candidate in built:
        spent = budget_spent(settings, wall(), state.gpu_seconds())
        if spent:
            return spent
        record(candidate)
    return None


def generation_record(generation: int, candidates: list[Candidate], elites_in: list[str],
                      state: SearchState, elites: int, wall_s: float) -> dict:
    order = ranked(state.outcomes)
    own = ranked({c.id: state.outcomes[c.id] for c in candidates if c.id in state.outcomes})
    best = order[0] if order else None
    return {
        "generation": generation, "status": "done",
        "candidates": [c.to_dict() for c in candidates], "carried_elites": elites_in,
        "best_id": best, "best_fitness": state.outcomes[best]["fitness"] if best else None,
        "generation_best_id": own[0] if own else None,
        "generation_best_fitness": state.outcomes[own[0]]["fitness"] if own else None,
        "elites": order[:elites],
        "measured": sum(1 for c in candidates if state.outcomes.get(c.id, {}).get("status") == "measured"),
        "rejected": sum(1 for c in candidates if state.outcomes.get(c.id, {}).get("status") == "rejected"),
        "wall_seconds_total": round(wall_s, 2), "gpu_seconds_total": round(state.gpu_seconds(), 2),
    }


def search(space: tuple[Knob, ...], settings: Settings, proposer: Proposer, evaluator: Evaluator,
           store: Store, root: Insight | None, clock: Callable[[], float] = time.monotonic,
           log: Callable[[str], None] = lambda line: None) -> SearchState:
    """Run (or resume) the search until a stop condition; every candidate's outcome and every
    generation is a file in `store`, read back instead of measured again."""
    state = SearchState()
    session_start, prior_wall = clock(), store.wall_seconds()

    def wall() -> float:
        return prior_wall + clock() - session_start

    generation = 0
    try:
        while True:
            record = store.generation(generation)
            if record is not None:
                candidates = [Candidate.from_dict(c) for c in record["candidates"]]
                elites_in = record.get("carried_elites", [])
                for candidate in candidates:
                    state.candidates.setdefault(candidate.id, candidate)
            else:
                candidates, elites_in = propose_generation(generation, state, space, settings, proposer, root)
                for candidate in candidates:
                    state.candidates[candidate.id] = candidate
                store.save_generation(generation, {"generation": generation, "status": "proposed",
                                                   "candidates": [c.to_dict() for c in candidates],
                                                   "carried_elites": elites_in})
            if generation > 0 and not candidates and not elites_in:
                state.stop = {"condition": "no_parents", "generation": generation,
                              "detail": "no candidate so far passed the gates and was measured, so none can breed"}
                break
            spent = run_generation(generation, candidates, state, settings, evaluator, store, clock, wall, log)
            if spent:
                # What it measured may win, so the curve shows it too (stored as proposed: a resume
                # finishes it).
                partial = generation_record(generation, candidates, elites_in, state, settings.elites, wall())
                state.generations.append({**partial, "status": "partial"})
                state.stop = {**spent, "generation": generation, "midway": True}
                break
            # A generation read back is judged at the wall time it ended with, not today's total
            # (which counts every later generation and the final checks).
            stored_wall = record.get("wall_seconds_total") if record and record.get("status") == "done" else None
            ended_at = wall() if stored_wall is None else stored_wall
            done = generation_record(generation, candidates, elites_in, state, settings.elites, ended_at)
            state.generations.append(done)
            exhausted = generation > 0 and not candidates
            stop = stop_reason(settings, generation, [g["best_fitness"] for g in state.generations],
                               ended_at, state.gpu_seconds(), exhausted)
            done["stop"] = stop
            store.save_generation(generation, done)
            log(f"generation {generation}: best {done['best_id']} fitness {done['best_fitness']}"
                + (f"; stop: {stop['condition']} ({stop['detail']})" if stop else ""))
            if stop:
                state.stop = {**stop, "generation": generation}
                break
            generation += 1
    finally:
        store.add_wall_seconds(clock() - session_start)
    return state


CONFIRM_TOP = 3      # the best measured candidates re-timed beside the defaults before one may win
CONFIRM_ROUNDS = 3   # re-timings of each


def confirm_leaders(state: SearchState, evaluator: Evaluator, store: Store, top: int = CONFIRM_TOP,
                    rounds: int = CONFIRM_ROUNDS, log: Callable[[str], None] = lambda line: None,
                    clock: Callable[[], float] = time.monotonic) -> dict[str, dict]:
    """The best of some forty timings, each a percent or two off, is biased high: on a flat landscape
    a non-default candidate won most seeded searches by its noise. So the defaults and the `top`
    best measured candidates are timed again, in turn, `rounds` times (each against SDPA in its
    own process, as in the search), and a leader's confirmed fitness is the geometric mean of its
    re-timings alone: its search timing is the one it was chosen for, high by selection (None where
    a re-timing failed: it does not win). Stored per candidate and read back on a resume.
    Returns id -> {fitness, search, retimed, gpu_seconds (the re-timings' own, the GPU time the
    search's budget did not see)}."""
    order = ranked(state.outcomes)
    leaders = ([DEFAULTS_ID] if DEFAULTS_ID in order else []) + [cid for cid in order if cid != DEFAULTS_ID][:top]
    timings = {cid: store.retimings(cid) for cid in leaders}
    builds = None
    started = clock()
    try:
        for round_index in range(rounds):
            for cid in leaders:
                if len(timings[cid]) > round_index:
                    continue
                if builds is None:
                    builds = evaluator.build([state.candidates[c] for c in leaders])
                timed = clock()
                measured = evaluator.measure(state.candidates[cid], builds.get(cid, {}))
                fitness = fitness_of(measured["speedups"]) if measured.get("status") == "measured" else None
                timings[cid].append({"fitness": fitness, "status": measured.get("status"),
                                     "reason": measured.get("reason", ""), "gpu_seconds": clock() - timed})
                store.save_retimings(cid, timings[cid])
    finally:
        store.add_wall_seconds(clock() - started)
    confirmed = {}
    for cid in leaders:
        retimed = [t["fitness"] for t in timings[cid][:rounds]]
        confirmed[cid] = {"fitness": geomean(retimed), "search": state.outcomes[cid]["fitness"], "retimed": retimed,
                          # records from before it was timed have none: counted as 0
                          "gpu_seconds": sum(t.get("gpu_seconds") or 0.0 for t in timings[cid][:rounds])}
        log(f"confirm {cid}: search {state.outcomes[cid]['fitness']:.4f}, again "
            + " ".join("failed" if v is None else f"{v:.4f}" for v in retimed)
            + (f" -> {confirmed[cid]['fitness']:.4f}" if confirmed[cid]["fitness"] else " -> cannot win"))
    return confirmed


def winner_order(state: SearchState, min_gain: float, confirmed: dict[str, dict] | None = None) -> list[str]:
    """Measured candidates in the order they may win: best first, except that one beating the
    measured defaults by less than min_gain ranks behind them. Two runs of one build differ by a
    percent or two, so a smaller lead is noise, and promoting it would change the defaults for
    nothing. With `confirmed` (confirm_leaders) the re-timed leaders rank by their confirmed
    fitness, ahead of every candidate that was not re-timed or whose re-timing failed."""
    fitness = {cid: state.outcomes[cid]["fitness"] for cid in ranked(state.outcomes)}
    order = list(fitness)
    if confirmed:
        fitness = {cid: c["fitness"] for cid, c in confirmed.items() if c["fitness"] is not None}
        leaders = sorted(fitness, key=lambda cid: (-fitness[cid], cid))
        order = leaders + [cid for cid in order if cid not in leaders]
    base = fitness.get(DEFAULTS_ID)
    if base is None:
        return order
    clear = [cid for cid in order if cid != DEFAULTS_ID and cid in fitness and fitness[cid] >= base * (1 + min_gain)]
    return clear + [DEFAULTS_ID] + [cid for cid in order if cid != DEFAULTS_ID and cid not in clear]


def pick_winner(state: SearchState, evaluator: Evaluator, store: Store, tries: int,
                log: Callable[[str], None] = lambda line: None, min_gain: float = 0.0,
                clock: Callable[[], float] = time.monotonic,
                confirmed: dict[str, dict] | None = None) -> tuple[str | None, list[dict]]:
    """The first candidate of winner_order that passes the final checks (the next when it does
    not, up to `tries`); every check is recorded with its GPU seconds (the build before it is the
    host's), and read back on a resume. Their wall time counts in the store's, like the search's."""
    checks = []
    order = winner_order(state, min_gain, confirmed)
    best = winner_order(state, 0.0, confirmed)[:1]
    if best and order[:1] != best:
        log(f"{best[0]} leads the defaults by less than min_gain ({min_gain:.1%}): the defaults stand")
    started = clock()
    try:
        for cid in order[:tries]:
            record = store.final(cid)
            if record is None:
                candidate = state.candidates[cid]
                build = evaluator.build([candidate])[cid]
                checked = clock()
                record = evaluator.final_check(candidate, build)
                record = {**record, "gpu_seconds": clock() - checked}
                store.save_final(cid, record)
            checks.append({"id": cid, **record})
            log(f"final check {cid}: {record['status']} {'; '.join(record.get('reasons') or [])}")
            if record["status"] == "pass":
                return cid, checks
        return None, checks
    finally:
        store.add_wall_seconds(clock() - started)


def check_first_generation(space: tuple[Knob, ...], settings: Settings, proposer: Proposer,
                           evaluator: Evaluator, root: Insight | None) -> dict:
    """What a host without a GPU can check: the first generation is proposed and every candidate
    of it built (nothing is gated or timed)."""
    state = SearchState()
    candidates, _ = propose_generation(0, state, space, settings, proposer, root)
    builds = evaluator.build([c for c in candidates if not c.proposal_error])
    rows = []
    for candidate in candidates:
        build = builds.get(candidate.id, {})
        rows.append({"id": candidate.id, "origin": candidate.origin, "changed": candidate.changed,
                     "lever": candidate.lever, "proposal_error": candidate.proposal_error,
                     "build": build.get("status", "not built"), "reasons": build.get("reasons", [])})
    return {"knobs": len(space), "movable_knobs": sum(1 for knob in space if knob.movable),
            "first_generation": rows,
            "builds": dict(sorted(Counter(r["build"] for r in rows).items()))}


# ---------------------------------------------------------------- records


def curve(variant: str, state: SearchState) -> dict:
    """Best fitness by generation against SDPA's line (1.0): what the summary plots."""
    defaults = state.outcomes.get(DEFAULTS_ID, {})
    return {
        "variant": variant,
        "fitness": "geometric-mean p50 speedup against SDPA's default, timed in the same process",
        "sdpa": 1.0,
        "defaults_fitness": defaults.get("fitness"),
        "generations": [{"generation": g["generation"], "best_fitness": g["best_fitness"], "best_id": g["best_id"],
                         "generation_best_fitness": g["generation_best_fitness"],
                         "measured": g["measured"], "rejected": g["rejected"],
                         "partial": g["status"] == "partial"} for g in state.generations],
    }


def rejection_counts(state: SearchState) -> dict[str, int]:
    return dict(Counter(o["gate"] for o in state.outcomes.values() if o.get("status") == "rejected"))


def summary(variant: str, state: SearchState, winner: str | None, checks: list[dict],
            wall_s: float, confirmed: dict[str, dict] | None = None) -> dict:
    """best.json: the winner (or why there is none), against the defaults, and how the search went.
    Where the leaders were re-timed (confirm_leaders), the winner's fitness and its ratio over the
    defaults are the confirmed ones; the search's single timing stays beside them. The GPU seconds
    are the search's, the re-timings' and the final checks', each also given alone."""
    defaults = state.outcomes.get(DEFAULTS_ID, {})
    confirmed = confirmed or {}
    gpu = {"search": state.gpu_seconds(),
           "confirm": sum(c["gpu_seconds"] for c in confirmed.values()),
           "final_checks": sum(c.get("gpu_seconds") or 0.0 for c in checks)}   # checks stored before it have none

    def fitness(cid: str) -> float | None:
        return confirmed[cid]["fitness"] if cid in confirmed else state.outcomes.get(cid, {}).get("fitness")

    record = {
        "variant": variant,
        "status": "pass" if winner else "fail",
        "reasons": [] if winner else ["no measured candidate passed the final checks" if checks
                                      else "no candidate was measured"],
        "stop": state.stop,
        "generations": len(state.generations),
        "candidates": {"proposed": len(state.candidates), "measured": len(ranked(state.outcomes)),
                       "rejected_by": rejection_counts(state),
                       # proposed, but a budget stopped the search before their gates ran
                       "not_reached": len(state.candidates) - len(state.outcomes)},
        "rejections": [{"id": cid, "gate": o["gate"], "reason": o["reason"]}
                       for cid, o in sorted(state.outcomes.items()) if o.get("status") == "rejected"],
        "defaults": {"id": DEFAULTS_ID, "fitness": defaults.get("fitness"), "speedups": defaults.get("speedups"),
                     "confirmed_fitness": confirmed.get(DEFAULTS_ID, {}).get("fitness")},
        "confirmed": confirmed,
        "final_checks": checks,
        "wall_seconds": round(wall_s, 1),
        "gpu_seconds": round(sum(gpu.values()), 1),
        "gpu_seconds_by_phase": {phase: round(seconds, 1) for phase, seconds in gpu.items()},
        "winner": None,
    }
    if winner:
        candidate, outcome = state.candidates[winner], state.outcomes[winner]
        base = state.candidates[DEFAULTS_ID].tunables if DEFAULTS_ID in state.candidates else {}
        record["winner"] = {
            "id": winner, "tunables": candidate.tunables, "source_dir": candidate.source_dir,
            "changed_from_defaults": {k: v for k, v in candidate.tunables.items() if base.get(k) != v},
            "fitness": fitness(winner), "search_fitness": outcome["fitness"], "speedups": outcome["speedups"],
            "over_defaults": (fitness(winner) / fitness(DEFAULTS_ID)) if fitness(DEFAULTS_ID) else None,
            "lineage": [{"id": cid, "origin": state.candidates[cid].origin, "changed": state.candidates[cid].changed,
                         "lever": state.candidates[cid].lever, "fitness": state.outcomes.get(cid, {}).get("fitness")}
                        for cid in lineage(state, winner)],
        }
    return record
