"""How timing jobs and CUDA builds share one host under `--cores N`: a timing job records each
eager call's host time beside its GPU time (and flags host-bound calls by it), and nvcc
processes on the same host move it. Both ask for shares of one Snakemake resource,
`quiet_host`, of QUIET_HOST in all: the shares are sized so that up to one timing job per GPU
slot runs at once, no build runs beside a timing job, and with one GPU slot any number of builds
run beside each other and beside the jobs that time nothing (sanitizer, parity, profiles)."""
from __future__ import annotations

QUIET_HOST = 1024


def timing_shares(gpu_slots: int) -> int:
    """A timing job's share: `gpu_slots` of them fit together."""
    return QUIET_HOST // max(1, gpu_slots)


def build_shares(gpu_slots: int) -> int:
    """A CUDA build's share: more than what one timing job leaves free. With one GPU slot that is
    1, so builds run side by side; with several, one build at a time (each still compiles its
    translation units in parallel on its threads)."""
    return QUIET_HOST - timing_shares(gpu_slots) + 1
