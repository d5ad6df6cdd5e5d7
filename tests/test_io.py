"""Result files: written whole (temporary file + rename) and readable by whoever the umask allows,
like any file the user's tools write (mkstemp alone leaves 0600)."""
from __future__ import annotations

import os
import stat

import pytest

from evo_sdpa.io import read_json, write_json, write_text


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
