"""Result files: written whole (temporary file + rename) and readable by whoever the umask allows,
like any file the user's tools write (mkstemp alone leaves 0600)."""
from __future__ import annotations

import os
import stat

import pytest

from evo_sdpa.errors import StageError
from evo_sdpa.io import read_env, read_json, read_object, read_record, write_json, write_text


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_result_files_get_the_mode_the_umask_gives(tmp_path, umask, mode):
    previous = os.umask(umask)
    try:
        write_json(tmp_path / "r.json", {"status": "pass"})
        write_text(tmp_path / "s.md", "# summary\n")
    finally:
        os.umask(previous)
    for name in ("r.json", "s.md"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode
    assert read_json(tmp_path / "r.json") == {"status": "pass"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "s.md"]  # no temporary left behind


# ---------------------------------------------------------------- readers that check what they read


def written(tmp_path, name: str, data) -> str:
    path = tmp_path / name
    write_json(path, data)
    return str(path)


@pytest.mark.parametrize("data, problem", [
    ([], "a JSON list, not an object"),
    ({}, "no 'ceilings', 'device', 'git', 'versions' key"),
    ({"device": None, "ceilings": None, "git": {}, "versions": []}, "'versions' is a list"),
])
def test_a_damaged_environment_record_is_one_line_naming_it(tmp_path, data, problem):
    path = written(tmp_path, "environment.json", data)
    with pytest.raises(StageError) as caught:
        read_env(path)
    assert str(caught.value) == (f"{path}: not an environment record ({problem}), a damaged result; rebuild it: "
                                 f"snakemake --cores 1 results/final/final_summary.md --forcerun {path}")


def test_a_whole_environment_record_reads_back(tmp_path):
    cpu = {"device": None, "ceilings": None, "git": {"commit": "abc"}, "versions": {"torch": "2.13.0"}, "cuda": False}
    assert read_env(written(tmp_path, "env.json", cpu)) == cpu


def test_a_stage_record_needs_its_reasons(tmp_path):
    stub = written(tmp_path, "verdict.json", {"status": "pass"})
    with pytest.raises(StageError, match=r"verdict.json: not a stage record \(no 'reasons' key\)"):
        read_record(stub)
    with pytest.raises(StageError, match=r"not a stage record \(no 'status', 'reasons' key\)"):
        read_record(written(tmp_path, "empty.json", {}))
    with pytest.raises(StageError, match=r"not a stage record \(a JSON list, not an object\)"):
        read_record(written(tmp_path, "list.json", []))
    assert read_record(written(tmp_path, "ok.json", {"status": "skipped", "reasons": ["no card"]}))["reasons"] == ["no card"]
    with pytest.raises(StageError, match=r"not a build's resources \('kernels' is a dict\)"):
        read_object(written(tmp_path, "resources.json", {"kernels": {}}), "a build's resources", {"kernels": list})
