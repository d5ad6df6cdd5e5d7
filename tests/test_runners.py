"""Where the variants run: the Triton interpreter's known breakage is named with its fix."""
import importlib.metadata as md

from evo_sdpa import runners


def test_interpreter_blocker_names_the_fix(monkeypatch):
    versions = {"triton": "3.6.0", "numpy": "2.4.1"}
    monkeypatch.setattr(md, "version", lambda name: versions[name])
    assert "triton>=3.9" in runners.interpreter_blocker()
    versions["numpy"] = "2.2.6"
    assert runners.interpreter_blocker() is None
    versions.update(triton="3.9.0", numpy="2.4.1")
    assert runners.interpreter_blocker() is None
