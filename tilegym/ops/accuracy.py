"""Declared accuracy: the relative L2 error vs float64 a correct implementation stays under.

One place for the tolerance of every (query dtype, cache format, implementation) combination.
It comes from the cache format (``tilegym.quant.CacheFormat``: what quantising the cache or the
query costs) and from what the implementation declares at registration (``quantizes_query``),
never from backend names. Tests and the benchmark ask here.
"""

from __future__ import annotations

import torch

from tilegym.backend import implementations
from tilegym.quant import cache_format
from tilegym.utils import DTYPE_SHORT_NAMES, FP8_DTYPES

LSE_ATOL = 1e-3  # lse is float32 math on exact products: errors ~1e-5; a missed block moves it by > 1e-2
QUERY_QUANTIZED_LSE_ATOL = 3e-2  # a query rounded to fp8 moves lse by up to ~1e-2


def format_name(kv_dtype: torch.dtype) -> str:
    """The cache format of a kv dtype: "bf16", "fp16" or "fp8"."""
    return "fp8" if kv_dtype in FP8_DTYPES else DTYPE_SHORT_NAMES[kv_dtype]


def quantizes_query(op: str, backend: str, kv_dtype: torch.dtype) -> bool:
    """True when ``backend``'s implementation of ``op`` declares it rounds the query for this cache."""
    impl = implementations(op).get(backend)
    return impl is not None and format_name(kv_dtype) in impl.quantizes_query


def output_tolerance(op: str, backend: str, q_dtype: torch.dtype, kv_dtype: torch.dtype) -> float:
    """Relative L2 error vs the float64 oracle (fed the dequantised cache) that a correct run stays under."""
    fmt = cache_format(format_name(kv_dtype))
    if quantizes_query(op, backend, kv_dtype):
        return fmt.query_quantized_tolerance
    return fmt.output_tolerance[q_dtype]


def lse_tolerance(op: str, backend: str, kv_dtype: torch.dtype) -> float:
    """Absolute lse error vs float64 that a correct run stays under."""
    return QUERY_QUANTIZED_LSE_ATOL if quantizes_query(op, backend, kv_dtype) else LSE_ATOL
