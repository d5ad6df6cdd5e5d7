"""Planted variants for the tests: tests/mutants/<name>/ (deliberately wrong kernels) and
tests/pathologies/<name>/ (deliberately slow ones). Each folder holds its variant.yaml and
planted.patch: the one edit, as a unified diff against the kernels/ variant it comes from, whose
first line names that parent. materialize() writes the whole variant where a test needs it:
the parent's sources with the patch applied. A patch that no longer applies says so."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
KERNELS = REPO / "kernels"
PATCH = "planted.patch"
METADATA = "variant.yaml"


def parent_of(planted: Path) -> str:
    first = (planted / PATCH).read_text().splitlines()[0]
    if not first.startswith("parent: "):
        raise ValueError(f"{planted / PATCH}: the first line must be 'parent: <kernels/ variant>'")
    return first.removeprefix("parent: ").strip()


def materialize(planted: Path, dest_dir: Path) -> Path:
    """Write the full variant `planted.name` under dest_dir and return its folder."""
    parent = KERNELS / parent_of(planted)
    dest = dest_dir / planted.name
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for source in yaml.safe_load((parent / METADATA).read_text())["sources"]:
        shutil.copy2(parent / source, dest / source)
    shutil.copy2(planted / METADATA, dest / METADATA)
    proc = subprocess.run(["patch", "-p1", "--forward", "--batch", "--no-backup-if-mismatch",
                           "-d", str(dest), "-i", str(planted / PATCH)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{planted / PATCH} no longer applies to {parent.relative_to(REPO)}: "
                           f"redo the edit on the current parent\n{proc.stdout}{proc.stderr}")
    return dest


_SCRATCH = Path(tempfile.mkdtemp(prefix="evo_planted_"))


@lru_cache(maxsize=None)
def materialized(planted: Path) -> Path:
    """The planted variant written once per test process (for load_variant and builds)."""
    return materialize(planted, _SCRATCH / planted.parent.name)
