"""How many rounds of calls a timed CUDA graph holds, and the power-capped share of a timing (no GPU)."""

from __future__ import annotations

import types

import pytest
import torch

from tilegym import power
from tilegym.power import PowerReading, capped_percent, read_power
from tilegym.timing import MAX_CALLS_PER_GRAPH, graph_rounds


def test_short_replays_are_repeated_until_the_sample_is_long_enough() -> None:
    assert graph_rounds(100.0, 1, 2000.0) == 20
    assert graph_rounds(300.0, 2, 2000.0) == 7  # ceil(2000 / 300)


def test_long_replays_are_timed_once() -> None:
    assert graph_rounds(2000.0, 1, 2000.0) == 1
    assert graph_rounds(25_000.0, 1, 2000.0) == 1
    assert graph_rounds(100.0, 1, 0.0) == 1  # min_sample_us=0: one round, the old behaviour


def test_rounds_never_exceed_the_graph_cap() -> None:
    assert graph_rounds(1.0, 1, 2000.0) == MAX_CALLS_PER_GRAPH
    assert graph_rounds(10.0, 56, 2000.0) == 1  # 56 input sets already fill the graph
    assert graph_rounds(10.0, 20, 2000.0) * 20 <= MAX_CALLS_PER_GRAPH


def test_power_readings_are_absent_off_the_gpu() -> None:
    assert read_power(torch.device("cpu")) is None
    assert capped_percent(None, None) is None


def test_capped_share_of_the_window() -> None:
    before, after = PowerReading(capped_ns=1_000, wall_ns=0), PowerReading(capped_ns=251_000, wall_ns=1_000_000)
    assert capped_percent(before, after) == 25.0
    assert capped_percent(after, before) is None  # readings in the wrong order
    clamped = PowerReading(capped_ns=5_000_000, wall_ns=1_000_000)  # counter ahead of the wall clock
    assert capped_percent(before, clamped) == 100.0


class FakeNvml:
    """The three NVML entry points read_power uses, answering like the library does."""

    def __init__(self, uuids: set[str], capped_ns: int) -> None:
        self.uuids, self.capped_ns, self.policies = uuids, capped_ns, []

    def nvmlDeviceGetHandleByUUID(self, key: bytes, handle) -> int:  # noqa: N802 (NVML's name)
        return 0 if key.decode() in self.uuids else 13  # NVML_ERROR_NOT_FOUND

    def nvmlDeviceGetViolationStatus(self, handle, policy: int, status) -> int:  # noqa: N802
        self.policies.append(policy)
        status._obj.violation_time = self.capped_ns
        return 0


def fake_gpu(monkeypatch: pytest.MonkeyPatch, lib: object) -> None:
    monkeypatch.setattr(power, "_nvml", lambda: lib)
    monkeypatch.setattr(power.torch.version, "hip", None)
    props = types.SimpleNamespace(uuid="5a159310-50c1-77de-8577-e66c17d5e513")  # no PCI fields
    monkeypatch.setattr(power.torch.cuda, "get_device_properties", lambda index: props)
    power._handle.cache_clear()


def test_power_reading_matches_the_device_by_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    lib = FakeNvml({"GPU-5a159310-50c1-77de-8577-e66c17d5e513"}, capped_ns=4_000)
    fake_gpu(monkeypatch, lib)
    reading = read_power(torch.device("cuda", 0))
    assert reading is not None and reading.capped_ns == 4_000
    assert lib.policies == [power.NVML_PERF_POLICY_POWER]
    power._handle.cache_clear()


def test_power_reading_is_absent_when_nvml_cannot_name_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_gpu(monkeypatch, FakeNvml({"GPU-another-board"}, capped_ns=4_000))
    assert read_power(torch.device("cuda", 0)) is None
    fake_gpu(monkeypatch, types.SimpleNamespace())  # an NVML without these symbols
    assert read_power(torch.device("cuda", 0)) is None
    power._handle.cache_clear()
