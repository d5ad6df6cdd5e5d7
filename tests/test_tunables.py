"""Tunables: variant.yaml is the one home of each knob's default and range. The schema checks
(one line naming the file and field), the values a build resolves and passes, the real kernels
holding no second copy of a default, the A/B sweep's --set, and promoting a winner's values."""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from evo_sdpa.errors import StageError
from evo_sdpa.tunables import (changed, declared, defaults, define_flags, parse_assignments, promote_defaults,
                               resolve, split_define_flags)
from evo_sdpa.variants import discover, load_variant

REPO = Path(__file__).resolve().parents[1]


def write_variant(root: Path, kind: str = "cuda", tunables: dict | None = None, name: str = "alpha") -> Path:
    folder = root / "kernels" / name
    folder.mkdir(parents=True)
    entry = "kernel.cu" if kind == "cuda" else "kernel.py"
    (folder / entry).write_text("// source\n")
    meta = {"name": name, "kind": kind, "description": "a tunables test variant", "sources": [entry],
            "support": {"dtypes": ["fp16"], "head_dims": [64], "causal": [False]}}
    if tunables is not None:
        meta["tunables"] = tunables
    (folder / "variant.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    return folder


def error(folder: Path) -> str:
    with pytest.raises(StageError) as info:
        load_variant(folder)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"kernels/{folder.name}/variant.yaml: "), message
    return message


KNOBS = {"stages": {"values": [2, 3], "default": 3, "define": "ALPHA_STAGES", "addresses": ["memory_stalls"]},
         "block_n": {"values": [32, 64], "default": 64, "define": "ALPHA_BLOCK_N"}}


# ---------------------------------------------------------------- schema


def test_a_cuda_tunable_names_its_macro(tmp_path):
    variant = load_variant(write_variant(tmp_path, tunables=KNOBS))
    assert declared(variant)["block_n"]["addresses"] == []  # filled in
    assert defaults(variant) == {"stages": 3, "block_n": 64}


def test_a_cuda_tunable_without_define(tmp_path):
    knobs = {"stages": {"values": [2, 3], "default": 3}}
    assert error(write_variant(tmp_path, tunables=knobs)) == (
        "kernels/alpha/variant.yaml: field 'tunables.stages.define' is missing: a CUDA tunable names the macro "
        "the build passes as -D<define>=<value>")


def test_a_triton_tunable_takes_no_define(tmp_path):
    knobs = {"BLOCK_M": {"values": [64], "default": 64, "define": "BLOCK_M"}}
    assert "field 'tunables.BLOCK_M.define': a triton tunable reaches the kernel as a launch argument" in \
        error(write_variant(tmp_path, kind="triton", tunables=knobs))


def test_a_default_outside_its_values(tmp_path):
    knobs = {"stages": {"values": [2, 3], "default": 4, "define": "ALPHA_STAGES"}}
    assert error(write_variant(tmp_path, tunables=knobs)) == (
        "kernels/alpha/variant.yaml: field 'tunables.stages.default': 4 is not one of its values [2, 3]")


def test_one_macro_for_two_tunables(tmp_path):
    knobs = {"a": {"values": [1], "default": 1, "define": "ALPHA_X"}, "b": {"values": [1], "default": 1, "define": "ALPHA_X"}}
    assert "field 'tunables.b.define': 'ALPHA_X' is already the macro of tunable 'a'" in \
        error(write_variant(tmp_path, tunables=knobs))


@pytest.mark.parametrize("spec,where", [
    ({"values": [2, 3], "default": 3, "define": "ALPHA_S", "addresses": ["speed"]}, "tunables.stages.addresses[0]"),
    ({"values": ["two"], "default": 3, "define": "ALPHA_S"}, "tunables.stages.values[0]"),
    ({"values": [2, 3], "default": 3, "define": "lower_case"}, "tunables.stages.define"),
    ({"values": [2, 3], "default": {"D64": 3}, "define": "ALPHA_S"}, "tunables.stages.default"),
    ({"values": [2, 3], "default": 3, "define": "ALPHA_S", "dfeault": 2}, "tunables.stages.dfeault"),
])
def test_schema_names_the_field(tmp_path, spec, where):
    assert f"'{where}'" in error(write_variant(tmp_path, tunables={"stages": spec}))


# ---------------------------------------------------------------- values a build resolves


def test_resolve_defaults_and_overrides(tmp_path):
    variant = load_variant(write_variant(tmp_path, tunables=KNOBS))
    assert resolve(variant) == {"stages": 3, "block_n": 64}
    assert resolve(variant, {"block_n": 32}) == {"stages": 3, "block_n": 32}
    assert define_flags(variant, resolve(variant, {"stages": 2})) == ["-DALPHA_STAGES=2", "-DALPHA_BLOCK_N=64"]
    assert changed(variant, {"stages": 2, "block_n": 64}) == {"stages": 2}


def test_resolve_rejects_what_is_not_declared(tmp_path):
    variant = load_variant(write_variant(tmp_path, tunables=KNOBS))
    with pytest.raises(StageError) as info:
        resolve(variant, {"stages": 4})
    assert str(info.value) == ("alpha: tunable stages=4 is not one of its declared values [2, 3] "
                               "(extend `values` in variant.yaml to try it)")
    with pytest.raises(StageError, match=r"^alpha: tunable 'stage' is not declared in its variant.yaml "
                                         r"\(declared: stages, block_n\)$"):
        resolve(variant, {"stage": 2})


def test_set_assignments_and_define_flags_become_overrides(tmp_path):
    variant = load_variant(write_variant(tmp_path, tunables=KNOBS))
    assert parse_assignments(["stages=2", " block_n =32"]) == {"stages": 2, "block_n": 32}
    for bad, text in (("stages", "expected NAME=VALUE"), ("stages=two", "must be an integer")):
        with pytest.raises(StageError, match=text):
            parse_assignments([bad])
    assert split_define_flags(variant, ["-DALPHA_STAGES=2", "-lineinfo", "-DOTHER=1"]) == (
        {"stages": 2}, ["-lineinfo", "-DOTHER=1"])


def test_promote_rewrites_only_the_defaults(tmp_path):
    text = (REPO / "kernels" / "v4_pipelined" / "variant.yaml").read_text()
    promoted = promote_defaults(text, {"stages": 2, "key_split": 0})
    before, after = yaml.safe_load(text), yaml.safe_load(promoted)
    assert after["tunables"]["stages"]["default"] == 2 and after["tunables"]["key_split"]["default"] == 0
    after["tunables"]["stages"]["default"], after["tunables"]["key_split"]["default"] = 3, 1
    assert after == before
    assert len(promoted.splitlines()) == len(text.splitlines())
    with pytest.raises(StageError, match="no `default:` line found for tunable\\(s\\) nope"):
        promote_defaults(text, {"nope": 1})


def test_promote_script_refuses_a_winner_without_tunables(tmp_path):
    best = tmp_path / "best.json"
    best.write_text(json.dumps({"variant": "v4_pipelined", "status": "measured", "winner": {"id": "g1"}}))
    yaml_before = (REPO / "kernels" / "v4_pipelined" / "variant.yaml").read_bytes()
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "promote_tunables.py"), "--variant", "v4_pipelined",
                          "--best", str(best)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    assert run.stderr.strip() == (f"evo-sdpa: {best}: its winner 'g1' names no tunables (a best.json the evolve "
                                  "rule did not write?); rerun that rule to write it again")
    assert (REPO / "kernels" / "v4_pipelined" / "variant.yaml").read_bytes() == yaml_before


def test_promote_script_moves_only_what_the_search_changed(tmp_path):
    """A default edited by hand after the search (stages 3 -> 2) stays; the knob the search moved
    (block_n 64 -> 32) is promoted. Run on a copy of the tree: the real variant.yaml is never written."""
    import shutil

    for folder in ("scripts", "workflow/schemas", "kernels/v4_pipelined", "kernels/common"):
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    meta = tmp_path / "kernels/v4_pipelined/variant.yaml"
    meta.write_text(meta.read_text().replace("values: [2, 3]\n    default: 3", "values: [2, 3]\n    default: 2"))
    best = tmp_path / "best.json"
    winner = {"id": "g02-c03", "tunables": {"stages": 3, "block_n": 32, "min_ctas_d64": 3, "key_split": 1,
                                            "cluster_split": 1},
              "changed_from_defaults": {"block_n": 32}}
    best.write_text(json.dumps({"variant": "v4_pipelined", "status": "pass", "winner": winner}))
    run = subprocess.run([sys.executable, "scripts/promote_tunables.py", "--variant", "v4_pipelined",
                          "--best", str(best)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    tunables = yaml.safe_load(meta.read_text())["tunables"]
    assert (tunables["block_n"]["default"], tunables["stages"]["default"]) == (32, 2)


# ---------------------------------------------------------------- the real kernels


CUDA_VARIANTS = [v for v in discover().values() if v.kind == "cuda"]


@pytest.mark.parametrize("variant", CUDA_VARIANTS, ids=lambda v: v.name)
def test_each_macro_has_no_second_default_in_the_sources(variant):
    """Every tunable is passed by the build; a source may only stop (#error) when it is missing."""
    text = "\n".join(path.read_text() for path in variant.sources)
    assert declared(variant), f"{variant.name} declares no tunables"
    for name, spec in declared(variant).items():
        macro = spec["define"]
        assert not re.search(rf"#\s*define\s+{macro}\b", text), f"{variant.name}: a second default of {macro}"
        guard = re.search(rf"#ifndef {macro}\n#error \"{macro} undefined: [^\n]*tunables\.{name}\)", text)
        assert guard, f"{variant.name}: no #error guard for {macro}"
        assert re.search(rf"\b{macro}\b", text.replace(guard.group(0), "")), f"{variant.name}: {macro} unused"


def test_v5_defaults_are_the_ones_tunables_cuh_held():
    """The values of kernels/v5_hopper/tunables.cuh before it lost its fallbacks (V5_HOPPER_STAGES_D64
    fell back to V5_HOPPER_STAGES, 2), and the knobs added since at the defaults their runs chose
    (pdl: NOTES.md, runs 20-23; key_split: run 29; free_issue_d128_min_keys: runs 53-59; q_buffers_d64:
    run 62; q_buffers: run 67; lazy_rescale: runs 67, 80 and 83; tail_split_min_keys: runs 77-78;
    split_stages_d64: runs 125-126; split_block_n_d128: runs 153-154; split_wide: runs 209-215;
    evict_first_inputs: run 249; split_burst_gap and split_burst_gap2: runs 256-261)."""
    v5 = load_variant(REPO / "kernels" / "v5_hopper")
    assert defaults(v5) == {"fast_exp2": 1, "stages": 2, "stages_d64": 2, "block_n": 128, "block_m_d64_full": 128,
                            "block_m_d64_causal": 128, "block_n_d128_full": 128, "persistent": 2,
                            "persistent_min_waves": 3, "pingpong": 1, "tma_epilogue": 1,
                            "pingpong_full": 1, "q_buffers": 2, "q_buffers_d64": 2,
                            "lazy_rescale": 4, "max_chains": 4, "max_chains_d64": 1,
                            "sum_chains": 1, "key_split": 1, "split_block_m": 64, "split_block_n": 64, "split_block_n_d128": 128, "split_stages_d64": 4, "split_ctas_per_sm": 2,
                            "split_wide": 0, "pdl": 2,
                            "causal_order": 3, "free_issue_d128_min_keys": 1024, "kv_producers": 1,
                            "tail_split_min_keys": 1024, "evict_first_inputs": 1, "split_burst_gap": 600,
                            "split_burst_gap2": 400}


def test_v4_defaults_are_the_ones_its_header_held():
    v4 = load_variant(REPO / "kernels" / "v4_pipelined")
    assert define_flags(v4, defaults(v4)) == [
        "-DV4_PIPELINED_STAGES=3", "-DV4_PIPELINED_BLOCK_N=64", "-DV4_PIPELINED_MIN_CTAS_D64=3",
        "-DV4_PIPELINED_KEY_SPLIT=1", "-DV4_PIPELINED_CLUSTER_SPLIT=1", "-DV4_PIPELINED_CLUSTER_KEY_GROUPS_D64=2",
        "-DV4_PIPELINED_SPLIT_CTAS_PER_SM=1", "-DV4_PIPELINED_PDL=1",
        "-DV4_PIPELINED_ROW_WARPS_D128=4", "-DV4_PIPELINED_CARVEOUT_HINT=1",
        "-DV4_PIPELINED_ISSUE_AFTER_SCORES=0"]


# ---------------------------------------------------------------- the A/B sweep's --set


def ab_sweep():
    spec = importlib.util.spec_from_file_location("ab_sweep_under_test", REPO / "scripts" / "ab_sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ab_sweep_set_and_flags_attach_to_the_last_config():
    module = ab_sweep()
    args = module.argument_parser().parse_args(
        ["--variant", "v4_pipelined", "--out", "x.json", "--config", "default", "--config", "s2",
         "--set", "stages=2", "--flags", "-DV4_PIPELINED_BLOCK_N=32 -lineinfo"])
    assert args.configs == [{"name": "default", "set": [], "flags": []},
                            {"name": "s2", "set": ["stages=2"], "flags": ["-DV4_PIPELINED_BLOCK_N=32", "-lineinfo"]}]
    v4 = load_variant(REPO / "kernels" / "v4_pipelined")
    assert module.overrides_of(v4, args.configs[0]) == ({}, [])
    assert module.overrides_of(v4, args.configs[1]) == ({"block_n": 32, "stages": 2}, ["-lineinfo"])
    with pytest.raises(StageError, match="stages=5 is not one of its declared values"):
        module.overrides_of(v4, {"name": "bad", "set": ["stages=5"], "flags": []})


def test_ab_sweep_set_before_any_config_is_an_error(capsys):
    with pytest.raises(SystemExit):
        ab_sweep().argument_parser().parse_args(["--variant", "v", "--out", "x", "--set", "stages=2"])
    assert "--set 'stages=2' comes before any --config NAME" in capsys.readouterr().err


def test_a_ruled_out_combination_is_refused_in_one_line_naming_why(tmp_path):
    v5 = load_variant(REPO / "kernels" / "v5_hopper")
    with pytest.raises(StageError, match=r"stages=3 with tma_epilogue=1 is ruled out: .*shared memory"):
        resolve(v5, {"stages": 3})
    with pytest.raises(StageError, match=r"stages=3 with q_buffers=2 is ruled out: .*shared memory"):
        resolve(v5, {"stages": 3, "tma_epilogue": 0})
    assert resolve(v5, {"stages": 3, "tma_epilogue": 0, "q_buffers": 1})["stages"] == 3


@pytest.mark.parametrize("constraint, message", [
    ({"forbid": {"nope": 1}, "because": "x"}, "'nope' is not a declared tunable"),
    ({"forbid": {"stages": 7}, "because": "x"}, "stages=7 is not one of its values"),
    ({"forbid": {"stages": 2}, "because": "x"}, "rules out the declared defaults"),
    ({"forbid": {"stages": 3}}, "because"),
])
def test_a_bad_constraint_is_one_line_naming_the_field(tmp_path, constraint, message):
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "kernel.cu").write_text("// empty\n")
    (folder / "variant.yaml").write_text(yaml.safe_dump({
        "name": "tiny", "kind": "cuda", "description": "a test variant", "sources": ["kernel.cu"],
        "kernel_regex": "tiny",
        "support": {"dtypes": ["fp16"], "head_dims": [64], "causal": [False]},
        "tunables": {"stages": {"values": [2, 3], "default": 2, "define": "TINY_STAGES"}},
        "tunable_constraints": [constraint]}))
    with pytest.raises(StageError, match=message) as info:
        load_variant(folder)
    assert "\n" not in str(info.value) and "variant.yaml" in str(info.value)
