"""The reproducibility bundle: one archive with the environment record, the config, the kernel
sources, the stage scripts, the results and a manifest of sha256 checksums, plus rerun_bench.py,
which rebuilds one variant from the bundle, times it again and compares with the recorded numbers."""
from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

MANIFEST = "MANIFEST.json"
CONFIG = "config.json"
RERUN = "rerun_bench.py"
# What travels: the code that measured (kernels, stage scripts, library, schemas) and what it measured.
CODE = ("kernels", "scripts", "workflow/schemas")
RESULTS = ("env", "baseline", "build", "sanitizer", "parity", "bench", "analysis", "final")
SKIP_SUFFIXES = (".pyc", ".so", ".ncu-rep", ".partial.png", ".partial", ".tar.gz")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def collect(repo: Path, results: Path) -> list[tuple[str, Path]]:
    """(name in the archive, file on disk) for every file the bundle holds, in a fixed order."""
    files = []
    for root, folders in ((repo, CODE), (results.parent, tuple(f"{results.name}/{r}" for r in RESULTS))):
        for folder in folders:
            base = root / folder
            if base.is_dir():
                files += [(str(p.relative_to(root)), p) for p in sorted(base.rglob("*"))
                          if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(SKIP_SUFFIXES)]
    return files


def manifest(entries: dict[str, bytes], meta: dict) -> dict:
    return {**meta, "files": {name: {"sha256": sha256(data), "bytes": len(data)} for name, data in entries.items()}}


def write(path: Path, repo: Path, results: Path, config: dict, meta: dict) -> dict:
    """Write the archive (gzip'd tar, one top folder 'evo-sdpa-bundle/'); returns its manifest."""
    entries = {name: file.read_bytes() for name, file in collect(repo, results)}
    entries[CONFIG] = (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()
    entries[RERUN] = (Path(__file__).resolve().parent / "templates" / RERUN).read_bytes()
    listing = manifest(entries, meta)
    entries[MANIFEST] = (json.dumps(listing, indent=2) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with tarfile.open(partial, "w:gz") as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(f"evo-sdpa-bundle/{name}")
            info.size, info.mode = len(data), 0o755 if name == RERUN else 0o644
            tar.addfile(info, io.BytesIO(data))
    partial.replace(path)
    return listing


def verify(root: Path) -> list[str]:
    """Files whose checksum differs from the manifest, or are missing: [] when the bundle is whole."""
    listing = json.loads((root / MANIFEST).read_text())
    bad = []
    for name, want in listing["files"].items():
        path = root / name
        if not path.is_file() or sha256(path.read_bytes()) != want["sha256"]:
            bad.append(name)
    return bad


def compare_bench(recorded: dict, rerun: dict, tolerance: float) -> list[str]:
    """Per case, the speedup now against the recorded one: lines for cases beyond the tolerance
    (relative), or not measured in one of the two runs."""
    def speedups(bench: dict) -> dict:
        return {f"{c['label']} {c['dtype']}": c["modes"][c["primary_mode"]]["speedup_p50"]
                for c in bench.get("cases", []) if c.get("status") == "measured"}

    before, now = speedups(recorded), speedups(rerun)
    lines = [f"{case}: measured in the bundle, not now" for case in before if case not in now]
    for case, value in now.items():
        if case not in before:
            lines.append(f"{case}: not in the bundle's record")
        elif abs(value / before[case] - 1.0) > tolerance:
            lines.append(f"{case}: speedup {value:.3f} now, {before[case]:.3f} recorded "
                         f"({100 * (value / before[case] - 1):+.1f}%, tolerance {tolerance:.0%})")
    return lines
