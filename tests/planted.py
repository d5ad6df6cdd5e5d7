"""Planted variants for the tests: tests/mutants/<name>/ (deliberately wrong kernels) and
tests/pathologies/<name>/ (deliberately slow ones). Each folder holds its variant.yaml and
planted.patch: the one edit, as a unified diff against the kernels/ variant it comes from, whose
first line names that parent. materialize() writes the whole variant where a test needs it:
the parent's sources with the patch applied, and the parent's `tunables:` (the one home of their
defaults) unless the planted variant.yaml declares its own. A patch that no longer applies says so."""
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
    parent_meta = yaml.safe_load((parent / METADATA).read_text())
    for source in parent_meta["sources"]:
        shutil.copy2(parent / source, dest / source)
    (dest / METADATA).write_text(with_parent_tunables((planted / METADATA).read_text(), parent_meta))
    proc = subprocess.run(["patch", "-p1", "--forward", "--batch", "--no-backup-if-mismatch",
                           "-d", str(dest), "-i", str(planted / PATCH)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{planted / PATCH} no longer applies to {parent.relative_to(REPO)}: "
                           f"redo the edit on the current parent\n{proc.stdout}{proc.stderr}")
    return dest


def with_parent_tunables(text: str, parent_meta: dict) -> str:
    """The planted variant.yaml's text, with the parent's tunables appended when it has none."""
    if "tunables" in (yaml.safe_load(text) or {}) or not parent_meta.get("tunables"):
        return text
    return text.rstrip("\n") + "\n" + yaml.safe_dump({"tunables": parent_meta["tunables"]}, sort_keys=False)


_SCRATCH = Path(tempfile.mkdtemp(prefix="evo_planted_"))


@lru_cache(maxsize=None)
def materialized(planted: Path) -> Path:
    """The planted variant written once per test process (for load_variant and builds)."""
    return materialize(planted, _SCRATCH / planted.parent.name)


def build_all(planted_dirs: list[Path], out_root: Path, compute_capability: str = "9.0") -> dict:
    """Build planted CUDA variants with the build stage's own function, in parallel:
    {name: (verdict, resources, compiler log)}. The output folders are made first, in the
    caller's thread."""
    from concurrent.futures import ThreadPoolExecutor

    from evo_sdpa.build import build_cuda
    from evo_sdpa.variants import load_variant

    outdirs = {d.name: out_root / d.name for d in planted_dirs}
    for outdir in outdirs.values():
        outdir.mkdir(parents=True, exist_ok=True)

    def build(planted: Path):
        return planted.name, build_cuda(load_variant(materialized(planted)), compute_capability,
                                        outdirs[planted.name])

    with ThreadPoolExecutor(max(1, len(planted_dirs))) as pool:
        return dict(pool.map(build, planted_dirs))
