"""Reading and writing the pipeline's artifacts: atomic JSON/text writes, one reader per kind."""
from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    """JSON has no NaN/Inf: write them as strings so a reader sees them rather than a crash."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write via a temporary file and rename, so a crash never leaves half a file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike, data: Any) -> None:
    write_text(path, json.dumps(_clean(data), indent=2, sort_keys=False) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    with open(path) as handle:
        return json.load(handle)


def read_verdict(path: str | os.PathLike) -> dict:
    """A check stage's verdict: {"status": "pass"|"fail"|"skipped", "reasons": [...], ...}."""
    verdict = read_json(path)
    if verdict.get("status") not in {"pass", "fail", "skipped"}:
        raise ValueError(f"{path}: not a verdict file (status={verdict.get('status')!r})")
    return verdict
