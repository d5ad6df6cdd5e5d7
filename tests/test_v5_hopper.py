"""v5_hopper, the CuTe/wgmma/TMA rung. CPU: it builds for sm_90a with nvcc alone, its SASS holds
the Hopper instructions, nothing spills, and the library exports the C ABI and nothing else.
GPU (an sm_90 device): parity on ragged lengths, and two builds of it side by side in one process."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from evo_sdpa.build import build_cuda, installed_cutlass_include
from evo_sdpa.variants import KERNELS_DIR, load_variant, with_flags

ABI = {"evo_sdpa_abi_version", "evo_sdpa_forward", "evo_sdpa_error_string"}


def v5_variant(extra_flags: tuple[str, ...] = ()):
    return with_flags(load_variant(KERNELS_DIR / "v5_hopper"), list(extra_flags))


def needs_toolchain():
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    if installed_cutlass_include() is None:
        pytest.skip("needs the nvidia-cutlass headers")


@pytest.fixture(scope="module")
def sm90a_build(tmp_path_factory):
    needs_toolchain()
    verdict, resources, log = build_cuda(v5_variant(), "9.0", tmp_path_factory.mktemp("v5"))
    return verdict, resources, log


def test_builds_for_sm90a_without_spills(sm90a_build):
    verdict, resources, _ = sm90a_build
    assert verdict["status"] == "pass", verdict["reasons"]
    assert verdict["arch"] == "-gencode=arch=compute_90a,code=sm_90a"
    # the ABI and one unit per (dtype, head dim): in parallel, or in runs of units where this host has
    # fewer cores than units (build.merge_units)
    assert len(verdict["units"]) == min(5, os.cpu_count())
    assert sum(len(unit.get("merges", [unit["source"]])) for unit in verdict["units"]) == 5
    kernels = {r["kernel"] for r in resources}
    assert len(kernels) == 14             # 2 dtypes x 2 head dims x causal, full, full split; D=128 free issue
    assert len(resources) == 14           # each compiled once, in its own unit (merged or not)
    assert all(r["spill_store_bytes"] == 0 and r["stack_frame_bytes"] == 0 for r in resources)


def test_sass_holds_wgmma_tma_and_setmaxnreg(sm90a_build):
    verdict, _, _ = sm90a_build
    assert set(verdict["sass"]) == {"HGMMA", "UTMALDG", "USETMAXREG"}
    assert all(count > 0 for count in verdict["sass"].values()), verdict["sass"]


def test_library_exports_only_the_abi(sm90a_build):
    # A template's static local is an STB_GNU_UNIQUE symbol, bound across every library of a
    # process: exported, it let a second build of v5 skip its shared-memory opt-in (NOTES.md, run 2).
    verdict, _, _ = sm90a_build
    listing = subprocess.run(["nm", "-D", "--defined-only", verdict["artifact"]],
                             capture_output=True, text=True, check=True).stdout
    symbols = [line.split()[-1] for line in listing.splitlines() if line.strip()]
    assert ABI <= set(symbols)
    unique = [line for line in listing.splitlines() if line.split()[1:2] == ["u"] and "v5_hopper" in line]
    assert not unique
    assert not [s for s in symbols if "v5_hopper" in s]


def sm90_device() -> bool:
    import torch

    return torch.cuda.get_device_capability() == (9, 0)


def assert_matches_reference(artifact: str, dtype: str, B: int, H: int, S: int, D: int, causal: bool,
                             distribution: str = "normal") -> None:
    """One parity case of a v5 build on the card, under config.yaml's tolerance rule."""
    from evo_sdpa.parity import ParityCase, run_case
    from evo_sdpa.runners import load_forward
    from evo_sdpa.tolerance import ToleranceRule

    if not sm90_device():
        pytest.skip("v5_hopper runs on compute capability 9.0 only")
    forward = load_forward(v5_variant(), artifact)
    rule = ToleranceRule(sdpa_multiple=4.0, atol={"fp16": 1e-3, "bf16": 8e-3})
    record = run_case(ParityCase(dtype, B, H, S, D, causal, distribution, 0), forward, rule, "cuda")
    assert record["status"] == "pass", record


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("S", [1, 130, 1000])
def test_matches_reference(sm90a_build, dtype, D, causal, S):
    assert_matches_reference(sm90a_build[0]["artifact"], dtype, 2, 3, S, D, causal)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("B,H", [(1, 4), (2, 8)])
def test_long_d128_key_loops_match_reference(sm90a_build, dtype, B, H):
    """A long D=128 non-causal call runs the free-issue kernel (free_issue_d128_min_keys, from 1024
    keys), past the parity tiers' longest S (2048): 4100 keys end on a ragged key tile and a ragged
    query tile; B1 H4 is one wave of 132 tiles, B2 H8 four on the persistent grid."""
    assert sm90a_build[0]["tunables"]["free_issue_d128_min_keys"] <= 4100
    assert_matches_reference(sm90a_build[0]["artifact"], dtype, B, H, 4100, 128, False)


@pytest.mark.gpu
def test_two_builds_share_a_process(sm90a_build, tmp_path):
    """The A/B sweep and an evolution run load several builds of one variant into one process."""
    import math

    import torch

    from evo_sdpa.inputs import make_qkv, reference
    from evo_sdpa.runners import load_forward

    if not sm90_device():
        pytest.skip("v5_hopper runs on compute capability 9.0 only")
    other, _, _ = build_cuda(v5_variant(), "9.0", tmp_path, tunable_values={"pingpong": 0})
    assert other["status"] == "pass", other["reasons"]
    q, k, v = make_qkv(1, 2, 300, 128, torch.float16, "cuda", 0)
    expected = reference(q, k, v, True, 1 / math.sqrt(128))
    for artifact in (sm90a_build[0]["artifact"], other["artifact"]):
        out = torch.full_like(q, float("nan"))
        load_forward(v5_variant(), artifact)(q, k, v, out, True, 1 / math.sqrt(128))
        assert (out.double() - expected).abs().max().item() < 2e-3


@pytest.fixture(scope="module", params=[1, 2], ids=["q_buffers1", "q_buffers2"])
def persistent_build(tmp_path_factory, request):
    needs_toolchain()
    verdict, _, _ = build_cuda(v5_variant(), "9.0", tmp_path_factory.mktemp("v5_persistent"),
                               tunable_values={"persistent": 1, "q_buffers": request.param,
                                               "q_buffers_d64": request.param})
    assert verdict["status"] == "pass", verdict["reasons"]
    return verdict


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("S", [1100, 4000])
def test_persistent_grid_reuses_its_buffers_tile_after_tile(persistent_build, dtype, D, causal, S):
    """With `persistent=1` a CTA per SM walks the query tiles: B2 H16 S1100 gives each CTA two or
    three (288 tiles of 128 rows on 132 SMs), S4000 about eight (1024), so every barrier's phase
    wraps more than once. The epilogue's O slabs, the K/V rings and the barriers are reused tile
    after tile, and the last tile of each head has rows past S that the TMA store must clip. Causal,
    each CTA steps over pairs of one head's tiles (causal_order 3; S1100 leaves each head's middle
    tile of nine alone). The parity tiers' shapes are too small to give a CTA a second tile."""
    assert_matches_reference(persistent_build["artifact"], dtype, 2, 16, S, D, causal)


def defined_macros(variant, values: dict) -> set[str]:
    """The macros tunables.cuh leaves defined under these tunable values (the preprocessor only)."""
    from evo_sdpa import tunables as tunables_lib

    argv = ["g++", "-std=c++17", "-E", "-dM", "-x", "c++", *tunables_lib.define_flags(variant, values),
            str(variant.folder / "tunables.cuh")]
    listing = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return {line.split()[1] for line in listing.splitlines() if line.startswith("#define ")}


EXTENDED = "CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED"


def test_cutes_extended_wgmma_shapes_only_for_176_key_tiles():
    """The extended shapes' headers cost about 14 s of every translation unit's front end (NOTES.md,
    "Build time"): tunables.cuh defines the flag for the 176-key build alone, and no nvcc flag does."""
    from evo_sdpa import tunables as tunables_lib

    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    variant = v5_variant()
    assert not any(EXTENDED in flag for flag in variant.meta["build"]["nvcc_flags"])
    assert EXTENDED not in defined_macros(variant, tunables_lib.resolve(variant))
    assert EXTENDED in defined_macros(variant, tunables_lib.resolve(variant, {"block_n_d128_full": 176,
                                                                             "tma_epilogue": 0, "key_split": 0,
                                                                             "q_buffers": 1}))


def test_176_key_tiles_get_one_64x176_wgmma(tmp_path):
    """Built with 176-key tiles, the fp16 D=128 unit issues one 64x176 wgmma per key tile (without the
    extended shapes, kernel_traits.cuh's static_assert stops the compile instead)."""
    from evo_sdpa import nvcc as nvcc_lib, sass as sass_lib, tunables as tunables_lib
    from evo_sdpa.build import compile_inputs

    needs_toolchain()
    variant = v5_variant()
    values = tunables_lib.resolve(variant, {"block_n_d128_full": 176, "tma_epilogue": 0, "key_split": 0,
                                            "q_buffers": 1})
    flags, includes = compile_inputs(variant, values)
    obj = tmp_path / "inst_fp16_d128.o"
    argv = nvcc_lib.object_command(shutil.which("nvcc"), str(variant.folder / "inst_fp16_d128.cu"), str(obj),
                                   nvcc_lib.arch_gencode("9.0"), flags, includes)
    proc = subprocess.run(argv, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    _, listing = sass_lib.dump_sass(sass_lib.find_sass_tools(), obj)
    shapes = {m for m in sass_lib.mnemonics(listing) if m.startswith("HGMMA.64x")}
    assert any(m.startswith("HGMMA.64x176x16") for m in shapes), shapes


TRAITS_PROGRAM = r"""
#include "kernel_traits.cuh"
using Element = cutlass::half_t;
using FreeIssue = v5_hopper::KernelTraits<Element, 128, 128, 128, 2, false, true>;
using PingPong = v5_hopper::KernelTraits<Element, 128, 128, 128, 2, false, false>;
using PingPong64 = v5_hopper::KernelTraits<Element, 64, 128, 128, 2, false, false>;
using Split = v5_hopper::KernelTraits<Element, 128, 64, 64, 2, true, false>;
static_assert(FreeIssue::kLazyRescale == EXPECT_FREE_LAZY, "free-issue kernel: lazy rescaling");
static_assert(PingPong::kLazyRescale == EXPECT_OTHER_LAZY, "D=128 ping-pong kernel: lazy rescaling");
static_assert(PingPong64::kLazyRescale == EXPECT_OTHER_LAZY, "D=64 ping-pong kernel: lazy rescaling");
static_assert(FreeIssue::kOptimisticMax == EXPECT_OPTIMISTIC, "free-issue kernel: optimistic maxima");
static_assert(PingPong::kOptimisticMax == EXPECT_OTHER_OPTIMISTIC, "D=128 ping-pong kernel: optimistic maxima");
static_assert(PingPong64::kOptimisticMax == EXPECT_OTHER_OPTIMISTIC, "D=64 ping-pong kernel: optimistic maxima");
static_assert(Split::kOptimisticMax == EXPECT_OTHER_OPTIMISTIC, "split kernel: optimistic maxima");
static_assert(PingPong::kSeparateV == EXPECT_SEPARATE_V, "unsplit kernel: a loading thread per ring");
static_assert(!Split::kSeparateV, "a split kernel keeps one loading thread");
static_assert(PingPong::kQBuffers == EXPECT_Q_BUFFERS, "D=128 ping-pong kernel: Q buffers");
static_assert(FreeIssue::kQBuffers == 2, "free-issue kernel: two Q buffers where they fit");
"""


@pytest.mark.parametrize("overrides, free_lazy, other_lazy, optimistic, other_optimistic, separate_v, q_buffers", [
    ({}, 1, 1, 1, 1, 0, 2),                                     # the defaults (NOTES.md, runs 67-83)
    ({"lazy_rescale": 1, "kv_producers": 2, "q_buffers": 1}, 1, 1, 0, 0, 1, 1),
    ({"lazy_rescale": 0}, 0, 0, 0, 0, 0, 2),
    ({"lazy_rescale": 2}, 1, 0, 0, 0, 0, 2),
    ({"lazy_rescale": 3}, 1, 0, 1, 0, 0, 2),
])
def test_per_kernel_knobs_reach_the_kernels_they_name(tmp_path, overrides, free_lazy, other_lazy, optimistic,
                                                      other_optimistic, separate_v, q_buffers):
    """lazy_rescale 2 rescales lazily in the free-issue kernel only (the ping-pong and D=64 kernels
    measured 2-7% slower with it, NOTES.md run 67), 3 also skips its tiles' maxima optimistically
    there (run 80), 4 does both in every kernel; kv_producers never reaches a split kernel;
    q_buffers sets the D=128 ping-pong kernels' Q buffers. The traits are compiled and asserted."""
    from evo_sdpa import nvcc as nvcc_lib, tunables as tunables_lib
    from evo_sdpa.build import compile_inputs

    needs_toolchain()
    variant = v5_variant()
    flags, includes = compile_inputs(variant, tunables_lib.resolve(variant, overrides))
    source = tmp_path / "traits.cu"
    source.write_text(TRAITS_PROGRAM)
    expect = [f"-DEXPECT_FREE_LAZY={free_lazy}", f"-DEXPECT_OTHER_LAZY={other_lazy}",
              f"-DEXPECT_OPTIMISTIC={optimistic}", f"-DEXPECT_OTHER_OPTIMISTIC={other_optimistic}",
              f"-DEXPECT_SEPARATE_V={separate_v}", f"-DEXPECT_Q_BUFFERS={q_buffers}"]
    argv = nvcc_lib.object_command(shutil.which("nvcc"), str(source), str(tmp_path / "traits.o"),
                                   nvcc_lib.arch_gencode("9.0"), flags + expect, includes)
    proc = subprocess.run(argv, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


WALK_PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include "tile_order.cuh"
int main(int argc, char** argv) {
    const v5_hopper::TileOrder order{std::atoi(argv[1]), std::atoi(argv[2]), std::atoi(argv[3]),
                                     std::atoi(argv[4]), std::atoi(argv[5]) != 0};
    for (int cta = 0; cta < order.grid; ++cta) {
        for (int t = order.first(cta); order.valid(t); t = order.next(t)) {
            int m_block, head_index;
            order.locate(t, m_block, head_index);
            std::printf("%d %d %d\n", cta, m_block, head_index);
        }
    }
}
"""


def host_program(tmp_path_factory, name: str, source: str):
    """A C++ program over this folder's host-compilable headers, built with g++: a function of its
    arguments that returns its standard output."""
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    folder = tmp_path_factory.mktemp(name)
    (folder / f"{name}.cpp").write_text(source)
    binary = folder / name
    subprocess.run(["g++", "-std=c++17", "-O1", f"-I{v5_variant().folder}", str(folder / f"{name}.cpp"),
                    "-o", str(binary)], check=True, capture_output=True, text=True)
    return lambda *args: subprocess.run([str(binary), *map(str, args)], check=True, capture_output=True,
                                        text=True).stdout


@pytest.fixture(scope="module")
def tile_walk(tmp_path_factory):
    """Walks every CTA of a launch through tile_order.cuh, compiled for the host: {cta: [(m_block,
    head_index), ...]} in the order each CTA visits its tiles."""
    run = host_program(tmp_path_factory, "walk", WALK_PROGRAM)

    def walk(m_blocks: int, heads_total: int, grid: int, order: int, causal: bool = True) -> dict[int, list]:
        lists: dict[int, list] = {}
        for line in run(m_blocks, heads_total, grid, order, int(causal)).splitlines():
            cta, m_block, head_index = map(int, line.split())
            lists.setdefault(cta, []).append((m_block, head_index))
        return lists
    return walk


def makespan(lists: dict[int, list], per_tile: float = 0.5) -> float:
    """The longest CTA's work with one key tile per query tile of 128 rows at the diagonal (the
    D=128 causal tiles: m_block + 1 key tiles) plus a fixed cost per tile."""
    return max(sum(m_block + 1 + per_tile for m_block, _ in tiles) for tiles in lists.values())


@pytest.mark.parametrize("order", [0, 1, 2, 3])
@pytest.mark.parametrize("m_blocks, heads_total, grid", [
    (16, 64, 132), (16, 32, 132), (17, 8, 132), (17, 40, 132), (1, 300, 132), (2, 5, 3), (16, 64, 1024), (33, 3, 99),
    (16, 4, 128)])   # the last: more CTAs than tiles (a cluster split's grid; its CTAs past the tiles walk none)
@pytest.mark.parametrize("causal", [True, False])
def test_every_tile_is_visited_once(tile_walk, order, m_blocks, heads_total, grid, causal):
    lists = tile_walk(m_blocks, heads_total, grid, order, causal)
    visited = sorted(tile for tiles in lists.values() for tile in tiles)
    assert visited == sorted((m, h) for m in range(m_blocks) for h in range(heads_total))


def test_paired_order_balances_the_persistent_stride(tile_walk):
    """4,16,2048,128 causal on 132 SMs: head by head the stride gives CTAs 56-80 key tiles; pairs of one
    head's k-th longest and k-th shortest tiles (17 key tiles each) give every CTA 3 or 4 pairs, and keep
    a pass of the grid within about 17 heads (rank order spans all 64)."""
    head_by_head = tile_walk(16, 64, 132, 1)
    paired = tile_walk(16, 64, 132, 3)
    assert makespan(head_by_head) == 84
    assert makespan(paired) == 4 * 17 + 4 * 2 * 0.5
    for tiles in paired.values():
        for (longer, head_a), (shorter, head_b) in zip(tiles[::2], tiles[1::2]):
            assert head_a == head_b and longer + shorter == 15 and longer > shorter
    first_pass = {tiles[0][1] for tiles in paired.values()}
    assert len(first_pass) == 17


def test_paired_order_keeps_rank_order_below_a_persistent_grid(tile_walk):
    """One CTA per tile (1,8,4096,128 causal: 256 tiles): order 3 is order 1, every head's longest first."""
    assert tile_walk(32, 8, 256, 3) == tile_walk(32, 8, 256, 1)
    assert [tiles[0] for _, tiles in sorted(tile_walk(32, 8, 256, 3).items())][:8] == [(31, h) for h in range(8)]


PLAN_PROGRAM = r"""
#include <cstdio>
#include <cstdlib>
#include "tail_split.cuh"
int main(int argc, char** argv) {
    const int heads_total = std::atoi(argv[1]), seq_len = std::atoi(argv[2]), sms = std::atoi(argv[3]);
    const int m_blocks = (seq_len + 127) / 128, split_m_blocks = (seq_len + 63) / 64, shares = (seq_len + 127) / 128;
    // cluster_splits on a device of `sms` SMs holding two 64-row split CTAs each, every cluster resident
    const auto splits_for = [&](long long tiles) {
        for (int splits = 4; splits >= 2; splits /= 2)
            if (splits <= shares && tiles * splits <= 2LL * sms) return splits;
        return 1;
    };
    // persistent_min_waves 3
    const v5_hopper::TailPlan plan =
        v5_hopper::plan_tail(heads_total, m_blocks, 128, seq_len, split_m_blocks, 64, sms, 3LL * sms, splits_for);
    std::printf("%d %d\n", plan.heads, plan.splits);
}
"""


@pytest.fixture(scope="module")
def tail_plan(tmp_path_factory):
    """tail_split.cuh's plan for (heads x batch, keys, SMs), compiled for the host: (heads, splits)."""
    run = host_program(tmp_path_factory, "plan", PLAN_PROGRAM)

    def plan(heads_total: int, seq_len: int, sms: int = 132) -> tuple[int, int]:
        heads, splits = map(int, run(heads_total, seq_len, sms).split())
        return heads, splits
    return plan


@pytest.mark.parametrize("B,H,S,expected", [
    # 8192 tiles, 62 rounds and 8 tiles -> 8160 and one head's 64 halves x 4: 62.66 rounds of 63
    (16, 16, 4096, (1, 4)),
    (8, 16, 4096, (1, 4)),    # 4096 tiles, 31 rounds and 4
    (1, 17, 4096, (1, 4)),    # 544 tiles: 5 rounds -> 4.66
    (1, 45, 1100, (1, 4)),    # 405 tiles: 4 rounds -> 3.83 (ragged: 1100 keys)
    (1, 50, 1024, (0, 1)),    # 400 -> 392 tiles would leave the persistent grid (396 from 3 waves)
    (1, 100, 1024, (0, 1)),   # 800 -> 792 tiles: 6 rounds, but the split launch costs 0.875 of one
    (1, 17, 8192, (0, 1)),    # 1088 -> 1024 tiles saves a round, one head's 128 halves x 2 cost 1.08
    (8, 16, 1024, (0, 1)),    # 1024 tiles: 8 rounds; 7 need 13 heads, whose halves fit no cluster of 2
    (2, 16, 8192, (0, 1)),    # 2048 tiles: 16 rounds; 15 need 2 heads' 256 halves, no cluster of 2 fits
    (1, 132, 1024, (0, 1)),   # whole rounds: nothing to save
])
def test_tail_split_plans_the_last_round(tail_plan, B, H, S, expected):
    assert tail_plan(B * H, S) == expected


def test_tail_split_needs_more_tiles_than_sms(tail_plan):
    assert tail_plan(16, 1024) == (0, 1)   # 128 tiles on 132 SMs: one round, nothing idles for a second
    assert tail_plan(256, 4096, sms=0) == (0, 1)   # the SM count could not be read


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("B,H,S", [(1, 45, 1100), (1, 17, 4096)])
def test_last_heads_in_a_split_launch_match_reference(sm90a_build, tail_plan, dtype, D, B, H, S):
    """With tail_split_min_keys these calls run as two launches: the unsplit kernel over the first
    heads (a call of batch 1 on a slice of the tensors) and the split kernel over the last head,
    whose rows end ragged at 1100 keys."""
    import torch

    if not sm90_device():
        pytest.skip("v5_hopper runs on compute capability 9.0 only")
    assert 0 < sm90a_build[0]["tunables"]["tail_split_min_keys"] <= S
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if tail_plan(B * H, S, sms)[0] == 0:
        pytest.skip(f"no tail plan for {B * H} heads of {S} keys on {sms} SMs")
    assert_matches_reference(sm90a_build[0]["artifact"], dtype, B, H, S, D, False)
