"""ncu raw-page parsing, command lines and key metrics, on real H100 output of cuDNN's SDPA kernel."""
from __future__ import annotations

from pathlib import Path

import pytest

from evo_sdpa import ncu
from evo_sdpa.ncu import KernelProfile

FIXTURES = Path(__file__).parent / "fixtures"
CLEAN_CSV = FIXTURES / "h100_sdpa_cudnn_b2h8s512d64_raw.csv"
MIXED_CSV = FIXTURES / "h100_sdpa_cudnn_stdout_mixed.csv"
CUDNN_PREFIX = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16"


@pytest.fixture(scope="module")
def profiles() -> list[KernelProfile]:
    return ncu.read_raw_csv(CLEAN_CSV)


@pytest.fixture(scope="module")
def cudnn(profiles) -> KernelProfile:
    return next(p for p in profiles if p.id == 1)


# ---------------------------------------------------------------- parsing


def test_three_kernels_in_id_order_with_names(profiles):
    assert [p.id for p in profiles] == [0, 1, 2]
    assert "distribution_elementwise_grid_stride_kernel" in profiles[0].name
    assert profiles[1].name.startswith(CUDNN_PREFIX)
    assert profiles[2].name == profiles[1].name


def test_exact_values_of_the_cudnn_kernel(cudnn):
    assert cudnn.get("gpu__time_duration.sum") == 9664.0
    assert cudnn.units["gpu__time_duration.sum"] == "ns"
    assert cudnn.get("launch__registers_per_thread") == 168.0
    assert cudnn.get("launch__grid_size") == 64.0
    assert cudnn.get("launch__block_size") == 384.0
    assert cudnn.get("launch__waves_per_multiprocessor") == 0.48


def test_thousands_separators_are_numbers(cudnn):
    assert cudnn.get("SM_A.TriageCompute.l1tex__data_pipe_lsu_wavefronts.avg") == 1443.83
    assert cudnn.get("l1tex__data_pipe_lsu_wavefronts_mem_shared.sum") == 188631.0
    assert cudnn.get("launch__shared_mem_per_block") == 135168.0
    assert cudnn.get("device__attribute_clock_rate") == 1980000.0


def test_text_values_are_kept_as_strings_and_get_ignores_them(cudnn):
    assert cudnn.metrics["Block Size"] == "(384, 1, 1)"
    assert cudnn.metrics["device__attribute_display_name"] == "NVIDIA H100 80GB HBM3"
    assert cudnn.metrics["launch__cluster_scheduling_policy"] == "PolicySpread"
    assert cudnn.get("Block Size") is None
    assert cudnn.get("Block Size", -1.0) == -1.0


def test_empty_nan_and_no_data_cells_are_absent(cudnn):
    assert "FBSP.TriageCompute.dramc__read_throughput.avg.pct_of_peak_sustained_elapsed" not in cudnn.metrics
    assert "derived_tempMetric4" not in cudnn.metrics  # "nan" in the file
    assert "sass__inst_executed_register_spilling_mem_local" not in cudnn.metrics  # "no data"
    assert cudnn.get("derived_tempMetric4") is None


@pytest.mark.parametrize(
    "cell, expected",
    [("1,443.83", 1443.83), ("39,517,792", 39517792.0), ("0", 0.0), ("-2.5", -2.5),
     ("", None), ("  ", None), ("n/a", None), ("N/A", None), ("nan", None), ("no data", None),
     ("PolicySpread", "PolicySpread"), ("(64, 1, 1)", "(64, 1, 1)")],
)
def test_parse_value(cell, expected):
    assert ncu.parse_value(cell) == expected


def test_mixed_stdout_parses_identically_to_the_clean_export(profiles):
    mixed = ncu.read_raw_csv(MIXED_CSV)
    assert [(p.id, p.name) for p in mixed] == [(p.id, p.name) for p in profiles]
    for got, want in zip(mixed, profiles):
        assert got.metrics == want.metrics
        assert got.units == want.units


def test_clean_csv_text_strips_ncu_log_lines():
    mixed_text = MIXED_CSV.read_text()
    assert "==PROF==" in mixed_text and "==WARNING==" in mixed_text
    cleaned = ncu.clean_csv_text(mixed_text)
    assert cleaned.startswith('"ID",')
    assert "==PROF==" not in cleaned and "==WARNING==" not in cleaned
    assert cleaned == CLEAN_CSV.read_text()


def test_clean_csv_text_drops_log_lines_after_the_header_too():
    text = '"ID","Kernel Name","gpu__time_duration.sum"\n==PROF== Disconnected\n"0","k","1,000"\n'
    assert ncu.clean_csv_text(text) == '"ID","Kernel Name","gpu__time_duration.sum"\n"0","k","1,000"\n'


def test_text_without_header_is_an_error():
    with pytest.raises(ValueError, match="header"):
        ncu.parse_raw_csv("==PROF== Connected to process 1\n==ERROR== no kernels were profiled\n")


def test_csv_without_units_row_parses():
    text = '"ID","Kernel Name","gpu__time_duration.sum"\n"3","k","2,048"\n"4","j",""\n'
    parsed = ncu.parse_raw_csv(text)
    assert [(p.id, p.name) for p in parsed] == [(3, "k"), (4, "j")]
    assert parsed[0].get("gpu__time_duration.sum") == 2048.0
    assert parsed[0].units == {}
    assert parsed[1].get("gpu__time_duration.sum") is None


def test_select_kernels(profiles):
    assert [p.id for p in ncu.select_kernels(profiles, r"sdpa|flash")] == [1, 2]
    assert [p.id for p in ncu.select_kernels(profiles, r"^void at::")] == [0]
    assert ncu.select_kernels(profiles, r"no_such_kernel") == []


# ---------------------------------------------------------------- command lines


def test_profile_command():
    argv = ncu.profile_command(
        "/usr/local/cuda/bin/ncu", "results/nsight/v/report", ["python", "run.py", "--shape", "2,8,512,64"],
        launch_count=3, log_file="logs/ncu/v.log",
    )
    assert argv == [
        "/usr/local/cuda/bin/ncu", "--set", "full", "--clock-control", "none",
        "--profile-from-start", "off", "--launch-count", "3",
        "--export", "results/nsight/v/report", "--force-overwrite", "--log-file", "logs/ncu/v.log",
        "--", "python", "run.py", "--shape", "2,8,512,64",
    ]


def test_export_command():
    assert ncu.export_command("ncu", "r.ncu-rep") == ["ncu", "--import", "r.ncu-rep", "--page", "raw", "--csv"]


# ---------------------------------------------------------------- key metrics


def test_key_metrics_of_the_cudnn_kernel(cudnn):
    m = ncu.key_metrics(cudnn)
    assert m["kernel_name"] == cudnn.name
    assert m["duration_us"] == pytest.approx(9.664)
    assert m["sm_throughput_pct"] == 13.23
    assert m["memory_throughput_pct"] == 8.53
    assert m["dram_throughput_pct"] == 3.31
    assert m["dram_bytes"] == 1067776.0  # 1,067,776 read + 0 written
    assert m["l2_to_sm_read_bytes"] == 9441280.0
    assert m["l2_hit_rate_pct"] == 86.20
    assert m["tensor_pipe_pct"] == 30.34
    assert m["fma_pipe_pct"] == 15.11
    assert m["achieved_occupancy_pct"] == 14.23
    assert m["theoretical_occupancy_pct"] == 18.75
    assert m["occupancy_limits"] == {"registers": 1.0, "shared_mem": 1.0, "warps": 5.0, "blocks": 32.0, "barriers": 9.0}
    assert m["occupancy_limiter"] == "registers+shared_mem"
    assert m["occupancy_limit_blocks"] == 1.0
    assert m["registers_per_thread"] == 168.0
    assert m["shared_mem_per_block_bytes"] == 135168.0
    assert (m["grid_size"], m["block_size"], m["sm_count"], m["waves_per_sm"]) == (64.0, 384.0, 132.0, 0.48)
    assert (m["shared_bank_conflicts"], m["shared_wavefronts"]) == (1066.0, 188631.0)
    assert m["shared_bank_conflict_ratio"] == pytest.approx(1066 / 188631)
    assert (m["global_excessive_sectors"], m["global_sectors"], m["uncoalesced_excess_ratio"]) == (0.0, 128.0, 0.0)
    assert (m["local_loads"], m["local_stores"], m["local_load_sectors"]) == (0.0, 0.0, 0.0)


def test_warp_stall_breakdown(cudnn):
    stalls = ncu.key_metrics(cudnn)["warp_stalls"]
    assert stalls["barrier"] == 1.51
    assert stalls["long_scoreboard"] == 1.21
    assert stalls["wait"] == 0.96
    assert stalls["no_instruction"] == 0.29
    assert stalls["selected"] == 1.0
    assert max(stalls, key=lambda r: stalls[r] if r != "selected" else 0) == "barrier"


def test_key_metrics_of_an_empty_profile_are_none():
    m = ncu.key_metrics(KernelProfile(id=7, name="bare"))
    assert m["kernel_name"] == "bare"
    numeric = {k: v for k, v in m.items() if k not in {"kernel_name", "warp_stalls", "occupancy_limits"}}
    assert numeric and all(v is None for v in numeric.values())
    assert m["warp_stalls"] == {} and m["occupancy_limits"] == {}


def test_partial_dram_bytes_are_not_invented():
    only_read = KernelProfile(id=0, name="k", metrics={"dram__bytes_read.sum": 100.0}, units={})
    assert ncu.key_metrics(only_read)["dram_bytes"] is None


def test_duration_respects_the_unit():
    kernel = KernelProfile(id=0, name="k", metrics={"gpu__time_duration.sum": 12.5},
                           units={"gpu__time_duration.sum": "usecond"})
    assert ncu.key_metrics(kernel)["duration_us"] == 12.5
