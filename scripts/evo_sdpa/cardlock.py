"""One card per GPU job: a job takes a free card among those visible to it, holds an exclusive
lock on it for its whole life and sees only that card. Snakemake's `gpu` resource counts how many
GPU jobs run at once; it does not say which card each gets, and it knows nothing of a job left
running after a crash. The lock does both: an flock(2) on <lock dir>/<card>.lock, which the
kernel releases only when the holding process ends (however it ends), so a stray job keeps its
card and a new one waits for it. Each lease is appended to <lock dir>/<card>.jsonl (acquired,
released), from which check() proves that no two jobs overlapped on one card.

Environment:
  EVO_SDPA_LOCK_DIR     where the locks and their logs live (default /tmp/evo-sdpa-locks)
  EVO_SDPA_CARD         take this card only (an nvidia-smi index or a UUID), waiting if held
  EVO_SDPA_FAKE_CARDS   comma-separated names of cards to pretend this host has (tests)
  EVO_SDPA_CARD_HELD    set by a holder for its children: they run on its card, unlocked
"""
from __future__ import annotations

import atexit
import fcntl
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .device import GpuIdentity, normalise_uuid, nvidia_driver_present, pick_visible, smi_gpus
from .errors import StageError

LOCK_DIR_ENV = "EVO_SDPA_LOCK_DIR"
CARD_ENV = "EVO_SDPA_CARD"
FAKE_CARDS_ENV = "EVO_SDPA_FAKE_CARDS"
HELD_ENV = "EVO_SDPA_CARD_HELD"
DEFAULT_LOCK_DIR = Path("/tmp/evo-sdpa-locks")
POLL_S = 0.2
# What check() reads of each event in a card's log.
EVENT_KEYS = {"acquired": {"job", "host", "pid"}, "released": {"job", "pid", "acquired", "released"}}
WAIT_NOTE_S = 60.0  # how often a waiting job says in its log which job holds the cards


@dataclass(frozen=True)
class Card:
    key: str      # the lock's name: the card's UUID, else "index-<n>", else the fake name
    visible: str  # what CUDA_VISIBLE_DEVICES is set to for a job on this card
    index: str = ""  # nvidia-smi's index, when it listed the card


def lock_dir() -> Path:
    return Path(os.environ.get(LOCK_DIR_ENV) or DEFAULT_LOCK_DIR)


def _card(gpu: GpuIdentity) -> Card:
    """A card nvidia-smi listed: locked and shown by its UUID, else by its index."""
    return Card(gpu.uuid or f"index-{gpu.index}", gpu.uuid or str(gpu.index), str(gpu.index))


def visible_cards() -> list[Card]:
    """The cards this job may take, in order: fake ones in tests; none when forced to the CPU or
    when CUDA_VISIBLE_DEVICES is empty; else those CUDA_VISIBLE_DEVICES names (a scheduler's
    allocation), or every card nvidia-smi lists. Never asks torch (that would start CUDA before
    CUDA_VISIBLE_DEVICES is set)."""
    fake = os.environ.get(FAKE_CARDS_ENV)
    if fake:
        return [Card(name.strip(), name.strip()) for name in fake.split(",") if name.strip()]
    if os.environ.get("EVO_SDPA_FORCE_CPU") == "1":
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    gpus = smi_gpus()
    if gpus is None and not nvidia_driver_present():
        return []  # no NVIDIA driver: nothing to lock, whatever a scheduler put in the variable
    if gpus is None:  # a driver without nvidia-smi: the device nodes say how many cards there are
        nodes = sorted(int(p.name[6:]) for p in Path("/dev").glob("nvidia[0-9]*") if p.name[6:].isdigit())
        entries = [e.strip() for e in visible.split(",")] if visible is not None else [str(n) for n in nodes]
        if not nodes and visible is None:
            return []
        return [Card(e if e.startswith(("GPU-", "MIG-")) else f"index-{e}", e) for e in entries if e]
    if visible is None:
        return [_card(g) for g in gpus]
    cards = []
    for entry in (e.strip() for e in visible.split(",")):
        if entry.startswith("MIG-"):
            cards.append(Card(entry, entry))
        elif entry and (gpu := pick_visible(gpus, entry)) is not None:
            cards.append(_card(gpu))
    return cards


def choose(cards: list[Card], explicit: str | None) -> list[Card]:
    """The candidates: all visible cards, or the one EVO_SDPA_CARD names (an index or a UUID)."""
    if not explicit:
        return cards
    wanted = [c for c in cards if explicit in (c.key, c.visible, c.index)
              or (not explicit.isdigit() and c.key.startswith(normalise_uuid(explicit)))]
    if not wanted:
        raise StageError(f"{CARD_ENV}={explicit} names no visible card (visible: "
                         f"{', '.join(c.visible for c in cards) or 'none'}); unset it or name one of those")
    return wanted[:1]


class Lease:
    """An exclusive hold on one card, for as long as this process (or release()) lasts."""

    def __init__(self, card: Card, job: str, directory: Path, fd: int, waited_s: float):
        self.card, self.job, self.directory, self.fd = card, job, directory, fd
        self.waited_s = waited_s
        self.acquired = time.time()
        self.released: float | None = None
        self._log({"event": "acquired", "at": self.acquired, "waited_s": round(waited_s, 3)})
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(self._who()).encode(), 0)

    def _who(self) -> dict:
        return {"job": self.job, "card": self.card.key, "host": platform.node(), "pid": os.getpid()}

    def _log(self, fields: dict) -> None:
        line = json.dumps({**self._who(), **fields}) + "\n"
        fd = os.open(self.directory / f"{self.card.key}.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def record(self) -> dict:
        """What a result says about the lock it was measured under."""
        return {"card": self.card.key, "visible": self.card.visible, "job": self.job,
                "waited_s": round(self.waited_s, 3), "acquired": self.acquired,
                "lock_file": str(self.directory / f"{self.card.key}.lock")}

    def release(self) -> None:
        if self.released is not None:
            return
        self.released = time.time()
        self._log({"event": "released", "acquired": self.acquired, "released": self.released})
        os.close(self.fd)  # closing the last descriptor drops the flock


def _open_lock(directory: Path, card: Card) -> int:
    return os.open(directory / f"{card.key}.lock", os.O_RDWR | os.O_CREAT, 0o666)


def holder(directory: Path, card: Card) -> str:
    """Who holds a card, as its holder wrote it in the lock file (best effort, for messages)."""
    try:
        who = json.loads((directory / f"{card.key}.lock").read_text())
        return f"{who['job']} (pid {who['pid']} on {who['host']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "an unknown job"


def acquire(job: str, cards: list[Card], directory: Path, timeout_s: float | None = None,
            say=None) -> Lease:
    """The first free card of `cards`, waiting (polling every POLL_S) while all are held."""
    if not directory.is_dir():
        directory.mkdir(parents=True, exist_ok=True)
        try:
            directory.chmod(0o1777)  # shared by every user's jobs on the host, like /tmp
        except OSError:
            pass
    start = time.monotonic()
    noted = None
    while True:
        for card in cards:
            fd = _open_lock(directory, card)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return Lease(card, job, directory, fd, time.monotonic() - start)
        waited = time.monotonic() - start
        if timeout_s is not None and waited >= timeout_s:
            raise StageError(f"no card free for {job} after {waited:.0f} s (held: "
                             f"{'; '.join(holder(directory, c) for c in cards)}); end the stray job "
                             f"or wait for it")
        if say and (noted is None or waited - noted >= WAIT_NOTE_S):
            noted = waited
            say(f"{job}: every card is held ({'; '.join(holder(directory, c) for c in cards)}); waiting")
        time.sleep(POLL_S)


_LEASE: Lease | None = None


def hold(job: str, say=None) -> dict | None:
    """Take a card for this job before anything starts CUDA, show only it to the process (and its
    children) and keep it until the process ends. None on a host without cards. A child of a
    holder (EVO_SDPA_CARD_HELD set) runs on the holder's card without a lock of its own."""
    global _LEASE
    if _LEASE is not None or os.environ.get(HELD_ENV):
        return current()
    if "torch" in sys.modules and getattr(sys.modules["torch"].cuda, "is_initialized", lambda: False)():
        raise RuntimeError("cardlock.hold() must run before CUDA starts")
    cards = choose(visible_cards(), os.environ.get(CARD_ENV))
    if not cards:
        return None
    _LEASE = acquire(job, cards, lock_dir(), say=say)
    os.environ["CUDA_VISIBLE_DEVICES"] = _LEASE.card.visible
    os.environ[HELD_ENV] = json.dumps(_LEASE.record())
    atexit.register(_LEASE.release)
    return _LEASE.record()


def current() -> dict | None:
    """The lock record of this job (or of the holder that started it), None when there is none."""
    if _LEASE is not None:
        return _LEASE.record()
    held = os.environ.get(HELD_ENV)
    if held:
        try:
            return {**json.loads(held), "inherited": True}
        except ValueError:
            return None
    return None


def read_log(directory: Path) -> dict[str, list[dict]]:
    """Every card's lease events, in the order they were appended. A missing folder or a line that
    is not a JSON object is a StageError: a check that read nothing, or half a log, proves nothing."""
    directory = Path(directory)
    if not directory.is_dir():
        raise StageError(f"{directory}: no such lock folder; pass --lock-dir or set {LOCK_DIR_ENV} "
                         "to the folder the GPU jobs locked their cards in")
    logs = {}
    for path in sorted(directory.glob("*.jsonl")):
        events = []
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError:
                event = None
            if not isinstance(event, dict) or not EVENT_KEYS.get(event.get("event"), {"?"}) <= event.keys():
                raise StageError(f"{path}: line {number} is not a lease event (a job killed while writing it, "
                                 "or another file); delete that line, or move the log aside, to check the rest")
            events.append(event)
        logs[path.stem] = events
    return logs


def check(directory: Path) -> tuple[dict[str, int], list[str]]:
    """Leases per card and every overlap found: two leases of one card whose [acquired,
    released] intervals intersect, or an acquisition while another job's lease was open that the
    kernel had not released (its holder still alive: same host, pid still running)."""
    counts, problems = {}, []
    for card, events in read_log(directory).items():
        leases = sorted((e for e in events if e["event"] == "released"), key=lambda e: e["acquired"])
        counts[card] = sum(1 for e in events if e["event"] == "acquired")
        for before, after in zip(leases, leases[1:]):
            if after["acquired"] < before["released"]:
                problems.append(f"card {card}: {after['job']} (pid {after['pid']}) took it at "
                                f"{after['acquired']:.3f} while {before['job']} (pid {before['pid']}) "
                                f"held it until {before['released']:.3f}")
        open_lease = None
        for event in events:
            if event["event"] == "acquired":
                if open_lease is not None and open_lease["host"] == event["host"] and _alive(open_lease["pid"]) \
                        and open_lease["host"] == platform.node():
                    problems.append(f"card {card}: {event['job']} (pid {event['pid']}) took it while "
                                    f"{open_lease['job']} (pid {open_lease['pid']}) still runs")
                open_lease = event
            elif open_lease is not None and event["pid"] == open_lease["pid"]:
                open_lease = None
    return counts, problems


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, under another user
        return True
    return True


def hold_card(job: str, log=None) -> dict | None:
    """hold() for a stage script: the first thing its main() does after parsing its arguments,
    logging which card it took and how long it waited (nothing on a host without cards)."""
    lock = hold(job, say=log.info if log else None)
    if lock and log and not lock.get("inherited"):
        log.info("%s: card %s (CUDA_VISIBLE_DEVICES=%s) after %.1f s waiting", job, lock["card"],
                 lock["visible"], lock["waited_s"])
    elif log and not lock:
        log.info("%s: no card to lock here (CUDA_VISIBLE_DEVICES=%s)", job,
                 os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
    return lock
