"""Reading and writing the pipeline's artifacts: atomic JSON/text writes, one reader per kind."""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from .errors import StageError

# The one command that rebuilds a result (and what depends on it) when it is missing or damaged;
# the target comes first because --forcerun takes several values.
REBUILD = "snakemake --cores 1 results/final/final_summary.md --forcerun {path}"


def _clean(value: Any) -> Any:
    """JSON has no NaN/Inf: write them as strings so a reader sees them rather than a crash."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write via a temporary file and rename, so a crash never leaves half a file behind. The file
    gets the mode a plain open() would give it (mkstemp's is 0600: unreadable to others on a
    shared host)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike, data: Any) -> None:
    write_text(path, json.dumps(_clean(data), indent=2, sort_keys=False) + "\n")


def rebuild_hint(path: str | os.PathLike) -> str:
    return REBUILD.format(path=path)


def read_json(path: str | os.PathLike) -> Any:
    """A result file; a missing, truncated or corrupted one is one line naming it and the fix."""
    try:
        with open(path) as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise StageError(f"{path}: missing (deleted after it was made?); rebuild it: "
                         f"{rebuild_hint(path)}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise StageError(f"{path}: not valid JSON ({exc}), a truncated or corrupted result; "
                         f"rebuild it: {rebuild_hint(path)}") from None


def read_object(path: str | os.PathLike, what: str, fields: dict[str, type | tuple[type, ...]]) -> dict:
    """A result that must be a JSON object with these fields of these types (a tuple holding
    type(None) allows null); else one line naming the file, what it lacks and the fix."""
    record = read_json(path)
    if not isinstance(record, dict):
        problem = f"a JSON {type(record).__name__}, not an object"
    else:
        missing = [name for name in fields if name not in record]
        wrong = [name for name, kind in fields.items() if name in record and not isinstance(record[name], kind)]
        problem = (f"no {', '.join(repr(m) for m in missing)} key" if missing else
                   f"{wrong[0]!r} is a {type(record[wrong[0]]).__name__}" if wrong else None)
    if problem:
        raise StageError(f"{path}: not {what} ({problem}), a damaged result; rebuild it: {rebuild_hint(path)}")
    return record


# The env stage's record, as far as each reader reads it: a stage the card's ceilings (and the
# analysis the device), the summary also the git state and the versions.
CEILINGS = {"ceilings": (dict, type(None))}
DEVICE_CEILINGS = {**CEILINGS, "device": (dict, type(None))}
ENV_FIELDS = {**DEVICE_CEILINGS, "git": dict, "versions": dict}


def read_env(path: str | os.PathLike, fields: dict = ENV_FIELDS) -> dict:
    return read_object(path, "an environment record", fields)


def read_record(path: str | os.PathLike) -> dict:
    """A stage's record: a JSON object with a status ("pass", "measured", "skipped", ...) and its
    reasons (a list, empty when it passed)."""
    return read_object(path, "a stage record", {"status": str, "reasons": list})


def read_verdict(path: str | os.PathLike) -> dict:
    """A check stage's verdict: {"status": "pass"|"fail"|"skipped", "reasons": [...], ...}."""
    verdict = read_record(path)
    if verdict["status"] not in {"pass", "fail", "skipped"}:
        raise StageError(f"{path}: not a verdict file (status={verdict['status']!r}); "
                         f"rebuild it: {rebuild_hint(path)}")
    return verdict
