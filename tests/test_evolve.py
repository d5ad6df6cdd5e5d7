"""The evolution's search loop on CPU, with a fake evaluator in place of the GPU: the first
generation around the defaults, selection, elitism, determinism, resume without re-measuring,
each stop condition, insight-guided lever choice, the final checks, and the external proposer's
protocol driven by a scripted proposer (tests/fixtures/proposer/edit_proposer.py)."""
from __future__ import annotations

import json
import logging
import random
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from evo_sdpa import evolve, report
from evo_sdpa.bottlenecks import RULES, STALL_LEVERS
from evo_sdpa.evolve import (DEFAULTS_ID, FINDING_TAGS, Candidate, Insight, Knob, Settings, Store,
                             bench_speedups, builtin_proposer, choose_lever, command_proposer, crossover,
                             curve, fitness_of, geomean, mutate, pick_winner, rank_select, ranked, search, space_of,
                             stop_reason, summary)
from evo_sdpa.schema import load_schema

REPO = Path(__file__).resolve().parents[1]
PROPOSER = REPO / "tests" / "fixtures" / "proposer" / "edit_proposer.py"
LOG = logging.getLogger("test_evolve")

TUNABLES = {
    "block": {"values": [16, 32, 64, 128], "default": 64, "addresses": ["grid_fill", "occupancy"]},
    "stages": {"values": [1, 2, 3], "default": 2, "addresses": ["memory_stalls"]},
    "pad": {"values": [0, 1], "default": 0, "addresses": ["bank_conflicts"]},
    "fixed": {"values": [3], "default": 3},
}
SPACE = space_of(TUNABLES)


def settings(**over) -> Settings:
    base = dict(population=6, elites=2, generations=5, seed=1, crossover_rate=0.3, max_levers=2,
                insight_rate=0.8, min_gain=0.0, wall_s=None, gpu_s=None, patience=None)
    return Settings(**{**base, **over})


def score(tunables: dict) -> float:
    """A fitness landscape with one peak (block 128, stages 3, pad 1)."""
    return round(0.6 + 0.002 * tunables["block"] + 0.05 * tunables["stages"] + 0.03 * tunables["pad"], 6)


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Interrupted(Exception):
    pass


class FakeEvaluator:
    """Records every call; `fitness` scores a candidate, `reject`/`build_fail` gate it out."""

    def __init__(self, clock=None, fitness=score, reject=None, build_fail=None, final_fail=(),
                 measure_limit=None, gpu_cost=0.0, build_cost=0.0):
        self.clock, self.fitness, self.reject, self.build_fail = clock, fitness, reject, build_fail
        self.final_fail, self.measure_limit = set(final_fail), measure_limit
        self.gpu_cost, self.build_cost = gpu_cost, build_cost
        self.built, self.gated, self.measured, self.finals = [], [], [], []

    def build(self, candidates):
        self.built += [c.id for c in candidates]
        if self.clock:
            self.clock.now += self.build_cost
        return {c.id: ({"status": "fail", "reasons": ["nvcc: planted build failure"]}
                       if self.build_fail and self.build_fail(c) else {"status": "pass", "reasons": []})
                for c in candidates}

    def gate(self, candidate, build):
        self.gated.append(candidate.id)
        reason = self.reject(candidate) if self.reject else None
        return {"status": "fail", "reason": reason} if reason else {"status": "pass", "reason": ""}

    def measure(self, candidate, build):
        if self.measure_limit is not None and len(self.measured) >= self.measure_limit:
            raise Interrupted("the machine went away")
        self.measured.append(candidate.id)
        if self.clock:
            self.clock.now += self.gpu_cost
        value = self.fitness(candidate.tunables)
        return {"status": "measured", "speedups": {"B1_H2_S64_D64_full fp16": value, "B1_H2_S128_D128_causal fp16": value}}

    def final_check(self, candidate, build):
        self.finals.append(candidate.id)
        failed = candidate.id in self.final_fail
        return {"status": "fail" if failed else "pass", "reasons": ["parity (full): planted"] if failed else []}


def run(tmp_path: Path, evaluator: FakeEvaluator | None = None, root: Insight | None = None, space=SPACE,
        clock=None, **over):
    clock = clock or FakeClock()
    evaluator = evaluator or FakeEvaluator(clock)
    cfg = settings(**over)
    store = Store(tmp_path)
    store.open({"test": 1})
    state = search(space, cfg, builtin_proposer(space, cfg), evaluator, store, root, clock=clock)
    return state, evaluator, store


def generation_lists(state) -> list[list[tuple]]:
    return [[(c["id"], tuple(sorted(c["tunables"].items())), c["origin"]) for c in g["candidates"]]
            for g in state.generations]


# ---------------------------------------------------------------- pieces


def test_a_knob_marked_evolve_false_keeps_its_default():
    """A knob with evolve: false (v5_hopper's pdl, say) is never moved from its default."""
    knobs = space_of({"split": {"values": [0, 1], "default": 0, "evolve": False},
                      "stages": {"values": [2, 3], "default": 2}})
    assert knobs[0] == Knob("split", (0,), 0) and not knobs[0].movable
    assert knobs[1].movable


def test_space_and_fitness_helpers():
    assert [k.name for k in SPACE] == ["block", "stages", "pad", "fixed"]
    assert SPACE[0] == Knob("block", (16, 32, 64, 128), 64, ("grid_fill", "occupancy"))
    assert not SPACE[3].movable and SPACE[3].addresses == ()
    assert geomean([1.0, 4.0]) == pytest.approx(2.0)
    assert geomean([1.0, 0.0]) is None and geomean([]) is None
    bench = {"cases": [
        {"status": "measured", "label": "A", "dtype": "fp16", "primary_mode": "graph",
         "modes": {"eager": {"speedup_p50": 0.5}, "graph": {"speedup_p50": 2.0}}},
        {"status": "measured", "label": "B", "dtype": "bf16", "primary_mode": "eager",
         "modes": {"eager": {"speedup_p50": 0.5}}},
        {"status": "skipped", "label": "C", "dtype": "fp16"},
    ]}
    assert bench_speedups(bench) == {"A fp16": 2.0, "B bf16": 0.5}
    assert fitness_of(bench_speedups(bench)) == pytest.approx(1.0)
    assert fitness_of({}) is None


def test_rank_selection_favours_the_better_ranked():
    rng = random.Random(0)
    counts = Counter(rank_select(["a", "b", "c", "d"], rng) for _ in range(20000))
    assert counts["a"] > counts["b"] > counts["c"] > counts["d"] > 0
    assert counts["a"] / counts["d"] == pytest.approx(4.0, rel=0.15)  # weights 4:3:2:1


def test_mutation_changes_one_or_two_levers_within_their_values():
    parent = evolve.defaults_candidate(SPACE)
    rng = random.Random(3)
    sizes = Counter()
    for index in range(200):
        child = mutate(parent, SPACE, None, rng, settings(), f"g01-c{index:02d}", 1)
        sizes[len(child.changed)] += 1
        assert child.parents == [DEFAULTS_ID] and child.origin == "mutation"
        for name, (old, new) in child.changed.items():
            assert old == parent.tunables[name] and new != old and new in TUNABLES[name]["values"]
            assert name != "fixed"
        assert {k: v for k, v in child.tunables.items() if k not in child.changed} == \
               {k: v for k, v in parent.tunables.items() if k not in child.changed}
    assert set(sizes) == {1, 2}
    one = mutate(parent, SPACE, None, random.Random(3), settings(max_levers=1), "x", 1)
    assert len(one.changed) == 1


def test_crossover_takes_each_lever_from_a_parent():
    a = Candidate("a", 0, {"block": 16, "stages": 1, "pad": 0, "fixed": 3}, "mutation")
    b = Candidate("b", 0, {"block": 128, "stages": 3, "pad": 1, "fixed": 3}, "mutation")
    seen = set()
    for seed in range(40):
        child = crossover(a, b, SPACE, random.Random(seed), "c", 1)
        assert child.parents == ["a", "b"] and child.origin == "crossover"
        for name, value in child.tunables.items():
            assert value in (a.tunables[name], b.tunables[name])
        seen.add(tuple(child.tunables.values()))
    assert len(seen) > 4


# ---------------------------------------------------------------- insight


BANKS = Insight(({"id": "shared_bank_conflicts", "title": "Shared-memory bank conflicts", "severity": 0.6},
                 {"id": "stall_selected_unknown", "severity": 0.9}), "results/analysis/x/bottlenecks.json")


def test_insight_chooses_the_lever_and_the_record_names_the_finding():
    movable = [k for k in SPACE if k.movable]
    knob, lever = choose_lever(movable, BANKS, random.Random(0), insight_rate=1.0)
    assert knob.name == "pad"
    assert lever == {"knob": "pad", "finding": "shared_bank_conflicts", "title": "Shared-memory bank conflicts",
                     "severity": 0.6, "tag": "bank_conflicts", "analysis": BANKS.source}


def test_lever_chosen_at_random_says_why():
    movable = [k for k in SPACE if k.movable]
    _, lever = choose_lever(movable, None, random.Random(0), 1.0)
    assert lever["finding"] is None and lever["why"] == "no bottleneck analysis of the parent"
    unmapped = Insight(({"id": "uncoalesced_global", "severity": 1.0},), "a.json")
    _, lever = choose_lever(movable, unmapped, random.Random(0), 1.0)
    assert lever["why"] == "no finding of the parent's analysis names a knob of this variant"
    whys = {choose_lever(movable, BANKS, random.Random(seed), 0.0)[1]["why"] for seed in range(5)}
    assert whys == {"exploration (a random knob, 1 - insight_rate of the time)"}


def test_findings_weighted_by_severity_choose_among_knobs():
    insight = Insight(({"id": "low_occupancy", "severity": 0.9}, {"id": "stall_long_scoreboard", "severity": 0.1}),
                      "a.json")
    movable = [k for k in SPACE if k.movable]
    picks = Counter(choose_lever(movable, insight, random.Random(seed), 1.0)[1]["finding"] for seed in range(2000))
    assert picks["low_occupancy"] > 5 * picks["stall_long_scoreboard"] > 0


def test_first_generation_mutations_follow_the_defaults_profile(tmp_path):
    state, _, _ = run(tmp_path, root=BANKS, insight_rate=1.0, max_levers=1, generations=2, crossover_rate=0.0)
    first = [Candidate.from_dict(c) for c in state.generations[0]["candidates"]]
    assert first[0].id == DEFAULTS_ID and first[0].origin == "defaults"
    for child in first[1:]:
        assert child.lever["finding"] == "shared_bank_conflicts" and child.changed == {"pad": [0, 1]}
    # pad has two values, so only one child can follow the finding; the rest were drawn anew
    assert len(first) == 2
    # the next generation's parents inherit the defaults' analysis
    for child in (Candidate.from_dict(c) for c in state.generations[1]["candidates"]):
        if child.origin == "mutation":
            assert child.lever["analysis"] == BANKS.source


def test_every_finding_kind_maps_to_a_schema_tag():
    tags = set(load_schema("variant.schema.yaml")["properties"]["tunables"]["additionalProperties"]
               ["properties"]["addresses"]["items"]["enum"])
    assert set(FINDING_TAGS.values()) <= tags
    rule_ids = {rule.__name__ for rule in RULES} | {f"stall_{reason}" for reason in STALL_LEVERS}
    assert set(FINDING_TAGS) <= rule_ids
    assert rule_ids - set(FINDING_TAGS) == set(), "a bottleneck rule no lever can address"


def test_issue_mapping_of_findings_to_levers():
    """The issue's examples: bank conflicts -> layout/padding, low occupancy -> registers or tile
    size, memory stalls -> stages, an under-filled grid -> tile size or split."""
    assert FINDING_TAGS["shared_bank_conflicts"] == "bank_conflicts"
    assert FINDING_TAGS["low_occupancy"] == "occupancy"
    assert FINDING_TAGS["stall_long_scoreboard"] == "memory_stalls"
    assert FINDING_TAGS["underfilled_grid"] == "grid_fill"


# ---------------------------------------------------------------- the loop


def test_elites_are_kept_and_never_measured_twice(tmp_path):
    state, evaluator, _ = run(tmp_path)
    assert len(evaluator.measured) == len(set(evaluator.measured)) == len(state.outcomes)
    assert len(state.generations) == 5
    best = [g["best_fitness"] for g in state.generations]
    assert best == sorted(best)
    for before, after in zip(state.generations, state.generations[1:]):
        assert after["carried_elites"] == before["elites"] and len(after["elites"]) == 2
        new_ids = [c["id"] for c in after["candidates"]]
        assert not set(new_ids) & set(after["carried_elites"])
        assert len(new_ids) == 6 - 2
    assert state.stop["condition"] == "generations"
    assert best[-1] > state.outcomes[DEFAULTS_ID]["fitness"]


def test_children_descend_from_measured_candidates_only(tmp_path):
    evaluator = FakeEvaluator(FakeClock(), reject=lambda c: "planted parity failure" if c.tunables["stages"] == 1 else None,
                              build_fail=lambda c: c.tunables["block"] == 16)
    state, _, _ = run(tmp_path, evaluator)
    gates = {o["gate"] for o in state.outcomes.values() if o["status"] == "rejected"}
    assert gates == {"parity", "build"}
    for cid, outcome in state.outcomes.items():
        if outcome["gate"] == "build":
            assert cid not in evaluator.gated and outcome["reason"] == "nvcc: planted build failure"
        if outcome["gate"] == "parity":
            assert cid not in evaluator.measured and outcome["reason"] == "planted parity failure"
    for candidate in state.candidates.values():
        for parent in candidate.parents:
            assert state.outcomes[parent]["status"] == "measured"


def test_same_seed_same_candidates_other_seed_others(tmp_path):
    first, _, _ = run(tmp_path / "a")
    again, _, _ = run(tmp_path / "b")
    other, _, _ = run(tmp_path / "c", seed=2)
    assert generation_lists(first) == generation_lists(again)
    assert generation_lists(first) != generation_lists(other)
    assert [c.lever for c in first.candidates.values()] == [c.lever for c in again.candidates.values()]


def test_resume_measures_nothing_twice_and_ends_where_an_uninterrupted_run_does(tmp_path):
    whole, whole_eval, _ = run(tmp_path / "whole")
    interrupted = FakeEvaluator(FakeClock(), measure_limit=9)
    with pytest.raises(Interrupted):
        run(tmp_path / "resumed", interrupted)
    assert (tmp_path / "resumed" / "generations" / "gen_01.json").is_file()
    assert json.loads((tmp_path / "resumed" / "generations" / "gen_01.json").read_text())["status"] == "proposed"
    resumed, resumed_eval, _ = run(tmp_path / "resumed")
    assert not set(interrupted.measured) & set(resumed_eval.measured)
    assert sorted(interrupted.measured + resumed_eval.measured) == sorted(whole_eval.measured)
    assert generation_lists(resumed) == generation_lists(whole)
    assert resumed.stop["condition"] == whole.stop["condition"]
    # a finished search resumed again measures nothing
    again, again_eval, _ = run(tmp_path / "resumed")
    assert again_eval.measured == [] and generation_lists(again) == generation_lists(whole)


def test_more_generations_continue_a_finished_search(tmp_path):
    short, short_eval, _ = run(tmp_path, generations=2)
    longer, longer_eval, _ = run(tmp_path, generations=4)
    assert len(longer.generations) == 4 and short.stop["condition"] == "generations"
    assert not set(short_eval.measured) & set(longer_eval.measured)


def test_stop_when_no_improvement(tmp_path):
    state, _, _ = run(tmp_path, evaluator=FakeEvaluator(fitness=lambda t: 1.0), patience=2, generations=10)
    assert state.stop["condition"] == "no_improvement" and state.stop["generation"] == 2
    assert "for 2 generations" in state.stop["detail"]


def test_stop_on_the_gpu_budget_midway(tmp_path):
    clock = FakeClock()
    state, evaluator, store = run(tmp_path, FakeEvaluator(clock, gpu_cost=10.0), clock=clock, gpu_s=35.0)
    assert state.stop["condition"] == "gpu_time" and state.stop["midway"]
    assert len(evaluator.measured) == 4 and state.gpu_seconds() == pytest.approx(40.0)
    assert "of 0.583333 GPU minutes" in state.stop["detail"] or "GPU minutes spent" in state.stop["detail"]
    # what the stopped generation measured may win, so the curve shows it
    (only,) = curve("toy", state)["generations"]
    assert only["partial"] and only["best_id"] == ranked(state.outcomes)[0] and only["measured"] == 4
    assert summary("toy", state, None, [], 0.0)["generations"] == 1


def test_a_budget_stopping_midway_still_records_the_build_rejections(tmp_path):
    # The builds of a generation run before any timing; a candidate the build rejected costs no GPU
    # time, so a budget that stops the timing midway must not leave its rejection out of the record.
    clock = FakeClock()
    fails = lambda c: c.id in ("g00-c04", "g00-c05")
    state, evaluator, store = run(tmp_path, FakeEvaluator(clock, gpu_cost=10.0, build_fail=fails), clock=clock,
                                  gpu_s=15.0)
    assert state.stop["condition"] == "gpu_time" and state.stop["midway"]
    assert evaluator.measured == ["g00-c00", "g00-c01"]
    assert {cid: o["gate"] for cid, o in state.outcomes.items() if o["status"] == "rejected"} == \
        {"g00-c04": "build", "g00-c05": "build"}
    assert store.outcome("g00-c05")["gate"] == "build"
    counts = summary("toy", state, None, [], 0.0)["candidates"]
    assert counts == {"proposed": 6, "measured": 2, "rejected_by": {"build": 2}, "not_reached": 2}


def test_stop_on_the_wall_budget(tmp_path):
    clock = FakeClock()
    state, evaluator, store = run(tmp_path, FakeEvaluator(clock, build_cost=100.0), clock=clock, wall_s=150.0)
    assert state.stop["condition"] == "wall_time"
    assert store.wall_seconds() == pytest.approx(200.0)  # two generations' builds
    resumed, resumed_eval, _ = run(tmp_path, clock=FakeClock(), wall_s=150.0)
    assert resumed.stop["condition"] == "wall_time" and resumed_eval.measured == []


def test_stop_when_the_space_is_exhausted(tmp_path):
    small = space_of({"a": {"values": [0, 1], "default": 0}, "b": {"values": [0, 1], "default": 0}})
    state, evaluator, _ = run(tmp_path, space=small, population=3, elites=1, generations=20,
                              evaluator=FakeEvaluator(fitness=lambda t: 1 + t["a"] + t["b"]))
    assert state.stop["condition"] == "exhausted"
    assert sorted(tuple(c.tunables.values()) for c in state.candidates.values()) == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_stop_reason_order():
    cfg = settings(generations=3, patience=2, wall_s=60.0, gpu_s=60.0, min_gain=0.01)
    assert stop_reason(cfg, 0, [1.0], 0, 0, False) is None
    assert stop_reason(cfg, 2, [1.0, 1.2, 1.3], 0, 0, False)["condition"] == "generations"
    assert stop_reason(cfg, 2, [1.0, 1.005, 1.009], 0, 0, False)["condition"] == "no_improvement"
    assert stop_reason(cfg, 0, [1.0], 61, 0, False)["condition"] == "wall_time"
    assert stop_reason(cfg, 0, [1.0], 0, 61, False)["condition"] == "gpu_time"
    assert stop_reason(cfg, 0, [1.0], 61, 61, True)["condition"] == "exhausted"


# ---------------------------------------------------------------- winner and records


def test_the_winner_passes_the_final_checks_else_the_next_best(tmp_path):
    state, _, store = run(tmp_path)
    order = evolve.ranked(state.outcomes)
    evaluator = FakeEvaluator(final_fail={order[0]})
    winner, checks = pick_winner(state, evaluator, store, tries=2)
    assert winner == order[1] and [c["id"] for c in checks] == order[:2]
    assert checks[0]["status"] == "fail" and checks[0]["reasons"] == ["parity (full): planted"]
    again = FakeEvaluator()
    assert pick_winner(state, again, store, tries=2)[0] == order[1] and again.finals == []  # read back
    none, _ = pick_winner(state, FakeEvaluator(final_fail=set(order)), Store(tmp_path / "other"), tries=2)
    assert none is None


def test_a_lead_over_the_defaults_under_min_gain_does_not_win(tmp_path):
    """Measured on the H100: v4_pipelined's best child led its defaults by 0.4%, inside the
    run-to-run noise; it must not replace them."""
    state, _, store = run(tmp_path)
    base = state.outcomes[DEFAULTS_ID]["fitness"]
    order = evolve.ranked(state.outcomes)
    challengers = [cid for cid in order if cid != DEFAULTS_ID]
    for cid in challengers:
        state.outcomes[cid]["fitness"] = base * 0.9
    state.outcomes[challengers[0]]["fitness"] = base * 1.004
    state.outcomes[challengers[1]]["fitness"] = base * 1.05
    ordered = evolve.winner_order(state, min_gain=0.01)
    assert ordered[0] == challengers[1], "a 5% lead clears min_gain and wins"
    assert ordered.index(DEFAULTS_ID) < ordered.index(challengers[0]), "a 0.4% lead ranks behind the defaults"
    state.outcomes[challengers[1]]["fitness"] = base * 0.9
    lines = []
    winner, _ = pick_winner(state, FakeEvaluator(), Store(tmp_path / "w"), tries=2, log=lines.append, min_gain=0.01)
    assert winner == DEFAULTS_ID
    assert any("less than min_gain" in line and challengers[0] in line for line in lines)
    assert pick_winner(state, FakeEvaluator(), Store(tmp_path / "w0"), tries=2)[0] == challengers[0], \
        "with no min_gain the best measured wins"


def test_best_and_curve_records(tmp_path):
    state, _, store = run(tmp_path)
    winner, checks = pick_winner(state, FakeEvaluator(), store, tries=2)
    best = summary("fake", state, winner, checks, store.wall_seconds())
    assert best["status"] == "pass" and best["winner"]["id"] == evolve.ranked(state.outcomes)[0]
    assert best["winner"]["over_defaults"] == pytest.approx(best["winner"]["fitness"] / best["defaults"]["fitness"])
    lineage = best["winner"]["lineage"]
    assert lineage[0]["id"] == DEFAULTS_ID and lineage[-1]["id"] == winner
    assert best["winner"]["changed_from_defaults"] == {k: v for k, v in best["winner"]["tunables"].items()
                                                      if TUNABLES[k]["default"] != v}
    assert best["candidates"]["proposed"] == len(state.candidates)
    assert best["stop"]["condition"] == "generations"
    # The final summary's reading of this record (report.evolution_entry): every lineage step after the
    # defaults names its change and the finding or crossover that made it.
    shown = report.evolution_entry("fake", best)
    assert shown["winner"]["id"] == winner and shown["not_reached"] == 0
    assert [s["id"] for s in shown["winner"]["lineage"]] == [s["id"] for s in lineage]
    assert all(s["changed"] and " -> " in s["changed"] for s in shown["winner"]["lineage"][1:])
    line = curve("fake", state)
    assert line["sdpa"] == 1.0 and line["defaults_fitness"] == state.outcomes[DEFAULTS_ID]["fitness"]
    assert [g["generation"] for g in line["generations"]] == [0, 1, 2, 3, 4]
    assert line["generations"][-1]["best_fitness"] == best["winner"]["fitness"]
    json.dumps(best), json.dumps(line)


def test_a_search_under_other_settings_starts_afresh(tmp_path):
    run(tmp_path, generations=1)
    store = Store(tmp_path)
    assert store.open({"test": 1}) is None and store.outcome(DEFAULTS_ID) is not None
    reason = store.open({"test": 2})
    assert reason.startswith("the stored search was measured under other settings (test)")
    assert store.outcome(DEFAULTS_ID) is None and store.generation(0) is None


# ---------------------------------------------------------------- the external proposer


def fake_variant(root: Path) -> Path:
    folder = root / "kernels" / "fakevar"
    folder.mkdir(parents=True)
    (folder / "kernel.cu").write_text("// a fake variant: the scripted proposer edits this file\n")
    meta = {"name": "fakevar", "kind": "cuda", "description": "for the proposer protocol", "sources": ["kernel.cu"],
            "support": {"dtypes": ["fp16"], "head_dims": [64], "causal": [False]},
            "tunables": {"block": {"values": [32, 64], "default": 64, "define": "FAKEVAR_BLOCK"}}}
    (folder / "variant.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    return folder


def proposer_search(tmp_path: Path, generations: int = 2):
    from evo_sdpa.candidates import command_child_maker
    from evo_sdpa.variants import load_variant

    base = load_variant(fake_variant(tmp_path))
    store = Store(tmp_path / "search")
    store.open({"test": "proposer"})

    def variant_of(candidate):
        return base if candidate.source_dir is None else load_variant(Path(candidate.source_dir))

    maker = command_child_maker(f"{sys.executable} {PROPOSER}", 60, base, store, variant_of, LOG)
    cfg = settings(population=3, elites=1, generations=generations)
    evaluator = FakeEvaluator(fitness=lambda t: 1.0)
    insight = Insight(({"id": "low_occupancy", "severity": 0.7},), "analysis.json")
    state = search(space_of(base.meta["tunables"]), cfg, command_proposer(maker), evaluator, store, insight)
    return state, store, evaluator


def test_external_proposer_writes_children_that_go_through_the_same_gates(tmp_path):
    state, store, evaluator = proposer_search(tmp_path)
    children = [c for c in state.candidates.values() if c.origin == "proposer"]
    assert len(children) == 2 + 2  # population 3: two children in generation 0, two in generation 1
    for child in children:
        folder = Path(child.source_dir)
        assert folder == store.candidate_dir(child.id) / "fakevar"
        text = (folder / "kernel.cu").read_text()
        assert f"// edit_proposer: child {child.id} of {child.parents[0]}" in text
        assert child.lever["edited"] == ["kernel.cu"] and child.lever["proposer"].endswith("edit_proposer.py")
        assert child.id in evaluator.built and child.id in evaluator.gated and child.id in evaluator.measured
        assert (store.candidate_dir(child.id) / "proposer.log").read_text().startswith("$ ")
    first = next(c for c in children if c.generation == 0)
    request = json.loads((store.candidate_dir(first.id) / "proposal_request.json").read_text())
    assert request["protocol"] == 1 and request["variant"] == "fakevar" and request["child_id"] == first.id
    assert set(request["parent"]["sources"]) == {"variant.yaml", "kernel.cu"}
    assert request["parent"]["bottlenecks"] == {"findings": [{"id": "low_occupancy", "severity": 0.7}],
                                                "from": "analysis.json"}
    assert "top finding low_occupancy" in Path(first.source_dir, "kernel.cu").read_text()
    assert request["tunables"]["block"]["define"] == "FAKEVAR_BLOCK"
    later = next(c for c in children if c.generation == 1)
    request = json.loads((store.candidate_dir(later.id) / "proposal_request.json").read_text())
    assert request["parent"]["bench"]["fitness"] == 1.0  # the parent was measured before it bred
    assert request["parent"]["source_dir"] == str(state.candidates[later.parents[0]].source_dir or
                                                  tmp_path / "kernels" / "fakevar")


def test_a_failing_proposer_is_a_recorded_rejection(tmp_path, monkeypatch):
    monkeypatch.setenv("EDIT_PROPOSER_FAIL", "1")
    state, store, evaluator = proposer_search(tmp_path, generations=1)
    rejected = {cid: o for cid, o in state.outcomes.items() if o["status"] == "rejected"}
    assert len(rejected) == 2 and set(evaluator.built) == {DEFAULTS_ID}
    for outcome in rejected.values():
        assert outcome["gate"] == "proposer"
        assert outcome["reason"] == "the proposer exited with status 3: edit_proposer: asked to fail"


def test_a_child_that_is_not_a_variant_is_rejected_with_the_reason(tmp_path):
    from evo_sdpa.candidates import command_child_maker
    from evo_sdpa.variants import load_variant

    base = load_variant(fake_variant(tmp_path))
    store = Store(tmp_path / "search")
    writer = tmp_path / "bad_proposer.py"
    writer.write_text("import json, pathlib, sys\nr = json.loads(pathlib.Path(sys.argv[1]).read_text())\n"
                      "d = pathlib.Path(r['child_dir']); d.mkdir()\n(d / 'variant.yaml').write_text('name: other\\n')\n")
    maker = command_child_maker(f"{sys.executable} {writer}", 60, base, store, lambda c: base, LOG)
    child = maker(evolve.defaults_candidate(space_of(base.meta["tunables"])), "g00-c01", 0, None)
    assert child.proposal_error.startswith("the proposer's child is not a valid variant: ")
    assert "variant.yaml" in child.proposal_error


@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="needs nvcc")
def test_stage_script_with_a_proposer_command_builds_its_children_without_a_gpu(tmp_path):
    """scripts/evolve_variant.py on a host without a GPU: the configured proposer command writes the
    first generation's children, the build stage's code builds them, best.json says the search
    itself needs a GPU."""
    import subprocess

    from pipeline_helpers import CPU_ENV

    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["evolve"].update(population=3, proposer={"command": f"{sys.executable} {PROPOSER}", "timeout_s": 120})
    (tmp_path / "env.json").write_text(json.dumps({"device": None, "ceilings": None}))
    (tmp_path / "analysis.json").write_text(json.dumps({"status": "skipped", "reasons": ["not profiled"]}))
    out = tmp_path / "evolve" / "v1_scalar"
    proc = subprocess.run([sys.executable, "scripts/evolve_variant.py", "--variant", "v1_scalar",
                           "--env", str(tmp_path / "env.json"), "--analysis", str(tmp_path / "analysis.json"),
                           "--compute-capability", "8.9", "--device", "cpu", "--jobs", "2",
                           "--config-json", json.dumps(cfg), "--best", str(out / "best.json"),
                           "--curve", str(out / "curve.json")],
                          cwd=REPO, env=CPU_ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    best = json.loads((out / "best.json").read_text())
    assert best["status"] == "skipped" and "no CUDA device" in best["reasons"][0]
    rows = best["checked"]["first_generation"]
    assert [row["origin"] for row in rows] == ["defaults", "proposer", "proposer"]
    assert best["checked"]["builds"] == {"pass": 3}
    for row in rows[1:]:
        assert row["lever"]["edited"] == ["kernel.cu"]
        child = out / "candidates" / row["id"] / "v1_scalar"
        assert f"edit_proposer: child {row['id']} of g00-c00" in (child / "kernel.cu").read_text()
        verdict = json.loads((out / "candidates" / row["id"] / "build" / "verdict.json").read_text())
        assert str(child / "kernel.cu") in verdict["command"]


def test_a_candidates_kernel_runs_in_a_process_of_its_own(tmp_path, monkeypatch):
    """A Triton candidate builds in its own process (here: imported under the interpreter, its
    tunables recorded); a step whose process ends without a record is that step's failure, named
    with the process's last line, and the search goes on."""
    from evo_sdpa.candidates import PipelineEvaluator, StageConfig
    from evo_sdpa.variants import KERNELS_DIR, load_variant

    monkeypatch.setenv("EVO_SDPA_FORCE_CPU", "1")
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    (tmp_path / "env.json").write_text(json.dumps({"ceilings": None}))
    store = Store(tmp_path / "search")
    triton = load_variant(KERNELS_DIR / "triton_flash")
    evaluator = PipelineEvaluator(triton, store, StageConfig("9.0", cfg), str(tmp_path / "env.json"), 2, LOG)
    child = Candidate("g00-c01", 0, {**evolve.defaults_candidate(space_of(triton.meta["tunables"])).tunables,
                                     "BLOCK_N": 32}, "mutation")
    verdict = evaluator.build([child])[child.id]
    assert verdict["status"] == "pass" and verdict["tunables"]["BLOCK_N"] == 32
    assert (store.candidate_dir(child.id) / "build" / "verdict.json").is_file()
    assert "--step build" in (store.candidate_dir(child.id) / "build.log").read_text()
    gate = evaluator.gate(child, verdict)  # no CUDA device: the process raises before any record
    assert gate["status"] == "fail"
    assert gate["reason"].startswith("the candidate's gate process ended (1) without a record: ")


def test_a_search_whose_defaults_fail_the_gates_stops_without_parents(tmp_path):
    state, evaluator, _ = run(tmp_path, FakeEvaluator(reject=lambda c: "planted"))
    assert state.stop["condition"] == "no_parents" and len(state.generations) == 1
    assert evaluator.measured == []
    assert summary("fake", state, None, [], 0.0)["reasons"] == ["no candidate was measured"]


def test_a_terminated_search_still_records_its_wall_time(tmp_path):
    """A timeout or a cancel sends SIGTERM: the evolve stage turns it into SystemExit, so the
    search's `finally` adds the session's wall time to the store and a resume's wall budget counts it."""
    import signal
    import subprocess
    import time

    scripts = Path(__file__).resolve().parents[1] / "scripts"
    child = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
sys.path.insert(0, {str(scripts)!r})
from pathlib import Path
from evo_sdpa.cli import exit_on_sigterm
from evo_sdpa.evolve import Store
store = Store(Path({str(tmp_path)!r}))
store.open({{"variant": "fake"}})
exit_on_sigterm()
try:
    Path({str(tmp_path / "ready")!r}).write_text("")
    time.sleep(60)
finally:
    store.add_wall_seconds(7.0)
"""])
    deadline = time.monotonic() + 30
    while not (tmp_path / "ready").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=30) == 128 + signal.SIGTERM
    assert Store(tmp_path).wall_seconds() == pytest.approx(7.0)


def test_the_search_never_proposes_a_ruled_out_combination(tmp_path):
    """A `tunable_constraints` entry (a combination that cannot build) is never a candidate; the
    same search without it proposes that combination."""
    forbid = [{"forbid": {"block": 128, "stages": 3}, "because": "planted: no room"}]
    cfg = settings(generations=6)

    def proposed(constraints) -> list[dict]:
        store = Store(tmp_path / str(bool(constraints)))
        store.open({"test": 1})
        state = search(SPACE, cfg, builtin_proposer(SPACE, cfg, constraints), FakeEvaluator(FakeClock()), store,
                       None, clock=FakeClock())
        return [c.tunables for c in state.candidates.values()]

    free = proposed([])
    assert any(t["block"] == 128 and t["stages"] == 3 for t in free)   # the landscape's peak
    held = proposed(forbid)
    assert held and not any(t["block"] == 128 and t["stages"] == 3 for t in held)


def test_the_final_checks_count_in_the_recorded_wall_time(tmp_path):
    """best.json's wall time is the search's and the final checks' (full tier, every sanitizer)."""
    clock = FakeClock()
    state, _, store = run(tmp_path, clock=clock)
    searched = store.wall_seconds()

    class SlowFinal(FakeEvaluator):
        def final_check(self, candidate, build):
            clock.now += 120.0
            return super().final_check(candidate, build)

    winner, _ = pick_winner(state, SlowFinal(), store, tries=2, clock=clock)
    assert winner is not None
    assert store.wall_seconds() == pytest.approx(searched + 120.0)


def test_an_interrupted_build_is_not_kept_so_a_resume_builds_it_again(tmp_path, monkeypatch):
    from evo_sdpa import candidates

    calls = []

    def fake_build(variant, cc, outdir, cutlass_include, tunables, jobs=None):
        calls.append(outdir)
        interrupted = len(calls) == 1
        verdict = {"status": "fail" if interrupted else "pass", "reasons": [], "artifact": None, "kind": "cuda"}
        if interrupted:
            verdict["interrupted"] = True
        return verdict, [], "log"

    monkeypatch.setattr(candidates, "build_variant", fake_build)

    class Stage:
        cc = "9.0"
        cfg = {"build": {}}

    out = tmp_path / "build"
    first = candidates.build_into(type("V", (), {"name": "fake"})(), {}, out, Stage())
    assert first["interrupted"] and not (out / "verdict.json").exists()
    second = candidates.build_into(type("V", (), {"name": "fake"})(), {}, out, Stage())
    assert second["status"] == "pass" and (out / "verdict.json").is_file()


def test_a_finished_search_read_back_after_its_final_checks_ends_where_it_ended(tmp_path):
    """The store's wall time grows with the final checks; a generation read back is judged at the
    wall time it ended with, so the replay neither stops early nor changes the winner."""
    clock = FakeClock()
    state, _, store = run(tmp_path, FakeEvaluator(clock, build_cost=10.0), clock=clock, wall_s=50.0, generations=3)
    assert state.stop["condition"] == "generations"
    store.add_wall_seconds(120.0)   # the final checks
    again, again_eval, _ = run(tmp_path, FakeEvaluator(FakeClock()), wall_s=50.0, generations=3)
    assert again_eval.measured == []
    assert again.stop["condition"] == "generations" and len(again.generations) == 3
    assert [g["best_id"] for g in again.generations] == [g["best_id"] for g in state.generations]


def test_a_stored_search_is_not_resumed_under_another_sanitizer_setting():
    """The final check runs the sanitizer as configured: a pass stored with it switched off must not
    be read back once it is on (Snakemake reruns the rule on the changed params; the search restarts)."""
    from evo_sdpa.candidates import StageConfig, fingerprint
    from evo_sdpa.variants import KERNELS_DIR, load_variant

    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    variant = load_variant(KERNELS_DIR / "v1_scalar")
    base = fingerprint(variant, "NVIDIA H100 80GB HBM3", StageConfig("9.0", cfg))
    off = fingerprint(variant, "NVIDIA H100 80GB HBM3", StageConfig("9.0", {**cfg, "stages": {**cfg["stages"], "sanitizer": False}}))
    padding = {**cfg, "sanitizer": {**cfg["sanitizer"], "padding_bytes": cfg["sanitizer"].get("padding_bytes", 256) * 2}}
    assert base != off and base != fingerprint(variant, "NVIDIA H100 80GB HBM3", StageConfig("9.0", padding))
    budgets = {**cfg, "evolve": {**cfg["evolve"], "generations": cfg["evolve"]["generations"] + 4}}
    assert base == fingerprint(variant, "NVIDIA H100 80GB HBM3", StageConfig("9.0", budgets))


def test_proposer_children_with_the_same_code_are_one_experiment():
    """Each proposer child has a folder of its own; two that hold the same code (by their sources'
    digest) with the same tunables are one experiment, so the second is not measured again."""
    def child(cid, folder, sources):
        return Candidate(cid, 1, {"block": 64}, "proposer", ["g00-c00"], {}, None, folder, None, sources)

    first, same, other = child("g01-c00", "/s/g01-c00/v", "abc"), child("g01-c01", "/s/g01-c01/v", "abc"), \
        child("g01-c02", "/s/g01-c02/v", "def")
    assert first.key == same.key and first.key != other.key
    made = iter([first, same, other])
    propose = command_proposer(lambda parent, cid, generation, insight: next(made))
    pool = [Candidate(DEFAULTS_ID, 0, {"block": 64}, "defaults")]
    children = propose(1, 0, 3, pool, lambda c: None, set(), random.Random(0))
    assert [c.proposal_error for c in children] == [
        None, "the proposer wrote a child identical to an earlier candidate", None]
    assert Candidate.from_dict({k: v for k, v in first.to_dict().items() if k != "sources"}).sources is None


def test_the_leaders_are_timed_again_before_one_wins(tmp_path):
    """g00-c00 (the defaults) scores 1.0; the search's luckiest timing is re-timed twice beside the
    defaults and the next two; the confirmed fitness decides, and is what best.json reports."""
    from evo_sdpa.evolve import confirm_leaders

    luck = {"g00-c01": [1.10, 0.99, 0.99, 1.0], "g00-c02": [1.05, 1.05, 1.06, 1.04], "g00-c03": [1.04, 1.04, None, 1.04]}

    class Retimed(FakeEvaluator):
        def measure(self, candidate, build):
            self.measured.append(candidate.id)
            values = luck.get(candidate.id, [1.0] * 4)
            value = values[self.measured.count(candidate.id) - 1]
            if value is None:
                return {"status": "fail", "gate": "recheck", "reason": "output differs on fresh inputs"}
            return {"status": "measured", "speedups": {"a fp16": value}}

    evaluator = Retimed(fitness=lambda t: 1.0)
    state, _, store = run(tmp_path, evaluator, generations=1, population=6, min_gain=0.01)
    confirmed = confirm_leaders(state, evaluator, store)
    assert list(confirmed) == [DEFAULTS_ID, "g00-c01", "g00-c02", "g00-c03"]
    assert confirmed["g00-c01"] == {"fitness": pytest.approx((0.99 * 0.99 * 1.0) ** (1 / 3)), "search": 1.10,
                                    "retimed": [0.99, 0.99, 1.0], "gpu_seconds": pytest.approx(0.0, abs=1.0)}
    assert confirmed["g00-c03"]["fitness"] is None   # a re-timing failed its re-check: it cannot win
    winner, _ = pick_winner(state, evaluator, store, 2, min_gain=0.01, confirmed=confirmed)
    assert winner == "g00-c02"
    won = summary("toy", state, winner, [], 0.0, confirmed)["winner"]
    assert won["search_fitness"] == pytest.approx(1.05) and won["fitness"] == pytest.approx((1.05 * 1.06 * 1.04) ** (1 / 3))
    assert won["over_defaults"] == pytest.approx(won["fitness"])
    measured = len(evaluator.measured)
    assert confirm_leaders(state, evaluator, store) == confirmed and len(evaluator.measured) == measured   # read back


def test_confirmation_takes_the_winners_curse_off_a_flat_landscape(tmp_path):
    """Every candidate is truly 1.0, timed with 1% noise: the search's single timings name a
    non-default winner in most of 40 seeded runs (34 here); timing the leaders again takes most of
    that back (8), and the median winner is the defaults."""
    import statistics

    from evo_sdpa.evolve import confirm_leaders, winner_order

    plain, checked, gains = 0, 0, []
    for seed in range(40):
        noise = random.Random(seed)
        evaluator = FakeEvaluator(fitness=lambda t: 1.0 + noise.gauss(0.0, 0.01))
        state, _, store = run(tmp_path / str(seed), evaluator, population=8, elites=2, generations=6, seed=seed,
                              min_gain=0.01)
        plain += winner_order(state, 0.01)[0] != DEFAULTS_ID
        confirmed = confirm_leaders(state, evaluator, store)
        order = winner_order(state, 0.01, confirmed)
        checked += order[0] != DEFAULTS_ID
        gains.append(confirmed[order[0]]["fitness"] / confirmed[DEFAULTS_ID]["fitness"])
    assert plain >= 28 and checked <= 12, (plain, checked)
    assert statistics.median(gains) < 1.005


def test_the_gpu_seconds_count_the_retimings_and_the_final_checks(tmp_path):
    """best.json's GPU seconds are the search's gates and timings, the leaders' re-timings and the
    final checks', each phase also alone; a resume reads the latter two back, not timing them again."""
    from evo_sdpa.evolve import confirm_leaders

    clock = FakeClock()

    class Final(FakeEvaluator):
        def final_check(self, candidate, build):
            clock.now += 90.0
            return super().final_check(candidate, build)

    evaluator = Final(clock=clock, gpu_cost=10.0, build_cost=5.0)
    state, _, store = run(tmp_path, evaluator, clock=clock, generations=1, population=6)
    search_gpu = state.gpu_seconds()
    assert search_gpu == pytest.approx(10.0 * len(evaluator.measured))
    confirmed = confirm_leaders(state, evaluator, store, clock=clock)
    assert [c["gpu_seconds"] for c in confirmed.values()] == [pytest.approx(30.0)] * 4   # 3 rounds of 10 s each
    winner, checks = pick_winner(state, evaluator, store, tries=2, clock=clock, confirmed=confirmed)
    assert checks[0]["gpu_seconds"] == pytest.approx(90.0)   # the build before it (5 s) is the host's
    best = summary("toy", state, winner, checks, store.wall_seconds(), confirmed)
    assert best["gpu_seconds_by_phase"] == {"search": pytest.approx(search_gpu), "confirm": 120.0, "final_checks": 90.0}
    assert best["gpu_seconds"] == pytest.approx(search_gpu + 120.0 + 90.0)
    again = Final(clock=clock)
    assert confirm_leaders(state, again, store, clock=clock) == confirmed
    assert pick_winner(state, again, store, tries=2, clock=clock, confirmed=confirmed)[1] == checks
    assert again.measured == [] and again.finals == []
