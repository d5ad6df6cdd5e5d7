"""The run history: every run's leaderboard, one file per run under results/history/<device>/,
created once and never rewritten; which runs were accepted (a marker file beside the entry);
and the comparison of a run with an earlier one on the same card, for the "since last run" line
and the regression gate.

The history is not an output Snakemake owns: Snakemake deletes a rule's outputs before rerunning
it, so the summary job appends its entry as a side effect under a name no other run can take, and
its declared output is a small pointer (results/final/history_entry.json) naming that entry."""
from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path

from .errors import StageError
from .io import read_json, write_json, write_text

ACCEPTED_SUFFIX = ".accepted"
ENTRY_SUFFIX = ".json"


def device_slug(device: str) -> str:
    """A folder name for a card model: 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "unknown"


def case_key(row: dict) -> str:
    return f"{row['shape']} {row['dtype']}"


def variant_record(entry: dict) -> dict:
    """What the history keeps of one variant: where its numbers were taken (commit, dirty flag,
    sources digest), whether it passed its correctness gates, and per case the variant's p50,
    p90 and IQR (the noise) and its speedups against SDPA."""
    state = entry["measured_at"][0] if entry["measured_at"] else {}
    funnel = entry["funnel"]
    return {
        "commit": state.get("commit"),
        "dirty": state.get("dirty"),
        "sources": state.get("sources"),
        "funnel": funnel,
        "correct": all(funnel[s] == "pass" for s in ("build", "parity"))
                   and funnel["sanitizer"] in ("pass", "skipped"),
        "cases": {case_key(r): {k: r.get(k) for k in ("variant_p50_us", "variant_p90_us", "variant_iqr_us",
                                                      "sdpa_p50_us", "sdpa_p90_us", "speedup_p50",
                                                      "speedup_p90", "mode")}
                  for r in entry["speedups"]},
    }


def make_entry(leaderboard: dict, recorded_at: datetime) -> dict:
    git = leaderboard.get("git") or {}
    return {
        "recorded_at": recorded_at.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "device": leaderboard["device"],
        "commit": git.get("commit"),
        "dirty": git.get("dirty"),
        "bench_suite": leaderboard.get("bench_suite"),
        "variants": {e["name"]: variant_record(e) for e in leaderboard["variants"]},
    }


def entry_name(entry: dict) -> str:
    stamp = re.sub(r"[^0-9T]", "", entry["recorded_at"])
    return f"{stamp}-{(entry.get('commit') or 'nogit')[:12]}"


def append(history: Path, entry: dict) -> Path:
    """Create the entry's file under history/<device>/; an existing file is never overwritten (a
    second run in the same microsecond gets the next number)."""
    folder = history / device_slug(entry["device"])
    folder.mkdir(parents=True, exist_ok=True)
    base = entry_name(entry)
    for n in range(1000):
        path = folder / f"{base}-{n:03d}{ENTRY_SUFFIX}"  # names sort in the order they were made
        try:
            with open(path, "x") as handle:
                json.dump(entry, handle, indent=2)
                handle.write("\n")
            return path
        except FileExistsError:
            continue
    raise StageError(f"{folder}: could not find a free name for {base}; clean up the folder")


def entries(history: Path, device: str) -> list[Path]:
    """The device's entries, oldest first (names start with the UTC time they were recorded)."""
    return _entries_in(history / device_slug(device))


def _entries_in(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"*{ENTRY_SUFFIX}")) if folder.is_dir() else []


def is_accepted(path: Path) -> bool:
    return path.with_name(path.name + ACCEPTED_SUFFIX).exists()


def accept(path: Path, when: datetime | None = None) -> Path:
    """Mark an entry accepted: a marker file beside it (the entry itself is never rewritten)."""
    if not path.exists():
        raise StageError(f"{path}: no such history entry; run the summary first "
                         f"(snakemake --cores 1 results/final/final_summary.md)")
    marker = path.with_name(path.name + ACCEPTED_SUFFIX)
    when = when or datetime.now(timezone.utc)
    write_text(marker, json.dumps({"accepted_at": when.strftime("%Y-%m-%dT%H:%M:%SZ")}) + "\n")
    return marker


def previous(history: Path, device: str, current: Path | None, accepted_only: bool) -> Path | None:
    """The latest entry on the device before `current` (accepted ones only, if asked)."""
    earlier = [p for p in entries(history, device)
               if current is None or p.name < current.name]
    if accepted_only:
        earlier = [p for p in earlier if is_accepted(p)]
    return earlier[-1] if earlier else None


def devices(history: Path) -> list[str]:
    return sorted(p.name for p in history.iterdir() if p.is_dir()) if history.is_dir() else []


def latest_per_device(history: Path) -> dict[str, dict]:
    """The newest entry of every card the history holds, by its device name."""
    latest = {}
    for slug in devices(history):
        paths = _entries_in(history / slug)
        if paths:
            entry = read_json(paths[-1])
            latest[entry["device"]] = entry
    return latest


def regressed(cur: dict, base: dict, threshold: float, noise_multiple: float) -> bool:
    """Slower by more than the threshold AND by more than the noise of both runs (each run's IQR,
    times the multiple); a missing IQR counts as no noise."""
    cur_p50, base_p50 = cur.get("variant_p50_us"), base.get("variant_p50_us")
    if not cur_p50 or not base_p50:
        return False
    slower_us = cur_p50 - base_p50
    noise_us = noise_multiple * max(cur.get("variant_iqr_us") or 0.0, base.get("variant_iqr_us") or 0.0)
    return slower_us > threshold * base_p50 and slower_us > noise_us


def compare(current: dict, base: dict, threshold: float, noise_multiple: float) -> dict:
    """Per variant and case: regressions, speed-ups (the mirror rule), new variants and cases, and
    which variants' sources changed. Only entries of the same device are ever compared, and a case
    only with the same case timed the same way (eager against graph replay, or a different graph
    length, is a different measurement: listed as retimed, not compared)."""
    if current["device"] != base["device"]:
        raise StageError(f"history: cannot compare a run on {current['device']} with one on {base['device']}")
    out: dict = {"regressions": [], "speedups": [], "new": [], "changed_sources": [], "no_longer_correct": [],
                 "sdpa_moved": [], "retimed": []}
    for name, var in current["variants"].items():
        old = base["variants"].get(name)
        if old is None:
            out["new"].append(name)
            continue
        if var.get("sources") != old.get("sources"):
            out["changed_sources"].append(name)
        if old.get("correct") and not var.get("correct"):
            out["no_longer_correct"].append(name)
        for key, case in var["cases"].items():
            was = old["cases"].get(key)
            if was is None:
                out["new"].append(f"{name} {key}")
                continue
            if case.get("mode") and was.get("mode") and case["mode"] != was["mode"]:
                out["retimed"].append(f"{name} {key} ({was['mode']} -> {case['mode']})")
                continue
            line = {"variant": name, "case": key, "before_us": was["variant_p50_us"],
                    "now_us": case["variant_p50_us"],
                    "change_pct": 100.0 * (case["variant_p50_us"] / was["variant_p50_us"] - 1.0)}
            if regressed(case, was, threshold, noise_multiple):
                out["regressions"].append(line)
            elif regressed(was, case, threshold, noise_multiple):
                out["speedups"].append(line)
            # SDPA runs the same code in both runs: when its own time moved, the card's state did, and
            # a ratio there may not repeat even though each run pinned its own (issue 12).
            sdpa_now, sdpa_was = case.get("sdpa_p50_us"), was.get("sdpa_p50_us")
            if sdpa_now and sdpa_was and abs(sdpa_now / sdpa_was - 1.0) > threshold:
                out["sdpa_moved"].append({"variant": name, "case": key, "before_us": sdpa_was, "now_us": sdpa_now,
                                          "change_pct": 100.0 * (sdpa_now / sdpa_was - 1.0)})
    return out


def describe_change(line: dict) -> str:
    return (f"{line['variant']} {line['case']}: p50 {line['before_us']:.2f} -> {line['now_us']:.2f} µs "
            f"({line['change_pct']:+.1f}%)")


def write_pointer(path: str | os.PathLike, entry_path: Path, entry: dict) -> None:
    write_json(path, {"entry": str(entry_path), "device": entry["device"], "recorded_at": entry["recorded_at"]})
