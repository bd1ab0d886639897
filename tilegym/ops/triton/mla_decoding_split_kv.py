"""Triton MLA decode over a split schedule: the split kernel, its combine, and the plan that runs them.

Split kernel, grid (pieces, query-row groups): each program computes one *piece* of the
schedule (``tilegym.ops.schedule``), one wave of persistent programs in all: for every row
the piece meets, ``BLOCK_H`` query rows (new token x head pairs) of that batch row against
the row's KV blocks in the piece, ``BLOCK_N`` tokens per step. Every
KV tile (latent [BLOCK_N, D] + rope [BLOCK_N, P]) is loaded once and used for all BLOCK_H
rows, first as K (scores) then, the same registers / shared memory, as V (output): the
cache is read from DRAM once per query-row group, never once per head. (fp8 tiles in a
pipelined loop are read as int16 byte pairs on NVIDIA GPUs, see ``_attend_fp8_pairs``; else
a second time for V, from L2, see ``_fp8_operands``.)
Softmax runs online in float32 (base 2); 16-bit values appear only at loads, stores and
dot operands. A segment that is a whole row writes the final output and lse; the others
write partials to their slot (``partial_dtype``), which the combine kernel merges.

Cache layouts (constexpr ``LAYOUT``): dense rows, a block table, or a ragged page list;
``PAGE_SIZE`` >= ``BLOCK_N`` reads one page id per tile, smaller pages one per token. Page
ids are clamped to the cache and lengths to the row's pages: no read leaves the cache.

fp8 caches (e4m3fn; e4m3fnuz on AMD) are loaded as fp8 (half the bytes), staged in shared
memory and widened exactly as each dot reads them; the per-tensor ``kv_scale`` is folded
into the score scale and the output. Up to 32 query rows on NVIDIA GPUs (fp16 dot operands) the
fp8 tile is read as int16 pairs of bytes: 16-bit operand loads (``ldmatrix``, transposing for V)
instead of byte gathers, each pair widened to fp16 by one ``cvt``, each dot split into the even and
odd columns (``_attend_fp8_pairs``). Under Triton's CPU interpreter (``INTERPRETED``), dot operands
are widened to float32 (the interpreter computes bf16 and fp8 dots wrongly, so the kernel never asks
it to) and bf16 results are rounded to nearest (``rounding.to_nearest``; the interpreter truncates).

No host synchronisation, no value-dependent allocation, no atomics: graph-capturable and
deterministic. The ROCm path is the same source, untested on hardware; AMD would want
``BLOCK_N`` = 32 and one pipeline stage for D = 512 (64 KB LDS), which ``default_config``
encodes as a guess.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tilegym.ops.contract import FP8_DS_MLA, MXFP4, MLADecodeCall
from tilegym.ops.schedule import ScheduleShape, SplitSchedule, layout_code, schedule_shape
from tilegym.ops.triton.launcher import KernelLauncher, all_aligned, interpreting
from tilegym.ops.triton.rounding import to_nearest
from tilegym.ops.triton.splitk_reduce import merge_splits
from tilegym.utils import cdiv, next_power_of_2

LOG2_E = math.log2(math.e)
MAX_BLOCK_H = 64
SMALL_PROBLEM_TOKENS = 8192  # B * S at or below which 32-token steps measured faster
FEW_ROWS = 8  # batch rows (16 query rows) at or below which 128-token steps measured faster
COMBINE_BLOCK_SPLITS = 16
# A segment's fixed start (query staged, pipeline refilled, partial written) as the tokens a program
# streams in that time: the schedule balances blocks plus starts for rows of unequal lengths
# (tilegym/ops/schedule.py). Session 24's H200 sweep of the mixed suite (timeline), 0 -> 128 tokens:
# 354.7 -> 341.1 us at 128 x U[1, 4096] x 128; 16 heads within 1.5% either way.
SEGMENT_COST_TOKENS = 128
KV_FORMAT_CODES = {FP8_DS_MLA: 1, MXFP4: 2}  # the kernel's KV_FORMAT; 0: plain values (fp8 per tensor too)
CONFIG_NAME = re.compile(r"(?:h(\d+))?n(\d+)w(\d+)s(\d+)(f?)(?:p(\d+))?")


FP8_PAIRS_OFF, FP8_PAIRS_PORTABLE, FP8_PAIRS_PTX = 0, 1, 2  # the kernel's FP8_PAIRS (see _e4m3_pairs_to_f16)


def fp8_pairs_mode(call: MLADecodeCall, config: KernelConfig, kv_address: int, vendor: str | None = None) -> int:
    """How the split kernel reads an fp8 latent: as int16 pairs of bytes, widened to fp16 in registers
    after 16-bit shared-memory reads (PTX conversion on NVIDIA GPUs, integer ops under the
    interpreter), when both dots take fp16 operands at fewer than 64 query rows and the cache allows
    2-byte reads; else FP8_PAIRS_OFF (fp8 dot operands gathered byte by byte). With 64 rows (wgmma)
    the pairs were slower (fp8_ds_mla 64 x 4096 x 128: 1024.6 us against 717.4), and AMD keeps the
    byte path (unmeasured there). ``vendor`` (default: the call's, or the interpreter) lets tools
    compile for a GPU elsewhere."""
    fp16_operands = call.kv_format == FP8_DS_MLA or (call.is_fp8 and config.fp8_v_fp16 and config.fp8_fp16_scores)
    if config.block_h >= 64:
        return FP8_PAIRS_OFF
    pairs_fit = (
        call.kv.element_size() == 1
        and call.head_dim % 2 == 0
        and stride_multiple(call.kv.stride()[:2], 2) == 2
        and kv_address % 2 == 0
    )
    if not (fp16_operands and pairs_fit):
        return FP8_PAIRS_OFF
    if vendor is None and interpreting(call.device):
        return FP8_PAIRS_PORTABLE
    return FP8_PAIRS_PTX if (vendor or call.vendor) == "nvidia" else FP8_PAIRS_OFF


def stride_multiple(strides: tuple[int, ...], limit: int = 16) -> int:
    """The largest power of two up to ``limit`` that divides every stride (in elements): lets the
    kernel prove the 16-byte alignment ``cp.async`` needs where Triton's own specialisation (on
    divisibility by 16) cannot, e.g. fp8_ds_mla's rope, 328 bf16 elements per token."""
    multiple = limit
    while multiple > 1 and any(s % multiple for s in strides):
        multiple //= 2
    return multiple


@dataclass(frozen=True)
class KernelConfig:
    """Tile sizes and launch parameters of the split kernel.

    ``block_h``: query rows per program (>= 16: ``tl.dot`` needs M >= 16 on GPUs).
    ``block_n``: KV tokens per loop step, also the schedule's block. ``programs_per_sm``:
    occupancy goal of the balanced schedule. ``min_blocks``: shortest segment in blocks.
    ``fp8_v_fp16``: with an fp8 cache, multiply P by V in fp16 rather than in the query
    dtype. ``fp8_fp16_scores``: with an fp8 cache, score in fp16 (K widened to fp16, the queries
    rescaled per row by a power of two into fp16) rather than in the query dtype.
    """

    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    programs_per_sm: int = 2
    min_blocks: int = 2
    fp8_v_fp16: bool = True
    fp8_fp16_scores: bool = False

    @property
    def name(self) -> str:
        """``n<block_n>w<warps>s<stages>``, ``f`` appended for fp8 scores in fp16 (see ``parse``)."""
        return f"n{self.block_n}w{self.num_warps}s{self.num_stages}" + ("f" if self.fp8_fp16_scores else "")

    @classmethod
    def parse(cls, name: str, block_h: int, programs_per_sm: int = 2) -> KernelConfig:
        """The config a name like ``n32w4s3f`` gives (tools and sweeps name configs this way); an
        ``h<rows>`` prefix overrides ``block_h`` and a ``p<programs>`` suffix ``programs_per_sm``."""
        match = CONFIG_NAME.fullmatch(name)
        if match is None:
            raise ValueError(
                f"config name {name!r} is not [h<block_h>]n<block_n>w<warps>s<stages>[f][p<programs_per_sm>]"
            )
        h, n, w, st, f, p = match.groups()
        return cls(
            int(h) if h else block_h,
            int(n),
            int(w),
            int(st),
            int(p) if p else programs_per_sm,
            fp8_fp16_scores=bool(f),
        )


def default_config(call: MLADecodeCall, vendor: str | None = None) -> KernelConfig:
    """Tile sizes by vendor (the call's unless given), query rows and cache dtype (NVIDIA numbers:
    H200 sweeps, benchmarks/NOTES_triton.md)."""
    vendor = vendor or call.vendor
    rows = call.query_rows
    block_h = min(MAX_BLOCK_H, max(16, next_power_of_2(rows)))
    if vendor == "cpu":
        # Interpreter: short steps, so small test shapes still cut rows into segments. Two stages as on
        # GPUs: the interpreter does not pipeline, but the fp8 paths read V differently when pipelined.
        # fp8 per tensor with fp16 scores as on NVIDIA GPUs, so CI runs the byte-pair reads (portably).
        return KernelConfig(
            block_h, block_n=16, num_warps=4, num_stages=2, programs_per_sm=1, min_blocks=1,
            fp8_fp16_scores=call.is_fp8,
        )  # fmt: skip
    if vendor == "amd":  # untested guess: 64-lane wavefronts, 64 KB LDS
        return KernelConfig(block_h, block_n=32, num_warps=4, num_stages=1)
    if block_h >= 64:  # compute-bound: 8 warps keep the [64, D] accumulator in registers
        if call.is_fp8 or call.is_packed:
            # Tiles are widened in shared memory too: 64-token steps fit with one stage only (two need
            # 244 KB of the 227 KB). Measured at 64 x 4096 x 128 (sweep of round 2, NOTES_triton.md):
            # fp8 413 us vs 535 with 32-token steps, fp8_ds_mla 683 vs 829, mxfp4 988 vs 1655. Session
            # 13: fp8 418.9 us vs 499.5 (n32 w8 s3) and 565.5 (n32 w8 s2), whose loads are pipelined.
            return KernelConfig(block_h, block_n=64, num_warps=8, num_stages=1, programs_per_sm=1)
        return KernelConfig(block_h, block_n=64, num_warps=8, num_stages=2, programs_per_sm=1)
    if block_h == 32:
        return KernelConfig(block_h, block_n=32, num_warps=4, num_stages=2)
    if call.is_fp8:
        # Byte pairs, 64 x 4096 x 16 / 128 x 8192 x 16 (session 14, one call): 74.1 / 235.1 us; n32 w4 s3 f
        # (session 13's) 77.1 / 258.9, n64 w4 s2 f 75.8 / 245.6.
        return KernelConfig(block_h, block_n=64, num_warps=4, num_stages=3, fp8_fp16_scores=True)
    if call.kv_format == MXFP4:  # 64 x 4096 x 16: 322 us vs 377 with 32-token steps and 4 warps
        return KernelConfig(block_h, block_n=64, num_warps=8, num_stages=3)
    if call.is_packed:  # fp8_ds_mla as byte pairs, 64 x 4096 x 16: 106.5 us; n32 w4 s2 127.4 (session 13)
        return KernelConfig(block_h, block_n=32, num_warps=4, num_stages=3)
    if call.batch * call.length_hint <= SMALL_PROBLEM_TOKENS:  # latency-bound: shorter steps
        return KernelConfig(block_h, block_n=32, num_warps=4, num_stages=2, min_blocks=1)
    if call.batch <= FEW_ROWS:  # one long request: long steps, one program per SM
        return KernelConfig(block_h, block_n=128, num_warps=8, num_stages=2, programs_per_sm=1)
    return KernelConfig(block_h, block_n=64, num_warps=4, num_stages=2)


@triton.jit
def _dot(a, b, acc, INTERPRETED: tl.constexpr):
    """``acc + a @ b``; under the interpreter in float32 (it multiplies bf16/fp8 bits wrongly)."""
    if INTERPRETED:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    return tl.dot(a, b, acc)


@triton.jit
def _token_offsets(
    table_row,
    offs_n,
    n0,
    n_mask,
    num_pages,
    stride_0,
    stride_1,
    LAYOUT: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Element offsets of a tile's tokens (relative to the row base for dense caches)."""
    if LAYOUT == 0:
        return offs_n.to(tl.int64) * stride_1
    if PAGE_SIZE >= BLOCK_N:  # the tile lies inside one page: one page id
        page = tl.load(table_row + n0 // PAGE_SIZE)
        page = tl.minimum(tl.maximum(page, 0), num_pages - 1).to(tl.int64)
        return page * stride_0 + ((n0 % PAGE_SIZE) + tl.arange(0, BLOCK_N)).to(tl.int64) * stride_1
    page = tl.load(table_row + offs_n // PAGE_SIZE, mask=n_mask, other=0)
    page = tl.minimum(tl.maximum(page, 0), num_pages - 1).to(tl.int64)
    return page * stride_0 + (offs_n % PAGE_SIZE).to(tl.int64) * stride_1


@triton.jit
def _mla_split_kernel(
    q_ptr,
    qpe_ptr,
    kv_ptr,
    kpe_ptr,
    kv_scale_ptr,
    table_ptr,
    indptr_ptr,
    lens_ptr,
    cum_ptr,
    bounds_ptr,
    piece_rows_ptr,
    out_ptr,
    lse_ptr,
    part_out_ptr,
    part_lse_ptr,
    score_scale,
    num_heads,
    q_len,
    query_rows,
    num_pages,
    num_indices,
    num_pieces,
    stride_q_b,
    stride_q_q,
    stride_q_h,
    stride_qpe_b,
    stride_qpe_q,
    stride_qpe_h,
    stride_kv_0,
    stride_kv_1,
    stride_kpe_0,
    stride_kpe_1,
    stride_scale_0,
    stride_scale_1,
    stride_table_b,
    HEAD_DIM: tl.constexpr,
    ROPE_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    LAYOUT: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    CAUSAL: tl.constexpr,
    IS_FP8: tl.constexpr,
    KV_FORMAT: tl.constexpr,
    KPE_STRIDE_MULTIPLE: tl.constexpr,
    FP8_PAIRS: tl.constexpr,
    FP8_V_FP16: tl.constexpr,
    FP8_FP16_SCORES: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    # Memory traffic per program: its piece of the step's KV blocks, (D + P) * sizeof(kv)
    # bytes per token read from DRAM once for all BLOCK_H query rows (fp8 pipelined: the
    # latent once more from L2, for V), plus per row it meets
    # BLOCK_H * (D + P) * 2 bytes of queries, a few schedule integers (+ one page id per tile
    # or token), and BLOCK_H * D * 4 (per-tensor fp8: 2) bytes of partials + BLOCK_H * 4 of lse written (a whole
    # row: BLOCK_H * D * 2 final bytes). Whole launch with one query-row group: the cache of
    # the tokens present, once.
    if KPE_STRIDE_MULTIPLE > 1:
        # Exact (the host checked the multiple), and Triton's alignment analysis sees the product: with
        # 16-byte rows proven it stages the rope by cp.async (fp8_ds_mla's 328-element stride hides it).
        stride_kpe_0 = stride_kpe_0 // KPE_STRIDE_MULTIPLE * KPE_STRIDE_MULTIPLE
        stride_kpe_1 = stride_kpe_1 // KPE_STRIDE_MULTIPLE * KPE_STRIDE_MULTIPLE
    piece = tl.program_id(0)
    pid_h = tl.program_id(1)
    start = tl.load(bounds_ptr + piece)
    end = tl.load(bounds_ptr + piece + 1)
    first_row = tl.load(piece_rows_ptr + piece)
    last_row = tl.load(piece_rows_ptr + num_pieces + piece)

    offs_r = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    r_mask = offs_r < query_rows
    token = offs_r // num_heads
    head = offs_r % num_heads
    offs_d = tl.arange(0, HEAD_DIM)
    offs_p = tl.arange(0, ROPE_DIM)
    for b in range(first_row, last_row + 1):
        row_begin = tl.load(cum_ptr + b)
        row_end = tl.load(cum_ptr + b + 1)
        lo = tl.maximum(start, row_begin)
        hi = tl.maximum(tl.minimum(end, row_end), lo)  # lo == hi: nothing of this row here
        # Row b's blocks [lo, hi) (step-wide numbering) give the final output when they are the
        # whole row, else a partial (partial_dtype) and lse in work slot piece + b. No branches: without
        # work the KV loop runs zero times and the stores are masked off, which keeps the KV loop
        # a plain pipelined loop.
        writes_final = (lo < hi) & (lo == row_begin) & (hi == row_end)
        writes_partial = (lo < hi) & ((lo != row_begin) | (hi != row_end))
        length = tl.load(lens_ptr + b)
        b64 = b + tl.zeros([], tl.int64)  # the loop index may be a plain int under the interpreter
        q_rows = b64 * stride_q_b + token * stride_q_q + head * stride_q_h
        qpe_rows = b64 * stride_qpe_b + token * stride_qpe_q + head * stride_qpe_h
        q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=r_mask[:, None], other=0.0)
        qpe = tl.load(qpe_ptr + qpe_rows[:, None] + offs_p[None, :], mask=r_mask[:, None], other=0.0)
        # Causal MTP: new token i of a row of length L sees positions < L - Q + 1 + i.
        if CAUSAL:
            limit = length - q_len + 1 + token
        else:
            limit = tl.zeros([BLOCK_H], tl.int32) + length

        row_scale = tl.full([BLOCK_H], 1.0, tl.float32) * score_scale
        if IS_FP8:
            kv_scale = tl.load(kv_scale_ptr)
            row_scale = row_scale * kv_scale
            if FP8_FP16_SCORES:
                q, qpe, head_scale = _queries_to_fp16(q, qpe)
                row_scale = row_scale * head_scale

        kv_row = kv_ptr
        kpe_row = kpe_ptr
        scale_row = kv_scale_ptr
        table_row = table_ptr
        if LAYOUT == 0:
            kv_row = kv_ptr + b64 * stride_kv_0
            kpe_row = kpe_ptr + b64 * stride_kpe_0
            scale_row = kv_scale_ptr + b64 * stride_scale_0
        elif LAYOUT == 1:
            table_row = table_ptr + b64 * stride_table_b
        else:
            table_row = table_ptr + tl.minimum(tl.maximum(tl.load(indptr_ptr + b), 0), num_indices)

        blk_lo = lo - row_begin
        blk_hi = hi - row_begin
        if KV_FORMAT == 1:
            m_i, l_i, acc = _attend_fp8_ds_mla(
                q_ptr, q_rows, r_mask, qpe, kv_row, kpe_row, scale_row, table_row, blk_lo, blk_hi, length, limit,
                row_scale, num_pages, stride_kv_0, stride_kv_1, stride_kpe_0, stride_kpe_1, stride_scale_0,
                stride_scale_1, ROPE_DIM, BLOCK_H, BLOCK_N, LAYOUT, PAGE_SIZE, NUM_STAGES, FP8_PAIRS, INTERPRETED,
            )  # fmt: skip
        elif KV_FORMAT == 2:
            m_i, l_i, acc = _attend_mxfp4(
                q, qpe, kv_row, kpe_row, scale_row, table_row, blk_lo, blk_hi, length, limit, row_scale, num_pages,
                stride_kv_0, stride_kv_1, stride_kpe_0, stride_kpe_1, stride_scale_0, stride_scale_1, HEAD_DIM,
                ROPE_DIM, BLOCK_H, BLOCK_N, LAYOUT, PAGE_SIZE, NUM_STAGES, INTERPRETED,
            )  # fmt: skip
        elif FP8_PAIRS > 0:
            m_i, l_i, acc = _attend_fp8_pairs(
                q, qpe, kv_row, kpe_row, table_row, blk_lo, blk_hi, length, limit, row_scale, num_pages,
                stride_kv_0, stride_kv_1, stride_kpe_0, stride_kpe_1, HEAD_DIM, ROPE_DIM, BLOCK_H, BLOCK_N, LAYOUT,
                PAGE_SIZE, NUM_STAGES, FP8_PAIRS, INTERPRETED,
            )  # fmt: skip
        else:
            m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
            l_i = tl.zeros([BLOCK_H], tl.float32)
            acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
            for blk in tl.range(blk_lo, blk_hi, num_stages=NUM_STAGES):
                n0 = blk * BLOCK_N
                offs_n = n0 + tl.arange(0, BLOCK_N)
                n_mask = offs_n < length
                kv_offs = _token_offsets(
                    table_row, offs_n, n0, n_mask, num_pages, stride_kv_0, stride_kv_1, LAYOUT, PAGE_SIZE, BLOCK_N
                )
                kpe_offs = _token_offsets(
                    table_row, offs_n, n0, n_mask, num_pages, stride_kpe_0, stride_kpe_1, LAYOUT, PAGE_SIZE, BLOCK_N
                )
                kv_ptrs = kv_row + kv_offs[:, None] + offs_d[None, :]
                kv = tl.load(kv_ptrs, mask=n_mask[:, None], other=0.0)
                kpe = tl.load(kpe_row + kpe_offs[:, None] + offs_p[None, :], mask=n_mask[:, None], other=0.0)
                if IS_FP8:
                    k_dtype = tl.float16 if FP8_FP16_SCORES else q_ptr.dtype.element_ty
                    v_dtype = tl.float16 if FP8_V_FP16 else q_ptr.dtype.element_ty
                    k_t, v = _fp8_operands(kv_ptrs, n_mask, k_dtype, v_dtype, NUM_STAGES, kv)
                    kpe_t = tl.trans(kpe).to(k_dtype)
                else:
                    v = kv
                    k_t = tl.trans(kv)
                    kpe_t = tl.trans(kpe)
                scores = _dot(qpe, kpe_t, tl.zeros([BLOCK_H, BLOCK_N], tl.float32), INTERPRETED)
                scores = _dot(q, k_t, scores, INTERPRETED)
                p, alpha, m_i, l_i = _softmax_step(scores, offs_n, limit, row_scale, m_i, l_i)
                acc = _dot(to_nearest(p, v.dtype, INTERPRETED), v, acc * alpha[:, None], INTERPRETED)

        # No visible token: zeros and lse -inf (the combine skips it). NaN in the row's data makes
        # l NaN, and then the lse too, so the combine keeps the NaN (NaN in, NaN out).
        empty = l_i == 0
        safe_l = tl.where(empty, 1.0, l_i)
        out = acc / safe_l[:, None]  # per-tensor fp8: before the cache scale (the fp16 partial's range)
        final = out
        if IS_FP8:
            final = out * kv_scale
        lse = tl.where(empty, float("-inf"), (m_i + tl.log2(safe_l)) / 1.4426950408889634)
        # Row masks as comparisons with a scalar bound (the interpreter rejects tensor & scalar-bool masks).
        final_mask = offs_r < tl.where(writes_final, query_rows, 0)
        part_mask = offs_r < tl.where(writes_partial, query_rows, 0)
        final_rows = b64 * query_rows + offs_r
        tl.store(
            out_ptr + final_rows[:, None] * HEAD_DIM + offs_d[None, :],
            to_nearest(final, out_ptr.dtype.element_ty, INTERPRETED),
            final_mask[:, None],
        )
        if WRITE_LSE:
            tl.store(lse_ptr + final_rows, lse, final_mask)
        part_rows = (piece + b64) * query_rows + offs_r
        tl.store(
            part_out_ptr + part_rows[:, None] * HEAD_DIM + offs_d[None, :],
            to_nearest(out, part_out_ptr.dtype.element_ty, INTERPRETED),
            part_mask[:, None],
        )
        tl.store(part_lse_ptr + part_rows, lse, part_mask)


@triton.jit
def _softmax_step(scores, offs_n, limit, row_scale, m_i, l_i):
    """One online-softmax step over a tile of raw scores [BLOCK_H, BLOCK_N]: the tile's
    probabilities (base 2, relative to the new running max), the factor that rescales what was
    accumulated so far, and the new running max and sum. Positions at or past a row's
    ``limit`` get probability 0."""
    visible = offs_n[None, :] < limit[:, None]
    scores = tl.where(visible, scores * row_scale[:, None], float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    # A row that sees no token of this tile (causal MTP) keeps m = -inf: shift by 0 then.
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(scores - m_safe[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def _concat_groups(a0, a1, a2, a3, BLOCK_H: tl.constexpr, GROUP: tl.constexpr):
    """[BLOCK_H, 4 * GROUP] from four [BLOCK_H, GROUP] column groups, in order."""
    pairs = tl.join(tl.join(a0, a1), tl.join(a2, a3))  # [H, GROUP, 2, 2]: [h, c, j, i] = a_{2i + j}[h, c]
    return tl.reshape(tl.permute(pairs, (0, 3, 2, 1)), (BLOCK_H, 4 * GROUP))


@triton.jit
def _packed_step_offsets(
    table_row, blk, length, num_pages, stride_kv_0, stride_kv_1, stride_kpe_0, stride_kpe_1, stride_s_0, stride_s_1,
    LAYOUT: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Step ``blk`` of a packed cache: its positions, their mask (inside the row), and the element
    offsets of each token's latent, rope and scales (three views with their own strides)."""
    n0 = blk * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    n_mask = offs_n < length
    kv = _token_offsets(table_row, offs_n, n0, n_mask, num_pages, stride_kv_0, stride_kv_1, LAYOUT, PAGE_SIZE, BLOCK_N)
    kpe = _token_offsets(
        table_row, offs_n, n0, n_mask, num_pages, stride_kpe_0, stride_kpe_1, LAYOUT, PAGE_SIZE, BLOCK_N
    )
    scales = _token_offsets(
        table_row, offs_n, n0, n_mask, num_pages, stride_s_0, stride_s_1, LAYOUT, PAGE_SIZE, BLOCK_N
    )
    return offs_n, n_mask, kv, kpe, scales


@triton.jit
def _ds_mla_scales_and_rope(scale_row, s_offs, kpe_row, kpe_offs, n_mask, ROPE_DIM: tl.constexpr):
    """A ``fp8_ds_mla`` step's four float32 group scales [BLOCK_N] and bf16 rope tile [BLOCK_N, ROPE_DIM]."""
    s0 = tl.load(scale_row + s_offs, mask=n_mask, other=0.0)
    s1 = tl.load(scale_row + s_offs + 1, mask=n_mask, other=0.0)
    s2 = tl.load(scale_row + s_offs + 2, mask=n_mask, other=0.0)
    s3 = tl.load(scale_row + s_offs + 3, mask=n_mask, other=0.0)
    kpe = tl.load(kpe_row + kpe_offs[:, None] + tl.arange(0, ROPE_DIM)[None, :], mask=n_mask[:, None], other=0.0)
    return s0, s1, s2, s3, kpe


@triton.jit
def _groups_to_fp16(q0, q1, q2, q3):
    """The four query groups scaled per row by one power of two (largest entry near 2^14) and cast
    to fp16, exactly (see ``_queries_to_fp16``), and the per-row factor that undoes the scaling."""
    row_max = tl.maximum(
        tl.maximum(tl.max(tl.abs(q0.to(tl.float32)), axis=1), tl.max(tl.abs(q1.to(tl.float32)), axis=1)),
        tl.maximum(tl.max(tl.abs(q2.to(tl.float32)), axis=1), tl.max(tl.abs(q3.to(tl.float32)), axis=1)),
    )
    head_scale = tl.exp2(tl.floor(tl.log2(tl.where(row_max > 0, row_max, 1.0))) - 14.0)
    inverse = (1.0 / head_scale)[:, None]
    return (
        (q0.to(tl.float32) * inverse).to(tl.float16),
        (q1.to(tl.float32) * inverse).to(tl.float16),
        (q2.to(tl.float32) * inverse).to(tl.float16),
        (q3.to(tl.float32) * inverse).to(tl.float16),
        head_scale,
    )


@triton.jit
def _scaled_group_update(acc, alpha, p, scale, values, INTERPRETED: tl.constexpr):
    """``acc * alpha + (p * scale) @ values`` for one column group whose tokens carry float32
    scales [BLOCK_N]: P is scaled per token relative to the tile's largest scale (so it stays in
    [0, 1] and keeps fp16's 11 bits whatever the scales' magnitude), and the dot result is
    multiplied back by that largest scale."""
    top = tl.max(scale, axis=0)
    top = tl.where(top > 0, top, 1.0)
    scaled_p = (p * (scale / top)[None, :]).to(tl.float16)
    return acc * alpha[:, None] + top * _dot(scaled_p, values, tl.zeros(acc.shape, tl.float32), INTERPRETED)


@triton.jit
def _e4m3_pairs_to_f16(pairs, FP8_PAIRS: tl.constexpr):
    """int16 elements holding two e4m3 bytes each -> (low bytes, high bytes) as fp16, exactly: by one
    ``cvt.rn.f16x2.e4m3x2`` each (``FP8_PAIRS`` 2, NVIDIA), or by integer ops (1, the interpreter)."""
    if FP8_PAIRS == 2:
        low, high = tl.inline_asm_elementwise(
            asm="{ .reg .b32 x; cvt.rn.f16x2.e4m3x2 x, $2; mov.b32 {$0, $1}, x; }",
            constraints="=h,=h,h",
            args=[pairs],
            dtype=(tl.float16, tl.float16),
            is_pure=True,
            pack=1,
        )
    else:
        low = (pairs & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        high = ((pairs >> 8) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float16)
    return low, high


@triton.jit
def _deinterleave(x, ROWS: tl.constexpr, HALF: tl.constexpr):
    """(even columns, odd columns) of ``x`` [ROWS, 2 * HALF]."""
    return tl.split(tl.reshape(x, [ROWS, HALF, 2]))


@triton.jit
def _interleave(even, odd, ROWS: tl.constexpr, C: tl.constexpr):
    """[ROWS, C] whose even columns are ``even`` and odd columns ``odd`` (the inverse of ``_deinterleave``)."""
    return tl.reshape(tl.join(even, odd), [ROWS, C])


@triton.jit
def _pair_scores(q_even, q_odd, pairs, acc, FP8_PAIRS: tl.constexpr, INTERPRETED: tl.constexpr):
    """``acc + q @ K^T`` for the fp8 tile K [BLOCK_N, 2 * C] given as byte pairs [BLOCK_N, C] and the
    query's even and odd columns [BLOCK_H, C] (fp16)."""
    k_even, k_odd = _e4m3_pairs_to_f16(tl.trans(pairs), FP8_PAIRS)
    return _dot(q_odd, k_odd, _dot(q_even, k_even, acc, INTERPRETED), INTERPRETED)


@triton.jit
def _scaled_pair_update(acc_even, acc_odd, alpha, p, scale, pairs, FP8_PAIRS: tl.constexpr, INTERPRETED: tl.constexpr):
    """``_scaled_group_update`` for a group given as byte pairs: the even and odd output columns."""
    top = tl.max(scale, axis=0)
    top = tl.where(top > 0, top, 1.0)
    scaled_p = (p * (scale / top)[None, :]).to(tl.float16)
    v_even, v_odd = _e4m3_pairs_to_f16(pairs, FP8_PAIRS)
    zero = tl.zeros(acc_even.shape, tl.float32)
    acc_even = acc_even * alpha[:, None] + top * _dot(scaled_p, v_even, zero, INTERPRETED)
    acc_odd = acc_odd * alpha[:, None] + top * _dot(scaled_p, v_odd, zero, INTERPRETED)
    return acc_even, acc_odd


@triton.jit
def _attend_fp8_pairs(
    q, qpe, kv_row, kpe_row, table_row, blk_lo, blk_hi, length, limit, row_scale, num_pages,
    stride_kv_0, stride_kv_1, stride_kpe_0, stride_kpe_1, HEAD_DIM: tl.constexpr, ROPE_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, LAYOUT: tl.constexpr, PAGE_SIZE: tl.constexpr,
    NUM_STAGES: tl.constexpr, FP8_PAIRS: tl.constexpr, INTERPRETED: tl.constexpr,
):  # fmt: skip
    """One row segment over a per-tensor fp8 cache read as int16 pairs of bytes: (running max, sum,
    output [BLOCK_H, HEAD_DIM]); ``q`` and ``qpe`` are the fp16 queries of ``_queries_to_fp16``.

    Why pairs: V [BLOCK_N, D] is the B operand of P V with the tokens as its reduction dimension, which
    is not the contiguous one. As fp8, Triton gathers it from shared memory byte by byte (sm_90 has no
    transposing ``ldmatrix`` for 8-bit data). As int16 [BLOCK_N, D / 2] it is an ordinary 16-bit
    operand (``ldmatrix.trans``; K^T plain ``ldmatrix``), and each element widens to the fp16 values
    of columns 2 j and 2 j + 1 (``_e4m3_pairs_to_f16``). So the scores are q_even K_even^T + q_odd
    K_odd^T and the output is kept as its even and odd columns, interleaved once at the end. One
    load per step serves K and V: BLOCK_N x (D + P) bytes read, the tile once, exactly as fp8."""
    HALF: tl.constexpr = HEAD_DIM // 2
    q_even, q_odd = _deinterleave(q, BLOCK_H, HALF)
    offs_j = tl.arange(0, HALF)
    offs_p = tl.arange(0, ROPE_DIM)
    pairs_row = kv_row.to(tl.pointer_type(tl.int16))
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc_even = tl.zeros([BLOCK_H, HALF], tl.float32)
    acc_odd = tl.zeros([BLOCK_H, HALF], tl.float32)
    for blk in tl.range(blk_lo, blk_hi, num_stages=NUM_STAGES):
        n0 = blk * BLOCK_N
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < length
        kv_offs = _token_offsets(
            table_row, offs_n, n0, n_mask, num_pages, stride_kv_0, stride_kv_1, LAYOUT, PAGE_SIZE, BLOCK_N
        )
        kpe_offs = _token_offsets(
            table_row, offs_n, n0, n_mask, num_pages, stride_kpe_0, stride_kpe_1, LAYOUT, PAGE_SIZE, BLOCK_N
        )
        pairs = tl.load(pairs_row + (kv_offs // 2)[:, None] + offs_j[None, :], mask=n_mask[:, None], other=0)
        kpe = tl.load(kpe_row + kpe_offs[:, None] + offs_p[None, :], mask=n_mask[:, None], other=0.0)
        scores = _dot(qpe, tl.trans(kpe).to(tl.float16), tl.zeros([BLOCK_H, BLOCK_N], tl.float32), INTERPRETED)
        scores = _pair_scores(q_even, q_odd, pairs, scores, FP8_PAIRS, INTERPRETED)
        p, alpha, m_i, l_i = _softmax_step(scores, offs_n, limit, row_scale, m_i, l_i)
        v_even, v_odd = _e4m3_pairs_to_f16(pairs, FP8_PAIRS)
        p16 = p.to(tl.float16)
        acc_even = _dot(p16, v_even, acc_even * alpha[:, None], INTERPRETED)
        acc_odd = _dot(p16, v_odd, acc_odd * alpha[:, None], INTERPRETED)
    return m_i, l_i, _interleave(acc_even, acc_odd, BLOCK_H, HEAD_DIM)


@triton.jit
def _fp8_operands(ptrs, n_mask, K_DTYPE: tl.constexpr, V_DTYPE: tl.constexpr, NUM_STAGES: tl.constexpr, tile=None):
    """An fp8 tile [BLOCK_N, C] at ``ptrs`` as both dot operands, each widened exactly from shared
    memory: K^T [C, BLOCK_N] in ``K_DTYPE`` and V [BLOCK_N, C] in ``V_DTYPE`` (``tile``: the tile if
    already loaded). In a pipelined loop V is a second load of the same bytes (an L2 hit): Triton
    stages a load in shared memory only when all its uses take one layout, and K^T and V do not,
    so a single load would be waited for synchronously every step."""
    if tile is None:
        tile = tl.load(ptrs, mask=n_mask[:, None], other=0.0)
    again = tile
    if NUM_STAGES > 1:
        again = tl.load(ptrs, mask=n_mask[:, None], other=0.0, eviction_policy="evict_first")
    return tl.trans(tile).to(K_DTYPE), again.to(V_DTYPE)


@triton.jit
def _attend_fp8_ds_mla(
    q_ptr, q_rows, r_mask, qpe, kv_row, kpe_row, scale_row, table_row, blk_lo, blk_hi, length, limit, row_scale,
    num_pages, stride_kv_0, stride_kv_1, stride_kpe_0, stride_kpe_1, stride_s_0, stride_s_1,
    ROPE_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, LAYOUT: tl.constexpr,
    PAGE_SIZE: tl.constexpr, NUM_STAGES: tl.constexpr, FP8_PAIRS: tl.constexpr, INTERPRETED: tl.constexpr,
):  # fmt: skip
    """One row segment over an ``fp8_ds_mla`` cache: (running max, sum, output [BLOCK_H, 512]).

    The latent is four 128-column groups, each with one float32 scale per token. Each group's fp8
    tile is widened exactly to fp16 as K and as V (``_fp8_operands``): its score dot (the query
    group scaled exactly into fp16 per row) is scaled per token on the [BLOCK_H, BLOCK_N] scores,
    and P is scaled per token before its dot with the group (``_scaled_group_update``). So no
    [BLOCK_N, 512] tile is multiplied element-wise, and no product is rounded to fewer than
    fp16's 11 bits. Per step it reads BLOCK_N x (512 fp8 + 16 scale + 128 rope) = BLOCK_N x 656 bytes.
    """
    GROUP: tl.constexpr = 128
    offs_g = tl.arange(0, GROUP)
    q_tile = q_ptr + q_rows[:, None] + offs_g[None, :]
    q0, q1, q2, q3, head_scale = _groups_to_fp16(
        tl.load(q_tile, mask=r_mask[:, None], other=0.0),
        tl.load(q_tile + GROUP, mask=r_mask[:, None], other=0.0),
        tl.load(q_tile + 2 * GROUP, mask=r_mask[:, None], other=0.0),
        tl.load(q_tile + 3 * GROUP, mask=r_mask[:, None], other=0.0),
    )
    if FP8_PAIRS > 0:
        return _attend_fp8_ds_mla_pairs(
            q0, q1, q2, q3, head_scale, qpe, kv_row, kpe_row, scale_row, table_row, blk_lo, blk_hi, length, limit,
            row_scale, num_pages, stride_kv_0, stride_kv_1, stride_kpe_0, stride_kpe_1, stride_s_0, stride_s_1,
            ROPE_DIM, BLOCK_H, BLOCK_N, LAYOUT, PAGE_SIZE, NUM_STAGES, FP8_PAIRS, INTERPRETED,
        )  # fmt: skip
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc0 = tl.zeros([BLOCK_H, GROUP], tl.float32)
    acc1 = tl.zeros([BLOCK_H, GROUP], tl.float32)
    acc2 = tl.zeros([BLOCK_H, GROUP], tl.float32)
    acc3 = tl.zeros([BLOCK_H, GROUP], tl.float32)
    for blk in tl.range(blk_lo, blk_hi, num_stages=NUM_STAGES):
        offs_n, n_mask, kv_offs, kpe_offs, s_offs = _packed_step_offsets(
            table_row, blk, length, num_pages, stride_kv_0, stride_kv_1, stride_kpe_0, stride_kpe_1, stride_s_0,
            stride_s_1, LAYOUT, PAGE_SIZE, BLOCK_N,
        )  # fmt: skip
        kv_tile = kv_row + kv_offs[:, None] + offs_g[None, :]
        k0, v0 = _fp8_operands(kv_tile, n_mask, tl.float16, tl.float16, NUM_STAGES)
        k1, v1 = _fp8_operands(kv_tile + GROUP, n_mask, tl.float16, tl.float16, NUM_STAGES)
        k2, v2 = _fp8_operands(kv_tile + 2 * GROUP, n_mask, tl.float16, tl.float16, NUM_STAGES)
        k3, v3 = _fp8_operands(kv_tile + 3 * GROUP, n_mask, tl.float16, tl.float16, NUM_STAGES)
        s0, s1, s2, s3, kpe = _ds_mla_scales_and_rope(scale_row, s_offs, kpe_row, kpe_offs, n_mask, ROPE_DIM)
        zero = tl.zeros([BLOCK_H, BLOCK_N], tl.float32)
        latent = _dot(q0, k0, zero, INTERPRETED) * s0[None, :]
        latent += _dot(q1, k1, zero, INTERPRETED) * s1[None, :]
        latent += _dot(q2, k2, zero, INTERPRETED) * s2[None, :]
        latent += _dot(q3, k3, zero, INTERPRETED) * s3[None, :]
        scores = _dot(qpe, tl.trans(kpe), zero, INTERPRETED) + latent * head_scale[:, None]
        p, alpha, m_i, l_i = _softmax_step(scores, offs_n, limit, row_scale, m_i, l_i)
        acc0 = _scaled_group_update(acc0, alpha, p, s0, v0, INTERPRETED)
        acc1 = _scaled_group_update(acc1, alpha, p, s1, v1, INTERPRETED)
        acc2 = _scaled_group_update(acc2, alpha, p, s2, v2, INTERPRETED)
        acc3 = _scaled_group_update(acc3, alpha, p, s3, v3, INTERPRETED)
    return m_i, l_i, _concat_groups(acc0, acc1, acc2, acc3, BLOCK_H, GROUP)


@triton.jit
def _attend_fp8_ds_mla_pairs(
    q0, q1, q2, q3, head_scale, qpe, kv_row, kpe_row, scale_row, table_row, blk_lo, blk_hi, length, limit,
    row_scale, num_pages, stride_kv_0, stride_kv_1, stride_kpe_0, stride_kpe_1, stride_s_0, stride_s_1,
    ROPE_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, LAYOUT: tl.constexpr,
    PAGE_SIZE: tl.constexpr, NUM_STAGES: tl.constexpr, FP8_PAIRS: tl.constexpr, INTERPRETED: tl.constexpr,
):  # fmt: skip
    """``_attend_fp8_ds_mla`` with each 128-column group read as [BLOCK_N, 64] byte pairs
    (``_e4m3_pairs_to_f16``): every group's dots split into its even and odd columns."""
    HALF: tl.constexpr = 64
    offs_j = tl.arange(0, HALF)
    q0e, q0o = _deinterleave(q0, BLOCK_H, HALF)
    q1e, q1o = _deinterleave(q1, BLOCK_H, HALF)
    q2e, q2o = _deinterleave(q2, BLOCK_H, HALF)
    q3e, q3o = _deinterleave(q3, BLOCK_H, HALF)
    pairs_row = kv_row.to(tl.pointer_type(tl.int16))
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    a0e = tl.zeros([BLOCK_H, HALF], tl.float32)
    a0o = tl.zeros([BLOCK_H, HALF], tl.float32)
    a1e = tl.zeros([BLOCK_H, HALF], tl.float32)
    a1o = tl.zeros([BLOCK_H, HALF], tl.float32)
    a2e = tl.zeros([BLOCK_H, HALF], tl.float32)
    a2o = tl.zeros([BLOCK_H, HALF], tl.float32)
    a3e = tl.zeros([BLOCK_H, HALF], tl.float32)
    a3o = tl.zeros([BLOCK_H, HALF], tl.float32)
    for blk in tl.range(blk_lo, blk_hi, num_stages=NUM_STAGES):
        offs_n, n_mask, kv_offs, kpe_offs, s_offs = _packed_step_offsets(
            table_row, blk, length, num_pages, stride_kv_0, stride_kv_1, stride_kpe_0, stride_kpe_1, stride_s_0,
            stride_s_1, LAYOUT, PAGE_SIZE, BLOCK_N,
        )  # fmt: skip
        pair_tile = pairs_row + (kv_offs // 2)[:, None] + offs_j[None, :]
        g0 = tl.load(pair_tile, mask=n_mask[:, None], other=0)
        g1 = tl.load(pair_tile + HALF, mask=n_mask[:, None], other=0)
        g2 = tl.load(pair_tile + 2 * HALF, mask=n_mask[:, None], other=0)
        g3 = tl.load(pair_tile + 3 * HALF, mask=n_mask[:, None], other=0)
        s0, s1, s2, s3, kpe = _ds_mla_scales_and_rope(scale_row, s_offs, kpe_row, kpe_offs, n_mask, ROPE_DIM)
        zero = tl.zeros([BLOCK_H, BLOCK_N], tl.float32)
        latent = _pair_scores(q0e, q0o, g0, zero, FP8_PAIRS, INTERPRETED) * s0[None, :]
        latent += _pair_scores(q1e, q1o, g1, zero, FP8_PAIRS, INTERPRETED) * s1[None, :]
        latent += _pair_scores(q2e, q2o, g2, zero, FP8_PAIRS, INTERPRETED) * s2[None, :]
        latent += _pair_scores(q3e, q3o, g3, zero, FP8_PAIRS, INTERPRETED) * s3[None, :]
        scores = _dot(qpe, tl.trans(kpe), zero, INTERPRETED) + latent * head_scale[:, None]
        p, alpha, m_i, l_i = _softmax_step(scores, offs_n, limit, row_scale, m_i, l_i)
        a0e, a0o = _scaled_pair_update(a0e, a0o, alpha, p, s0, g0, FP8_PAIRS, INTERPRETED)
        a1e, a1o = _scaled_pair_update(a1e, a1o, alpha, p, s1, g1, FP8_PAIRS, INTERPRETED)
        a2e, a2o = _scaled_pair_update(a2e, a2o, alpha, p, s2, g2, FP8_PAIRS, INTERPRETED)
        a3e, a3o = _scaled_pair_update(a3e, a3o, alpha, p, s3, g3, FP8_PAIRS, INTERPRETED)
    GROUP: tl.constexpr = 2 * HALF
    acc = _concat_groups(
        _interleave(a0e, a0o, BLOCK_H, GROUP),
        _interleave(a1e, a1o, BLOCK_H, GROUP),
        _interleave(a2e, a2o, BLOCK_H, GROUP),
        _interleave(a3e, a3o, BLOCK_H, GROUP),
        BLOCK_H,
        GROUP,
    )
    return m_i, l_i, acc


@triton.jit
def _pow2(exponent):
    """float32 2^exponent for int32 exponents in [-126, 127], built from bits (exact everywhere)."""
    return ((exponent + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _floor_log2(x):
    """int32 floor(log2 |x|) of normal float32 values, read from the exponent bits (exact)."""
    return ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127


@triton.jit
def _round_to_e4m3_grid(x):
    """float32 ``x`` (|x| < 448) rounded to the nearest e4m3 value, ties to even, in float32 math,
    so the later cast to fp8 is exact. (Triton's CPU interpreter rounds its f32 -> e4m3 casts
    wrongly when rounding up crosses a power of two, e.g. 7.94 -> 4; GPUs round correctly.)"""
    ulp_exponent = tl.maximum(_floor_log2(x), -6) - 3  # 3 mantissa bits; subnormals below 2^-6
    steps = x * _pow2(-ulp_exponent)
    rounded = tl.floor(steps + 0.5)
    odd = (rounded - 2.0 * tl.floor(rounded * 0.5)) != 0.0
    rounded = tl.where(((rounded - steps) == 0.5) & odd, rounded - 1.0, rounded)
    return rounded * _pow2(ulp_exponent)


@triton.jit
def _mx_query(q, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr):
    """q [BLOCK_H, HEAD_DIM] as MXFP8: (e4m3 values, uint8 e8m0 codes [BLOCK_H, HEAD_DIM / 32]).

    Each 32-column block is multiplied by 2^-(floor(log2 amax) - 7), which puts its largest entry
    in [128, 256): below e4m3's maximum 448, so nothing saturates (the OCP rule, -8, would clip
    the top of a block by up to 12.5%). Each entry is then rounded to nearest even on e4m3's
    grid (4 significant bits). A zero block gets code 1 (it stays zero); NaN stays NaN.
    """
    blocks = tl.reshape(q.to(tl.float32), (BLOCK_H, HEAD_DIM // 32, 32))
    exponent = tl.minimum(tl.maximum(_floor_log2(tl.max(tl.abs(blocks), axis=2)) - 7, -126), 126)
    values = _round_to_e4m3_grid(blocks * _pow2(-exponent)[:, :, None]).to(tl.float8e4nv)
    return tl.reshape(values, (BLOCK_H, HEAD_DIM)), (exponent + 127).to(tl.uint8)


@triton.jit
def _e2m1_values(codes):
    """float32 values of 4-bit e2m1 codes (bit 3 sign, bits 1-2 exponent, bit 0 mantissa)."""
    c = codes.to(tl.int32)
    exponent = (c >> 1) & 3
    mantissa = (c & 1).to(tl.float32)
    magnitude = tl.where(exponent == 0, 0.5 * mantissa, tl.exp2((exponent - 1).to(tl.float32)) * (1.0 + 0.5 * mantissa))
    return tl.where((c & 8) != 0, -magnitude, magnitude)


@triton.jit
def _mxfp4_tile(packed, scales, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, dtype: tl.constexpr):
    """[BLOCK_N, HEAD_DIM] values in ``dtype`` (exact: e2m1 times a power of two) from packed codes
    [BLOCK_N, HEAD_DIM / 2] (even column in the low nibble) and e8m0 codes [BLOCK_N, HEAD_DIM / 32]."""
    pairs = tl.join(_e2m1_values(packed & 0xF), _e2m1_values(packed >> 4))  # [N, D/2, 2]
    blocks = tl.reshape(pairs, (BLOCK_N, HEAD_DIM // 32, 32))
    block_scale = _pow2(scales.to(tl.int32) - 127)  # code 0 (2^-127) reads as 0: its block is ~0 anyway
    return tl.reshape(blocks * block_scale[:, :, None], (BLOCK_N, HEAD_DIM)).to(dtype)


@triton.jit
def _attend_mxfp4(
    q, qpe, kv_row, kpe_row, scale_row, table_row, blk_lo, blk_hi, length, limit, row_scale, num_pages,
    stride_kv_0, stride_kv_1, stride_kpe_0, stride_kpe_1, stride_s_0, stride_s_1,
    HEAD_DIM: tl.constexpr, ROPE_DIM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    LAYOUT: tl.constexpr, PAGE_SIZE: tl.constexpr, NUM_STAGES: tl.constexpr, INTERPRETED: tl.constexpr,
):  # fmt: skip
    """One row segment over an ``mxfp4`` cache: (running max, sum, output [BLOCK_H, HEAD_DIM]).

    Scores: ``tl.dot_scaled`` of the query as MXFP8 (e4m3, e8m0 per 32 columns; rounded once
    per row, see ``_mx_query``) with the e2m1 latent and its e8m0 scales (native on Blackwell and
    MI355X; Triton emulates it on Hopper), plus the rope dot in the query dtype. Output: P times
    the latent widened exactly to the query dtype (its scales run along D, not along the
    tokens that P . V sums over, so it cannot be a scaled dot). Per step it reads
    BLOCK_N x (D/2 + D/32 + 2P) bytes.
    """
    offs_half = tl.arange(0, HEAD_DIM // 2)
    offs_blocks = tl.arange(0, HEAD_DIM // 32)
    offs_p = tl.arange(0, ROPE_DIM)
    q8, q_scales = _mx_query(q, BLOCK_H, HEAD_DIM)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    for blk in tl.range(blk_lo, blk_hi, num_stages=NUM_STAGES):
        offs_n, n_mask, kv_offs, kpe_offs, s_offs = _packed_step_offsets(
            table_row, blk, length, num_pages, stride_kv_0, stride_kv_1, stride_kpe_0, stride_kpe_1, stride_s_0,
            stride_s_1, LAYOUT, PAGE_SIZE, BLOCK_N,
        )  # fmt: skip
        packed = tl.load(kv_row + kv_offs[:, None] + offs_half[None, :], mask=n_mask[:, None], other=0)
        scales = tl.load(scale_row + s_offs[:, None] + offs_blocks[None, :], mask=n_mask[:, None], other=0)
        kpe = tl.load(kpe_row + kpe_offs[:, None] + offs_p[None, :], mask=n_mask[:, None], other=0.0)
        scores = _dot(qpe, tl.trans(kpe), tl.zeros([BLOCK_H, BLOCK_N], tl.float32), INTERPRETED)
        scores += tl.dot_scaled(q8, q_scales, "e4m3", tl.trans(packed), scales, "e2m1")
        p, alpha, m_i, l_i = _softmax_step(scores, offs_n, limit, row_scale, m_i, l_i)
        v = _mxfp4_tile(packed, scales, BLOCK_N, HEAD_DIM, qpe.dtype)
        acc = _dot(to_nearest(p, v.dtype, INTERPRETED), v, acc * alpha[:, None], INTERPRETED)
    return m_i, l_i, acc


@triton.jit
def _queries_to_fp16(q, qpe):
    """Scale each row's (q, qpe) by a power of two so its largest entry is near 2^14 (far
    below the fp16 maximum), then cast to fp16: exact for every bf16 entry within a factor
    2^27 of the row's largest (fp16 keeps 11 significant bits, bf16 has 8). Returns the
    per-row factor that undoes the scaling on the scores."""
    row_max = tl.maximum(tl.max(tl.abs(q.to(tl.float32)), axis=1), tl.max(tl.abs(qpe.to(tl.float32)), axis=1))
    exponent = tl.floor(tl.log2(tl.where(row_max > 0, row_max, 1.0))) - 14.0
    head_scale = tl.exp2(exponent)
    inverse = 1.0 / head_scale
    q16 = (q.to(tl.float32) * inverse[:, None]).to(tl.float16)
    qpe16 = (qpe.to(tl.float32) * inverse[:, None]).to(tl.float16)
    return q16, qpe16, head_scale


@triton.jit
def _mla_combine_kernel(
    part_out_ptr,
    part_lse_ptr,
    row_pieces_ptr,
    out_ptr,
    lse_ptr,
    scale_ptr,
    batch,
    query_rows,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
    SCALED: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    # Memory traffic per program: the lse and BLOCK_D columns of the partials of one query
    # row's segments (read only for rows split over several segments), BLOCK_D * 2 bytes
    # written (+ 4 bytes of lse). Whole launch: every partial once, outputs of split rows.
    # SCALED: the partials hold a per-tensor fp8 cache's values before its scale (*scale_ptr).
    pid = tl.program_id(0)
    pid_d = tl.program_id(1)
    b = pid // query_rows
    r = pid % query_rows
    first = tl.load(row_pieces_ptr + b)
    count = tl.load(row_pieces_ptr + batch + b) - first + 1  # 0: an empty row
    empty = count == 0
    merge = count > 1
    n_merge = tl.where(merge, count, 0)
    first_slot = (first + b).to(tl.int64)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    lse_col = part_lse_ptr + first_slot * query_rows + r
    out_col = part_out_ptr + (first_slot * query_rows + r) * HEAD_DIM
    merged, merged_lse = merge_splits(
        lse_col, query_rows, out_col, query_rows * HEAD_DIM, offs_d, offs_d < HEAD_DIM, n_merge, BLOCK_S, BLOCK_D
    )
    if SCALED:
        merged = merged * tl.load(scale_ptr)
    row = b.to(tl.int64) * query_rows + r
    write = merge | empty
    tl.store(
        out_ptr + row * HEAD_DIM + offs_d,
        to_nearest(merged, out_ptr.dtype.element_ty, INTERPRETED),
        offs_d < tl.where(write, HEAD_DIM, 0),
    )
    if WRITE_LSE:
        if pid_d == 0:
            tl.store(lse_ptr + row, merged_lse, write)


def partial_dtype(call: MLADecodeCall) -> torch.dtype:
    """The partials' dtype: fp16 over a per-tensor fp8 cache, stored before its scale (each partial is a
    convex combination of e4m3 values, |x| <= 448, so fp16 keeps 11 significant bits at half float32's
    bytes; the combine applies the scale), float32 otherwise (bf16 values and the block-scaled formats'
    products are not bounded by fp16's range)."""
    return torch.float16 if call.is_fp8 else torch.float32


def combine_block_d(rows: int, head_dim: int, device: torch.device) -> int:
    """Columns per combine program: narrower when few (batch, query row) pairs must fill the GPU."""
    block_d = min(next_power_of_2(head_dim), 512)
    if device.type == "cuda":
        from tilegym.utils import multiprocessor_count

        target = 2 * multiprocessor_count(device)
        while block_d > 32 and rows * cdiv(head_dim, block_d) < target:
            block_d //= 2
    return block_d


class TritonDecodePlan:
    """Everything fixed for a decode step: config, schedule, workspace and the two launches."""

    def __init__(self, call: MLADecodeCall, config: KernelConfig | None = None) -> None:
        self.config = config = config or default_config(call)
        self.call = call
        head_groups = cdiv(call.query_rows, config.block_h)
        self.shape: ScheduleShape = schedule_shape(
            call,
            block_n=config.block_n,
            programs_per_sm=config.programs_per_sm,
            head_groups=head_groups,
            min_blocks=config.min_blocks,
            segment_cost_tokens=SEGMENT_COST_TOKENS,
        )
        self.schedule = SplitSchedule(call, self.shape)
        rows, device = call.query_rows, call.device
        self.part_out = torch.empty((self.shape.slots, rows, call.head_dim), dtype=partial_dtype(call), device=device)
        self.part_lse = torch.empty((self.shape.slots, rows), dtype=torch.float32, device=device)
        block_d = combine_block_d(call.batch * rows, call.head_dim, device)
        placeholder = self.part_lse
        self._index = (
            call.block_table if call.block_table is not None else call.kv_indices,
            call.kv_indptr,
        )
        index_table = self._index[0] if self._index[0] is not None else placeholder
        indptr = self._index[1] if self._index[1] is not None else placeholder
        self._pairs = fp8_pairs_mode(call, config, call.kv.data_ptr())
        self._split = self._split_kernel(self._pairs)
        self._split_byte_reads: KernelLauncher | None = None  # for a later cache on an odd address
        self._split_fixed = (
            index_table,
            indptr,
            self.schedule.lens,
            self.schedule.cum_blocks,
            self.schedule.piece_bounds,
            self.schedule.piece_rows,
        )
        self._split_ints = (
            call.sm_scale * LOG2_E,
            call.heads,
            call.q_len,
            rows,
            call.num_pages if call.is_paged else 1,
            call.kv_indices.numel() if call.kv_indices is not None else 0,
            self.shape.programs,
            *call.q.stride()[:3],
            *call.qpe.stride()[:3],
            *call.kv.stride()[:2],
            *call.kpe.stride()[:2],
            *(call.kv_scale.stride()[:2] if call.is_packed else (0, 0)),
            call.block_table.stride(0) if call.block_table is not None else 0,
        )
        self._combine = KernelLauncher(
            _mla_combine_kernel,
            grid=(call.batch * rows, cdiv(call.head_dim, block_d), 1),
            constexprs={
                "HEAD_DIM": call.head_dim,
                "BLOCK_D": block_d,
                "BLOCK_S": COMBINE_BLOCK_SPLITS,
                "SCALED": call.is_fp8,
                "WRITE_LSE": call.return_lse,
                "INTERPRETED": interpreting(call.device),
            },
            num_warps=4,
            num_stages=1,
        )
        self._combine_fixed = (self.part_out, self.part_lse, self.schedule.row_pieces)
        self._split_fixed_ptrs = tuple(t.data_ptr() for t in self._split_fixed)
        self._workspace_ptrs = (self.part_out.data_ptr(), self.part_lse.data_ptr())
        self._combine_fixed_ptrs = tuple(t.data_ptr() for t in self._combine_fixed)
        self._device_index = device.index if device.index is not None else 0

    def _split_kernel(self, pairs: int) -> KernelLauncher:
        """The split kernel's launch with this plan's constexprs and fp8 pair mode ``pairs``."""
        call, config = self.call, self.config
        return KernelLauncher(
            _mla_split_kernel,
            grid=(self.shape.programs, cdiv(call.query_rows, config.block_h), 1),
            constexprs={
                "HEAD_DIM": call.head_dim,
                "ROPE_DIM": call.rope_dim,
                "BLOCK_H": config.block_h,
                "BLOCK_N": config.block_n,
                "LAYOUT": layout_code(call.layout),
                "PAGE_SIZE": call.page_size if call.is_paged else 0,
                "NUM_STAGES": config.num_stages,
                "CAUSAL": call.causal and call.q_len > 1,
                "IS_FP8": call.is_fp8,
                "KV_FORMAT": KV_FORMAT_CODES.get(call.kv_format, 0),
                "KPE_STRIDE_MULTIPLE": stride_multiple(call.kpe.stride()[:2]),
                "FP8_PAIRS": pairs,
                "FP8_V_FP16": config.fp8_v_fp16,
                "FP8_FP16_SCORES": config.fp8_fp16_scores,
                "WRITE_LSE": call.return_lse,
                "INTERPRETED": interpreting(call.device),
            },
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        )

    def _split_for(self, kv_address: int) -> KernelLauncher:
        """The split launch for a cache at ``kv_address``: the planned one, or (built once) its
        byte-reading twin when the plan reads fp8 byte pairs and this cache is on an odd address."""
        if self._pairs == FP8_PAIRS_OFF or kv_address % 2 == 0:
            return self._split
        if self._split_byte_reads is None:
            self._split_byte_reads = self._split_kernel(FP8_PAIRS_OFF)
        return self._split_byte_reads

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
        """Both launches: write ``out`` (and ``lse`` when the plan returns it).

        The tensors may be the caller's 3-D or 4-D views: only their data pointers and dtypes
        are read, the strides and sizes are the plan's."""
        scale = kv_scale if kv_scale is not None else self.part_lse
        lse_arg = lse if lse is not None else self.part_lse
        pointers = (q.data_ptr(), qpe.data_ptr(), kv.data_ptr(), kpe.data_ptr(), scale.data_ptr())
        out_ptrs = (out.data_ptr(), lse_arg.data_ptr())
        aligned = all_aligned(pointers + out_ptrs)
        split = self._split_for(pointers[2])
        if split.ready(aligned) and self._combine.ready(aligned):
            stream = torch._C._cuda_getCurrentRawStream(self._device_index)
            split.direct(
                (*pointers, *self._split_fixed_ptrs, *out_ptrs, *self._workspace_ptrs, *self._split_ints), stream
            )
            sizes = (self.call.batch, self.call.query_rows)
            self._combine.direct((*self._combine_fixed_ptrs, *out_ptrs, pointers[4], *sizes), stream)
            return
        split(*self.split_arguments(q, qpe, kv, kpe, scale, out, lse_arg), aligned=aligned)
        self._combine(*self._combine_fixed, out, lse_arg, scale, self.call.batch, self.call.query_rows, aligned=aligned)

    def split_arguments(
        self,
        q: torch.Tensor,
        qpe: torch.Tensor,
        kv: torch.Tensor,
        kpe: torch.Tensor,
        scale: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
    ) -> tuple:
        """The split kernel's runtime arguments, in its signature's order (constexprs excluded)."""
        return (q, qpe, kv, kpe, scale, *self._split_fixed, out, lse, self.part_out, self.part_lse, *self._split_ints)

    @property
    def split_launcher(self) -> KernelLauncher:
        """The split kernel's launch: its grid, constexprs, warps and stages (for inspection tools)."""
        return self._split

    def workspace_bytes(self) -> int:
        return self.part_out.nbytes + self.part_lse.nbytes


def plan(call: MLADecodeCall) -> TritonDecodePlan:
    """The Triton backend's plan for ``call`` (config, schedule, workspace, launches)."""
    return TritonDecodePlan(call)
