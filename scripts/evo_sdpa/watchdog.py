"""A time limit on each step of a stage whose work can hang inside a CUDA call. A kernel that
never returns cannot be interrupted from Python, so the limit is kept by a thread of its own,
which runs the stage's ending (record the verdict, end the process) while the step still waits."""
from __future__ import annotations

import logging
import os
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator


class StepWatchdog:
    """`with watchdog.step(name): ...` gives the block `limit_s` seconds. If it has not left by
    then, `on_expiry(name, limit_s)` runs once, on the watchdog's thread."""

    def __init__(self, limit_s: float, on_expiry: Callable[[str, float], None]):
        self.limit_s = limit_s
        self._on_expiry = on_expiry
        self._changed = threading.Condition()
        self._current: tuple[str, float] | None = None  # (step, deadline)
        threading.Thread(target=self._watch, name="step-watchdog", daemon=True).start()

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        with self._changed:
            self._current = (name, time.monotonic() + self.limit_s)
            self._changed.notify()
        try:
            yield
        finally:
            with self._changed:
                self._current = None
                self._changed.notify()

    def _watch(self) -> None:
        while True:
            with self._changed:
                while self._current is None:
                    self._changed.wait()
                name, deadline = self._current
                left = deadline - time.monotonic()
                if left > 0:
                    self._changed.wait(left)  # woken early when the step ends or another begins
                    continue
                self._current = None
            self._on_expiry(name, self.limit_s)


def end_stage() -> None:
    """From the watchdog's thread, once the stage's record is written: flush the logs and end the
    process with exit 0 (a check stage's verdict, failed, is its result); the thread that waits on
    the GPU never returns, so nothing else would end it."""
    logging.shutdown()
    os._exit(0)
