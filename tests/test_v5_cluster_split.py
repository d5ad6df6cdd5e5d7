"""v5_hopper's cluster key split (issue 8). CPU: with key_split on, the sm_90a build holds one split
kernel per (dtype, head dim) and, with split_wide, a wide one at D=64 (128 rows, no producer); none
spills, and each pushes its state with st.async on the owner's mbarrier after the cluster barrier,
with no memory fence. GPU (an sm_90 device): parity on grids that launch clusters of 4 and 2 CTAs
(one and several key tiles per rank, ragged last tiles), racecheck over the pushes, and the
profiler's kernel names show which split kernel ran."""
from __future__ import annotations

import dataclasses
import re

import pytest

from evo_sdpa.build import build_cuda
from evo_sdpa.errors import StageError
from evo_sdpa.sass import dump_sass, find_sass_tools
from test_v5_hopper import assert_matches_reference, needs_toolchain, sm90_device, v5_variant

SPLIT = {"key_split": 1, "pdl": 1}   # PDL on every launch, eager ones included
# KernelTraits<Element, D, M, N, stages, true, false, false>: the split traits' last four arguments,
# mangled (2 stages, or 4 in the D=64 kernels with split_stages_d64 4); the wide split kernel's
# (split_wide: 128 rows, 64 keys, 4 stages, no producer) end in true, false, true.
SPLIT_TRAITS = re.compile(r"ELi[24]ELb1ELb0ELb0EEE")
WIDE_TRAITS = re.compile(r"ELi64ELi128ELi64ELi4ELb1ELb0ELb1EEE")


def is_split(kernel: str) -> bool:
    return SPLIT_TRAITS.search(kernel) is not None


def is_wide(kernel: str) -> bool:
    return WIDE_TRAITS.search(kernel) is not None


# Split CTAs of 128 query rows (two consumer warp groups) and of 64 (one; two CTAs to an SM at D=64),
# the latter with 128- and 64-key stages, with 64-key stages three to an SM at D=64 (two stages each),
# and with the default's four 64-key stages at D=64 (m64n64, here with 64-key stages at D=128 too);
# the default's with split_wide (wide: at D=64, 2 x 8 x 512 runs 128-row CTAs without a producer), and
# without the first burst's waits (nogaps).
@pytest.fixture(scope="module", params=[{"split_block_m": 128, "split_block_n": 128, "split_stages_d64": 2},
                                        {"split_block_m": 64, "split_block_n": 128, "split_stages_d64": 2},
                                        {"split_block_m": 64, "split_block_n": 64, "split_block_n_d128": 64},
                                        {"split_block_m": 64, "split_block_n": 64, "split_ctas_per_sm": 3,
                                         "split_stages_d64": 2},
                                        {"split_wide": 1},
                                        {"split_burst_gap": 0, "split_burst_gap2": 0}],
                ids=["m128", "m64", "m64n64", "m64n64c3", "wide", "nogaps"])
def split_build(request, tmp_path_factory):
    needs_toolchain()
    verdict, resources, _ = build_cuda(v5_variant(), "9.0", tmp_path_factory.mktemp("v5_split"),
                                       tunable_values={**SPLIT, **request.param})
    assert verdict["status"] == "pass", verdict["reasons"]
    return verdict, resources


def test_split_kernels_build_without_spills(split_build):
    _, resources = split_build
    split = [r for r in resources if is_split(r["kernel"])]
    assert len(split) == 4, [r["kernel"] for r in resources]   # fp16/bf16 x D 64/128, non-causal only
    tunables = split_build[0]["tunables"]
    wide = [r for r in resources if is_wide(r["kernel"])]
    assert len(wide) == 2 * tunables["split_wide"], [r["kernel"] for r in resources]   # fp16/bf16 at D=64
    assert all(r["spill_store_bytes"] == 0 and r["stack_frame_bytes"] == 0 for r in split + wide)
    # two CTAs of 256 threads to an SM, with no setmaxnreg to trade registers
    assert all(r["registers"] <= 128 for r in wide), wide
    assert len(resources) == 14 + len(wide)   # with the two D=128 free-issue kernels
    if tunables["split_block_m"] == 64:
        # Launched for two CTAs per SM at D=64 (setmaxnreg then trades within 128 x 256 registers),
        # three with 64-key stages where asked (80 x 256).
        ctas = 3 if tunables["split_block_n"] == 64 and tunables["split_ctas_per_sm"] == 3 else 2
        stages = tunables["split_stages_d64"]
        d64 = [r for r in split if re.search(rf"ELi64ELi64ELi(64|128)ELi{stages}ELb1", r["kernel"])]
        assert len(d64) == 2 and all(r["registers"] <= 65536 // (256 * ctas) // 8 * 8 for r in d64), d64


def split_and_other_sass(split_build) -> tuple[list[str], list[str]]:
    """The build's SASS, function by function (each body starting with its name): the split kernels'
    (wide ones included, their count checked) and the others'."""
    try:
        tools = find_sass_tools()
    except StageError as exc:  # the tools are optional on a developer machine
        pytest.skip(str(exc))
    _, listing = dump_sass(tools, split_build[0]["artifact"])
    split, others = [], []
    for body in re.split(r"\n\s*Function : ", listing)[1:]:
        name = body.split("\n", 1)[0]
        (split if is_split(name) or is_wide(name) else others).append(body)
    assert len(split) == 4 + 2 * split_build[0]["tunables"]["split_wide"] and others
    return split, others


def test_split_kernels_push_through_st_async_without_a_fence(split_build):
    """A pusher's state goes as 16-byte st.async chunks a lane: the head (maxima and whole sums), then O, as
    floats at D=128 (D/8 chunks) and as 16-bit pairs at D=64 (D/16, the compact push: NOTES.md, run 263)."""
    split, _ = split_and_other_sass(split_build)
    for body in split:
        head_dim = int(re.search(r"_tELi(\d+)ELi", body.split("\n", 1)[0]).group(1))   # KernelTraits<T, D, ...>
        o_chunks = head_dim // 16 if head_dim == 64 else head_dim // 8
        assert body.count("STAS.128") == 1 + o_chunks
        assert "SYNCS.ARRIVE.TRANS64" in body   # the owner's barriers expect the bytes
        assert "UCGABAR_ARV" in body and "UCGABAR_WAIT" in body   # the cluster barrier before any push
        assert "MEMBAR" not in body             # no fence: the barrier's byte count orders the pushes


def test_split_kernels_load_their_inputs_evict_first(split_build):
    """evict_first_inputs (default 1): the split kernels' TMA loads carry L2's evict-first policy
    (0x12F0000000000000, whose high word is an immediate of the load's policy operand), the other
    kernels the normal one (0x1000000000000000) (NOTES.md, runs 249-250)."""
    split, others = split_and_other_sass(split_build)
    split, others = [f.lower() for f in split], [f.lower() for f in others]
    assert all("utmaldg" in f and "0x12f00000" in f and "0x10000000" not in f for f in split)
    assert all("0x12f00000" not in f and "0x10000000" in f for f in others)


def test_d64_split_kernels_of_four_stages_wait_inside_their_first_burst(split_build):
    """split_burst_gap and split_burst_gap2 (600 and 400 by default, 0 in the nogaps build): the K/V
    thread of a D=64 split kernel with a four-stage ring waits on the SM's clock between K0 and V0, and
    between K1 and V1; no other kernel reads the clock, and with both at 0 none does (NOTES.md, runs
    256-261)."""
    split, others = split_and_other_sass(split_build)
    tunables = split_build[0]["tunables"]
    waits = tunables["split_burst_gap"] + tunables["split_burst_gap2"] > 0
    four_stage_d64 = re.compile(r"ELi64ELi64ELi64ELi4ELb1ELb0ELb0EEE")
    for body in split + others:
        name = body.split("\n", 1)[0]
        assert ("SR_CLOCKLO" in body) == (waits and four_stage_d64.search(name) is not None), name


# (B, H, S) on an H100's 132 SMs: 8 heads x 4 query tiles -> clusters of 2, two key tiles each
# (32 clusters of 4 do not fit at once: NOTES.md, run 21); 16 x 4 -> 2, two each; 2 x 5 tiles of
# 520 -> 4 (shares 1, 1, 1, 2, the last tile 8 keys, the last query tile 8 rows: the grid that
# covers clusters of 4); 6 x 8 tiles of 1000 -> 2 (four each, 104 keys in the last); one head of
# 129 -> 2 (the second rank's tile holds one key).
GRIDS = [(1, 8, 512), (2, 8, 512), (1, 2, 520), (2, 3, 1000), (1, 1, 129)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("grid", GRIDS, ids=lambda g: "x".join(map(str, g)))
def test_split_grids_match_reference(split_build, dtype, D, grid):
    B, H, S = grid
    for distribution in ("normal", "dominant_key", "large"):
        assert_matches_reference(split_build[0]["artifact"], dtype, B, H, S, D, False, distribution)


@pytest.mark.gpu
@pytest.mark.parametrize("grid, splits", [((1, 8, 512), True), ((2, 8, 512), True), ((4, 8, 512), False)],
                         ids=["1x8x512", "2x8x512", "4x8x512"])
def test_small_grids_run_the_split_kernel(split_build, grid, splits):
    """The split is chosen by the host from the grid: under one wave of query tiles it runs,
    at 128 tiles (one per SM already) it does not. Where 64-row split CTAs would fill both slots of
    every SM (2 x 8 x 512), split_wide runs the wide split kernel instead, one CTA of the call an SM."""
    import math

    import torch

    from evo_sdpa.inputs import make_qkv
    from evo_sdpa.runners import load_forward

    if not sm90_device():
        pytest.skip("v5_hopper runs on compute capability 9.0 only")
    forward = load_forward(v5_variant(), split_build[0]["artifact"])
    q, k, v = make_qkv(*grid, 64, torch.float16, "cuda", 0)
    out = torch.empty_like(q)
    forward(q, k, v, out, False, 1 / math.sqrt(64))   # the first call reads the device's cluster limits
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        forward(q, k, v, out, False, 1 / math.sqrt(64))
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if "v5_hopper_attention_fwd" in e.name]
    assert names, [e.name for e in prof.events()]
    # KernelTraits<..., stages, split, free issue, no producer>
    wide = grid == (2, 8, 512) and split_build[0]["tunables"]["split_wide"] == 1
    assert any(re.search(r", [24], true, false, false>", name) for name in names) == (splits and not wide), names
    assert any(re.search(r", 4, true, false, true>", name) for name in names) == wide, names


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 2, 520), (2, 8, 512)], ids=lambda g: "x".join(map(str, g)))
def test_racecheck_follows_the_pushes(split_build, tmp_path, monkeypatch, shape):
    """compute-sanitizer's racecheck over the split kernels (clusters of 4 on 1 x 2 x 520, of 2 filling
    both slots of every SM on 2 x 8 x 512, where split_wide runs the wide kernel at D=64, whose thread
    0 sends every load) completes with no hazard. It hung while the owner warps skipped the cluster
    barrier's wait (NOTES.md, runs 26-28), so a hang fails here after three minutes, not the stage's
    fifteen."""
    import json
    import shutil

    from evo_sdpa import sanitizer

    if not sm90_device():
        pytest.skip("v5_hopper runs on compute capability 9.0 only")
    tool = shutil.which("compute-sanitizer")
    if tool is None:
        pytest.skip("compute-sanitizer is not on PATH")
    monkeypatch.setattr(sanitizer, "TOOL_TIMEOUT_S", 180)
    build = tmp_path / "build.json"
    build.write_text(json.dumps(split_build[0]))
    cfg = {"tools": ["racecheck"], "padding_bytes": 256, "shape": {"B": 1, "H": 1, "S": 129}}
    # That shape in place of the variant's sanitizer shapes, whose persistent grids run no split kernel.
    variant = v5_variant()
    chosen = [dict(zip("BHS", shape))]
    variant = dataclasses.replace(variant, meta={**variant.meta, "sanitizer_shapes": chosen})
    result = sanitizer.check_variant(tool, cfg, variant, build, tmp_path / "logs")
    assert result["status"] == "pass", result
    assert result["variant_shapes"] == chosen
    # ... and ran: the target once took its shapes from variant.yaml and left this one out (run 220).
    assert f"ran {chosen[0]}" in (tmp_path / "logs" / "racecheck.stdout.log").read_text()


@pytest.mark.gpu
@pytest.mark.parametrize("operand", ["q", "k", "v"])
@pytest.mark.parametrize("grid", [(1, 8, 512), (2, 8, 512), (1, 2, 520)], ids=lambda g: "x".join(map(str, g)))
def test_a_chain_of_launches_reads_each_previous_output(split_build, operand, grid):
    """Each call's `operand` is the previous call's output, launched back to back with PDL (every
    launch of this build) and again captured in a graph. Only the loading threads wait for the
    previous grid (NOTES.md, run 32): a load issued before that grid's stores landed would read a
    stale input, and the chain would differ from the same calls run one at a time."""
    import math

    import torch

    from evo_sdpa.inputs import make_qkv
    from evo_sdpa.runners import load_forward

    if not sm90_device():
        pytest.skip("v5_hopper runs on compute capability 9.0 only")
    forward = load_forward(v5_variant(), split_build[0]["artifact"])
    q, k, v = make_qkv(*grid, 64, torch.float16, "cuda", 0)
    links = 8
    outs = [torch.empty_like(q) for _ in range(links)]

    def chain(synchronize: bool) -> None:
        previous = None
        for out in outs:
            args = {"q": q, "k": k, "v": v}
            if previous is not None:
                args[operand] = previous
            forward(args["q"], args["k"], args["v"], out, False, 1 / math.sqrt(64))
            if synchronize:
                torch.cuda.synchronize()
            previous = out

    chain(synchronize=True)
    expected = [out.clone() for out in outs]
    for out in outs:
        out.fill_(float("nan"))
    chain(synchronize=False)
    torch.cuda.synchronize()
    for i, (got, want) in enumerate(zip(outs, expected)):
        assert torch.equal(got, want), f"back-to-back call {i} differs from the one-at-a-time chain"
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        chain(synchronize=False)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain(synchronize=False)
    for out in outs:
        out.fill_(float("nan"))
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    for i, (got, want) in enumerate(zip(outs, expected)):
        assert torch.equal(got, want), f"graph-replayed call {i} differs from the one-at-a-time chain"
