"""Small shared helpers: integer math, dtype facts and device queries (lazy, cached)."""

from __future__ import annotations

import functools
import os

import torch

HALF_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)
FP8_DTYPES: tuple[torch.dtype, ...] = tuple(
    getattr(torch, name) for name in ("float8_e4m3fn", "float8_e4m3fnuz") if hasattr(torch, name)
)
DTYPE_SHORT_NAMES: dict[torch.dtype, str] = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "fp32",
    **{dt: "fp8" for dt in FP8_DTYPES},
}


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(-a // b)


def round_up(a: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``a``."""
    return cdiv(a, multiple) * multiple


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@functools.cache
def sm_count(device_index: int) -> int:
    """Number of SMs (CUs on ROCm) of a CUDA device, queried once."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def multiprocessor_count(device: torch.device) -> int:
    """SM/CU count of ``device``; for CPU tensors the CPU's cores (Triton's interpreter runs there)."""
    if device.type != "cuda":
        return os.cpu_count() or 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    return sm_count(index)


def capturing(device: torch.device) -> bool:
    """True while the current stream of ``device`` (a GPU) is being captured into a CUDA graph."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()
