import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))


def cuda_device_present() -> bool:
    if os.environ.get("EVO_SDPA_FORCE_CPU") == "1":
        return False
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped on hosts without one")


def pytest_collection_modifyitems(config, items):
    if cuda_device_present():
        return
    skip = pytest.mark.skip(reason="no CUDA device on this host")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def drawn(monkeypatch):
    """Every figure the report's plots close, kept to be read: what a PNG's bytes cannot show."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures, close = [], plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: (figures.append(fig), close(fig)))
    return figures
