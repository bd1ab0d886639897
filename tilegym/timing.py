"""Timing of op calls: CUDA graph replay or CUDA events on GPUs, a wall clock on the CPU.

Every function returns the median over repeats, warm-up excluded. ``time_calls`` cycles
through several callables (one per rotating input set) so that small working sets are
not served from L2, and says which mode it used.

A graph replay starts on the GPU only after the host has launched it, some microseconds after
the start event has been recorded on an idle stream. A sample of one call would count that gap
as the call's time, so a timed graph holds enough rounds of the calls to run for about
``GRAPH_SAMPLE_US`` (a decode step likewise replays one graph for all its layers).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

# Events mode: calls launched back to back between two events, so the host runs ahead of
# the GPU and launch latency is hidden except for the first call.
MIN_CALLS_PER_SAMPLE = 4
# Graph mode: replay length that makes the launch gap of a replay negligible, and a cap on the
# calls one graph holds (capture time and memory).
GRAPH_SAMPLE_US = 2000.0
MAX_CALLS_PER_GRAPH = 64


@dataclass(frozen=True)
class Timing:
    """Median microseconds per call, the spread of the samples, and how they were taken."""

    median_us: float
    spread_us: float  # p75 - p25 of the per-call samples: differences below it are noise
    mode: str  # "cuda-graph", "cuda-events" or "wall-clock"
    samples: int
    calls_per_sample: int = 1  # calls timed together in one sample (graph replay or event pair)


def _summary(samples_us: list[float], mode: str, calls_per_sample: int = 1) -> Timing:
    ordered = sorted(samples_us)
    quartiles = statistics.quantiles(ordered, n=4) if len(ordered) > 1 else [ordered[0]] * 3
    return Timing(statistics.median(ordered), quartiles[2] - quartiles[0], mode, len(ordered), calls_per_sample)


def _event_us(run: Callable[[], object]) -> float:
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    run()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) * 1e3


def _run_all(calls: Sequence[Callable[[], object]], count: int) -> None:
    for i in range(count):
        calls[i % len(calls)]()


def time_events(calls: Sequence[Callable[[], object]], *, warmup: int, repeat: int) -> Timing:
    """CUDA events around back-to-back eager launches cycling through ``calls``."""
    per_sample = max(len(calls), MIN_CALLS_PER_SAMPLE)
    _run_all(calls, max(warmup, 1) * len(calls))
    torch.cuda.synchronize()
    samples = [_event_us(lambda: _run_all(calls, per_sample)) / per_sample for _ in range(repeat)]
    return _summary(samples, "cuda-events", per_sample)


def capture_graph(calls: Sequence[Callable[[], object]]) -> torch.cuda.CUDAGraph:
    """Capture one CUDA graph running every call once (warmed up on a side stream first)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _run_all(calls, len(calls))
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _run_all(calls, len(calls))
    return graph


def graph_rounds(replay_us: float, calls: int, min_sample_us: float) -> int:
    """How many rounds of ``calls`` one timed graph holds so that a replay lasts ``min_sample_us``."""
    if replay_us <= 0 or replay_us >= min_sample_us:
        return 1
    return max(1, min(math.ceil(min_sample_us / replay_us), MAX_CALLS_PER_GRAPH // calls))


def _warm_graph(graph: torch.cuda.CUDAGraph, warmup: int) -> None:
    for _ in range(max(warmup, 1)):
        graph.replay()
    torch.cuda.synchronize()


def time_graph(
    calls: Sequence[Callable[[], object]], *, warmup: int, repeat: int, min_sample_us: float = GRAPH_SAMPLE_US
) -> Timing:
    """CUDA events around replays of a graph holding one or more rounds of ``calls``.

    One round (each input set once) is captured and replayed first; its time sets how many
    rounds the timed graph holds (``graph_rounds``). ``min_sample_us=0`` times one round.
    """
    graph = capture_graph(calls)
    _warm_graph(graph, warmup)
    rounds = graph_rounds(_event_us(graph.replay), len(calls), min_sample_us)
    timed = list(calls) * rounds
    if rounds > 1:
        graph = capture_graph(timed)
        _warm_graph(graph, 1)
    samples = [_event_us(graph.replay) / len(timed) for _ in range(repeat)]
    return _summary(samples, "cuda-graph", len(timed))


def time_wall_clock(calls: Sequence[Callable[[], object]], *, warmup: int, repeat: int) -> Timing:
    """Host wall clock per call (CPU tensors: the work is synchronous)."""
    _run_all(calls, warmup)
    samples = []
    for i in range(repeat):
        t0 = time.perf_counter()
        calls[i % len(calls)]()
        samples.append((time.perf_counter() - t0) * 1e6)
    return _summary(samples, "wall-clock")


def time_calls(
    calls: Sequence[Callable[[], object]],
    device: torch.device,
    *,
    warmup: int,
    repeat: int,
    use_graph: bool,
    min_sample_us: float = GRAPH_SAMPLE_US,
) -> Timing:
    """Median time per call over ``calls`` (cycled); on CUDA graph replay when ``use_graph``.

    A failed graph capture falls back to events; the returned mode says so.
    ``min_sample_us`` is graph mode's replay length (``time_graph``).
    """
    if not calls:
        raise ValueError("calls must hold at least one callable")
    if device.type != "cuda":
        return time_wall_clock(calls, warmup=warmup, repeat=repeat)
    if not use_graph:
        return time_events(calls, warmup=warmup, repeat=repeat)
    try:
        return time_graph(calls, warmup=warmup, repeat=repeat, min_sample_us=min_sample_us)
    except Exception as exc:  # not capturable (host sync, foreign stream): time eagerly, say why
        torch.cuda.synchronize()
        timing = time_events(calls, warmup=warmup, repeat=repeat)
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:120]
        return dataclasses.replace(timing, mode=f"cuda-events (graph capture failed: {reason})")


def time_call_us(fn: Callable[[], object], device: torch.device, *, warmup: int = 3, repeat: int = 20) -> float:
    """Median microseconds per call of ``fn`` (eager launches, warm-up excluded)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time_calls([fn], device, warmup=warmup, repeat=repeat, use_graph=False).median_us
