"""The v5_hopper diagnostics (kernels/v5_hopper/diagnostics/): stand-alone micro-benchmarks that
NOTES.md cites, outside the variant's sources. CPU: each still compiles for sm_90a against today's
headers, and pass_floor's passes keep the instructions and the order they time."""
from __future__ import annotations

import shutil
import subprocess

from evo_sdpa import nvcc as nvcc_lib, sass as sass_lib, tunables as tunables_lib
from evo_sdpa.build import compile_inputs
from evo_sdpa.variants import KERNELS_DIR

from test_v5_hopper import needs_toolchain, v5_variant

DIAGNOSTICS = KERNELS_DIR / "v5_hopper" / "diagnostics"


def compile_object(source, out, flags, include_dirs):
    argv = nvcc_lib.object_command(shutil.which("nvcc"), str(source), str(out), nvcc_lib.arch_gencode("9.0"),
                                   flags, include_dirs)
    return subprocess.run(argv, capture_output=True, text=True)


def test_pass_floor_builds_against_the_kernel_headers(tmp_path):
    """pass_floor.cu times the split kernel's own products, softmax and barriers through its traits:
    it builds with the variant's defines; ptxas injects no wgmma wait (C7517), which would add a wait
    the kernel's loop does not have to every pass it times; its SASS holds the products, the
    exponentials and the barrier waits."""
    needs_toolchain()
    variant = v5_variant()
    flags, include_dirs = compile_inputs(variant, tunables_lib.resolve(variant, None))
    obj = tmp_path / "pass_floor.o"
    proc = compile_object(DIAGNOSTICS / "pass_floor.cu", obj, flags, include_dirs)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "C7517" not in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-2000:]
    assert_has(object_mnemonics(obj), ("HGMMA.64x64x16", "HGMMA.64x128x16", "MUFU.EX2", "SYNCS.PHASECHK"))


def object_mnemonics(obj):
    _, listing = sass_lib.dump_sass(sass_lib.find_sass_tools(), obj)
    return set(sass_lib.mnemonics(listing))


def standalone_mnemonics(name, tmp_path):
    """Builds diagnostics/<name>.cu, which needs nvcc alone (and the headers beside it), and returns its SASS
    mnemonics."""
    needs_toolchain()
    obj = tmp_path / f"{name}.o"
    proc = compile_object(DIAGNOSTICS / f"{name}.cu", obj, ["-O3"], [])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return object_mnemonics(obj)


def assert_has(ops, wanted):
    for op in wanted:
        assert any(o.startswith(op) for o in ops), (op, sorted(ops))


def test_pdl_backfill_builds(tmp_path):
    """pdl_backfill.cu (runs 196-197) is self-contained: it builds with nvcc alone."""
    standalone_mnemonics("pdl_backfill", tmp_path)


def test_cluster_chain_builds_with_the_waits_it_times(tmp_path):
    """cluster_chain.cu (runs 244 and 244b): its clustered launch keeps what it stands in for: the cluster
    barrier across the CTA's life (UCGABAR), the PDL wait (ACQBULK) and the trigger (PREEXIT)."""
    assert_has(standalone_mnemonics("cluster_chain", tmp_path), ("UCGABAR_ARV", "UCGABAR_WAIT", "ACQBULK", "PREEXIT"))


def test_merge_cost_builds_with_both_merges(tmp_path):
    """merge_cost.cu (runs 245-246): its SASS holds both merges it prices: the cluster's pushes (STAS) landing
    on a barrier that the owner waits on (SYNCS.PHASECHK), and the global one's counter (ATOMG) behind a
    GPU-scope fence (MEMBAR.ALL.GPU), each after the PDL wait (ACQBULK)."""
    assert_has(standalone_mnemonics("merge_cost", tmp_path),
               ("STAS", "SYNCS.PHASECHK", "ATOMG.E.ADD", "MEMBAR.ALL.GPU", "ACQBULK"))
