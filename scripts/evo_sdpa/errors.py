"""The one way a stage stops when it cannot reach a verdict: one clear line, details in the log."""
from __future__ import annotations

import sys


class StageError(Exception):
    """An error the user can act on; its message is one line naming the thing and the fix."""


def fail(message: str, code: int = 1) -> None:
    print(f"evo-sdpa: {message}", file=sys.stderr)
    raise SystemExit(code)


def notice(message: str) -> None:
    """A verdict the console must show although the stage succeeded (a stage that could not run
    here): one line in the same form, which the rule repeats from its log."""
    print(f"evo-sdpa: {message}", file=sys.stderr)


def run_stage(main) -> None:
    """Run a stage's main(); turn a StageError into one line on stderr and exit status 1."""
    try:
        main()
    except StageError as exc:
        fail(str(exc))
