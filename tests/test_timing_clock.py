"""The card's clock around timing: read from this process's card, and spun up before the first
timed case (every bench process on the H100 found it idling at 345 MHz)."""
from __future__ import annotations

from evo_sdpa import timing


def test_spin_up_keeps_the_card_busy_until_it_reaches_its_clock():
    readings = iter([345, 900, 1500, 1900])
    bursts = []
    record = timing.spin_up_clock(clock=lambda: next(readings), max_clock=lambda: 1980,
                                  busy=lambda: bursts.append(1))
    assert len(bursts) == 3
    assert record["status"] == "at clock" and record["clock_before_mhz"] == 345
    assert record["clock_after_mhz"] == 1900 and record["max_clock_mhz"] == 1980


def test_spin_up_gives_up_after_its_time_and_says_so():
    bursts = []
    record = timing.spin_up_clock(clock=lambda: 345, max_clock=lambda: 1980,
                                  busy=lambda: bursts.append(1), max_s=0.05)
    assert bursts and record["status"] == "not at clock" and record["clock_after_mhz"] == 345


def test_spin_up_without_a_clock_reading_does_nothing():
    bursts = []
    record = timing.spin_up_clock(clock=lambda: None, max_clock=lambda: None, busy=lambda: bursts.append(1))
    assert record["status"] == "no clock reading" and not bursts


def test_the_clock_is_read_from_this_process_card(monkeypatch):
    """nvidia-smi without -i lists every card; on a two-GPU host the first line is another job's."""
    seen = []
    monkeypatch.setattr(timing, "_nvml", lambda: None)

    def fake_output(argv, timeout_s):
        seen.append(argv)
        return "1980\n"

    monkeypatch.setattr(timing.device, "find_tool", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(timing.device, "command_output", fake_output)
    monkeypatch.setattr(timing, "_this_card", lambda: "GPU-1111")
    assert timing.sm_clock_mhz() == 1980
    assert seen[0][1:3] == ["-i", "GPU-1111"] and "--query-gpu=clocks.sm" in seen[0]
    monkeypatch.setattr(timing, "_this_card", lambda: None)
    timing.sm_clock_mhz()
    assert "-i" not in seen[1]
    monkeypatch.setattr(timing.device, "command_output", lambda argv, timeout_s: None)
    assert timing.sm_clock_mhz() is None, "a failed nvidia-smi reads as no clock"


class FakeNvml:
    def __init__(self, fail=False):
        self.fail = fail

    def sm_clock_mhz(self):
        if self.fail:
            raise OSError("nvmlDeviceGetClockInfo failed: NVML error 15")
        return 1755

    def max_sm_clock_mhz(self):
        return 1980


def test_nvml_is_asked_before_nvidia_smi_and_a_failed_read_falls_back(monkeypatch):
    runs = []
    monkeypatch.setattr(timing.device, "find_tool", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(timing.device, "command_output", lambda argv, timeout_s: runs.append(argv) or "1410\n")
    monkeypatch.setattr(timing, "_this_card", lambda: "GPU-1111")
    monkeypatch.setattr(timing, "_nvml", lambda: FakeNvml())
    assert (timing.sm_clock_mhz(), timing.max_sm_clock_mhz()) == (1755, 1980) and not runs
    monkeypatch.setattr(timing, "_nvml", lambda: FakeNvml(fail=True))
    assert timing.sm_clock_mhz() == 1410 and "--query-gpu=clocks.sm" in runs[0]


def test_nvml_opens_no_card_without_a_uuid_or_a_driver():
    from evo_sdpa.nvml import open_card

    assert open_card(None) is None
    assert open_card("GPU-00000000-0000-0000-0000-000000000000") is None  # no such card, or no NVML here
