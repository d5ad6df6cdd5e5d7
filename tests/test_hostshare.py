"""How timing jobs and CUDA builds share a host (evo_sdpa.hostshare): the shares Snakemake's
`quiet_host` resource is split into never let a build run beside a timing job."""
from __future__ import annotations

import pytest

from evo_sdpa.hostshare import QUIET_HOST, build_shares, timing_shares


@pytest.mark.parametrize("gpu_slots", [1, 2, 3, 4, 8])
def test_a_timing_job_per_gpu_fits_and_no_build_beside_any(gpu_slots):
    timing, build = timing_shares(gpu_slots), build_shares(gpu_slots)
    assert gpu_slots * timing <= QUIET_HOST, "every GPU slot can time at once"
    assert timing + build > QUIET_HOST, "a build never fits beside a timing job"


def test_with_one_gpu_builds_run_side_by_side():
    assert build_shares(1) == 1 and timing_shares(1) == QUIET_HOST
    assert timing_shares(0) == QUIET_HOST, "no GPU slot reads as one"
