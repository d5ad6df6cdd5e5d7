"""v4_pipelined's cluster key split (issue 8). CPU: the sm_90a build compiles one split kernel per
(dtype, head dim) without spills, and its SASS pushes states with st.async on an mbarrier, with no
memory fence. GPU (an sm_90 device): parity on grids that launch clusters of 2 and 4 CTAs,
causal ones included (where a rank can get no key tile at all), for the default build and a 4-warp
build that splits every small grid 4 ways."""
from __future__ import annotations

import re
import shutil

import pytest

from evo_sdpa.build import build_cuda
from evo_sdpa.errors import StageError
from evo_sdpa.sass import dump_sass, find_sass_tools
from evo_sdpa.variants import KERNELS_DIR, load_variant

V4 = load_variant(KERNELS_DIR / "v4_pipelined")
# 4-warp split CTAs, up to 4 CTAs per SM: every grid below 132 x 4 CTAs splits 4 ways where it has
# 4 key tiles.
FOUR_WAY = {"cluster_key_groups_d64": 1, "split_ctas_per_sm": 4}


def split_kernels(resources: list[dict]) -> list[dict]:
    # The kernel template's second argument is the split flag: ...ELb1E... in the mangled name.
    return [r for r in resources if "ELb1E" in r["kernel"]]


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    default = build_cuda(V4, "9.0", tmp_path_factory.mktemp("v4_default"))
    four_way = build_cuda(V4, "9.0", tmp_path_factory.mktemp("v4_four_way"), tunable_values=FOUR_WAY)
    return {"default": default, "four_way": four_way}


def test_split_kernels_build_for_sm90a_without_spills(builds):
    for name, (verdict, resources, _) in builds.items():
        assert verdict["status"] == "pass", (name, verdict["reasons"])
        split = split_kernels(resources)
        assert len(split) == 4, [r["kernel"] for r in resources]  # fp16/bf16 x D 64/128
        assert all(r["spill_store_bytes"] == 0 and r["stack_frame_bytes"] == 0 for r in split)


def test_split_kernels_push_through_st_async_without_a_fence(builds):
    try:
        tools = find_sass_tools()
    except StageError as exc:  # the tools are optional on a developer machine
        pytest.skip(str(exc))
    _, listing = dump_sass(tools, builds["default"][0]["artifact"])
    functions = re.split(r"\n\s*Function : ", listing)
    split = [f for f in functions if "ELb1E" in f.split("\n", 1)[0]]
    assert len(split) == 4
    for body in split:
        assert "STAS.128" in body          # st.async of 16-byte state chunks into the owner
        assert "SYNCS.ARRIVE.TRANS64" in body  # the owner's barrier expects the bytes
        assert "UCGABAR_WAIT" in body      # the cluster barrier before the first push
        assert "MEMBAR" not in body        # no release fence (it cost ~1.1 us at 8 ranks, NOTES.md)


def sm90_device() -> bool:
    import torch

    return torch.cuda.get_device_capability() == (9, 0)


# (B, H, S) -> clusters of: 2 x 3 heads x 3 query tiles, 130 keys -> 2; one head of 1000 rows (16
# query tiles) -> 4; 2 heads of 67 rows (the sanitizer's shape) -> 2 where a key step is 64 keys
# (D=128, or the four-way build), none with the default's 128-key steps at D=64 (one step only).
GRIDS = [(2, 3, 130), (1, 1, 1000), (1, 2, 67)]


@pytest.mark.gpu
@pytest.mark.parametrize("build", ["default", "four_way"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("grid", GRIDS, ids=lambda g: "x".join(map(str, g)))
def test_split_grids_match_reference(builds, build, dtype, D, causal, grid):
    from evo_sdpa.parity import ParityCase, run_case
    from evo_sdpa.runners import load_forward
    from evo_sdpa.tolerance import ToleranceRule

    if not sm90_device():
        pytest.skip("clusters: compute capability 9.0")
    forward = load_forward(V4, builds[build][0]["artifact"])
    rule = ToleranceRule(sdpa_multiple=4.0, atol={"fp16": 1e-3, "bf16": 8e-3})
    B, H, S = grid
    for distribution in ("normal", "dominant_key"):
        record = run_case(ParityCase(dtype, B, H, S, D, causal, distribution, 0), forward, rule, "cuda")
        assert record["status"] == "pass", record
