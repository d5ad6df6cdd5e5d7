"""A variant's tunables: `tunables:` in its variant.yaml is the one home of each knob's default and
range. The build resolves the values it builds with (the defaults, or overrides the caller gives,
each checked against the knob's declared values) and passes them to the kernel: `-D<define>=<value>`
for a CUDA variant, launch arguments for a Triton one."""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from .errors import StageError
from .variants import Variant

TunableValues = dict[str, int]

_DEFINE_FLAG = re.compile(r"^-D([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def declared(variant: Variant) -> dict[str, dict]:
    """name -> {values, default, define?, addresses, description?}, in variant.yaml's order."""
    return variant.meta.get("tunables") or {}


def constraints(variant: Variant) -> list[dict]:
    """The combinations variant.yaml rules out (`tunable_constraints`: forbid + because)."""
    return variant.meta.get("tunable_constraints") or []


def defaults(variant: Variant) -> TunableValues:
    return {name: spec["default"] for name, spec in declared(variant).items()}


def resolve(variant: Variant, overrides: Mapping[str, int] | None = None) -> TunableValues:
    """Every declared tunable's value: the default unless `overrides` names it. An override of an
    undeclared knob or with a value outside the knob's declared `values` is one line naming both."""
    specs = declared(variant)
    values = defaults(variant)
    for name, value in (overrides or {}).items():
        if name not in specs:
            raise StageError(f"{variant.name}: tunable {name!r} is not declared in its variant.yaml "
                             f"(declared: {', '.join(specs) or 'none'})")
        if value not in specs[name]["values"] or isinstance(value, bool):
            raise StageError(f"{variant.name}: tunable {name}={value!r} is not one of its declared values "
                             f"{specs[name]['values']} (extend `values` in variant.yaml to try it)")
        values[name] = value
    reason = ruled_out(constraints(variant), values)
    if reason:
        raise StageError(f"{variant.name}: {reason} (variant.yaml, tunable_constraints)")
    return values


def ruled_out(forbidden: Iterable[dict], values: Mapping[str, int]) -> str | None:
    """Why `values` cannot be built (the first `tunable_constraints` entry they match), or None."""
    for constraint in forbidden:
        forbid = constraint["forbid"]
        if all(values.get(name) == value for name, value in forbid.items()):
            combination = " with ".join(f"{name}={value}" for name, value in forbid.items())
            return f"{combination} is ruled out: {constraint['because']}"
    return None


def define_flags(variant: Variant, values: Mapping[str, int]) -> list[str]:
    """`-D<define>=<value>` for every tunable of a CUDA variant, in declaration order."""
    return [f"-D{spec['define']}={values[name]}" for name, spec in declared(variant).items()]


def changed(variant: Variant, values: Mapping[str, int]) -> TunableValues:
    """The values that differ from the declared defaults."""
    base = defaults(variant)
    return {name: value for name, value in values.items() if base.get(name) != value}


def parse_assignments(items: Iterable[str]) -> TunableValues:
    """`name=value` strings (a command line's --set) as {name: int}; one line naming a bad one."""
    values: TunableValues = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name.strip():
            raise StageError(f"--set {item!r}: expected NAME=VALUE (a tunable of variant.yaml and one of its values)")
        try:
            values[name.strip()] = int(text)
        except ValueError as exc:
            raise StageError(f"--set {item!r}: the value must be an integer") from exc
    return values


def split_define_flags(variant: Variant, flags: Iterable[str]) -> tuple[TunableValues, list[str]]:
    """Raw nvcc flags with the `-D<define>=<int>` of a declared tunable turned into overrides (so
    the build passes each macro once), and the remaining flags as given."""
    by_define = {spec["define"]: name for name, spec in declared(variant).items() if spec.get("define")}
    overrides: TunableValues = {}
    rest: list[str] = []
    for flag in flags:
        match = _DEFINE_FLAG.match(flag)
        if match and match.group(1) in by_define:
            try:
                overrides[by_define[match.group(1)]] = int(match.group(2))
                continue
            except ValueError as exc:
                raise StageError(f"{flag}: tunable {by_define[match.group(1)]!r} takes an integer") from exc
        rest.append(flag)
    return overrides, rest


def promote_defaults(yaml_text: str, values: Mapping[str, int]) -> str:
    """variant.yaml's text with each named tunable's `default:` set to the given value (comments
    and layout kept): how a search's winner becomes the variant's defaults."""
    lines = yaml_text.splitlines(keepends=True)
    todo = dict(values)
    section = knob = None
    for index, line in enumerate(lines):
        stripped = line.strip()
        if not line.startswith((" ", "\t")) and stripped and not stripped.startswith("#"):
            section = stripped.split(":", 1)[0]
            knob = None
            continue
        if section != "tunables" or not stripped or stripped.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        key = stripped.split(":", 1)[0]
        if indent == 2:
            knob = key
        elif knob in todo and key == "default":
            lines[index] = f"{line[:indent]}default: {todo.pop(knob)}\n"
    if todo:
        raise StageError(f"variant.yaml: no `default:` line found for tunable(s) {', '.join(sorted(todo))} "
                         "(expected two-space knob names under `tunables:`)")
    return "".join(lines)
