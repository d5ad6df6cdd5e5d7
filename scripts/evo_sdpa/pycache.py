"""Bytecode for the jobs' own imports on a host that turns bytecode off.

A host that sets PYTHONDONTWRITEBYTECODE and ships torch without .pyc files compiles torch's
2141 modules again in every process that imports it: 4.5-5.1 s an import on the H100 host,
against 2.7-3.0 s once their bytecode is cached (issue 12). A run starts about forty such
processes one after another. The jobs get a cache of their own (PYTHONPYCACHEPREFIX), so
nothing is written into site-packages, which is what the setting usually protects.
"""
from __future__ import annotations

from collections.abc import MutableMapping
from pathlib import Path

OFF = "PYTHONDONTWRITEBYTECODE"
PREFIX = "PYTHONPYCACHEPREFIX"


def use_bytecode_cache(environ: MutableMapping[str, str], cache_dir: str | Path | None) -> str | None:
    """Point the jobs started from `environ` at `cache_dir` for bytecode when the host turned
    bytecode off and set no prefix of its own; return the prefix set, or None if nothing changed.

    Only then: with a prefix, Python reads bytecode from the prefix alone, so on a host that writes
    bytecode normally it would compile every module again once instead of using site-packages'."""
    if cache_dir is None or not environ.get(OFF) or environ.get(PREFIX):
        return None
    prefix = str(Path(cache_dir).expanduser().absolute())  # as the user sees it: no symlinks resolved
    del environ[OFF]
    environ[PREFIX] = prefix
    return prefix
