"""The validated pipeline configuration and the views the stages take of it."""
from __future__ import annotations

from .errors import StageError
from .schema import load_yaml, validate
from .shapes import Shape
from .variants import REPO

CONFIG_SCHEMA = "config.schema.yaml"


def load_repo_config() -> dict:
    """config/config.yaml of this checkout, checked as the pipeline checks it (the tools beside
    the pipeline read it: ab_sweep.py, trace_v5.py)."""
    return check_config(load_yaml((REPO / "config" / "config.yaml").read_text()), "config/config.yaml")


def check_config(config: dict, source: str = "config") -> dict:
    """Schema check plus the cross-key checks a schema cannot express. Returns the config."""
    validate(config, CONFIG_SCHEMA, source)
    suites = config["shape_suites"]
    for key in ("baseline_suite", "bench_suite"):
        if config[key] not in suites:
            raise StageError(f"{source}: key '{key}': {config[key]!r} is not a shape suite "
                             f"(defined: {', '.join(sorted(suites))})")
    tiers = config["parity"]["tiers"]
    for key in ("tier", "cpu_tier"):
        if config["parity"][key] not in tiers:
            raise StageError(f"{source}: key 'parity.{key}': {config['parity'][key]!r} is not a "
                             f"parity tier (defined: {', '.join(sorted(tiers))})")
    if config["timing"]["max_time_ms"] < config["timing"]["min_time_ms"]:
        raise StageError(f"{source}: key 'timing.max_time_ms' must be at least timing.min_time_ms")
    check_evolve(config["evolve"], suites, tiers, source)
    return config


def check_evolve(evolve: dict, suites: dict, tiers: dict, source: str) -> None:
    if evolve["suite"] not in suites:
        raise StageError(f"{source}: key 'evolve.suite': {evolve['suite']!r} is not a shape suite "
                         f"(defined: {', '.join(sorted(suites))})")
    for key in ("gate_tier", "final_tier"):
        if evolve[key] not in tiers:
            raise StageError(f"{source}: key 'evolve.{key}': {evolve[key]!r} is not a parity tier "
                             f"(defined: {', '.join(sorted(tiers))})")
    if evolve["elites"] >= evolve["population"]:
        raise StageError(f"{source}: key 'evolve.elites': {evolve['elites']} must be below evolve.population "
                         f"({evolve['population']}), or no child is ever proposed")


def suite_shapes(config: dict, suite: str) -> list[Shape]:
    return [Shape.from_dict(entry) for entry in config["shape_suites"][suite]]
