"""Which library files a stage script uses, and which files a variant's chain depends on, so
the workflow can list them as rule inputs: an edit reruns exactly the stages it can change."""
from __future__ import annotations

import ast
import json
from functools import lru_cache
from pathlib import Path

from .io import write_text
from .variants import Variant, variant_files

PACKAGE = "evo_sdpa"
PACKAGE_DIR = Path(__file__).resolve().parent
REPO = PACKAGE_DIR.parents[1]
# The C ABI every CUDA variant implements: an edit there reruns every CUDA variant's chain.
ABI_HEADER = REPO / "kernels" / "common" / "evo_sdpa_abi.h"

# Files a module reads at run time besides its imports.
DATA_FILES = {
    "schema": ["workflow/schemas/config.schema.yaml", "workflow/schemas/variant.schema.yaml"],
    "report": ["scripts/evo_sdpa/templates/final_summary.md.j2"],
    "bundle": ["scripts/evo_sdpa/templates/rerun_bench.py"],
}
# Each parsed file's imports, keyed by its size and mtime: parsing every module is most of what
# listing the rules' inputs costs when the DAG is built, and few change between two runs.
IMPORTS_CACHE = REPO / ".snakemake" / "evo_sdpa" / "imports.json"


class ImportsCache:
    """{path: [[mtime_ns, size, in_package], [module, ...]]}, read once, written when it grew."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.entries = json.loads(path.read_text())
        except (OSError, ValueError):
            self.entries = {}
        self.changed = False

    def imports(self, source: Path, in_package: bool) -> list[str]:
        stat = source.stat()
        signature = [stat.st_mtime_ns, stat.st_size, in_package]
        entry = self.entries.get(str(source))
        if isinstance(entry, list) and len(entry) == 2 and entry[0] == signature:
            return entry[1]
        modules = sorted(_parse_imports(source, in_package))
        self.entries[str(source)] = [signature, modules]
        self.changed = True
        return modules

    def save(self) -> None:
        if not self.changed:
            return
        try:
            write_text(self.path, json.dumps(self.entries))
            self.changed = False
        except OSError:
            pass  # a read-only checkout parses each time


@lru_cache(maxsize=1)
def _cache() -> ImportsCache:
    return ImportsCache(IMPORTS_CACHE)


@lru_cache(maxsize=None)
def _imported_modules(path: Path, in_package: bool) -> frozenset[str]:
    found = _cache().imports(path, in_package)
    return frozenset(name for name in found if (PACKAGE_DIR / f"{name}.py").is_file())


def _parse_imports(path: Path, in_package: bool) -> set[str]:
    """The package modules one file imports (names; not checked to exist)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == PACKAGE and len(parts) > 1:
                    found.add(parts[1])
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            parts = module.split(".") if module else []
            if node.level == 0 and parts and parts[0] == PACKAGE:
                rest = parts[1:]
            elif node.level == 1 and in_package:
                rest = parts
            else:
                continue
            if rest:
                found.add(rest[0])
            else:  # `from evo_sdpa import x` / `from . import x`
                found.update(alias.name for alias in node.names)
    return found


@lru_cache(maxsize=None)
def module_closure(script: str) -> tuple[str, ...]:
    """The package modules `script` imports, directly or through other modules, sorted."""
    seen: set[str] = set()
    todo = list(_imported_modules(REPO / script, in_package=False))
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(_imported_modules(PACKAGE_DIR / f"{name}.py", in_package=True) - seen)
    return tuple(sorted(seen))


def library_inputs(script: str) -> list[str]:
    """Repo-relative paths of the package files (and data they read) that `script` depends on."""
    modules = module_closure(script)
    _cache().save()
    paths = [f"scripts/{PACKAGE}/__init__.py"] + [f"scripts/{PACKAGE}/{m}.py" for m in modules]
    for module in modules:
        paths.extend(DATA_FILES.get(module, []))
    return paths


def variant_inputs(variant: Variant) -> list[Path]:
    """The files whose edit reruns a variant's chain: its metadata, its sources and, for a CUDA
    variant, the C ABI header. The rules list exactly these; the stages stamp their digest."""
    return variant_files(variant) + ([ABI_HEADER] if variant.kind == "cuda" else [])
