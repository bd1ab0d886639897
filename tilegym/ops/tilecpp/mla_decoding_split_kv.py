"""Launcher of the Tile C++ MLA decode over a split schedule, and its plan.

Stage 1 (``mla_decoding_split_kv.cuh``) launches (pieces, query-row groups) programs, one wave
of persistent programs each walking one piece of the schedule (``tilegym.ops.schedule``); a
segment that is a whole row writes the final output, the others float32 partials. Stage 2
(``mla_decoding_combine.cuh``) merges the rows split over several segments and zeroes empty
rows. Variants: dtype (bf16, fp16) x tile
config (query rows per program, tokens per step) x layout kind (dense rows, pages holding a
whole step, or smaller pages of 1, 16 or 32 tokens, one strided load each); with an fp8 cache
(float8_e4m3fn, per-tensor ``kv_scale`` read on the device) the 16 x 64 config only, pages of 16
tokens and more; sizes, strides, lengths and the schedule are runtime arguments, so a new shape
or batch never compiles anything.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from tilegym.ops.contract import DENSE, MLADecodeCall
from tilegym.ops.cubin_loader import TileCppKernel
from tilegym.ops.schedule import SplitSchedule, schedule_shape
from tilegym.ops.tilecpp.splitk_reduce import C_TYPES, device_arch
from tilegym.utils import cdiv

HEADER = "mla_decoding_split_kv.cuh"
KERNEL = "mla_decode_split_kernel"
COMBINE_HEADER = "mla_decoding_combine.cuh"
COMBINE_KERNEL = "mla_decode_combine_kernel"
COMBINE_ROWS_KERNEL = "mla_decode_combine_rows_kernel"
HEAD_DIM, ROPE_DIM = 512, 64  # fixed by the kernel's tile shapes
LOG2E = math.log2(math.e)  # the kernel's softmax works in base 2
DTYPES = (torch.bfloat16, torch.float16)
# fp8 cache (kv and kpe float8_e4m3fn, cache value = kv * kv_scale): the kernel widens its tiles to f16
# (exact; kv_scale goes into the score scale and the output, read from its device pointer).
FP8_KV = torch.float8_e4m3fn
KV_C_TYPES = {**C_TYPES, FP8_KV: "__nv_fp8_e4m3"}
# With an fp8 cache the MMAs run in fp16 whatever the query dtype: e4m3 -> f16 is one instruction per
# two elements (e4m3 -> bf16 goes through f32), and a bf16 query is rescaled per row to f16 exactly.
FP8_MMA_DTYPE = torch.float16
MAX_INT32 = 2**31 - 1
MAX_GRID_YZ = 65535
# A segment's fixed start (query staged, pipeline refilled, partial written) as the tokens a program
# streams in that time: the schedule balances blocks plus starts for rows of unequal lengths
# (tilegym/ops/schedule.py). H200 sweeps of the mixed suite (profiler timeline, session 25, two rounds
# in opposite orders), us per call at 512 / 768 / 1024 tokens: 64 rows U[1, 8192] x 16: 136.3, 135.6 /
# 112.1, 113.2 / 113.2, 114.9; long-tail: 61.4, 60.6 / 59.2, 58.2 / 55.8, 55.9; 128 rows U[1, 4096] x 16:
# 130.1, 132.0 / 127.4, 128.2 / 121.2, 122.2; at 128 heads (several head groups): 444.5, 438.0 / 463.5,
# 461.0 / 478.7, 474.1. 256 was nowhere faster than 512 (session 24 chose 256: 0 -> 256 took
# 81.8 -> 59.0 us long-tail).
SEGMENT_COST_TOKENS = 1024  # one head group (up to 16 query rows)
GROUPED_SEGMENT_COST_TOKENS = 512  # several head groups share the pieces
# Layout kinds: the kernel's (LAYOUT, PAGE_SIZE) template arguments.
LayoutKind = tuple[int, int]
DENSE_ROWS: LayoutKind = (0, 0)
PAGE_PER_STEP: LayoutKind = (1, 0)  # pages of at least a step: one page id per step
SMALL_PAGE_SIZES = (1, 16, 32)  # smaller pages with a kernel variant: one load per page
PAGED_ROWS: dict[int, LayoutKind] = {size: (2, size) for size in SMALL_PAGE_SIZES}
# Combine tiles (query rows, slots per step, columns): many rows with few segments each, or one
# row cut into many segments (one long request), chosen by the schedule's pieces per row.
FEW_SEGMENTS_TILE = (16, 1, 64)  # built as the 2-D rows kernel (16 rows x 64 columns)
MANY_SEGMENTS_TILE = (1, 16, 64)
MANY_SEGMENTS_PER_ROW = 8
SPLIT_PARAMS = (*("int",) * 10, *("long long",) * 11, "float")
COMBINE_PARAMS = ("const float*", "const float*", "const int*", "int")  # partials, lse, row pieces, batch


@dataclass(frozen=True)
class TileConfig:
    """Query rows per program, KV tokens per step, occupancy hint (CTAs per SM) of the split kernel."""

    block_h: int
    block_n: int
    occupancy: int


# Library defaults (the best of the configs measured on the H200, benchmarks/NOTES_tilecpp.md):
# up to 16 query rows -> 16-row programs, 64 tokens per step; more -> 32-row programs, 128 tokens
# per step. Each uses 150-190 KB of shared memory: one program per SM.
SMALL_HEADS = TileConfig(16, 64, 1)
MANY_HEADS = TileConfig(32, 128, 1)
MANY_HEADS_PAGED = TileConfig(32, 64, 1)  # pages under 128 tokens: 64-token steps (fewer per-page loads)
CONFIGS = (SMALL_HEADS, MANY_HEADS, MANY_HEADS_PAGED)
# fp8 cache: 16-row programs with 64-token steps for every head count. The widening runs in the MMA
# warps, so wider programs spill (32 x 128: ~3.5 KB of stack per thread, 32 x 64: 0.75 KB) and were
# slower at 128 heads on the H200 (benchmarks/NOTES_tilecpp.md).
FP8_CONFIGS = (SMALL_HEADS,)


# fp8 caches are built for pages of at least 16 tokens only: a page-size-1 variant takes 70-220 s to
# compile per dtype, and its per-page loads were 10x slower than a step-wide load in bf16 anyway.
FP8_SMALL_PAGE_SIZES = (16, 32)


def layout_kinds(config: TileConfig, kv_dtype: torch.dtype | None = None) -> list[LayoutKind]:
    """The layout kinds built for a config (and cache dtype: fp8 skips pages of 1 token)."""
    if kv_dtype == FP8_KV:
        if config not in FP8_CONFIGS:
            return []
        return [DENSE_ROWS, PAGE_PER_STEP, *(PAGED_ROWS[s] for s in FP8_SMALL_PAGE_SIZES if s < config.block_n)]
    if config is MANY_HEADS:
        return [DENSE_ROWS, PAGE_PER_STEP]
    kinds = [PAGE_PER_STEP, *(PAGED_ROWS[s] for s in SMALL_PAGE_SIZES if s < config.block_n)]
    return kinds if config is MANY_HEADS_PAGED else [DENSE_ROWS, *kinds]


@functools.cache
def split_kernel(
    dtype: torch.dtype,
    config: TileConfig,
    kind: LayoutKind,
    kv_dtype: torch.dtype | None = None,
    mma_dtype: torch.dtype | None = None,
) -> TileCppKernel:
    """The split kernel for ``dtype`` queries, a ``kv_dtype`` cache (default: ``dtype``), a tile config and a layout.

    ``mma_dtype``: the MMA element type (default: ``dtype``; fp16 for an fp8 cache, see FP8_MMA_DTYPE).
    """
    kv_dtype = kv_dtype or dtype
    if mma_dtype is None:
        mma_dtype = FP8_MMA_DTYPE if kv_dtype == FP8_KV else dtype
    ctype, kvtype, mtype = C_TYPES[dtype], KV_C_TYPES[kv_dtype], C_TYPES[mma_dtype]
    pointers = (
        *(f"const {ctype}*",) * 2,
        *(f"const {kvtype}*",) * 2,
        *("const int*",) * 6,
        "const float*",
        f"{ctype}*",
        "float*",
        "float*",
        "float*",
    )
    template_args = (ctype, kvtype, mtype, config.block_h, config.block_n, config.occupancy, *kind)
    return TileCppKernel(HEADER, KERNEL, template_args, (*pointers, *SPLIT_PARAMS))


@functools.cache
def combine_kernel(out_dtype: torch.dtype, tile: tuple[int, int, int]) -> TileCppKernel:
    """The combine kernel writing ``out_dtype`` with a (rows, slots, columns) tile."""
    params = (*COMBINE_PARAMS, f"{C_TYPES[out_dtype]}*", "float*", "int", "int", "int")
    if tile[1] == 1:
        rows_tile = (C_TYPES[out_dtype], tile[0], tile[2])
        return TileCppKernel(COMBINE_HEADER, COMBINE_ROWS_KERNEL, rows_tile, params)
    return TileCppKernel(COMBINE_HEADER, COMBINE_KERNEL, (C_TYPES[out_dtype], *tile), params)


def combine_tile(programs: int, batch: int) -> tuple[int, int, int]:
    """The many-segments tile when the schedule cuts a row into about 8 pieces or more."""
    return MANY_SEGMENTS_TILE if programs >= MANY_SEGMENTS_PER_ROW * batch else FEW_SEGMENTS_TILE


def all_kernels() -> list[TileCppKernel]:
    """Every decode variant the library may launch."""
    splits = [split_kernel(d, c, k) for d in DTYPES for c in CONFIGS for k in layout_kinds(c)]
    splits += [split_kernel(d, c, k, FP8_KV) for d in DTYPES for c in FP8_CONFIGS for k in layout_kinds(c, FP8_KV)]
    return splits + [combine_kernel(d, t) for d in DTYPES for t in (FEW_SEGMENTS_TILE, MANY_SEGMENTS_TILE)]


def choose_config(call: MLADecodeCall) -> TileConfig:
    """16-row programs up to 16 query rows or with an fp8 cache, else 32-row programs (64-token steps with
    pages under 128)."""
    if call.query_rows <= SMALL_HEADS.block_h or call.is_fp8:
        return SMALL_HEADS
    if call.is_paged and call.page_size < MANY_HEADS.block_n:
        return MANY_HEADS_PAGED
    return MANY_HEADS


def layout_kind(call: MLADecodeCall, config: TileConfig) -> LayoutKind | None:
    """Dense rows; pages holding a whole step (one id per step); smaller pages with a variant; else None."""
    if call.layout == DENSE:
        return DENSE_ROWS
    if call.page_size >= config.block_n:
        return PAGE_PER_STEP
    return PAGED_ROWS.get(call.page_size)


def _alignment_reasons(call: MLADecodeCall) -> list[str]:
    reasons = []
    for name in ("q", "qpe", "kv", "kpe"):
        t = getattr(call, name)
        vec = 16 // t.element_size()
        if t.data_ptr() % 16 or any(s % vec for s in t.stride()[:-1]):
            reasons.append(
                f"tilecpp needs {name} rows on 16-byte boundaries (pointer aligned, strides multiples of {vec} "
                f"elements), got strides {t.stride()}"
            )
    return reasons


def _offset_reasons(call: MLADecodeCall, config: TileConfig) -> list[str]:
    reasons = []
    for name in ("kv", "kpe"):
        if getattr(call, name).stride(1) * config.block_n > MAX_INT32:
            reasons.append(f"tilecpp needs {name}.stride(1) * {config.block_n} to fit in int32")
    for name in ("q", "qpe"):
        t = getattr(call, name)
        if (call.q_len - 1) * t.stride(1) + (call.heads - 1) * t.stride(2) + t.shape[3] > MAX_INT32:
            reasons.append(f"tilecpp needs one batch row of {name} to fit in int32 offsets")
    return reasons


def supports(call: MLADecodeCall) -> list[str]:
    """Why the Tile C++ kernels cannot run ``call`` (empty: they can)."""
    if call.is_fp8 and call.kv.dtype != FP8_KV:
        return [f"tilecpp's fp8 cache is {FP8_KV} (kv_scale per tensor), got {call.kv.dtype}"]
    if (call.head_dim, call.rope_dim) != (HEAD_DIM, ROPE_DIM):
        return [f"tilecpp supports D={HEAD_DIM}, P={ROPE_DIM}, got D={call.head_dim}, P={call.rope_dim}"]
    config = choose_config(call)
    kind = layout_kind(call, config)
    if kind is None or kind not in layout_kinds(config, call.kv.dtype):
        sizes = ", ".join(map(str, FP8_SMALL_PAGE_SIZES if call.is_fp8 else SMALL_PAGE_SIZES))
        cache = "an fp8 cache" if call.is_fp8 else "a bf16/fp16 cache"
        return [
            f"tilecpp builds page sizes {sizes} and multiples of {config.block_n} for {cache}, got {call.page_size}"
        ]
    reasons = _alignment_reasons(call) + _offset_reasons(call, config)
    if cdiv(call.query_rows, config.block_h) > MAX_GRID_YZ:
        reasons.append(f"tilecpp launches Q*H/{config.block_h} query-row groups: at most {MAX_GRID_YZ}")
    if reasons:
        return reasons
    arch = device_arch(call.device)
    kernels = [("split", split_kernel(call.q.dtype, config, kind, call.kv.dtype))]
    kernels += [("combine", combine_kernel(call.q.dtype, t)) for t in (FEW_SEGMENTS_TILE, MANY_SEGMENTS_TILE)]
    for stage, kernel in kernels:
        if not kernel.available(arch):
            reasons.append(
                f"no cached cubin for the {call.q.dtype} {stage} kernel on {arch} and no Tile-capable nvcc "
                "(run `python -m tilegym precompile`)"
            )
    return reasons


class TileCppDecodePlan:
    """Config, schedule, workspace and pre-packed arguments of both launches for one call's shapes."""

    def __init__(self, call: MLADecodeCall, config: TileConfig | None = None) -> None:
        self.call = call
        self.config = config = config or choose_config(call)
        head_groups = cdiv(call.query_rows, config.block_h)
        shape = schedule_shape(
            call,
            block_n=config.block_n,
            programs_per_sm=config.occupancy,
            head_groups=head_groups,
            min_blocks=1,
            segment_cost_tokens=SEGMENT_COST_TOKENS if head_groups == 1 else GROUPED_SEGMENT_COST_TOKENS,
        )
        self.schedule = SplitSchedule(call, shape)
        rows, device = call.query_rows, call.device
        self.part_out = torch.empty((shape.slots, rows, HEAD_DIM), dtype=torch.float32, device=device)
        self.part_lse = torch.empty((shape.slots, rows), dtype=torch.float32, device=device)
        self.split = split_kernel(call.q.dtype, config, layout_kind(call, config), call.kv.dtype)
        tile = combine_tile(shape.programs, call.batch)
        self.combine = combine_kernel(call.q.dtype, tile)
        self.device_index = device.index if device.index is not None else torch.cuda.current_device()
        self.split_grid = (shape.programs, head_groups, 1)
        self.combine_grid = (HEAD_DIM // tile[2], cdiv(rows, tile[0]), call.batch)
        table = call.block_table if call.block_table is not None else call.kv_indices
        s = self.schedule
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
            call.page_size if call.is_paged else 1,
            call.num_pages if call.is_paged else 1,
            0 if call.kv_indices is None else call.kv_indices.numel(),
            int(call.kv_indptr is not None),
            shape.programs,
            *call.q.stride()[:3],
            *call.qpe.stride()[:3],
            *call.kv.stride()[:2],
            *call.kpe.stride()[:2],
            0 if call.block_table is None else call.block_table.stride(0),
            call.sm_scale * LOG2E,
        )
        self._workspace = (self.part_out.data_ptr(), self.part_lse.data_ptr())
        self._combine_schedule = (
            self.part_out.data_ptr(),
            self.part_lse.data_ptr(),
            s.row_pieces.data_ptr(),
            call.batch,
        )
        self._combine_sizes = (rows, HEAD_DIM, int(call.return_lse))
        self._launch_split = self.split.bind(self.device_index, self.split_grid)
        self._launch_combine = self.combine.bind(self.device_index, self.combine_grid)

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
            kv.data_ptr(),
            kpe.data_ptr(),
            *self._split_schedule,
            0 if kv_scale is None else kv_scale.data_ptr(),
            out_ptr,
            lse_ptr,
            *self._workspace,
            *self._split_sizes,
        )
        self._launch_split(split_args, stream)
        self._launch_combine((*self._combine_schedule, out_ptr, lse_ptr, *self._combine_sizes), stream)


def plan(call: MLADecodeCall) -> TileCppDecodePlan:
    """The Tile C++ backend's plan for ``call``."""
    return TileCppDecodePlan(call)
