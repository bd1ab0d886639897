"""Timing of op calls: CUDA events (median over repeats) on GPUs, a wall clock on the CPU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def time_call_us(fn: Callable[[], object], device: torch.device, *, warmup: int = 3, repeat: int = 20) -> float:
    """Median microseconds per call of ``fn`` (eager launches, warm-up excluded)."""
    for _ in range(warmup):
        fn()
    samples = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(repeat):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            samples.append(start.elapsed_time(stop) * 1e3)
    else:
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)
