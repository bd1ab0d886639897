"""Launchers of the cutlass backend's MLA decode over a split schedule (sm_90a), and their plans.

Stage 1 walks the schedule (``tilegym.ops.schedule``) with one wave of persistent CTAs, each taking
one piece; a segment that is a whole row writes the final output, the others partials (float32; fp16
from the fp8 kernel, ``FP8_PARTIAL_DTYPE``).
Two stage-1 kernels:
  - ``mla_decoding_split_kv.cuh`` (CuTe, wgmma, TMA): bf16/fp16 caches, CTAs of 256 threads per
    (piece, 64-row query group), 1-1024 query rows; the plan encodes TMA maps of the cache tensors.
    Its ``kFp8`` variants read fp8 caches (per tensor, and ``fp8_ds_mla`` with its scales applied as
    they widen) at 33-1024 query rows (fp8 tiles widened to fp16 in shared memory, the query staged as fp16);
  - ``mla_decoding_split_kv_fp8.cuh`` (fp8 wgmma for the scores, mma.sync for P V, TMA loads into
    a ring of stages): the fp8 caches (per-tensor ``fp8`` and ``fp8_ds_mla``) at up to 16 query
    rows, and at 17-32 rows with two row tiles, where decoding is bound by the cache
    bytes; CTAs of one or more 128-thread warpgroups taking alternate blocks; the plan encodes TMA
    maps of the cache's values, rope and scales.
Stage 2 (``mla_decoding_combine.cuh``, plain CUDA) merges the rows split over several segments and
zeroes empty rows, up to 4 query rows per CTA; it is a programmatic dependent launch (its CTAs are
placed as the split kernel's CTAs end and wait on the device for the split grid, with no kernel
boundary between them), and so is the split kernel of a CTA alone after whatever precedes it.
Cluster pairs snap their pieces to whole rows of an equal-length batch (``PAIR_SNAP``).
Variants: the dtypes and cache format only; layout (dense, paged, ragged, any page size), sizes,
strides, lengths and the schedule are runtime arguments, so a new shape never compiles.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import struct
from typing import NamedTuple

import torch

from tilegym.ops.contract import DENSE, FP8_DS_MLA, RAGGED, MLADecodeCall
from tilegym.ops.cubin_loader import CudaKernel
from tilegym.ops.schedule import ScheduleShape, SplitSchedule, fewest_blocks_per_piece, most_blocks, schedule_shape
from tilegym.utils import cdiv, multiprocessor_count

HEADER = "mla_decoding_split_kv.cuh"
KERNEL = "mla_decode_cute_split_kernel"
COMBINE_HEADER = "mla_decoding_combine.cuh"
COMBINE_KERNEL = "mla_decode_cute_combine_kernel"
HEAD_DIM, ROPE_DIM = 512, 64  # fixed by the kernel's tile shapes
ROWS_PER_CTA = 64  # query rows per CTA (the wgmma M)
TOKENS_PER_BLOCK = 64  # KV tokens per step: the schedule's block
TILE_COLUMNS = 64  # columns of a shared KV tile: 128 bytes of bf16/fp16, one swizzled row
THREADS = 256  # two warpgroups (the fp8 variant)
PRODUCER_THREADS = 384  # bf16/fp16: the two consumer warpgroups and the one that issues the loads
# Shared memory (the kernel's SharedStorage): Q latent (64 KB) + 2 buffers of KV (144 KB) + P_A, P_B
# (16 KB) + row maxima, sums and query factors (1.25 KB) + 24 mbarriers, plus 1 KB so the kernel can
# align the buffer.
SHARED_BYTES = 64 * 512 * 2 + 2 * 64 * 576 * 2 + 2 * 64 * 64 * 2 + 5 * 64 * 4 + 24 * 8 + 1024
# Two 64-row groups run as a cluster of two CTAs (one GPC), whose reads of the same blocks then cost
# L2 less work (H200 sweep: 64 x 4096 x 128 180.2 us vs 193.3 as separate CTAs, 128 x 8192 x 128
# 632.9 vs 702.3).
PAIR_GROUPS = 2
# A cluster pair's pieces may grow by this much so that none cuts a row of an equal-length batch
# (tilegym/ops/schedule.py, snap). Session 23's timeline at 64 x 4096 x 128: 141.7 us per call with
# one row per piece (64 blocks) against 152.0 balanced (63 blocks): no partials, no second query
# staging, no combine work; at 128 x 8192 x 128, two rows per piece (+2.8%): 548.0 against 560.4.
PAIR_SNAP = 1 / 32
# A CTA alone (up to 64 query rows, bf16/fp16 cache) runs as a cluster of two with its neighbour piece:
# where the schedule cuts one row exactly into pieces 2k and 2k + 1 (equal rows of L blocks over about
# 2 x batch pieces, e.g. 64 rows on 132 SMs), the two CTAs merge the row in shared memory
# (mla_decoding_split_kv.cuh, merge_row_halves) instead of writing float32 partials for the combine.
# It runs from this many query rows (H x Q; None: never). Session 29's same-process A/B on an H100
# (profiler timeline, period per call, benchmarks/NOTES_cutlass.md "Session 29"): 124.4 -> 116.0 us at
# 64 x 4096 x 64, but 16 heads got slower (31.1 -> 37.1 at 1 x 32768, 10.6 -> 13.4 at 4 x 1024, +2% at
# 64 x 4096): the cluster launch and the exchange cost more than the partials they save there. On the
# H200 (session 31) 64 x 4096 x 64 gains less, 92.4-92.5 -> 90.3-90.5 us (likely: the partials cost
# less at its bandwidth; not measured).
MERGE_MIN_QUERY_ROWS: int | None = 64
# A segment's fixed start (its query staged, the pipeline refilled, a partial written), as the tokens a
# CTA streams in that time: the schedule balances blocks plus starts for rows of unequal lengths
# (tilegym/ops/schedule.py, segment_cost). From session 24's H200 sweep of the mixed-length suite
# (profiler timeline, period per call; benchmarks/NOTES_cutlass.md, "Session 24"): a CTA alone, 0 -> 256
# tokens: 100.1 -> 89.8 us at 64 x U[1, 8192] x 16, 52.1 -> 39.4 long-tail, 98.7 -> 90.0 at 128 x U[1, 4096]
# x 16; a cluster pair, 0 -> 384: 195.8 -> 174.1 at 128 x U[1, 4096] x 128; the fp8 kernel, 0 -> 256:
# 62.3 -> 57.8, 40.7 -> 33.2, 67.0 -> 58.6.
SEGMENT_COST_TOKENS = 256
PAIR_SEGMENT_COST_TOKENS = 384
FP8_SEGMENT_COST_TOKENS = 256
MAPS_KEPT = 8  # TMA map pairs a plan keeps (per cache address pair)
MAX_TMA_STRIDE = 1 << 40  # bytes: a tensor map's strides stay below it (and are multiples of 16)
COMBINE_THREADS = 128
COMBINE_CTAS_PER_SM = 6  # the combine's __launch_bounds__ minimum (kCtasPerSm): CTAs of one wave per SM
# One row per warp: with more, a warp's rows run one after another, one memory latency each (session 23,
# mixed lengths at 128 heads: 185 us per call with 24 rows per CTA, about one wave, against 178 with 4).
COMBINE_MAX_ROWS_PER_CTA = 4
# Q*H served: 64-row groups, one CTA or pairs of them per piece (above 128 rows several pairs,
# `row_groups`); 1024 is 8 new tokens at 128 heads, the contract's largest Q at DeepSeek's head count.
MIN_QUERY_ROWS, MAX_QUERY_ROWS = 1, 1024
LOG2E = math.log2(math.e)  # the kernel's softmax works in base 2
C_TYPES = {torch.bfloat16: "__nv_bfloat16", torch.float16: "__half"}
PARTIAL_C_TYPES = {torch.float32: "float", torch.float16: "__half"}
MAX_INT32 = 2**31 - 1
MAX_GRID_Y = 65535
SPLIT_POINTERS = ("const int*",) * 6  # the schedule: page table, indptr, lengths, cum_blocks, piece bounds, piece rows
TENSOR_MAP = "const __grid_constant__ CUtensorMap"
SPLIT_PARAMS = (*("int",) * 11, *("long long",) * 7, "float", *(TENSOR_MAP,) * 3, "int", "const float*")
FP8_SPLIT_PARAMS = (*("int",) * 11, *("long long",) * 11, "float", TENSOR_MAP, TENSOR_MAP, TENSOR_MAP, "int")

FP8_HEADER = "mla_decoding_split_kv_fp8.cuh"
FP8_KERNEL = "mla_decode_fp8_split_kernel"
FP8_FORMATS = {"fp8": 0, FP8_DS_MLA: 1}  # the kernel's kFormat
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX_QUERY_ROWS = 16  # query rows of one row tile of the fp8 kernel (the N of the scores' wgmma, per part)
# Two row tiles per CTA (17-32 query rows of an fp8 cache: 16 heads x 2 new tokens, or 32 heads): each V
# fragment is widened once for both tiles' mma. Two tiles double the staged query and S, so two CTAs per
# SM no longer fit: two warpgroups share one CTA's four stages. H100, 64 x 4096 x 16 with Q = 2, per-tensor
# fp8: 95.6 us in the wgmma kernel's fp8 variant, 75.8 with two tiles. False: both formats' 17-32 rows go
# to the wgmma kernel's fp8 variants.
FP8_TWO_TILES = True
# fp8_ds_mla's two row tiles (its scale groups two in flight). False: its 17-32 rows go to the wgmma
# kernel's fp8_ds_mla variant (FP8_DS_MLA_WIDE), else cutlass refuses them. H100 (session 42), 64 x 4096
# x 16 with Q = 2: 86.8 us (triton, which served those rows before: 192.4).
FP8_DS_MLA_TWO_TILES = True
# fp8_ds_mla at more rows than the fp8 kernel takes: the wgmma kernel's fp8_ds_mla variant (kFp8 = 2).
# False: cutlass refuses those rows (they run on triton). H100 (session 42): 64 x 4096 x 128 188.4 us
# (triton 710.1; the per-tensor fp8 variant 181.8, bf16 140.5), 128 x 8192 x 128 745.1 (2609.4).
FP8_DS_MLA_WIDE = True
# More fp8 query rows go to the wgmma kernel's kFp8 variants, which TMA-load fp8 tokens of 64 bytes (and
# fp8_ds_mla's scales, 16 bytes a token): a box must start on a 128-byte boundary in shared memory, so
# boxes hold at least two tokens (fp8_ds_mla: eight).
FP8_WIDE_MIN_BOX_ROWS = {"fp8": 2, FP8_DS_MLA: 8}
# The 16-row fp8 kernel's partials: each is a convex combination of V values its mma reads as fp16
# (per-tensor fp8: e4m3 values, |x| <= 448, before the cache scale, which the combine then applies;
# fp8_ds_mla: the e4m3 x scale products, fp16 already), so fp16 holds it with 11 significant bits, at
# half float32's bytes (H100, session 33: 64 x 4096 x 16 fp8 67.5 -> 61.8 us, 128 x 8192 x 16 227.5 -> 214.5).
FP8_PARTIAL_DTYPE = torch.float16
FP8_GROUP_THREADS = 128  # one warpgroup
FP8_MAX_GROUPS = 1024 // FP8_GROUP_THREADS  # warpgroups in a CTA of at most 1024 threads


class Fp8Config(NamedTuple):
    """Settings of the fp8 kernel and its plan: blocks in the shared ring (read or in flight),
    warpgroups per CTA (each takes every groups-th block), CTAs per SM (the kernel's register
    budget follows from both), score k-steps per fp8 accumulator, and the schedule's fewest blocks
    per piece and snap (the last two are the host's: the same cubin)."""

    stages: int
    groups: int
    ctas_per_sm: int
    chunk: int = 4  # k-steps (32 columns) per fresh score accumulator, summed in float32
    min_blocks: int | None = None  # fewest blocks per schedule piece; None: FP8_PIECES_PER_ROW's rule
    snap: float = 0.0  # equal-length rows: pieces may grow this much to hold whole segments (schedule.py)


# Equal-length rows: a piece may grow by this much to hold whole segments (L / k blocks of a row), so
# that no row is cut into a long and a short segment (schedule.py, snapped_sizes). It changes only
# schedules that cut rows unevenly: 128 x 8192 x 16 on 132 SMs, 63-block pieces -> half rows of 64.
# Session 37's sweep on an H100 (copy 3021 GB/s; benchmarks/NOTES_cutlass.md, "Session 37") there:
# fp8 219.6 -> 215.5 us, fp8_ds_mla 258.9 -> 252.4 (and 1.5-1.6% for three warpgroups, 125 -> 128).
FP8_SNAP = 0.04
# Per format, from benchmarks/sweep_cutlass_fp8.py on the H200: one warpgroup in each of two CTAs per
# SM, two stages each. Three warpgroups sharing four stages won where each piece meets long segments
# (128 x 8192 x 16: fp8 198.7 vs 209.6 us, fp8_ds_mla 218.4 vs 235.6) and lost where pieces cut rows
# into short ones (a later call: 128 x 4096 x 16 127.0 vs 108.5 us, 64 x 8192 x 16 131.7 vs 108.4).
# With snapped pieces (session 37, H100; the kernel's partials fp16 since session 33) the two were
# within 1% of each other at 128 x 8192 x 16, and three warpgroups still 3% behind at 64 x 8192 x 16.
FP8_CONFIGS = {"fp8": Fp8Config(2, 1, 2, snap=FP8_SNAP), FP8_DS_MLA: Fp8Config(2, 1, 2, snap=FP8_SNAP)}
# Calls with at most FP8_FEW_BLOCKS_PER_SM blocks per SM (host-known sizes) take FP8_FEW_BLOCKS_CONFIGS:
# two warpgroups sharing one CTA's four stages, one CTA per SM. With little work per SM a piece is
# short, and two warpgroups share it instead of two CTAs each running half as many blocks alone.
# Session 35 (benchmarks/NOTES_cutlass.md, "Session 35"), fp8, default against this, on the H200:
# 4 x 1024 x 16 9.9 -> 8.4 us, 1 x 32768 26.3 -> 22.7, 8 x 8192 24.6 -> 21.5 and 16 x 8192 31.7 -> 31.2
# (15.5 blocks per SM), but 64 x 4096 48.9 -> 50.7 (31 per SM), 96 x 4096 71.0 -> 76.7, and mixed
# lengths with more than 16 per SM by their longest row slower too (32 rows U[1, 8192]: 31.0 -> 32.3).
FP8_FEW_BLOCKS_CONFIGS = {"fp8": Fp8Config(4, 2, 1), FP8_DS_MLA: Fp8Config(4, 2, 1)}
FP8_FEW_BLOCKS_PER_SM = 16
FP8_TWO_TILE_CONFIG = Fp8Config(4, 2, 1)
FP8_BLOCK_N = 64  # KV tokens per block: the M of the scores' wgmma
# At most this many pieces per row of average length (H200, 1 x 32768 x 16 fp8: 256 pieces of 2
# blocks 72.9 us, 64 pieces of 8 blocks 43.6 us; 4 x 1024 and 64 x 4096 unchanged).
FP8_PIECES_PER_ROW = 64
SHARED_PER_SM = 228 * 1024  # Hopper: shared memory per SM (each CTA also reserves 1 KB)
CACHE_ALIGN = 16  # bytes: TMA reads rows (and takes strides) in multiples of 16 bytes
TILE_ALIGN = 1024  # wgmma's swizzled tiles start on 1 KB boundaries: the kernel rounds its base up


def tma_box_rows(call: MLADecodeCall) -> int:
    """Tokens per TMA box of the split kernel: a whole 64-token block of a dense row (fewer when the
    cache holds fewer tokens per row), or the largest part of a block that stays inside one page."""
    if call.is_paged:
        return math.gcd(call.page_size, TOKENS_PER_BLOCK)
    rows = call.kv.shape[1]
    return TOKENS_PER_BLOCK if rows >= TOKENS_PER_BLOCK else 1 << (rows.bit_length() - 1)


SWIZZLE_OF_ROW_BYTES = {128: "128B", 64: "64B", 16: "NONE"}  # box row width -> the swizzle wgmma reads
TMA_ELEMENT_TYPES = {torch.bfloat16: "BFLOAT16", torch.float16: "FLOAT16"}  # any other dtype: bytes


def encode_tile_map(t: torch.Tensor, box_rows: int, row_bytes: int = 128, swizzle: bool = True) -> bytes:
    """A TMA tensor map (128 bytes, passed to the kernel by value) of cache tensor ``t`` [units, rows, columns]
    (batch rows or pages, their tokens, the latent, rope or scale columns) read in boxes of
    [``row_bytes`` of columns, ``box_rows`` tokens], swizzled as wgmma reads rows of that width
    (128 or 64 bytes; 16-byte rows are not swizzled), or not at all (``swizzle=False``: fp8 tiles the
    kernel widens itself). 16-bit tensors are mapped by element, any other dtype (fp8 values, float32
    scales) by byte."""
    from tilegym.ops.cubin_loader import _check, _driver

    drv = _driver()
    kind = TMA_ELEMENT_TYPES.get(t.dtype, "UINT8")
    size = t.element_size()
    unit = size if t.dtype in TMA_ELEMENT_TYPES else 1  # bytes per map element
    tensor_map = _check(
        drv.cuTensorMapEncodeTiled(
            getattr(drv.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{kind}"),
            3,
            t.data_ptr(),
            [drv.cuuint64_t(n) for n in (t.shape[2] * size // unit, t.shape[1], t.shape[0])],
            [drv.cuuint64_t(n * size) for n in (t.stride(1), t.stride(0))],
            [drv.cuuint32_t(n) for n in (row_bytes // unit, box_rows, 1)],
            [drv.cuuint32_t(1)] * 3,
            drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            getattr(
                drv.CUtensorMapSwizzle,
                f"CU_TENSOR_MAP_SWIZZLE_{SWIZZLE_OF_ROW_BYTES[row_bytes] if swizzle else 'NONE'}",
            ),
            drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        ),
        f"cuTensorMapEncodeTiled({tuple(t.shape)}, {t.dtype})",
    )
    return struct.pack("16Q", *(int(v) for v in tensor_map.opaque))


def encode_latent_tiles_map(t: torch.Tensor, box_rows: int) -> bytes:
    """The wgmma kernel's 4-D TMA map of a 16-bit latent cache ``t`` [units, rows, 512], viewed as
    [units, 8 tiles, rows, 64 columns] (the tile stride, 128 bytes, is below the row stride): a box of
    whole 64-token blocks takes one side's four tiles at once, [4 tiles, 64 tokens, 64 columns] in the
    128-byte swizzle; smaller boxes (pages of fewer than 64 tokens) take one tile each."""
    from tilegym.ops.cubin_loader import _check, _driver

    drv = _driver()
    size = t.element_size()
    cols = TILE_COLUMNS
    tiles = t.shape[2] // cols
    side = tiles // 2 if box_rows == TOKENS_PER_BLOCK else 1
    tensor_map = _check(
        drv.cuTensorMapEncodeTiled(
            getattr(drv.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{TMA_ELEMENT_TYPES[t.dtype]}"),
            4,
            t.data_ptr(),
            [drv.cuuint64_t(n) for n in (cols, t.shape[1], tiles, t.shape[0])],
            [drv.cuuint64_t(n) for n in (t.stride(1) * size, cols * size, t.stride(0) * size)],
            [drv.cuuint32_t(n) for n in (cols, box_rows, side, 1)],
            [drv.cuuint32_t(1)] * 4,
            drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
            drv.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        ),
        f"cuTensorMapEncodeTiled({tuple(t.shape)}, {t.dtype}, 4-D)",
    )
    return struct.pack("16Q", *(int(v) for v in tensor_map.opaque))


def fp8_query_parts(dtype: torch.dtype) -> int:
    """e4m3 parts of the staged query that hold ``dtype`` exactly (4 significant bits each)."""
    return 3 if dtype == torch.float16 else 2


def fp8_stage_bytes(kv_format: str) -> int:
    """Bytes of one 64-token block in the fp8 kernel's ring: the latent, the rope, fp8_ds_mla's scales."""
    rope, scales = (ROPE_DIM, 0) if kv_format == "fp8" else (2 * ROPE_DIM, 16)  # bytes per token
    return FP8_BLOCK_N * (HEAD_DIM + rope + scales)


def fp8_shared_bytes(kv_format: str, config: Fp8Config, dtype: torch.dtype = torch.bfloat16, row_tiles: int = 1) -> int:
    """Dynamic shared memory of the fp8 kernel for ``dtype`` queries and ``row_tiles`` tiles of 16 query
    rows (mirrors its ``Tiles`` and trailing buffers)."""
    rows, n = FP8_MAX_QUERY_ROWS * row_tiles, FP8_BLOCK_N
    parts = rows * fp8_query_parts(dtype)  # staged query rows: the e4m3 parts
    query = parts * HEAD_DIM + (parts * ROPE_DIM if kv_format == "fp8" else rows * ROPE_DIM * 2)
    scores = config.groups * rows * (n + 8) * 4  # S [rows, 64 + 8 padding], float32, per warpgroup
    barriers = config.stages * (8 + 4)  # an mbarrier and a count of issued uses per stage
    return TILE_ALIGN + config.stages * fp8_stage_bytes(kv_format) + query + scores + rows * 4 + barriers


FP8_MERGE_BYTES = FP8_GROUP_THREADS * 68 * 4  # per warpgroup after the first and row tile: its O, maxima, sums


def fp8_config_fits(kv_format: str, config: Fp8Config, dtype: torch.dtype = torch.bfloat16, row_tiles: int = 1) -> bool:
    """Whether ``config.ctas_per_sm`` CTAs fit in an SM's shared memory (each also reserves 1 KB), and
    the warpgroups' merge fits in the ring."""
    shared = config.ctas_per_sm * (fp8_shared_bytes(kv_format, config, dtype, row_tiles) + 1024) <= SHARED_PER_SM
    merge = (config.groups - 1) * FP8_MERGE_BYTES * row_tiles <= config.stages * fp8_stage_bytes(kv_format)
    return shared and merge


@functools.cache
def split_kernel(
    dtype: torch.dtype, pair: bool = False, fp8: bool = False, merge: bool = False, kv_format: str = "fp8"
) -> CudaKernel:
    """The wgmma split kernel for ``dtype`` (bf16 or fp16) queries; ``pair``: the two 64-row groups of a
    piece as a cluster (PAIR_GROUPS); ``fp8``: an fp8 cache of ``kv_format`` ("fp8": per tensor;
    "fp8_ds_mla": bf16 queries only), else the cache is ``dtype``; ``merge``: pieces in clusters of two
    that merge a row they split (MERGE_MIN_QUERY_ROWS; one group, bf16/fp16)."""
    if merge and (pair or fp8):
        raise ValueError("the row-halves merge runs one 64-row group of a bf16/fp16 cache")
    if fp8 and dtype not in fp8_query_dtypes(kv_format):
        raise ValueError(f"the {kv_format} variant takes {fp8_query_dtypes(kv_format)} queries, got {dtype}")
    ctype = C_TYPES[dtype]
    pointers = (*(f"const {ctype}*",) * 2, *SPLIT_POINTERS, f"{ctype}*", "float*", "float*", "float*")
    template = (ctype, 2 if pair else 1, 1 + FP8_FORMATS[kv_format] if fp8 else 0, int(merge))
    return CudaKernel(HEADER, KERNEL, template, (*pointers, *SPLIT_PARAMS))


@functools.cache
def combine_kernel(dtype: torch.dtype, part_dtype: torch.dtype = torch.float32) -> CudaKernel:
    """The combine kernel reading ``part_dtype`` partials and writing ``dtype`` output."""
    part = PARTIAL_C_TYPES[part_dtype]
    params = (f"const {part}*", "const float*", "const int*", "const int*", "const int*", "int")
    params += (f"{C_TYPES[dtype]}*", "float*", "int", "int", "int", "const float*")
    return CudaKernel(COMBINE_HEADER, COMBINE_KERNEL, (part, C_TYPES[dtype]), params)


def combine_rows_per_cta(rows: int, batch: int, sms: int) -> int:
    """Query rows per combine CTA: the fewest that keep its grid, cdiv(rows, n) x batch CTAs, about one
    wave (a CTA pays its start, schedule reads and wait once), but at most COMBINE_MAX_ROWS_PER_CTA;
    past 4, a multiple of its 4 warps."""
    n = min(cdiv(rows * batch, sms * COMBINE_CTAS_PER_SM), COMBINE_MAX_ROWS_PER_CTA)
    return min(rows, n if n <= 4 else 4 * cdiv(n, 4))


@functools.cache
def fp8_split_kernel(
    dtype: torch.dtype, kv_format: str, config: Fp8Config | None = None, row_tiles: int = 1
) -> CudaKernel:
    """The fp8-cache split kernel for ``dtype`` queries and ``kv_format`` ("fp8" or "fp8_ds_mla"),
    tiled by ``config`` (default: the format's), with ``row_tiles`` tiles of 16 query rows per CTA."""
    config = FP8_CONFIGS[kv_format] if config is None else config
    ctype = C_TYPES[dtype]
    caches = ("const float*", "const unsigned char*", "const unsigned char*")  # tensor scale, rope, scales
    part = PARTIAL_C_TYPES[FP8_PARTIAL_DTYPE]
    pointers = (*(f"const {ctype}*",) * 2, *caches, *SPLIT_POINTERS, f"{ctype}*", "float*", f"{part}*", "float*")
    tiles = (config.stages, config.groups, config.ctas_per_sm, config.chunk, row_tiles)
    template = (ctype, FP8_FORMATS[kv_format], *tiles)
    return CudaKernel(FP8_HEADER, FP8_KERNEL, template, (*pointers, *FP8_SPLIT_PARAMS))


def fp8_kernel_max_rows(kv_format: str) -> int:
    """The most query rows the fp8 kernel serves for ``kv_format``: two row tiles (FP8_TWO_TILES, and for
    fp8_ds_mla FP8_DS_MLA_TWO_TILES), else one."""
    two = FP8_TWO_TILES and (kv_format == "fp8" or (kv_format == FP8_DS_MLA and FP8_DS_MLA_TWO_TILES))
    return 2 * FP8_MAX_QUERY_ROWS if two else FP8_MAX_QUERY_ROWS


def fp8_row_tiles(call: MLADecodeCall) -> int | None:
    """Row tiles of the fp8 kernel for ``call``: 1 up to 16 query rows, 2 for 17-32 rows (FP8_TWO_TILES),
    else None (the wgmma kernel's fp8 variant, or no cutlass kernel)."""
    if call.query_rows > fp8_kernel_max_rows(call.kv_format):
        return None
    return 1 if call.query_rows <= FP8_MAX_QUERY_ROWS else 2


def fp8_config(call: MLADecodeCall) -> Fp8Config:
    """The fp8 kernel's config for ``call``: FP8_TWO_TILE_CONFIG for two row tiles; else
    FP8_FEW_BLOCKS_CONFIGS where the call has at most FP8_FEW_BLOCKS_PER_SM blocks per SM, else FP8_CONFIGS."""
    if fp8_row_tiles(call) == 2:
        return FP8_TWO_TILE_CONFIG
    few = most_blocks(call, FP8_BLOCK_N) <= FP8_FEW_BLOCKS_PER_SM * multiprocessor_count(call.device)
    return (FP8_FEW_BLOCKS_CONFIGS if few else FP8_CONFIGS)[call.kv_format]


def fp8_query_dtypes(kv_format: str) -> tuple[torch.dtype, ...]:
    """Query dtypes the fp8 kernel takes with ``kv_format`` (fp8_ds_mla's rope is bf16)."""
    return (torch.bfloat16,) if kv_format == FP8_DS_MLA else tuple(C_TYPES)


def all_kernels() -> list[CudaKernel]:
    """Every kernel variant the backend may launch."""
    kernels = [split_kernel(d, pair, fp8) for d in C_TYPES for pair in (False, True) for fp8 in (False, True)]
    kernels += [split_kernel(torch.bfloat16, pair, True, kv_format=FP8_DS_MLA) for pair in (False, True)]
    kernels += [split_kernel(d, merge=True) for d in C_TYPES]
    kernels += [combine_kernel(d, p) for d in C_TYPES for p in PARTIAL_C_TYPES]
    configs = (FP8_CONFIGS, FP8_FEW_BLOCKS_CONFIGS)
    kernels += [fp8_split_kernel(d, f, c[f]) for c in configs for f in FP8_FORMATS for d in fp8_query_dtypes(f)]
    kernels += [fp8_split_kernel(d, f, FP8_TWO_TILE_CONFIG, 2) for f in FP8_FORMATS for d in fp8_query_dtypes(f)]
    return kernels


def merges_row_halves(call: MLADecodeCall) -> bool:
    """Whether ``call`` runs the row-halves kernel: one group of MERGE_MIN_QUERY_ROWS to 64 query rows
    reading a bf16/fp16 cache."""
    low = MERGE_MIN_QUERY_ROWS
    return low is not None and call.kv_format not in FP8_FORMATS and low <= call.query_rows <= ROWS_PER_CTA


def row_groups(query_rows: int, rows_per_cta: int = ROWS_PER_CTA) -> int:
    """CTAs per piece: one per group of ``rows_per_cta`` query rows, and above one group an even count,
    cluster pairs of two groups (above 128 rows several pairs per piece; with an odd number of 64-row
    groups the last pair's second CTA holds no rows and stores nothing)."""
    groups = cdiv(query_rows, rows_per_cta)
    return groups if groups == 1 else PAIR_GROUPS * cdiv(groups, PAIR_GROUPS)


def rows_merged_in_pairs(schedule: SplitSchedule) -> list[bool]:
    """Which batch rows the row-halves kernel merges itself: those cut exactly into pieces 2k and 2k + 1
    (the test of merge_row_halves' callers and of the combine). Reads the schedule back (a sync): for
    tests."""
    bounds = schedule.piece_bounds.tolist()
    cum = schedule.cum_blocks.tolist()
    first, last = schedule.row_pieces.tolist()
    pairs = [(f, f + 2) if end == f + 1 and f % 2 == 0 else None for f, end in zip(first, last, strict=True)]
    return [p is not None and (bounds[p[0]], bounds[p[1]]) == (cum[b], cum[b + 1]) for b, p in enumerate(pairs)]


def _arch_reasons(call: MLADecodeCall) -> list[str]:
    if call.device.type != "cuda" or torch.version.hip:
        return [f"cutlass runs on NVIDIA GPUs only, got a tensor on {call.device}"]
    index = call.device.index if call.device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    if (major, minor) != (9, 0):
        return [f"cutlass kernels are built for sm_90a (Hopper wgmma) only, got sm_{major}{minor}"]
    return []


def _layout_reasons(call: MLADecodeCall, copied: tuple[str, ...] = ("q", "qpe", "kv", "kpe")) -> list[str]:
    """Rows the wgmma kernel copies in 16-byte chunks (``copied``) that are not 16-byte aligned, and
    queries too large for its int32 offsets."""
    reasons = []
    for name in copied:
        t = getattr(call, name)
        if t.data_ptr() % 16 or any(s % 8 for s in t.stride()[:-1]):
            reasons.append(
                f"cutlass needs {name} rows on 16-byte boundaries (pointer aligned, strides multiples of 8 "
                f"elements), got strides {t.stride()}"
            )
    for name in ("q", "qpe"):
        t = getattr(call, name)
        if (call.q_len - 1) * t.stride(1) + (call.heads - 1) * t.stride(2) + t.shape[3] > MAX_INT32:
            reasons.append(f"cutlass needs one batch row of {name} to fit in int32 offsets")
    return reasons


def _fp8_reasons(call: MLADecodeCall) -> list[str]:
    fmt = call.kv_format
    if call.kv.dtype != FP8_DTYPE or (fmt == "fp8" and call.kpe.dtype != FP8_DTYPE):
        return [f"cutlass reads fp8 caches as {FP8_DTYPE} (kv and kpe), got kv {call.kv.dtype}, kpe {call.kpe.dtype}"]
    if call.q.dtype not in fp8_query_dtypes(fmt):
        names = ", ".join(str(d) for d in fp8_query_dtypes(fmt))
        return [f"cutlass's {fmt} kernel takes {names} queries, got {call.q.dtype}"]
    reasons = []
    if fp8_row_tiles(call) is None:
        reasons = _fp8_wide_reasons(call)
        if reasons:
            return reasons
    copied = {"kv": call.kv, "kpe": call.kpe}  # a per-tensor kv_scale is one float, read as such
    if fmt == FP8_DS_MLA:
        copied = {"kv's values": call.kv, "kv's rope": call.kpe, "kv's scales": call.kv_scale}
    for name, t in copied.items():
        if t.data_ptr() % CACHE_ALIGN or any(st * t.element_size() % CACHE_ALIGN for st in t.stride()[:-1]):
            reasons.append(
                f"cutlass needs {name} rows on {CACHE_ALIGN}-byte boundaries (pointer and strides), "
                f"got strides {t.stride()} of {t.element_size()}-byte elements"
            )
    return reasons


def _fp8_wide_reasons(call: MLADecodeCall) -> list[str]:
    """Why the wgmma kernel's fp8 variants (more rows than the fp8 kernel's) cannot run ``call``."""
    fmt = call.kv_format
    rows = f"(new tokens x heads), got {call.q_len} x {call.heads} = {call.query_rows}"
    if fmt == FP8_DS_MLA and not FP8_DS_MLA_WIDE:
        return [f"cutlass's {fmt} kernel serves at most {fp8_kernel_max_rows(fmt)} query rows per KV read {rows}"]
    if call.query_rows > MAX_QUERY_ROWS:
        return [f"cutlass's {fmt} kernels serve at most {MAX_QUERY_ROWS} query rows per KV read {rows}"]
    fewest = FP8_WIDE_MIN_BOX_ROWS[fmt]
    if tma_box_rows(call) < fewest:
        where = f"pages of {call.page_size} tokens" if call.is_paged else f"{call.kv.shape[1]} tokens per row"
        what = "a 64-byte token" if fmt == "fp8" else "a token's 16 bytes of scales"
        return [
            f"cutlass's {fmt} kernel for more than {fp8_kernel_max_rows(fmt)} query rows reads the cache in boxes of "
            f"{fewest} or more tokens (fewer than that of {what} do not fill the 128 bytes a box starts on in shared "
            f"memory), got {where}"
        ]
    return _layout_reasons(call, copied=("q", "qpe"))  # the cache rows: _fp8_reasons (16-byte rows)


def _split_kernel_of(call: MLADecodeCall, pair: bool = False) -> CudaKernel:
    """The split kernel that serves ``call``: the fp8 kernel at up to 32 query rows of an fp8 cache
    (``fp8_row_tiles``), else the wgmma kernel (its fp8 variants for more rows of an fp8 cache)."""
    if call.kv_format not in FP8_FORMATS:
        return split_kernel(call.q.dtype, pair, merge=merges_row_halves(call))
    tiles = fp8_row_tiles(call)
    if tiles is not None:
        return fp8_split_kernel(call.q.dtype, call.kv_format, fp8_config(call), tiles)
    return split_kernel(call.q.dtype, pair, fp8=True, kv_format=call.kv_format)


def partial_dtype(call: MLADecodeCall) -> torch.dtype:
    """The dtype of ``call``'s partials: the fp8 kernel's (``FP8_PARTIAL_DTYPE``), else float32."""
    if call.kv_format in FP8_FORMATS and fp8_row_tiles(call) is not None:
        return FP8_PARTIAL_DTYPE
    return torch.float32


def _kernels_of(call: MLADecodeCall) -> tuple[tuple[str, CudaKernel], ...]:
    split = _split_kernel_of(call, row_groups(call.query_rows) >= PAIR_GROUPS)
    return (("split", split), ("combine", combine_kernel(call.q.dtype, partial_dtype(call))))


def supports(call: MLADecodeCall) -> list[str]:
    """Why the cutlass kernels cannot run ``call`` (empty: they can)."""
    if call.kv_format in FP8_FORMATS:
        reasons = _fp8_reasons(call)
    elif call.is_packed:
        return [f"cutlass does not implement the {call.kv_format} KV cache"]
    else:
        reasons = _bf16_reasons(call)
    if reasons:
        return reasons
    if (call.head_dim, call.rope_dim) != (HEAD_DIM, ROPE_DIM):
        return [f"cutlass supports D={HEAD_DIM}, P={ROPE_DIM}, got D={call.head_dim}, P={call.rope_dim}"]
    if call.batch > MAX_GRID_Y:
        return [f"cutlass launches its combine with the batch on grid.y: at most {MAX_GRID_Y} rows, got {call.batch}"]
    reasons = _tensor_map_reasons(call)
    if reasons:
        return reasons
    reasons = _arch_reasons(call)
    if reasons:
        return reasons
    for stage, kernel in _kernels_of(call):
        if not kernel.available("sm_90a"):
            reasons.append(
                f"no cached cubin for the {call.q.dtype} {stage} kernel on sm_90a and no nvcc with the CUTLASS "
                "headers (run `python -m tilegym precompile --backend cutlass`)"
            )
    return reasons


def _tensor_map_reasons(call: MLADecodeCall) -> list[str]:
    """What a TMA map of the cache cannot describe: a batch/page or token stride of zero (an
    expanded tensor) or of 2^40 bytes or more."""
    reasons = []
    names = ("kv", "kpe", "kv_scale") if call.kv_format == FP8_DS_MLA else ("kv", "kpe")  # kv_scale: the scales
    for name in names:
        t = getattr(call, name)
        strides = [st * t.element_size() for st in t.stride()[:2]]
        if not all(0 < st < MAX_TMA_STRIDE for st in strides):
            reasons.append(
                f"cutlass reads {name} by TMA: its batch/page and token strides must be positive and below 2^40 "
                f"bytes, got {strides} bytes"
            )
    return reasons


def _bf16_reasons(call: MLADecodeCall) -> list[str]:
    if call.q.dtype not in C_TYPES or call.kv.dtype != call.q.dtype:
        return [f"cutlass supports bf16 and fp16 (the same for q and kv), got q {call.q.dtype}, kv {call.kv.dtype}"]
    if not MIN_QUERY_ROWS <= call.query_rows <= MAX_QUERY_ROWS:
        return [
            f"cutlass serves {MIN_QUERY_ROWS}..{MAX_QUERY_ROWS} query rows per KV read (new tokens x heads), "
            f"got {call.q_len} x {call.heads} = {call.query_rows}"
        ]
    return _layout_reasons(call)


def require_tma_aligned_fp8_cache(
    kv_format: str, kv: torch.Tensor, kpe: torch.Tensor, kv_scale: torch.Tensor | None
) -> None:
    """``ValueError`` unless the fp8 cache tensors the TMA maps address (kv, kpe, and fp8_ds_mla's scales)
    start on CACHE_ALIGN-byte boundaries: ``supports`` checks the call's, a plan's run may get others."""
    tensors = (kv, kpe, kv_scale) if kv_format == FP8_DS_MLA else (kv, kpe)
    misaligned = [hex(t.data_ptr()) for t in tensors if t.data_ptr() % CACHE_ALIGN]
    if misaligned:
        raise ValueError(
            f"cutlass's {kv_format} kernel reads the cache by TMA: kv and kpe (and fp8_ds_mla's scales) must "
            f"start on {CACHE_ALIGN}-byte boundaries, got addresses {misaligned}"
        )


class CutlassDecodePlan:
    """Schedule, workspace and pre-bound launches of both kernels for one call's shapes (bf16/fp16
    caches on the wgmma kernel; ``CutlassFp8DecodePlan`` overrides the hooks for fp8 caches)."""

    rows_per_cta = ROWS_PER_CTA
    threads = PRODUCER_THREADS
    # The combine starts as a programmatic dependent launch: its CTAs are placed while the split
    # kernel's last CTAs run and wait on the device for its end, instead of after a full kernel boundary.
    early_combine = True
    # The split kernel of a CTA alone is a programmatic dependent launch too: its CTAs are placed as the
    # previous kernel (the last call's combine, say) ends, and wait on the device before reading anything
    # (session 23 A/B: 1-2% faster at 16 heads; a cluster pair was no faster, 5% slower with fp8 caches).
    early_split = True
    # The row-halves kernel (a cluster of two) as a programmatic dependent launch as well: off, as it gained
    # nothing at 64 rows (session 29, H100 timeline: 116.0 -> 115.5 us at 64 x 4096 x 64, 115.7 -> 116.1 at
    # Q = 4) and left the kernel slower than a CTA alone at 16 rows (4 x 1024: 11.6 against 10.6).
    early_merge_split = False
    programs_per_sm = 1
    block_n = TOKENS_PER_BLOCK
    min_blocks = 1

    def __init__(self, call: MLADecodeCall) -> None:
        self.call = call
        self.groups = groups = row_groups(call.query_rows, self.rows_per_cta)
        self.paired = groups >= PAIR_GROUPS  # cluster pairs (the pair kernel)
        self.merge = merges_row_halves(call)
        self.device_index = call.device.index if call.device.index is not None else torch.cuda.current_device()
        shape = schedule_shape(
            call,
            block_n=self.block_n,
            programs_per_sm=self.programs_per_sm,
            head_groups=groups,
            min_blocks=self.min_blocks,
            snap=self._snap(),
            segment_cost_tokens=self._segment_cost_tokens(),
        )
        shape = self._one_wave(shape)
        self.schedule = s = SplitSchedule(call, shape)
        rows, device = call.query_rows, call.device
        self.part_out = torch.empty((shape.slots, rows, HEAD_DIM), dtype=partial_dtype(call), device=device)
        self.part_lse = torch.empty((shape.slots, rows), dtype=torch.float32, device=device)
        table = call.block_table if call.block_table is not None else call.kv_indices
        self._split_schedule = (
            0 if table is None or table.numel() == 0 else table.data_ptr(),
            0 if call.kv_indptr is None else call.kv_indptr.data_ptr(),
            s.lens.data_ptr(),
            s.cum_blocks.data_ptr(),
            s.piece_bounds.data_ptr(),
            s.piece_rows.data_ptr(),
        )
        self._split_sizes = (
            call.heads,
            call.q_len,
            rows,
            int(call.causal and call.q_len > 1),
            int(call.return_lse),
            int(call.layout != DENSE),
            call.page_size if call.is_paged else 1,
            call.num_pages if call.is_paged else 1,
            0 if call.kv_indices is None else call.kv_indices.numel(),
            int(call.layout == RAGGED),
            shape.programs,
            *call.q.stride()[:3],
            *call.qpe.stride()[:3],
            0 if call.block_table is None else call.block_table.stride(0),
            *self._cache_strides(),
            call.sm_scale * LOG2E,
        )
        self._workspace = (self.part_out.data_ptr(), self.part_lse.data_ptr())
        merge_tables = (s.piece_bounds.data_ptr(), s.cum_blocks.data_ptr()) if self.merge else (0, 0)
        self._combine_schedule = (*self._workspace, s.row_pieces.data_ptr(), *merge_tables, call.batch)
        per_cta = combine_rows_per_cta(rows, call.batch, multiprocessor_count(call.device))
        self._combine_sizes = (rows, int(call.return_lse), per_cta)
        grid = (shape.programs, groups, 1)
        self._maps: dict[tuple[int, int, int], tuple[bytes | int, ...]] = {}
        self._launch_split = self._split_kernel().bind(
            self.device_index,
            grid,
            (self.threads, 1, 1),
            self._shared_bytes(),
            early_start=self.early_split and not self.paired and (self.early_merge_split or not self.merge),
        )
        combine = combine_kernel(call.q.dtype, self.part_out.dtype)
        self._launch_combine = combine.bind(
            self.device_index,
            (cdiv(rows, per_cta), call.batch, 1),
            (COMBINE_THREADS, 1, 1),
            early_start=self.early_combine,
        )

    def _split_kernel(self) -> CudaKernel:
        return split_kernel(self.call.q.dtype, self.paired, merge=self.merge)

    def _snap(self) -> float:
        """How much longer a piece may get to hold whole segments of equal-length rows."""
        return PAIR_SNAP if self.paired else 0.0

    def _one_wave(self, shape: ScheduleShape) -> ScheduleShape:
        """``shape`` with no more pieces than CTAs of whole clusters the GPU runs at once (clusters need
        their SMs in one GPC, which some SM counts do not allow for every SM): the pieces stay one wave.
        The row-halves kernel's clusters take pieces two by two: an even count."""
        if self.merge:
            if shape.fixed_blocks is not None:  # fixed pieces: as many as they take, plus an empty one
                return dataclasses.replace(shape, programs=2 * cdiv(shape.programs, 2))
            grid, block = (2 * cdiv(shape.programs, 2), 1, 1), (self.threads, 1, 1)
            fit = self._split_kernel().max_active_clusters(self.device_index, grid, block, self._shared_bytes())
            return dataclasses.replace(shape, programs=2 * max(1, min(shape.programs // 2, fit)))
        if not self.paired or shape.fixed_blocks is not None:
            return shape
        grid, block = (shape.programs, self.groups, 1), (self.threads, 1, 1)
        fit = self._split_kernel().max_active_clusters(self.device_index, grid, block, self._shared_bytes())
        pairs_per_piece = self.groups // PAIR_GROUPS
        return dataclasses.replace(shape, programs=max(1, min(shape.programs, fit // pairs_per_piece)))

    def _shared_bytes(self) -> int:
        return SHARED_BYTES

    def _partial_scale(self, kv_scale: torch.Tensor | None) -> int:
        """The combine's last argument: the scale its output still needs (a device float; 0: none)."""
        return 0

    def _segment_cost_tokens(self) -> int:
        return PAIR_SEGMENT_COST_TOKENS if self.paired else SEGMENT_COST_TOKENS

    def _cache_pointers(self, kpe: torch.Tensor, kv_scale: torch.Tensor | None) -> tuple[int, ...]:
        return ()  # the TMA maps address the cache

    def _cache_strides(self) -> tuple[int, ...]:
        return ()

    def _scale_pointer(self, kv_scale: torch.Tensor | None) -> tuple[int, ...]:
        """The wgmma kernel's last argument: the per-tensor fp8 scale (0 for a bf16/fp16 cache)."""
        return (0,)

    def _tensor_maps(
        self, kv: torch.Tensor, kpe: torch.Tensor, kv_scale: torch.Tensor | None
    ) -> tuple[bytes | int, ...]:
        """The TMA maps of this call's cache tensors and the box height: encoded on the host once per
        set of addresses (a few kept), passed by value, so graph capture sees no copy."""
        key = (kv.data_ptr(), kpe.data_ptr(), 0 if kv_scale is None else kv_scale.data_ptr())
        args = self._maps.get(key)
        if args is None:
            if len(self._maps) >= MAPS_KEPT:
                self._maps.clear()
            rows = self._box_rows()
            args = self._maps[key] = (*self._encode_maps(kv, kpe, kv_scale, rows), rows)
        return args

    def _box_rows(self) -> int:
        """Tokens per TMA box (the kernels take any power of two that divides their 64-token block)."""
        return tma_box_rows(self.call)

    def _encode_maps(
        self, kv: torch.Tensor, kpe: torch.Tensor, kv_scale: torch.Tensor | None, rows: int
    ) -> tuple[bytes, ...]:
        """The latent's 4-D map (a side's tiles per box) and the rope's map, in the wgmma kernel's
        64-column (128-byte) tiles; the rope's again where the kernel takes the scales' (never read)."""
        rope = encode_tile_map(kpe, rows)
        return encode_latent_tiles_map(kv, rows), rope, rope

    def refresh(self) -> None:
        self.schedule.refresh()

    def run(
        self,
        q: torch.Tensor,
        qpe: torch.Tensor,
        kv: torch.Tensor,
        kpe: torch.Tensor,
        kv_scale: torch.Tensor | None,
        out: torch.Tensor,
        lse: torch.Tensor | None,
    ) -> None:
        """Both launches on the current stream: write ``out`` (and ``lse`` when given)."""
        stream = torch._C._cuda_getCurrentRawStream(self.device_index)
        out_ptr, lse_ptr = out.data_ptr(), 0 if lse is None else lse.data_ptr()
        split_args = (
            q.data_ptr(),
            qpe.data_ptr(),
            *self._cache_pointers(kpe, kv_scale),
            *self._split_schedule,
            out_ptr,
            lse_ptr,
            *self._workspace,
            *self._split_sizes,
            *self._tensor_maps(kv, kpe, kv_scale),
            *self._scale_pointer(kv_scale),
        )
        self._launch_split(split_args, stream)
        combine_args = (*self._combine_schedule, out_ptr, lse_ptr, *self._combine_sizes, self._partial_scale(kv_scale))
        self._launch_combine(combine_args, stream)


class CutlassFp8DecodePlan(CutlassDecodePlan):
    """The plan of the fp8-cache kernel: one CTA of one or two 16-row tiles per piece (one or more warpgroups), maps of
    the cache's values, rope and (fp8_ds_mla) scales."""

    def __init__(self, call: MLADecodeCall, config: Fp8Config | None = None) -> None:
        """``config`` other than ``fp8_config(call)``: benchmarks/sweep_cutlass_fp8.py."""
        self.row_tiles = fp8_row_tiles(call)
        if self.row_tiles is None:
            raise ValueError(f"the fp8 kernel takes no {call.query_rows} query rows of a {call.kv_format} cache")
        self.rows_per_cta = FP8_MAX_QUERY_ROWS * self.row_tiles
        self.config = fp8_config(call) if config is None else config
        c = self.config
        if not (c.stages >= 1 and 1 <= c.groups <= FP8_MAX_GROUPS and c.ctas_per_sm >= 1 and c.chunk >= 1):
            raise ValueError(
                f"config needs stages, ctas_per_sm and chunk >= 1 and 1 <= groups <= {FP8_MAX_GROUPS}, got {c}"
            )
        if not c.snap >= 0:
            raise ValueError(f"config's snap must be >= 0 (how much longer a piece may get), got {c.snap}")
        if not fp8_config_fits(call.kv_format, self.config, call.q.dtype, self.row_tiles):
            raise ValueError(f"{self.config} does not fit in an SM's shared memory")
        self.block_n, self.programs_per_sm = FP8_BLOCK_N, self.config.ctas_per_sm
        self.threads = FP8_GROUP_THREADS * self.config.groups
        self.min_blocks = self.config.min_blocks or fewest_blocks_per_piece(call, FP8_BLOCK_N, FP8_PIECES_PER_ROW)
        super().__init__(call)

    def _split_kernel(self) -> CudaKernel:
        return fp8_split_kernel(self.call.q.dtype, self.call.kv_format, self.config, self.row_tiles)

    def _snap(self) -> float:
        return self.config.snap

    def _shared_bytes(self) -> int:
        return fp8_shared_bytes(self.call.kv_format, self.config, self.call.q.dtype, self.row_tiles)

    def _segment_cost_tokens(self) -> int:
        return FP8_SEGMENT_COST_TOKENS

    def _partial_scale(self, kv_scale: torch.Tensor | None) -> int:
        """Per-tensor fp8's scale: the partials hold the cache's unscaled values."""
        return kv_scale.data_ptr() if self.call.kv_format == "fp8" else 0

    def _scale_pointer(self, kv_scale: torch.Tensor | None) -> tuple[int, ...]:
        return ()  # among the cache pointers

    def _cache_pointers(self, kpe: torch.Tensor, kv_scale: torch.Tensor | None) -> tuple[int, ...]:
        """The per-tensor scale (one float read on the device), and the rope and fp8_ds_mla's scales for
        pages too small for their TMA boxes (copied token by token)."""
        if self.call.kv_format == "fp8":
            return kv_scale.data_ptr(), kpe.data_ptr(), 0
        return 0, kpe.data_ptr(), kv_scale.data_ptr()

    def _cache_strides(self) -> tuple[int, ...]:
        """Byte strides (page or batch row, token) of the rope and of fp8_ds_mla's scales."""
        call = self.call
        scales = call.kv_scale if call.kv_format == FP8_DS_MLA else None
        rope = [st * call.kpe.element_size() for st in call.kpe.stride()[:2]]
        return (*rope, *((0, 0) if scales is None else (st * 4 for st in scales.stride()[:2])))

    def _encode_maps(
        self, kv: torch.Tensor, kpe: torch.Tensor, kv_scale: torch.Tensor | None, rows: int
    ) -> tuple[bytes, ...]:
        """Latent in 128-byte boxes; the rope in 64-byte (fp8) or 128-byte (fp8_ds_mla's bf16) boxes;
        fp8_ds_mla's scales in 16-byte boxes (per-tensor fp8: the latent map again, never read)."""
        ds_mla = self.call.kv_format == FP8_DS_MLA
        require_tma_aligned_fp8_cache(self.call.kv_format, kv, kpe, kv_scale)
        latent = encode_tile_map(kv, rows)
        rope = encode_tile_map(kpe, rows, 128 if ds_mla else ROPE_DIM)
        return latent, rope, encode_tile_map(kv_scale, rows, 16) if ds_mla else latent


class CutlassFp8WideDecodePlan(CutlassDecodePlan):
    """An fp8 cache at more query rows than the fp8 kernel takes (33-1024): the wgmma kernel's fp8 variants,
    with maps of the fp8 latent in unswizzled 64-byte rows (the kernel widens them), and of the rope: fp8
    in 64-byte rows, with the per-tensor scale read on the device; or fp8_ds_mla's bf16 rope in swizzled
    128-byte rows and its scales in 16-byte rows."""

    threads = THREADS  # no producer warpgroup: each consumer issues its own refills

    def _split_kernel(self) -> CudaKernel:
        return split_kernel(self.call.q.dtype, self.paired, fp8=True, kv_format=self.call.kv_format)

    def _scale_pointer(self, kv_scale: torch.Tensor | None) -> tuple[int, ...]:
        return (kv_scale.data_ptr() if self.call.kv_format == "fp8" else 0,)

    def _encode_maps(
        self, kv: torch.Tensor, kpe: torch.Tensor, kv_scale: torch.Tensor | None, rows: int
    ) -> tuple[bytes, ...]:
        ds_mla = self.call.kv_format == FP8_DS_MLA
        require_tma_aligned_fp8_cache(self.call.kv_format, kv, kpe, kv_scale)
        latent = encode_tile_map(kv, rows, ROPE_DIM, swizzle=False)
        if ds_mla:
            return latent, encode_tile_map(kpe, rows), encode_tile_map(kv_scale, rows, 16)
        rope = encode_tile_map(kpe, rows, ROPE_DIM, swizzle=False)
        return latent, rope, rope


def plan(call: MLADecodeCall) -> CutlassDecodePlan:
    """The cutlass backend's plan for ``call``."""
    if call.kv_format in FP8_FORMATS:
        if fp8_row_tiles(call) is None:
            return CutlassFp8WideDecodePlan(call)
        return CutlassFp8DecodePlan(call)
    return CutlassDecodePlan(call)
