"""Whether a stage may run given the records before it: a variant that failed a correctness
gate is never measured, and every skipped record names the root cause (the first stage that
did not pass, and why), so the funnel shows where a variant fell out."""
from __future__ import annotations

from .io import read_record


def root_cause(stage: str, record: dict) -> dict:
    """The cause a record carries: its own `cause` when it was itself skipped for an earlier
    stage, else this stage's status and reasons."""
    if record.get("cause"):
        return record["cause"]
    reason = "; ".join(record.get("reasons", [])) or record.get("reason", "")
    return {"stage": stage, "status": record.get("status"), "reason": reason}


def blocked_by(**upstream_paths: str) -> dict | None:
    """The root cause of the first upstream stage (in argument order) that did not pass, or None.

    A sanitizer switched off in the config does not block: nothing was found wrong. Every record
    is read first, so a damaged one stops the stage even behind a stage that did not pass."""
    records = {stage: read_record(path) for stage, path in upstream_paths.items()}
    for stage, record in records.items():
        status = record.get("status")
        if status in ("pass", "measured"):
            continue
        if stage == "sanitizer" and status == "skipped" and record.get("disabled"):
            continue
        return root_cause(stage, record)
    return None


def describe(cause: dict) -> str:
    word = "failed" if cause["status"] == "fail" else cause["status"]
    return f"{cause['stage']} {word}" + (f" ({cause['reason']})" if cause["reason"] else "")


def skipped(reason: str, cause: dict | None = None, **extra) -> dict:
    record = {"status": "skipped", "reasons": [reason], **extra}
    if cause:
        record["cause"] = cause
    return record


def skipped_for(verb: str, cause: dict, **extra) -> dict:
    """A record for a stage that did not run because an earlier one did not pass."""
    return skipped(f"{verb}: {describe(cause)}", cause, **extra)


def cannot_run(verb: str, cause: dict | None, no_device: str | None) -> dict | None:
    """The skipped record for a stage that cannot run here, else None. An upstream failure comes
    first, since it is news wherever the stage runs; then a missing device (`no_device`, its
    reason); then an upstream stage that was itself skipped, which on a host without a GPU is
    usually skipped for the same missing device."""
    if cause and cause["status"] == "fail":
        return skipped_for(verb, cause)
    if no_device:
        return skipped(f"{verb}: {no_device}")
    if cause:
        return skipped_for(verb, cause)
    return None
