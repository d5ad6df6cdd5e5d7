"""Argument parsing shared by the thin stage scripts."""
from __future__ import annotations

import argparse
import json
import logging
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
