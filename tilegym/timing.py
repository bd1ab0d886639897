"""Timing of op calls: CUDA graph replay or CUDA events on GPUs, a wall clock on the CPU.

Every function returns the median over repeats, warm-up excluded. ``time_calls`` cycles
through several callables (one per rotating input set) so that small working sets are
not served from L2, and says which mode it used.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

# Events mode: calls launched back to back between two events, so the host runs ahead of
# the GPU and launch latency is hidden except for the first call.
MIN_CALLS_PER_SAMPLE = 4


@dataclass(frozen=True)
class Timing:
    """Median microseconds per call, the spread of the samples, and how they were taken."""

    median_us: float
    spread_us: float  # p75 - p25 of the per-call samples: differences below it are noise
    mode: str  # "cuda-graph", "cuda-events" or "wall-clock"
    samples: int


def _summary(samples_us: list[float], mode: str) -> Timing:
    ordered = sorted(samples_us)
    quartiles = statistics.quantiles(ordered, n=4) if len(ordered) > 1 else [ordered[0]] * 3
    return Timing(statistics.median(ordered), quartiles[2] - quartiles[0], mode, len(ordered))


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
    return _summary(samples, "cuda-events")


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


def time_graph(calls: Sequence[Callable[[], object]], *, warmup: int, repeat: int) -> Timing:
    """CUDA events around replays of a graph holding one call per input set."""
    graph = capture_graph(calls)
    for _ in range(max(warmup, 1)):
        graph.replay()
    torch.cuda.synchronize()
    samples = [_event_us(graph.replay) / len(calls) for _ in range(repeat)]
    return _summary(samples, "cuda-graph")


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
) -> Timing:
    """Median time per call over ``calls`` (cycled); on CUDA graph replay when ``use_graph``.

    A failed graph capture falls back to events; the returned mode says so.
    """
    if not calls:
        raise ValueError("calls must hold at least one callable")
    if device.type != "cuda":
        return time_wall_clock(calls, warmup=warmup, repeat=repeat)
    if not use_graph:
        return time_events(calls, warmup=warmup, repeat=repeat)
    try:
        return time_graph(calls, warmup=warmup, repeat=repeat)
    except Exception as exc:  # not capturable (host sync, foreign stream): time eagerly, say why
        torch.cuda.synchronize()
        timing = time_events(calls, warmup=warmup, repeat=repeat)
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:120]
        return Timing(
            timing.median_us, timing.spread_us, f"cuda-events (graph capture failed: {reason})", timing.samples
        )


def time_call_us(fn: Callable[[], object], device: torch.device, *, warmup: int = 3, repeat: int = 20) -> float:
    """Median microseconds per call of ``fn`` (eager launches, warm-up excluded)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time_calls([fn], device, warmup=warmup, repeat=repeat, use_graph=False).median_us
