"""Declared accuracy: the relative L2 error vs float64 a correct implementation stays under.

One place for the tolerance of every (query dtype, cache format, implementation) combination.
It comes from the cache format (``tilegym.quant.CacheFormat``: what quantising the cache or the
query costs) and from what the implementation declares at registration (``quantizes_query``,
``fp8_mma_scores``), never from backend names. Tests and the benchmark ask here.
"""

from __future__ import annotations

import torch

from tilegym.backend import implementations
from tilegym.quant import cache_format
from tilegym.utils import DTYPE_SHORT_NAMES, FP8_DTYPES

LSE_ATOL = 1e-3  # lse is float32 math on exact products: errors ~1e-5; a missed block moves it by > 1e-2
# A query rounded to fp8 (4 significant bits) moves each score by ~sm_scale * sqrt(D) * 2% RMS: with
# D = 512, N(0,1) data, the lse moved by up to 0.052 (MXFP8 query) and 0.080 (per-tensor fp8) over
# 3 x 16 rows (float64 emulation); a missed 16-token block of a 70-token row moves it by ~0.26.
QUERY_QUANTIZED_LSE_ATOL = 0.12
# Scores by fp8 tensor-core MMA: its accumulator keeps fewer bits than float32, so even summed in
# float32 every 128 products (cutlass's 16-row fp8 kernel) a score carries an error that grows with
# its magnitude. Measured on the H200 with keys growing along the row (lse 45-52): 1.0-1.6e-4 of
# |lse| with 128 products per float32 sum, 0.6-0.9e-4 with 64, 0.3-0.5e-4 with 32
# (benchmarks/NOTES_cutlass.md, "Session 20"). Allowed on top of the absolute bound:
FP8_MMA_LSE_RTOL = 3e-4


KvFormat = torch.dtype | str  # a kv dtype (its plain format) or a cache format name


def format_name(kv: KvFormat) -> str:
    """The cache format name of a kv dtype ("bf16", "fp16" or "fp8") or of a format name (itself)."""
    if isinstance(kv, str):
        return cache_format(kv).name
    return "fp8" if kv in FP8_DTYPES else DTYPE_SHORT_NAMES[kv]


def quantizes_query(op: str, backend: str, kv: KvFormat) -> bool:
    """True when ``backend``'s implementation of ``op`` declares it rounds the query for this cache."""
    impl = implementations(op).get(backend)
    return impl is not None and format_name(kv) in impl.quantizes_query


def output_tolerance(op: str, backend: str, q_dtype: torch.dtype, kv: KvFormat) -> float:
    """Relative L2 error vs the float64 oracle (fed the dequantised cache) that a correct run stays under."""
    fmt = cache_format(format_name(kv))
    if quantizes_query(op, backend, kv):
        return fmt.query_quantized_tolerance
    return fmt.output_tolerance[q_dtype]


def lse_tolerance(op: str, backend: str, kv: KvFormat) -> float:
    """Absolute lse error vs float64 that a correct run stays under (plus ``lse_rtol`` of |lse|)."""
    return QUERY_QUANTIZED_LSE_ATOL if quantizes_query(op, backend, kv) else LSE_ATOL


def lse_rtol(op: str, backend: str, kv: KvFormat) -> float:
    """The part of |lse| (float64's) a correct run's lse error may add to ``lse_tolerance``: nonzero
    where the implementation declares fp8 MMA scores for this cache."""
    impl = implementations(op).get(backend)
    return FP8_MMA_LSE_RTOL if impl is not None and format_name(kv) in impl.fp8_mma_scores else 0.0
