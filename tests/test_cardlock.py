"""One card per GPU job (evo_sdpa.cardlock), on fake cards: concurrent jobs spread over the cards
and never share one, a lock held by a killed job is released by the kernel, a stray job keeps its
card, the lock log proves (or disproves) that no two jobs overlapped, and the cards a job may take
follow nvidia-smi and CUDA_VISIBLE_DEVICES."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from evo_sdpa import cardlock, device, provenance
from evo_sdpa.errors import StageError

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
# A GPU stage in miniature: take a card first thing, say which, hold it a while.
JOB = """
import json, os, sys, time
sys.path.insert(0, {scripts!r})
from evo_sdpa.cardlock import hold_card
lock = hold_card(sys.argv[1])
print(json.dumps({{"lock": lock, "visible": os.environ.get("CUDA_VISIBLE_DEVICES")}}), flush=True)
time.sleep(float(sys.argv[2]))
"""
SMI_TWO = ("0, GPU-aaaaaaaa-1111-2222-3333-444444444444, NVIDIA H100 80GB HBM3, 9.0\n"
           "1, GPU-bbbbbbbb-1111-2222-3333-444444444444, NVIDIA H100 80GB HBM3, 9.0\n")


def job_env(lock_dir: Path, cards: str, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (cardlock.HELD_ENV, cardlock.CARD_ENV)}
    env.update({cardlock.LOCK_DIR_ENV: str(lock_dir), cardlock.FAKE_CARDS_ENV: cards, **extra})
    return env


def start(lock_dir: Path, cards: str, name: str, hold_s: float, **extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", JOB.format(scripts=str(SCRIPTS)), name, str(hold_s)],
                            env=job_env(lock_dir, cards, **extra), stdout=subprocess.PIPE, text=True)


def first_line(proc: subprocess.Popen) -> dict:
    return json.loads(proc.stdout.readline())


def test_concurrent_jobs_spread_over_the_cards_and_never_share_one(tmp_path):
    jobs = [start(tmp_path, "fake0,fake1,fake2", f"bench v{i}", 0.6) for i in range(7)]
    said = [first_line(job) for job in jobs]
    assert all(job.wait(timeout=60) == 0 for job in jobs)
    for record in said:
        assert record["visible"] == record["lock"]["card"]  # the job sees only its card
    counts, problems = cardlock.check(tmp_path)
    assert problems == []
    assert set(counts) == {"fake0", "fake1", "fake2"} and sum(counts.values()) == 7
    assert max(r["lock"]["waited_s"] for r in said) > 0.3  # seven jobs, three cards: some waited
    events = cardlock.read_log(tmp_path)
    for card, card_events in events.items():
        kinds = [e["event"] for e in card_events]
        assert kinds == ["acquired", "released"] * (len(kinds) // 2), card


def test_an_explicit_card_is_honoured_and_waited_for(tmp_path):
    first = start(tmp_path, "fake0,fake1", "parity a", 0.5, EVO_SDPA_CARD="fake1")
    assert first_line(first)["lock"]["card"] == "fake1"
    second = start(tmp_path, "fake0,fake1", "parity b", 0.0, EVO_SDPA_CARD="fake1")
    record = first_line(second)
    assert record["lock"]["card"] == "fake1" and record["lock"]["waited_s"] > 0.1
    assert first.wait(timeout=30) == 0 and second.wait(timeout=30) == 0
    assert cardlock.check(tmp_path) == ({"fake1": 2}, [])


def test_an_explicit_card_by_nvidia_smi_index_or_uuid_prefix(monkeypatch):
    monkeypatch.delenv(cardlock.FAKE_CARDS_ENV, raising=False)
    monkeypatch.delenv("EVO_SDPA_FORCE_CPU", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(cardlock, "smi_gpus", lambda: device.parse_smi_gpus(SMI_TWO))
    cards = cardlock.visible_cards()
    assert cardlock.choose(cards, "1") == [cards[1]] == cardlock.choose(cards, "GPU-bbbbbbbb")


def test_an_explicit_card_that_is_not_visible_is_one_line():
    with pytest.raises(StageError, match=r"EVO_SDPA_CARD=fake9 names no visible card \(visible: fake0\)"):
        cardlock.choose([cardlock.Card("fake0", "fake0")], "fake9")


def test_a_killed_jobs_lock_is_released_by_the_kernel(tmp_path):
    killed = start(tmp_path, "fake0", "bench killed", 600)
    assert first_line(killed)["lock"]["card"] == "fake0"
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait(timeout=30)
    after = start(tmp_path, "fake0", "bench after", 0.0)
    record = first_line(after)
    assert record["lock"]["card"] == "fake0" and record["lock"]["waited_s"] < 5
    assert after.wait(timeout=30) == 0
    counts, problems = cardlock.check(tmp_path)
    assert counts == {"fake0": 2} and problems == []  # the killed lease never released: no overlap


def test_a_stray_job_keeps_its_card(tmp_path):
    stray = start(tmp_path, "fake0", "bench stray", 600)
    try:
        first_line(stray)
        with pytest.raises(StageError, match=r"no card free for bench new .*bench stray \(pid \d+ on "):
            cardlock.acquire("bench new", [cardlock.Card("fake0", "fake0")], tmp_path, timeout_s=0.5)
    finally:
        stray.kill()
        stray.wait(timeout=30)


def test_the_check_finds_two_jobs_on_one_card(tmp_path):
    leases = [("bench a", 1, 10.0, 20.0), ("bench b", 2, 15.0, 25.0), ("bench c", 3, 30.0, 31.0)]
    lines = []
    for job, pid, acquired, released in leases:
        who = {"job": job, "card": "fake0", "host": "h", "pid": pid}
        lines.append({**who, "event": "acquired", "at": acquired, "waited_s": 0})
        lines.append({**who, "event": "released", "acquired": acquired, "released": released})
    (tmp_path / "fake0.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    counts, problems = cardlock.check(tmp_path)
    assert counts == {"fake0": 3}
    assert len(problems) == 1 and "bench b (pid 2) took it at 15.000 while bench a (pid 1)" in problems[0]


def test_check_card_locks_script_exits_non_zero_on_an_overlap(tmp_path):
    script = SCRIPTS / "check_card_locks.py"
    job = start(tmp_path, "fake0", "bench ok", 0.0)
    job.wait(timeout=30)
    proc = subprocess.run([sys.executable, str(script), "--lock-dir", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0 and "fake0: 1 job" in proc.stdout
    who = {"job": "x", "card": "fake0", "host": "h", "pid": 1}
    with open(tmp_path / "fake0.jsonl", "a") as log:
        for acquired in (0.0, 0.5):
            log.write(json.dumps({**who, "event": "released", "acquired": acquired, "released": 1.0}) + "\n")
    proc = subprocess.run([sys.executable, str(script), "--lock-dir", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 1 and "evo-sdpa: card fake0:" in proc.stderr


def test_check_card_locks_refuses_what_it_cannot_read(tmp_path):
    script = SCRIPTS / "check_card_locks.py"

    def check_script(directory):
        return subprocess.run([sys.executable, str(script), "--lock-dir", str(directory)],
                              capture_output=True, text=True)

    missing = check_script(tmp_path / "typo")
    assert missing.returncode == 1 and "no such lock folder" in missing.stderr
    assert "Traceback" not in missing.stderr
    empty = check_script(tmp_path)
    assert empty.returncode == 1 and "no lock logs" in empty.stderr
    job = start(tmp_path, "fake0", "bench ok", 0.0)
    job.wait(timeout=30)
    with open(tmp_path / "fake0.jsonl", "a") as log:
        log.write('{"event": "acquired", "job": "cut')  # a job killed mid-write
    torn = check_script(tmp_path)
    assert torn.returncode == 1 and "fake0.jsonl: line 3 is not a lease event" in torn.stderr
    assert "Traceback" not in torn.stderr and torn.stderr.count("\n") == 1
    lines = (tmp_path / "fake0.jsonl").read_text().splitlines()
    (tmp_path / "fake0.jsonl").write_text("\n".join(lines[:2] + ['{"event": "released", "job": "x"}']) + "\n")
    partial = check_script(tmp_path)   # JSON, but not the fields a lease has
    assert partial.returncode == 1 and "fake0.jsonl: line 3 is not a lease event" in partial.stderr
    (tmp_path / "fake0.jsonl").write_text("\n".join(lines[:2]) + "\n")
    assert check_script(tmp_path).returncode == 0


def test_children_of_a_holder_run_on_its_card_without_a_lock(tmp_path):
    child = ("import json, sys; sys.path.insert(0, %r); from evo_sdpa.cardlock import hold;"
             " print(json.dumps(hold('child')))" % str(SCRIPTS))
    parent = (JOB.format(scripts=str(SCRIPTS)).replace("time.sleep(float(sys.argv[2]))", "")
              + f"import subprocess; subprocess.run([sys.executable, '-c', {child!r}], check=True)\n")
    proc = subprocess.run([sys.executable, "-c", parent, "evolve v1", "0"], env=job_env(tmp_path, "fake0"),
                          capture_output=True, text=True, timeout=60)
    said, inherited = [json.loads(line) for line in proc.stdout.splitlines()]
    assert inherited["inherited"] and inherited["card"] == said["lock"]["card"] == "fake0"
    assert cardlock.check(tmp_path) == ({"fake0": 1}, [])


def test_no_cards_no_lock(tmp_path, monkeypatch):
    monkeypatch.delenv(cardlock.FAKE_CARDS_ENV, raising=False)
    monkeypatch.delenv(cardlock.HELD_ENV, raising=False)
    monkeypatch.setenv("EVO_SDPA_FORCE_CPU", "1")
    monkeypatch.setenv(cardlock.LOCK_DIR_ENV, str(tmp_path))
    assert cardlock.visible_cards() == [] and cardlock.hold("bench v1") is None
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("visible, expected", [
    (None, ["GPU-aaaaaaaa-1111-2222-3333-444444444444", "GPU-bbbbbbbb-1111-2222-3333-444444444444"]),
    ("1", ["GPU-bbbbbbbb-1111-2222-3333-444444444444"]),          # a scheduler's allocation
    ("GPU-bbbbbbbb", ["GPU-bbbbbbbb-1111-2222-3333-444444444444"]),  # a UUID prefix, as CUDA takes
    ("", []),                                                     # no card for this job
])
def test_the_cards_a_job_may_take_follow_cuda_visible_devices(monkeypatch, visible, expected):
    monkeypatch.delenv(cardlock.FAKE_CARDS_ENV, raising=False)
    monkeypatch.delenv("EVO_SDPA_FORCE_CPU", raising=False)
    monkeypatch.setattr(cardlock, "smi_gpus", lambda: device.parse_smi_gpus(SMI_TWO))
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    cards = cardlock.visible_cards()
    assert [c.key for c in cards] == expected and [c.visible for c in cards] == expected


def test_the_stamp_records_host_card_and_lock(monkeypatch):
    monkeypatch.setenv("EVO_SDPA_FORCE_CPU", "1")
    monkeypatch.setenv(cardlock.HELD_ENV, json.dumps({"card": "fake0", "waited_s": 1.5}))
    record = provenance.stamp({}, measured_on_card=True)[provenance.KEY]
    assert record["host"] and record["card"]["name"] == "cpu"
    assert record["lock"] == {"card": "fake0", "waited_s": 1.5, "inherited": True}
    assert provenance.stamp({})[provenance.KEY]["lock"] is None


def test_every_gpu_stage_of_the_workflow_takes_a_card_and_records_it(tmp_path):
    """The stages themselves, through Snakemake: with two fake cards and two jobs at a time, each
    GPU stage locks a card before it starts, its record names the card, and no two overlapped."""
    from pipeline_helpers import CPU_ENV, copy_tree, snakemake

    (tmp_path / "tree").mkdir()
    root = copy_tree(tmp_path / "tree", kernels=["triton_flash", "v1_scalar"])
    locks = tmp_path / "locks"
    env = {**CPU_ENV, cardlock.FAKE_CARDS_ENV: "fakeA,fakeB", cardlock.LOCK_DIR_ENV: str(locks)}
    targets = ["results/bench/triton_flash.json", "results/bench/v1_scalar.json", "results/nsight/sdpa/status.json",
               "results/baseline/sdpa.json"]
    snakemake(root, "--cores", "2", *targets, "--configfile", "config/test.yaml", env=env)
    counts, problems = cardlock.check(locks)
    assert problems == [] and set(counts) <= {"fakeA", "fakeB"}
    jobs = sorted(e["job"] for events in cardlock.read_log(locks).values() for e in events if e["event"] == "released")
    assert jobs == sorted(["env_capture", "sdpa_baseline", "sdpa_parity", "ncu sdpa", "build_variant triton_flash",
                           *(f"{stage} {v}" for stage in ("sanitizer", "parity", "bench") for v in ("triton_flash", "v1_scalar"))])
    parity = json.loads((root / "results/parity/triton_flash.json").read_text())
    assert parity["measured_at"]["lock"]["card"] in {"fakeA", "fakeB"}
    assert parity["measured_at"]["lock"]["job"] == "parity triton_flash"
    environment = json.loads((root / "results/env/environment.json").read_text())
    assert environment["lock"]["card"] in {"fakeA", "fakeB"}
