"""The jobs' bytecode cache: set only on a host that turns bytecode off and names no prefix."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from evo_sdpa.pycache import OFF, PREFIX, use_bytecode_cache


def test_host_without_bytecode_gets_a_cache_of_its_own(tmp_path):
    environ = {OFF: "1", "PATH": "/bin"}
    prefix = use_bytecode_cache(environ, tmp_path / "pycache")
    assert prefix == str(tmp_path / "pycache")
    assert environ == {"PATH": "/bin", PREFIX: prefix}


def test_relative_cache_dir_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    environ = {OFF: "1"}
    assert use_bytecode_cache(environ, ".snakemake/pycache") == str(tmp_path / ".snakemake" / "pycache")


def test_home_is_expanded(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert use_bytecode_cache({OFF: "1"}, "~/pycache") == str(tmp_path / "pycache")


def test_environment_left_alone_otherwise(tmp_path):
    for environ in ({}, {OFF: ""}, {OFF: "1", PREFIX: "/users/own"}):
        before = dict(environ)
        assert use_bytecode_cache(environ, tmp_path) is None
        assert environ == before
    environ = {OFF: "1"}
    assert use_bytecode_cache(environ, None) is None
    assert environ == {OFF: "1"}


def test_a_job_started_from_it_writes_bytecode_under_the_prefix_only(tmp_path):
    module = tmp_path / "src" / "probe_module.py"
    module.parent.mkdir()
    module.write_text("VALUE = 1\n")
    environ = {**os.environ, OFF: "1"}
    environ.pop(PREFIX, None)
    prefix = use_bytecode_cache(environ, tmp_path / "cache")
    environ["PYTHONPATH"] = str(module.parent)
    subprocess.run([sys.executable, "-c", "import probe_module"], cwd=tmp_path, env=environ, check=True)
    assert not (module.parent / "__pycache__").exists()
    assert list(Path(prefix).rglob("probe_module*.pyc"))
