"""Where a result was measured, recorded by the job that measured it: the git state, a digest of
the variant's sources, the host, the card and the card lock the job held (cardlock). The
environment record is older than a kernel edit and the DAG's device identity is the submitting
host's, so only these say what a number was taken on; the summary prints them per variant and
refuses to pass off one card's numbers as another's."""
from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path
from typing import Callable

from . import cardlock
from .device import CPU_DEVICE_ID, command_output, cuda_available, normalise_uuid, query_gpu
from .io import write_json

REPO = Path(__file__).resolve().parents[2]
DIGEST_CHARS = 16
KEY = "measured_at"
TARGET_NO_DEVICE_EXIT = 3  # a target process (ncu's, the sanitizer's) whose torch sees no CUDA device


def _git(repo: Path, *args: str) -> str | None:
    out = command_output(["git", "-C", str(repo), *args], timeout_s=30)
    return out.strip() if out is not None else None


def git_state(repo: Path = REPO) -> dict:
    """HEAD and whether tracked files differ from it (None for either when git cannot say)."""
    commit = _git(repo, "rev-parse", "HEAD")
    status = _git(repo, "status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def sources_digest(paths: list[Path]) -> str:
    """sha256 over each file's name and bytes, in a fixed order: equal digests, equal sources."""
    digest = hashlib.sha256()
    for path in sorted(paths, key=lambda p: str(p)):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:DIGEST_CHARS]


NO_CARD = {"name": CPU_DEVICE_ID, "uuid": None, "compute_capability": None}


def card() -> dict:
    """The card this process measures on (torch's current device, UUID when the driver gives
    one), or the CPU on a host without a CUDA device."""
    if not cuda_available():
        return dict(NO_CARD)
    import torch

    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    uuid = normalise_uuid(str(props.uuid)) if getattr(props, "uuid", None) else None
    if uuid is None:
        visible = query_gpu()
        uuid = visible.uuid if visible and visible.name == props.name else None
    return {"name": props.name, "uuid": uuid, "compute_capability": f"{props.major}.{props.minor}"}


def fresh_target_card(folder: str | Path) -> Path:
    """Where a stage's target process reports its card: folder/card.json, an earlier run's report
    removed first, so a stage that skips or whose target fails never reads or ships a stale one."""
    path = Path(folder) / "card.json"
    path.unlink(missing_ok=True)
    return path


def report_card(path: str | Path, record: dict | None = None) -> None:
    """A target process's side: write the card it runs on to `path`, for the stage that started it
    to stamp its record with; exit TARGET_NO_DEVICE_EXIT when it has no CUDA device. `record` is
    the card as a target without torch found it (bare.open_device); by default torch is asked."""
    record = card() if record is None else record
    write_json(path, record)
    if record["name"] == CPU_DEVICE_ID:
        raise SystemExit(TARGET_NO_DEVICE_EXIT)


def target_card(path: str | Path) -> dict | None:
    """The stage's side: the card its target process reported; None when it wrote none (it failed
    before that, or never ran): the record then names no card rather than a guess."""
    try:
        record = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "name" in record else None


def target_found_no_device(path: str | Path) -> bool:
    """Whether the target reported that torch sees no CUDA device (a GPU the driver lists, torch
    built without CUDA or unable to use it)."""
    reported = target_card(path)
    return reported is not None and reported["name"] == CPU_DEVICE_ID


def stamp(record: dict, sources: list[Path] | None = None, measured_on_card: bool = False,
          card_of: Callable[[], dict | None] | None = None) -> dict:
    """Add where this record was made: git state, the digest of the variant's sources
    (deps.variant_inputs), the host, and the card and its lock when the stage ran something on
    it (the lock: which card the job held, how long it waited for it). The card is this process's,
    or for a stage that ran its work in a target process, what card_of gives: the card that process
    reported (target_card). Returns the record."""
    card_of = card_of or card
    record[KEY] = {
        "git": git_state(),
        "sources": sources_digest(sources) if sources is not None else None,
        "host": platform.node(),
        "card": card_of() if measured_on_card else None,
        "lock": cardlock.current() if measured_on_card else None,
    }
    return record
