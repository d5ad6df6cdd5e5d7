"""Argument parsing shared by the thin stage scripts."""
from __future__ import annotations

import argparse
import json
import logging
import signal
import sys


def parser(description: str) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(description=description)


def config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config-json", required=True, type=json.loads,
                   help="the config slices the stage reads, as JSON (the workflow passes them)")


def bool_arg(text: str) -> bool:
    if text.lower() in {"true", "1", "yes"}:
        return True
    if text.lower() in {"false", "0", "no"}:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def setup_logging() -> logging.Logger:
    """Stage progress goes to stderr, which the workflow sends to the rule's log file."""
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s")
    return logging.getLogger("evo_sdpa")


def exit_on_sigterm() -> None:
    """Turn SIGTERM (a timeout, a scheduler's cancel, Snakemake stopping its jobs) into SystemExit,
    so `finally` blocks still record what a long stage has done, as they do for Ctrl-C."""
    def _exit(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)
