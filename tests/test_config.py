"""Config validation: the shipped configs pass; every mistake is one line naming the key and what is allowed."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from evo_sdpa import schema
from evo_sdpa.config import check_config, suite_shapes
from evo_sdpa.errors import StageError

REPO = Path(__file__).resolve().parents[1]


def deep_merge(base: dict, over: dict) -> dict:
    """What Snakemake does with a second --configfile: nested mappings merge, other values replace."""
    merged = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


@pytest.fixture(scope="module")
def shipped() -> dict:
    with open(REPO / "config" / "config.yaml") as handle:
        return yaml.safe_load(handle)


@pytest.fixture
def cfg(shipped) -> dict:
    return copy.deepcopy(shipped)


def error_of(config: dict) -> str:
    with pytest.raises(StageError) as info:
        check_config(config)
    message = str(info.value)
    assert "\n" not in message, f"not one line: {message!r}"
    assert message.startswith("config: "), message
    return message


# ---------------------------------------------------------------- configs that pass


def test_shipped_config_passes(cfg):
    assert check_config(cfg) is cfg
    labels = [s.label for s in suite_shapes(cfg, cfg["bench_suite"])]
    assert "B4_H16_S2048_D128_causal" in labels


def test_test_config_merged_over_shipped_passes(shipped):
    with open(REPO / "config" / "test.yaml") as handle:
        test_cfg = yaml.safe_load(handle)
    merged = deep_merge(shipped, test_cfg)
    assert check_config(merged) is merged
    # The merge really took the test values (and kept the shipped tiers beside the new one).
    assert merged["parity"]["cpu_tier"] == "tiny"
    assert {"quick", "full", "cpu", "tiny"} <= set(merged["parity"]["tiers"])
    assert merged["timing"]["min_samples"] == 5
    assert merged["dtypes"] == shipped["dtypes"]


# ---------------------------------------------------------------- schema errors


def test_unknown_top_level_key(cfg):
    cfg["timming"] = {"min_samples": 5}
    message = error_of(cfg)
    assert "'timming'" in message
    assert "not allowed" in message
    assert "allowed keys:" in message and "timing" in message.split("allowed keys:")[1]


def test_unknown_nested_key(cfg):
    cfg["timing"]["min_sampels"] = 10
    message = error_of(cfg)
    assert "timing.min_sampels" in message
    allowed = message.split("allowed keys:")[1]
    assert "min_samples" in allowed and "max_time_ms" in allowed


def test_dtype_not_allowed(cfg):
    cfg["dtypes"] = ["fp16", "fp32"]
    message = error_of(cfg)
    assert "dtypes[1]" in message
    assert "'fp32'" in message
    assert "fp16, bf16" in message


def test_negative_min_samples(cfg):
    cfg["timing"]["min_samples"] = -3
    message = error_of(cfg)
    assert "timing.min_samples" in message
    assert "-3" in message
    assert "minimum 5" in message


@pytest.mark.parametrize("path", [("timing",), ("timing", "rel_spread"), ("gates", "min_speedup")])
def test_missing_required_key(cfg, path):
    parent = cfg
    for key in path[:-1]:
        parent = parent[key]
    del parent[path[-1]]
    message = error_of(cfg)
    assert f"'{'.'.join(path)}'" in message
    assert "missing" in message


def test_head_dim_65_in_a_shape(cfg):
    cfg["shape_suites"]["canonical"][1]["D"] = 65
    message = error_of(cfg)
    assert "shape_suites.canonical[1].D" in message
    assert "65" in message
    assert "64" in message and "128" in message  # the allowed head dims


def test_variants_neither_all_nor_a_list(cfg):
    cfg["variants"] = "some"
    message = error_of(cfg)
    assert "'variants'" in message
    assert "'some'" in message
    assert "'all'" in message and "array" in message


def test_variants_list_passes(cfg):
    cfg["variants"] = ["v1_scalar"]
    check_config(cfg)


# ---------------------------------------------------------------- cross-key errors


def test_bench_suite_not_defined(cfg):
    cfg["bench_suite"] = "huge"
    message = error_of(cfg)
    assert "bench_suite" in message and "'huge'" in message
    assert "defined: canonical" in message


def test_baseline_suite_not_defined(cfg):
    cfg["baseline_suite"] = "nope"
    message = error_of(cfg)
    assert "baseline_suite" in message and "defined: canonical" in message


@pytest.mark.parametrize("key", ["tier", "cpu_tier"])
def test_parity_tier_not_defined(cfg, key):
    cfg["parity"][key] = "exhaustive"
    message = error_of(cfg)
    assert f"parity.{key}" in message and "'exhaustive'" in message
    assert "defined: cpu, full, quick" in message


def test_max_time_below_min_time(cfg):
    cfg["timing"]["min_time_ms"] = 500
    cfg["timing"]["max_time_ms"] = 100
    message = error_of(cfg)
    assert "timing.max_time_ms" in message and "timing.min_time_ms" in message


def test_max_time_equal_to_min_time_passes(cfg):
    cfg["timing"]["min_time_ms"] = cfg["timing"]["max_time_ms"] = 100
    check_config(cfg)


def test_source_names_the_file(cfg):
    cfg["dtypes"] = ["fp32"]
    with pytest.raises(StageError, match=r"^config/mine\.yaml: key 'dtypes\[0\]'"):
        check_config(cfg, source="config/mine.yaml")


# ---------------------------------------------------------------- schema helpers


def test_key_path_formats_nested_keys_and_indices():
    assert schema.key_path(["shape_suites", "canonical", 0, "D"]) == "shape_suites.canonical[0].D"
    assert schema.key_path([]) == "(top level)"


def test_with_defaults_fills_nested_defaults():
    toy = {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "default": 1},
            "outer": {
                "type": "object",
                "default": {},
                "properties": {
                    "b": {"type": "string", "default": "x"},
                    "inner": {"type": "object", "default": {},
                              "properties": {"c": {"type": "array", "default": [1, 2]}}},
                },
            },
            "kept": {"type": "object", "properties": {"d": {"type": "boolean", "default": True}}},
        },
    }
    given = {"a": 5, "kept": {}}
    filled = schema.with_defaults(given, toy)
    assert filled == {"a": 5, "outer": {"b": "x", "inner": {"c": [1, 2]}}, "kept": {"d": True}}
    assert given == {"a": 5, "kept": {}}, "with_defaults must not modify its input"
    filled["outer"]["inner"]["c"].append(3)
    assert toy["properties"]["outer"]["properties"]["inner"]["properties"]["c"]["default"] == [1, 2]


def test_with_defaults_on_the_variant_schema():
    meta = {"name": "x", "kind": "cuda", "description": "d", "sources": ["k.cu"],
            "support": {"dtypes": ["fp16"], "head_dims": [64], "causal": [False]}}
    filled = schema.with_defaults(meta, schema.load_schema("variant.schema.yaml"))
    assert filled["kernel_regex"] == ".*"
    assert filled["build"] == {"nvcc_flags": [], "allow_warnings": False, "allow_spills": False,
                               "requires": [], "merge_units": False, "sass_expect": []}
    assert filled["support"]["max_seq_len"] is None
    assert filled["support"]["min_compute_capability"] == "8.0"
    assert filled["support"]["layouts"] == ["bhsd"]
    assert filled["tunables"] == {}


# ---------------------------------------------------------------- the large suite, build.cutlass_include


def test_large_suite_is_the_hopper_shapes_none_graph_timed(cfg):
    labels = [s.label for s in suite_shapes(cfg, "large")]
    assert labels == ["B4_H16_S2048_D128_causal", "B1_H8_S4096_D128_causal", "B16_H16_S4096_D128_full",
                      "B8_H16_S1024_D64_full", "B2_H16_S2048_D64_causal"]
    assert not any(entry.get("graph") for entry in cfg["shape_suites"]["large"])
    assert cfg["bench_suite"] == "canonical"
    cfg["bench_suite"] = "large"
    assert check_config(cfg) is cfg


def test_small_suite_is_the_launch_bound_shapes_all_graph_timed(cfg):
    labels = [s.label for s in suite_shapes(cfg, "small")]
    assert labels == ["B1_H8_S512_D64_full", "B2_H8_S512_D64_full", "B1_H8_S256_D64_full",
                      "B4_H8_S512_D64_full", "B1_H16_S1024_D64_full", "B1_H8_S512_D128_full"]
    assert all(entry.get("graph") for entry in cfg["shape_suites"]["small"])


@pytest.mark.parametrize("overlay", ["hopper.yaml", "small.yaml", "test.yaml"])
def test_shipped_overlays_pass_over_the_base_config(shipped, overlay):
    with open(REPO / "config" / overlay) as handle:
        merged = deep_merge(shipped, yaml.safe_load(handle))
    assert check_config(merged) is merged
    assert merged["bench_suite"] in merged["shape_suites"]


def test_cutlass_include_defaults_to_null_and_takes_a_path(cfg):
    assert cfg["build"]["cutlass_include"] is None
    cfg["build"]["cutlass_include"] = "/opt/cutlass/include"
    assert check_config(cfg) is cfg


@pytest.mark.parametrize(("value", "allowed"), [(3, "expected ['null', 'string']"), ("", "")])
def test_cutlass_include_rejects_junk(cfg, value, allowed):
    cfg["build"]["cutlass_include"] = value
    message = error_of(cfg)
    assert message.startswith(f"config: key 'build.cutlass_include': {value!r} is not valid"), message
    assert allowed in message


# ---------------------------------------------------------------- evolve


def test_evolve_settings_are_read_as_the_search_reads_them(cfg):
    from evo_sdpa.evolve import Settings

    settings = Settings.from_config(cfg["evolve"])
    assert cfg["evolve"]["suite"] == "canonical" and cfg["evolve"]["proposer"] == "builtin"
    assert settings.gpu_s == 60.0 * cfg["evolve"]["budgets"]["gpu_minutes"]
    assert settings.patience == cfg["evolve"]["budgets"]["no_improvement_generations"]


def test_evolve_unknown_key(cfg):
    cfg["evolve"]["populaton"] = 4
    message = error_of(cfg)
    assert "'evolve.populaton'" in message and "population" in message.split("allowed keys:")[1]


def test_evolve_budget_unknown_key(cfg):
    cfg["evolve"]["budgets"]["gpu_hours"] = 1
    assert "'evolve.budgets.gpu_hours'" in error_of(cfg)


@pytest.mark.parametrize("key,value,allowed", [
    ("population", 1, "minimum 2"),
    ("max_levers", 3, "maximum 2"),
    ("crossover_rate", 1.5, "maximum 1"),
    ("dtypes", ["fp8"], "fp16, bf16"),
])
def test_evolve_values_out_of_range(cfg, key, value, allowed):
    cfg["evolve"][key] = value
    message = error_of(cfg)
    assert f"evolve.{key}" in message and allowed in message


def test_evolve_proposer_is_builtin_or_a_command(cfg):
    cfg["evolve"]["proposer"] = "llm"
    message = error_of(cfg)
    assert "'evolve.proposer'" in message and "'builtin' or a object" in message
    cfg["evolve"]["proposer"] = {"command": "python3 tests/fixtures/proposer/edit_proposer.py", "timeout_s": 60}
    check_config(cfg)
    cfg["evolve"]["proposer"] = {"cmd": "x"}
    assert "'evolve.proposer'" in error_of(cfg)


def test_evolve_suite_and_tiers_must_exist(cfg):
    cfg["evolve"]["suite"] = "huge"
    assert error_of(cfg) == "config: key 'evolve.suite': 'huge' is not a shape suite (defined: canonical, large, small)"
    cfg["evolve"]["suite"] = "large"
    cfg["evolve"]["final_tier"] = "exhaustive"
    assert error_of(cfg) == ("config: key 'evolve.final_tier': 'exhaustive' is not a parity tier "
                             "(defined: cpu, full, quick)")


def test_evolve_elites_below_population(cfg):
    cfg["evolve"]["elites"] = cfg["evolve"]["population"]
    assert error_of(cfg) == ("config: key 'evolve.elites': 8 must be below evolve.population (8), "
                             "or no child is ever proposed")


def test_evolve_is_required(cfg):
    del cfg["evolve"]
    assert error_of(cfg) == "config: key 'evolve' is missing (add it)"


@pytest.mark.parametrize("key, value, allowed", [("regression_threshold", -0.1, "minimum 0"),
                                                 ("regression_threshold", "2%", "expected number"),
                                                 ("regression_noise_iqr", -1, "minimum 0")])
def test_regression_gate_keys_are_checked(cfg, key, value, allowed):
    cfg["gates"][key] = value
    message = error_of(cfg)
    assert f"'gates.{key}'" in message and allowed in message


def test_shipped_regression_threshold_is_two_percent(shipped):
    assert shipped["gates"]["regression_threshold"] == 0.02
