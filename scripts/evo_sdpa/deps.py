"""Which library files a stage script uses, so the workflow can list them as rule inputs:
an edit to a module reruns exactly the stages that import it."""
from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

PACKAGE = "evo_sdpa"
PACKAGE_DIR = Path(__file__).resolve().parent
REPO = PACKAGE_DIR.parents[1]

# Files a module reads at run time besides its imports.
DATA_FILES = {
    "schema": ["workflow/schemas/config.schema.yaml", "workflow/schemas/variant.schema.yaml"],
    "report": ["scripts/evo_sdpa/templates/final_summary.md.j2"],
}


@lru_cache(maxsize=None)
def _imported_modules(path: Path, in_package: bool) -> frozenset[str]:
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
    return frozenset(name for name in found if (PACKAGE_DIR / f"{name}.py").is_file())


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
    paths = [f"scripts/{PACKAGE}/__init__.py"] + [f"scripts/{PACKAGE}/{m}.py" for m in modules]
    for module in modules:
        paths.extend(DATA_FILES.get(module, []))
    return paths
