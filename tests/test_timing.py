"""How many rounds of calls a timed CUDA graph holds, and the power-capped share of a timing (no GPU)."""

from __future__ import annotations

import torch

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
