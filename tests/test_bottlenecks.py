"""Bottleneck rules on synthetic profiles (each pathology fires, a healthy kernel does not) and on
the real cuDNN SDPA profile from an H100."""
from __future__ import annotations

from pathlib import Path

import pytest

from evo_sdpa import bottlenecks, ncu
from evo_sdpa.bottlenecks import RuleContext
from evo_sdpa.ncu import KernelProfile

FIXTURES = Path(__file__).parent / "fixtures"
CLEAN_CSV = FIXTURES / "h100_sdpa_cudnn_b2h8s512d64_raw.csv"
# v4_pipelined's cluster-split kernel on (1,8,512,64) fp16, same card and export (v4 NOTES.md, run 11).
V4_SMALL_CSV = FIXTURES / "h100_v4_pipelined_b1h8s512d64_raw.csv"
# v5_hopper's split kernel on (2,8,512,64) fp16, NVIDIA H200, the pipeline's ncu stage (v5 NOTES.md,
# run 111): TMA loads, the owner's O stored from registers.
V5_SMALL_CSV = FIXTURES / "h200_v5_hopper_b2h8s512d64_raw.csv"

B, H, S, D = 2, 8, 512, 64
FLOPS = 4.0 * B * H * S * S * D
MIN_BYTES = 4.0 * B * H * S * D * 2  # q, k, v, o in fp16
CEILINGS = {"matmul_tflops": {"fp16": 700.0, "bf16": 690.0}, "copy_gbps": 3000.0}

STALL = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"

# A kernel with no pathology: full waves, fair occupancy, busy tensor pipe, clean access patterns,
# no spills, and stall cycles spread evenly (no reason above 20%).
HEALTHY: dict[str, float] = {
    "gpu__time_duration.sum": 100_000.0,
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": 80.0,
    "smsp__issue_active.avg.pct_of_peak_sustained_active": 80.0,
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active": 70.0,
    "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active": 10.0,
    "smsp__inst_executed.sum": 1_000_000.0,
    "dram__bytes_read.sum": 5_000_000.0,
    "dram__bytes_write.sum": 1_000_000.0,
    "l1tex__m_xbar2l1tex_read_bytes.sum": 8_000_000.0,
    "sm__warps_active.avg.pct_of_peak_sustained_active": 40.0,
    "sm__maximum_warps_per_active_cycle_pct": 50.0,
    "launch__occupancy_limit_registers": 2.0,
    "launch__occupancy_limit_shared_mem": 3.0,
    "launch__occupancy_limit_warps": 4.0,
    "launch__occupancy_limit_blocks": 32.0,
    "launch__occupancy_limit_barriers": 16.0,
    "launch__registers_per_thread": 128.0,
    "launch__shared_mem_per_block": 65_536.0,
    "launch__grid_size": 1056.0,
    "launch__block_size": 256.0,
    "launch__sm_count": 132.0,
    "launch__waves_per_multiprocessor": 4.0,
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum": 10.0,
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum": 10_000.0,
    "derived__memory_l2_theoretical_sectors_global_excessive": 0.0,
    "memory_l2_theoretical_sectors_global": 4096.0,
    "sass__inst_executed_local_loads": 0.0,
    "sass__inst_executed_local_stores": 0.0,
    "l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum": 0.0,
    "l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum": 0.0,
    STALL.format("selected"): 1.0,
    STALL.format("long_scoreboard"): 0.3,
    STALL.format("barrier"): 0.3,
    STALL.format("wait"): 0.3,
    STALL.format("math_pipe_throttle"): 0.3,
    STALL.format("short_scoreboard"): 0.3,
    STALL.format("not_selected"): 0.3,
}


def kernel(overrides: dict[str, float] | None = None, drop: tuple[str, ...] = (), name: str = "synthetic") -> KernelProfile:
    metrics = {**HEALTHY, **(overrides or {})}
    for metric in drop:
        metrics.pop(metric, None)
    return KernelProfile(id=0, name=name, metrics=dict(metrics), units={"gpu__time_duration.sum": "ns"})


def finding_ids(profile: KernelProfile, flops: float | None = FLOPS, min_bytes: float | None = MIN_BYTES) -> list[str]:
    return [f["id"] for f in bottlenecks.analyze([profile], flops, CEILINGS, min_bytes=min_bytes)["findings"]]


def only_finding(profile: KernelProfile, finding_id: str, **kwargs) -> dict:
    analysis = bottlenecks.analyze([profile], kwargs.get("flops", FLOPS), CEILINGS, min_bytes=kwargs.get("min_bytes", MIN_BYTES))
    matches = [f for f in analysis["findings"] if f["id"] == finding_id]
    assert len(matches) == 1, [f["id"] for f in analysis["findings"]]
    return matches[0]


# ---------------------------------------------------------------- healthy kernel


def test_healthy_kernel_has_no_findings():
    assert finding_ids(kernel()) == []


# ---------------------------------------------------------------- each rule: fires / does not fire


def test_bank_conflicts_fire_with_the_ratio_as_severity():
    finding = only_finding(kernel({"l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum": 7000.0,
                                   "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum": 8000.0}), "shared_bank_conflicts")
    assert finding["severity"] == pytest.approx(7000 / 8000, abs=1e-3)
    assert finding["metric"] == "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"
    assert finding["value"] == 7000.0
    assert "7,000" in finding["evidence"] and "8,000" in finding["evidence"]
    assert "swizzle" in finding["lever"] or "pad" in finding["lever"].lower()


def test_bank_conflicts_just_under_threshold_do_not_fire():
    assert "shared_bank_conflicts" not in finding_ids(kernel({"l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum": 900.0}))


def test_uncoalesced_global_fires():
    finding = only_finding(kernel({"derived__memory_l2_theoretical_sectors_global_excessive": 3072.0}), "uncoalesced_global")
    assert finding["severity"] == pytest.approx(0.75)
    assert "16 bytes" in finding["lever"]


def test_coalesced_global_does_not_fire():
    assert "uncoalesced_global" not in finding_ids(kernel({"derived__memory_l2_theoretical_sectors_global_excessive": 200.0}))


def test_spills_fire_and_scale_with_local_traffic():
    light = only_finding(kernel({"sass__inst_executed_local_loads": 10.0}), "register_spills")
    heavy = only_finding(kernel({"sass__inst_executed_local_loads": 30_000.0,
                                 "sass__inst_executed_local_stores": 30_000.0}), "register_spills")
    assert light["severity"] >= bottlenecks.SPILL_MIN_SEVERITY
    assert heavy["severity"] == 1.0 > light["severity"]
    assert heavy["value"] == 60_000.0


def test_local_sectors_alone_count_as_spills():
    assert "register_spills" in finding_ids(kernel({"l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum": 64.0}))


def test_matmuls_on_fma_pipe_fire_as_not_on_tensor_cores():
    finding = only_finding(kernel({"sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active": 0.0,
                                   "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active": 65.0}), "low_tensor_pipe")
    assert finding["title"] == "Matmuls not on tensor cores"
    assert finding["severity"] == 1.0
    assert "mma.sync" in finding["lever"] and "wgmma" in finding["lever"]


def test_partly_busy_tensor_pipe_fires_as_under_used():
    finding = only_finding(kernel({"sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active": 25.0}), "low_tensor_pipe")
    assert finding["title"] == "Tensor pipe under-used"
    assert finding["severity"] == pytest.approx(0.5)


def test_tensor_pipe_rule_needs_a_matmul_heavy_kernel():
    idle = kernel({"sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active": 0.0,
                   "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active": 1.0})
    assert "low_tensor_pipe" not in finding_ids(idle, flops=None)
    assert "low_tensor_pipe" in finding_ids(idle, flops=FLOPS)


def test_tensor_pipe_falls_back_to_the_hmma_metric():
    profile = kernel({"sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": 20.0},
                     drop=("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",))
    assert only_finding(profile, "low_tensor_pipe")["value"] == 20.0


def test_occupancy_limited_by_registers_names_the_limiter():
    finding = only_finding(kernel({
        "launch__registers_per_thread": 255.0,
        "launch__occupancy_limit_registers": 1.0,
        "launch__occupancy_limit_shared_mem": 8.0,
        "sm__maximum_warps_per_active_cycle_pct": 12.5,
        "sm__warps_active.avg.pct_of_peak_sustained_active": 11.0,
    }), "low_occupancy")
    assert finding["title"] == "Low occupancy (limited by registers)"
    assert "registers" in finding["evidence"] and "255" in finding["evidence"]
    assert "__launch_bounds__" in finding["lever"]
    assert "smaller tiles" not in finding["lever"]
    assert finding["severity"] == pytest.approx((25 - 11) / 25, abs=1e-3)


def test_occupancy_limited_by_shared_memory_suggests_smaller_tiles():
    finding = only_finding(kernel({
        "launch__occupancy_limit_shared_mem": 1.0,
        "sm__maximum_warps_per_active_cycle_pct": 12.5,
        "sm__warps_active.avg.pct_of_peak_sustained_active": 12.0,
    }), "low_occupancy")
    assert "shared_mem" in finding["title"]
    assert "smaller tiles" in finding["lever"] and "__launch_bounds__" not in finding["lever"]


def test_fair_occupancy_does_not_fire():
    assert "low_occupancy" not in finding_ids(kernel())


def test_underfilled_grid_fires_with_the_idle_fraction():
    finding = only_finding(kernel({"launch__grid_size": 33.0, "launch__waves_per_multiprocessor": 0.25}), "underfilled_grid")
    assert finding["severity"] == pytest.approx(0.75)
    assert finding["value"] == 0.25
    assert "33 CTAs on 132 SMs" in finding["evidence"]
    assert "split" in finding["lever"] and "persistent" in finding["lever"]


def test_grid_below_sm_count_fires_even_without_waves():
    profile = kernel({"launch__grid_size": 66.0}, drop=("launch__waves_per_multiprocessor",))
    assert only_finding(profile, "underfilled_grid")["severity"] == pytest.approx(0.5)


def test_full_grid_does_not_fire():
    assert "underfilled_grid" not in finding_ids(kernel({"launch__waves_per_multiprocessor": 1.0}))


def test_partial_last_wave_fires_with_the_idle_share_of_the_tail():
    finding = only_finding(kernel({"launch__grid_size": 317.0, "launch__waves_per_multiprocessor": 1.2}), "tail_effect")
    assert finding["severity"] == pytest.approx(0.8 / 2)
    assert finding["value"] == 1.2
    assert "last of 2 runs 20% full" in finding["evidence"] and "40%" in finding["evidence"]


@pytest.mark.parametrize("waves", [1.0, 2.0, 4.0, 1.95, 3.7, 0.5])
def test_whole_or_nearly_whole_waves_have_no_tail_finding(waves):
    assert "tail_effect" not in finding_ids(kernel({"launch__waves_per_multiprocessor": waves}))


def launch_analysis(profile: KernelProfile | list[KernelProfile], launch_us: float | None) -> dict:
    profiles = profile if isinstance(profile, list) else [profile]
    return bottlenecks.analyze(profiles, FLOPS, {**CEILINGS, "launch_us": launch_us}, min_bytes=MIN_BYTES)


def test_short_kernel_is_launch_bound_with_the_launch_share_as_severity():
    analysis = launch_analysis(kernel({"gpu__time_duration.sum": 3_000.0}), launch_us=1.1)
    [finding] = [f for f in analysis["findings"] if f["id"] == "launch_bound"]
    assert finding["severity"] == pytest.approx(1.1 / 4.1, abs=1e-3)
    assert "3 µs" in finding["evidence"] and "1.1 µs" in finding["evidence"] and "27%" in finding["evidence"]


@pytest.mark.parametrize(("duration_ns", "launch_us"), [(100_000.0, 1.1), (7_000.0, 1.1), (3_000.0, None)])
def test_long_kernels_or_an_unmeasured_launch_are_not_launch_bound(duration_ns, launch_us):
    analysis = launch_analysis(kernel({"gpu__time_duration.sum": duration_ns}), launch_us)
    assert "launch_bound" not in [f["id"] for f in analysis["findings"]]


def test_sdpa_on_the_small_shape_is_named_grid_bound_first():
    # cuDNN on (2,8,512,64), H100: 64 CTAs on 132 SMs, 9.7 µs under ncu.
    analysis = launch_analysis(ncu.read_raw_csv(CLEAN_CSV), launch_us=1.1)
    ids = [f["id"] for f in analysis["findings"]]
    assert ids[0] == "underfilled_grid" and "tail_effect" not in ids
    assert "0.48 waves" in analysis["findings"][0]["evidence"]


def test_kv_not_reused_fires_on_l2_traffic_far_above_the_minimum():
    finding = only_finding(kernel({"l1tex__m_xbar2l1tex_read_bytes.sum": 64 * MIN_BYTES}), "no_kv_reuse")
    assert finding["metric"] == "l1tex__m_xbar2l1tex_read_bytes.sum"
    assert finding["severity"] == pytest.approx(1 - 16 / 64)
    assert "64.0x" in finding["evidence"]
    assert "shared memory" in finding["lever"]


def test_kv_reuse_rule_needs_min_bytes_and_excess():
    wasteful = kernel({"l1tex__m_xbar2l1tex_read_bytes.sum": 64 * MIN_BYTES})
    assert "no_kv_reuse" not in finding_ids(wasteful, min_bytes=None)
    assert "no_kv_reuse" not in finding_ids(kernel({"l1tex__m_xbar2l1tex_read_bytes.sum": 4 * MIN_BYTES}))


def test_kv_not_reused_fires_on_dram_traffic():
    finding = only_finding(kernel({"dram__bytes_read.sum": 10 * MIN_BYTES, "dram__bytes_write.sum": 0.0}), "no_kv_reuse")
    assert finding["metric"].startswith("dram__bytes_read.sum")


@pytest.mark.parametrize(
    "reason, lever_word",
    [("long_scoreboard", "cp.async"), ("barrier", "__syncthreads"), ("mio_throttle", "ldmatrix"),
     ("short_scoreboard", "ldmatrix"), ("math_pipe_throttle", "math-bound"), ("wait", "instruction-level"),
     ("lg_throttle", "Vectorise"), ("no_instruction", "unroll")],
)
def test_dominant_stall_reason_fires_with_its_lever(reason, lever_word):
    profile = kernel({STALL.format(reason): 3.0, "smsp__issue_active.avg.pct_of_peak_sustained_active": 30.0})
    finding = only_finding(profile, f"stall_{reason}")
    assert lever_word in finding["lever"]
    assert finding["metric"] == STALL.format(reason)
    stalls = ncu.key_metrics(profile)["warp_stalls"]
    share = 3.0 / (sum(stalls.values()) - stalls["selected"])
    assert finding["severity"] == pytest.approx(share * (1 - 0.30), abs=1e-3)


def test_not_selected_is_never_a_stall_finding():
    profile = kernel({STALL.format("not_selected"): 5.0})
    assert not [i for i in finding_ids(profile) if i.startswith("stall_")]


def test_busy_issue_slots_damp_stall_severity():
    stalled = {STALL.format("long_scoreboard"): 3.0}
    idle = only_finding(kernel({**stalled, "smsp__issue_active.avg.pct_of_peak_sustained_active": 20.0}), "stall_long_scoreboard")
    busy = only_finding(kernel({**stalled, "smsp__issue_active.avg.pct_of_peak_sustained_active": 90.0}), "stall_long_scoreboard")
    assert idle["severity"] > busy["severity"]


# ---------------------------------------------------------------- missing metrics


@pytest.mark.parametrize("rule", bottlenecks.RULES, ids=lambda rule: rule.__name__)
def test_each_rule_is_silent_on_missing_metrics(rule):
    assert rule({}, RuleContext(flops=FLOPS, min_bytes=MIN_BYTES)) is None
    assert rule(ncu.key_metrics(KernelProfile(id=0, name="bare")), RuleContext(flops=FLOPS, min_bytes=MIN_BYTES)) is None


def test_bare_profile_gives_no_findings_and_no_roofline():
    analysis = bottlenecks.analyze([KernelProfile(id=0, name="bare")], FLOPS, CEILINGS, min_bytes=MIN_BYTES)
    assert analysis["dominant_kernel"] == "bare"
    assert analysis["findings"] == []
    assert analysis["kernels"] == [{"id": 0, "name": "bare", "duration_us": None}]
    assert analysis["roofline"]["bound"] == "unknown"
    assert analysis["roofline"]["achieved_tflops"] is None


def test_no_kernels_at_all():
    analysis = bottlenecks.analyze([], None, None)
    assert analysis["dominant_kernel"] is None and analysis["findings"] == [] and analysis["kernels"] == []
    assert "none" in bottlenecks.render_markdown(analysis, "empty")


def test_only_the_metrics_present_are_used():
    profile = KernelProfile(id=0, name="partial", metrics={"launch__waves_per_multiprocessor": 0.5})
    assert finding_ids(profile) == ["underfilled_grid"]


# ---------------------------------------------------------------- ranking and roofline


def test_findings_are_ranked_by_severity():
    profile = kernel({
        "launch__waves_per_multiprocessor": 0.9,  # severity 0.1
        "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum": 5000.0,  # 0.5
        "sass__inst_executed_local_loads": 100_000.0,  # 1.0
    })
    findings = bottlenecks.analyze([profile], FLOPS, CEILINGS, min_bytes=MIN_BYTES)["findings"]
    assert [f["id"] for f in findings] == ["register_spills", "shared_bank_conflicts", "underfilled_grid"]
    assert [f["rank"] for f in findings] == [1, 2, 3]
    assert all(0.0 <= f["severity"] <= 1.0 for f in findings)
    assert set(findings[0]) == {"rank", "id", "title", "severity", "metric", "value", "threshold", "evidence", "lever"}


def test_dominant_kernel_is_the_longest():
    short = KernelProfile(id=0, name="short", metrics={"gpu__time_duration.sum": 1000.0})
    long = KernelProfile(id=1, name="long", metrics={"gpu__time_duration.sum": 5000.0})
    analysis = bottlenecks.analyze([short, long], None, None)
    assert analysis["dominant_kernel"] == "long"
    assert analysis["kernels"] == [{"id": 0, "name": "short", "duration_us": 1.0}, {"id": 1, "name": "long", "duration_us": 5.0}]


def test_roofline_compute_bound():
    profile = kernel({"gpu__time_duration.sum": 10_000.0, "dram__bytes_read.sum": 3e6, "dram__bytes_write.sum": 1e6})
    roof = bottlenecks.analyze([profile], 2e9, CEILINGS)["roofline"]
    assert roof["achieved_tflops"] == pytest.approx(200.0)
    assert roof["dram_gbps"] == pytest.approx(400.0)
    assert roof["arithmetic_intensity_flop_per_byte"] == pytest.approx(500.0)
    assert roof["ridge_point"] == pytest.approx(700e12 / 3000e9)
    assert roof["bound"] == "compute"
    assert roof["pct_of_compute_ceiling"] == pytest.approx(100 * 200 / 700)
    assert roof["pct_of_memory_ceiling"] == pytest.approx(100 * 400 / 3000)


def test_roofline_memory_bound_and_dtype_choice():
    profile = kernel({"gpu__time_duration.sum": 10_000.0, "dram__bytes_read.sum": 20e6, "dram__bytes_write.sum": 20e6})
    roof = bottlenecks.analyze([profile], 2e9, CEILINGS, dtype="bf16")["roofline"]
    assert roof["arithmetic_intensity_flop_per_byte"] == pytest.approx(50.0)
    assert roof["ridge_point"] == pytest.approx(690e12 / 3000e9)
    assert roof["bound"] == "memory"


def test_roofline_without_ceilings_or_flops_is_unknown():
    no_ceilings = bottlenecks.analyze([kernel()], FLOPS, None)["roofline"]
    assert no_ceilings["bound"] == "unknown" and no_ceilings["pct_of_compute_ceiling"] is None
    assert no_ceilings["achieved_tflops"] is not None
    no_flops = bottlenecks.analyze([kernel()], None, CEILINGS)["roofline"]
    assert no_flops["achieved_tflops"] is None and no_flops["bound"] == "unknown"
    assert no_flops["dram_gbps"] is not None


# ---------------------------------------------------------------- the real cuDNN profile


@pytest.fixture(scope="module")
def cudnn_analysis() -> dict:
    kernels = ncu.select_kernels(ncu.read_raw_csv(CLEAN_CSV), r"sdpa")
    return bottlenecks.analyze(kernels, FLOPS, CEILINGS, min_bytes=MIN_BYTES)


def test_cudnn_dominant_kernel_and_kernel_list(cudnn_analysis):
    assert cudnn_analysis["dominant_kernel"].startswith("cudnn_generated_fort_native_sdpa_sm90")
    assert [k["duration_us"] for k in cudnn_analysis["kernels"]] == [pytest.approx(9.664), pytest.approx(9.6)]
    assert cudnn_analysis["key_metrics"]["duration_us"] == pytest.approx(9.664)


def test_cudnn_underfilled_grid_leads(cudnn_analysis):
    ids = [f["id"] for f in cudnn_analysis["findings"]]
    assert "underfilled_grid" in ids[:2]
    top = cudnn_analysis["findings"][ids.index("underfilled_grid")]
    assert top["value"] == 0.48
    assert "64 CTAs on 132 SMs" in top["evidence"]


def test_cudnn_ramp_and_drain_is_measured_below_the_grid_finding(cudnn_analysis):
    by_id = {f["id"]: f for f in cudnn_analysis["findings"]}
    ramp = by_id["ramp_and_drain"]
    assert ramp["value"] == 13953 and "13,953 of the kernel's 17,852 cycles" in ramp["evidence"]
    assert ramp["severity"] == pytest.approx(1 - 13953 / 17852, abs=1e-3)
    assert ramp["rank"] > by_id["underfilled_grid"]["rank"]


def test_v4_small_shape_names_its_fixed_part_not_its_grid():
    """Issue 8's mission shape on v4's split kernel: 128 CTAs fill the grid (0.97 waves), so the
    grid finding is slight; the measured ramp-up and drain (29% of the kernel) is named above it."""
    kernels = ncu.select_kernels(ncu.read_raw_csv(V4_SMALL_CSV), r"v4_pipelined")
    flops, min_bytes = 4.0 * 8 * 512 * 512 * 64, 4.0 * 8 * 512 * 64 * 2
    analysis = bottlenecks.analyze(kernels, flops, CEILINGS, min_bytes=min_bytes)
    by_id = {f["id"]: f for f in analysis["findings"]}
    ramp = by_id["ramp_and_drain"]
    assert ramp["severity"] == pytest.approx(1 - 10264 / 14382, abs=1e-3)
    assert "29% of the kernel" in ramp["evidence"] and "average SM for 67%" in ramp["evidence"]
    assert ramp["rank"] < by_id["underfilled_grid"]["rank"]
    assert by_id["underfilled_grid"]["severity"] == pytest.approx(0.03)


def test_v5_small_shape_names_its_fixed_part_above_its_epilogue_stores():
    """Issue 8's shapes on v5's split kernel: TMA moves 18.9 MB and the owners' register stores 2.1
    MB at half a sector each. The stores are named as stores, weighted by their 10% of the traffic,
    so the measured ramp-up and drain (23% of the kernel) ranks above them, in the summary's three."""
    kernels = ncu.select_kernels(ncu.read_raw_csv(V5_SMALL_CSV), r"v5_hopper")
    flops, min_bytes = 4.0 * 2 * 8 * 512 * 512 * 64, 4.0 * 2 * 8 * 512 * 64 * 2
    analysis = bottlenecks.analyze(kernels, flops, CEILINGS, min_bytes=min_bytes)
    by_id = {f["id"]: f for f in analysis["findings"]}
    m = analysis["key_metrics"]
    assert m["global_store_bytes_per_sector"] == 16.0 and m["global_load_bytes_per_sector"] == 0.0
    assert m["lsu_global_share"] == pytest.approx(65536 * 32 / (65536 * 32 + 18_874_368), abs=1e-6)
    stores = by_id["uncoalesced_global"]
    assert stores["title"] == "Uncoalesced global memory stores"
    assert "stores: 16 of each sector's 32 bytes used" in stores["evidence"] and "10% of the kernel's" in stores["evidence"]
    assert stores["lever"].startswith("Store 16 bytes") and "Load" not in stores["lever"]
    assert stores["severity"] == pytest.approx(0.5 * m["lsu_global_share"], abs=1e-3)
    assert "ramp_and_drain" in [f["id"] for f in analysis["findings"][:3]]
    assert by_id["ramp_and_drain"]["rank"] < stores["rank"]


def test_uncoalesced_loads_and_stores_are_each_named_with_their_lever():
    finding = only_finding(kernel({"derived__memory_l2_theoretical_sectors_global_excessive": 2048.0,
                                   "smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.ratio": 8.0,
                                   "smsp__sass_average_data_bytes_per_sector_mem_global_op_st.ratio": 32.0}),
                           "uncoalesced_global")
    assert finding["title"] == "Uncoalesced global memory loads" and finding["lever"].startswith("Load 16 bytes")
    assert "loads: 8 of each sector's 32 bytes used" in finding["evidence"]
    assert finding["severity"] == pytest.approx(0.5)  # no TMA counters: every global byte is the LSU's
    both = only_finding(kernel({"derived__memory_l2_theoretical_sectors_global_excessive": 2048.0,
                                "smsp__sass_average_data_bytes_per_sector_mem_global_op_ld.ratio": 8.0,
                                "smsp__sass_average_data_bytes_per_sector_mem_global_op_st.ratio": 4.0}),
                        "uncoalesced_global")
    assert both["title"] == "Uncoalesced global memory loads and stores" and "Store 16 bytes" in both["lever"]


def test_uncoalesced_severity_is_the_excess_share_of_all_global_traffic_tma_included():
    tma = {"l1tex__m_xbar2l1tex_read_bytes_mem_global_op_tma_ld.sum": 4096.0 * 32 * 3,
           "l1tex__m_l1tex2xbar_write_bytes_mem_global_op_tma_st.sum": 0.0}
    finding = only_finding(kernel({"derived__memory_l2_theoretical_sectors_global_excessive": 2048.0, **tma}),
                           "uncoalesced_global")
    assert finding["severity"] == pytest.approx(0.5 * 0.25)
    assert "25% of the kernel's global traffic, TMA moves the rest" in finding["evidence"]


@pytest.mark.parametrize("busiest, expected", [(9_000, None), (8_400, "ramp_and_drain")])
def test_ramp_and_drain_threshold(busiest, expected):
    m = {"sm_active_cycles_max": busiest, "sm_elapsed_cycles_max": 10_000, "sm_active_cycles_avg": None}
    finding = bottlenecks.ramp_and_drain(m, RuleContext(flops=None, min_bytes=None))
    assert (finding.id if finding else None) == expected
    if finding:
        assert "average SM" not in finding.evidence  # an unmeasured average is not invented


def test_ramp_and_drain_needs_both_counters():
    ctx = RuleContext(flops=None, min_bytes=None)
    assert bottlenecks.ramp_and_drain({"sm_active_cycles_max": 100.0}, ctx) is None
    assert bottlenecks.ramp_and_drain({"sm_active_cycles_max": 100.0, "sm_elapsed_cycles_max": 0.0}, ctx) is None


def test_cudnn_low_occupancy_barrier_and_long_scoreboard(cudnn_analysis):
    by_id = {f["id"]: f for f in cudnn_analysis["findings"]}
    assert "registers" in by_id["low_occupancy"]["title"] and "shared_mem" in by_id["low_occupancy"]["title"]
    assert by_id["low_occupancy"]["value"] == 14.23
    assert "stall_barrier" in by_id and "stall_long_scoreboard" in by_id
    assert by_id["stall_barrier"]["rank"] < by_id["stall_long_scoreboard"]["rank"]


def test_cudnn_has_no_false_alarms(cudnn_analysis):
    ids = {f["id"] for f in cudnn_analysis["findings"]}
    assert not ids & {"shared_bank_conflicts", "register_spills", "uncoalesced_global", "no_kv_reuse"}
    assert "low_tensor_pipe" not in ids or cudnn_analysis["findings"][0]["id"] != "low_tensor_pipe"
    ranks = [f["rank"] for f in cudnn_analysis["findings"]]
    severities = [f["severity"] for f in cudnn_analysis["findings"]]
    assert ranks == list(range(1, len(ranks) + 1)) and severities == sorted(severities, reverse=True)


def test_cudnn_roofline(cudnn_analysis):
    roof = cudnn_analysis["roofline"]
    assert roof["achieved_tflops"] == pytest.approx(FLOPS / 9.664e-6 / 1e12)  # ~111 TFLOP/s
    assert roof["achieved_tflops"] == pytest.approx(111.1, abs=0.1)
    assert roof["dram_gbps"] == pytest.approx(1067776 / 9.664e-6 / 1e9)
    assert roof["bound"] == "compute"
    assert roof["pct_of_compute_ceiling"] == pytest.approx(100 * roof["achieved_tflops"] / 700)


def test_render_markdown(cudnn_analysis):
    page = bottlenecks.render_markdown(cudnn_analysis, "cudnn on b2 h8 s512 d64")
    assert page.startswith("# cudnn on b2 h8 s512 d64\n")
    assert cudnn_analysis["dominant_kernel"] in page
    assert cudnn_analysis["findings"][0]["title"] in page
    assert "TFLOP/s" in page and "bound: compute" in page
    assert page.count("\n| ") >= len(cudnn_analysis["findings"]) + len(cudnn_analysis["kernels"])
