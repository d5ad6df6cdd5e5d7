"""Whether a stage may run given the verdicts before it: a variant that failed a correctness
gate is never measured, and the record says where it fell out of the funnel."""
from __future__ import annotations

from .io import read_json


def blocked_by(**upstream_paths: str) -> str | None:
    """The first upstream stage (in argument order) that did not pass, as a reason, else None.

    A sanitizer skipped because it is disabled in the config does not block; any other skip
    (no device, build skipped) does, since nothing was checked."""
    for stage, path in upstream_paths.items():
        record = read_json(path)
        status = record.get("status")
        if status in ("pass", "measured"):
            continue
        if stage == "sanitizer" and status == "skipped" and record.get("disabled"):
            continue
        why = "; ".join(record.get("reasons", [])) or record.get("reason", "")
        word = "failed" if status == "fail" else status
        return f"{word} {stage}" + (f": {why}" if why else "")
    return None


def not_run(reason: str, **extra) -> dict:
    return {"status": "skipped", "reasons": [reason], **extra}
