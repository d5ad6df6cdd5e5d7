"""JSON-schema validation that ends in one line naming the key, the bad value and what is allowed."""
from __future__ import annotations

import copy
from functools import lru_cache
from pathlib import Path

import jsonschema
import yaml

from .errors import StageError

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "workflow" / "schemas"


# libyaml's loader where PyYAML was built with it: every snakemake call (a dry run included) reads
# each variant.yaml and schema, and the pure-Python loader was most of that time.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(text):
    """yaml.safe_load, through libyaml when available (the same safe subset of YAML)."""
    return yaml.load(text, Loader=_SAFE_LOADER)


@lru_cache(maxsize=None)
def load_schema(name: str) -> dict:
    with open(SCHEMA_DIR / name) as handle:
        return load_yaml(handle)


def key_path(path) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _allowed(error: jsonschema.ValidationError) -> str:
    schema = error.schema
    if error.validator == "additionalProperties":
        return "allowed keys: " + ", ".join(sorted(schema.get("properties", {})))
    if error.validator == "required":
        return "add it"
    if error.validator in ("enum", "const"):
        options = schema.get("enum", [schema.get("const")])
        return "allowed: " + ", ".join(str(o) for o in options)
    if error.validator == "oneOf":
        parts = []
        for sub in schema["oneOf"]:
            parts.append(repr(sub["const"]) if "const" in sub else f"a {sub.get('type', 'value')}")
        return "allowed: " + " or ".join(parts)
    if error.validator == "type":
        return f"expected {schema['type']}"
    if error.validator in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return f"{error.validator} {schema[error.validator]}"
    if error.validator == "pattern":
        return f"must match {schema['pattern']}"
    return error.message


def describe(error: jsonschema.ValidationError) -> str:
    """One line for the most relevant error: '<key>: <problem> (<what is allowed>)'."""
    if error.validator == "additionalProperties":
        known = set(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - known)
        where = key_path(list(error.absolute_path) + [extra[0]]) if extra else key_path(error.absolute_path)
        return f"key '{where}' is not allowed ({_allowed(error)})"
    if error.validator == "required":
        missing = [k for k in error.validator_value if k not in error.instance][0]
        return f"key '{key_path(list(error.absolute_path) + [missing])}' is missing ({_allowed(error)})"
    return f"key '{key_path(error.absolute_path)}': {error.instance!r} is not valid ({_allowed(error)})"


def validate(instance: dict, schema_name: str, source: str) -> None:
    """Raise StageError naming `source` and the first offending key; return None when valid."""
    validator = jsonschema.Draft202012Validator(load_schema(schema_name))
    errors = list(validator.iter_errors(instance))
    if errors:
        best = jsonschema.exceptions.best_match(errors)
        raise StageError(f"{source}: {describe(best)}")


def with_defaults(instance: dict, schema: dict) -> dict:
    """A copy of `instance` with every absent property that has a schema default filled in."""
    result = copy.deepcopy(instance)
    for key, sub in schema.get("properties", {}).items():
        if key not in result and "default" in sub:
            result[key] = copy.deepcopy(sub["default"])
        if isinstance(result.get(key), dict) and sub.get("type") == "object":
            result[key] = with_defaults(result[key], sub)
    return result
