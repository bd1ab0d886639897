"""Triton MLA decode with split-KV (stage 1) and its launcher; stage 2 is ``splitk_reduce``.

Grid: (head groups, splits, batch). Each program holds ``BLOCK_H`` query heads of one batch
row and walks one split of the KV sequence ``BLOCK_N`` tokens at a time. Every KV tile
(latent [BLOCK_N, D] + rope [BLOCK_N, P]) is loaded once and used for all ``BLOCK_H`` heads,
first as K (scores) and then, the same registers / shared memory, as V (output): the cache
is read once per head group, never once per head and never twice for V. Softmax runs
online in float32 (base 2); 16-bit values appear only at loads, stores and dot operands.

fp8 caches (e4m3fn; e4m3fnuz on AMD) are loaded as fp8 (half the bytes) and widened in
registers (exact: every e4m3 value is a bf16/fp16 value); the per-tensor ``kv_scale`` is
folded into the score scale and the final output, read through a pointer. The NVIDIA
default (``fp8_one_tile``) widens each tile once to fp16 and uses it as both K and V; the
queries are moved into fp16 by a per-head power-of-two scale that the scores undo.

With one split the program writes the final output (and lse) itself; otherwise it writes
float32 partials [B, H, N, D] + lse [B, H, N] that ``splitk_reduce`` merges. No host
synchronisation, no value-dependent allocation, no atomics: graph-capturable, deterministic.

The kernels use no NVIDIA-only feature (the fp8 capability check lives in ``supports``),
so the same source targets ROCm, but the ROCm path is untested on hardware. AMD wavefronts
are 64 lanes and LDS is 64 KB (MI300), so AMD would want ``BLOCK_N`` = 32 and a single
software pipeline stage for D = 512; ``default_config`` encodes that guess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tilegym.ops.contract import MLADecodeCall
from tilegym.ops.split_plan import SplitPlan, plan_mla_splits
from tilegym.ops.triton.splitk_reduce import ReduceTiles, splitk_reduce_into
from tilegym.utils import cdiv, next_power_of_2

LOG2_E = math.log2(math.e)
MAX_BLOCK_H = 64
SMALL_PROBLEM_TOKENS = 8192  # B * S at or below which 32-token steps measured faster
FEW_ROWS = 8  # batch rows (H <= 16) at or below which 128-token steps measured faster


@dataclass(frozen=True)
class KernelConfig:
    """Tile sizes and launch parameters of the stage-1 kernel.

    ``block_h``: query heads per program (>= 16: ``tl.dot`` needs M >= 16 on GPUs).
    ``block_n``: KV tokens per loop step. ``programs_per_sm``: occupancy goal handed to
    ``plan_splits`` when the user does not fix ``kv_len_per_split``. ``fp8_v_fp16``: with
    an fp8 cache, multiply P by V in fp16 rather than in the query dtype. ``fp8_one_tile``:
    with an fp8 cache, widen each tile once to fp16 and use that one tile for both dots
    (K and V); the queries are rescaled per head by a power of two into fp16.
    ``reduce_tiles``: tile policy of the combine (None: its default).
    """

    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    programs_per_sm: int = 2
    fp8_v_fp16: bool = True
    fp8_one_tile: bool = False
    reduce_tiles: ReduceTiles | None = None


def default_config(call: MLADecodeCall) -> KernelConfig:
    """Tile sizes by vendor, head count and cache dtype (NVIDIA numbers: H200 sweeps,
    benchmarks/NOTES_triton.md)."""
    block_h = min(MAX_BLOCK_H, max(16, next_power_of_2(call.heads)))
    if call.vendor == "cpu":  # interpreter: its cost is programs x loop steps
        return KernelConfig(block_h, block_n=64, num_warps=4, num_stages=1)
    if call.vendor == "amd":  # untested guess: 64-lane wavefronts, 64 KB LDS
        return KernelConfig(block_h, block_n=32, num_warps=4, num_stages=1)
    if block_h >= 64:  # compute-bound: 8 warps keep the [64, D] accumulator in registers
        # fp8 widens each tile in shared memory too: 64-token steps need 244 KB (limit 227 KB).
        return KernelConfig(block_h, block_n=32 if call.is_fp8 else 64, num_warps=8, num_stages=2)
    if block_h == 32:
        return KernelConfig(block_h, block_n=32, num_warps=4, num_stages=2)
    if call.is_fp8:  # one fp16 tile for K and V measured 128.5 us vs 163.6 (round 2)
        return KernelConfig(block_h, block_n=32, num_warps=4, num_stages=3, fp8_one_tile=True)
    if call.batch * call.seq_len <= SMALL_PROBLEM_TOKENS:  # latency-bound: shorter steps
        return KernelConfig(block_h, block_n=32, num_warps=4, num_stages=2)
    if call.batch <= FEW_ROWS:  # one long request: long steps, one program per SM
        return KernelConfig(block_h, block_n=128, num_warps=8, num_stages=2, programs_per_sm=1)
    # Whole waves of 2 programs per SM (4 splits for B=64) measured fastest (NOTES_triton.md).
    return KernelConfig(block_h, block_n=64, num_warps=4, num_stages=2)


@triton.jit
def _mla_split_kv_kernel(
    q_ptr,
    qpe_ptr,
    kv_ptr,
    kpe_ptr,
    kv_lens_ptr,
    kv_scale_ptr,
    o_ptr,
    lse_ptr,
    score_scale,
    num_heads,
    seq_len,
    kv_len_per_split,
    stride_q_b,
    stride_q_h,
    stride_qpe_b,
    stride_qpe_h,
    stride_kv_b,
    stride_kv_s,
    stride_kpe_b,
    stride_kpe_s,
    stride_o_b,
    stride_o_h,
    stride_o_n,
    stride_lse_b,
    stride_lse_h,
    stride_lse_n,
    HEAD_DIM: tl.constexpr,
    ROPE_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    HAS_KV_LENS: tl.constexpr,
    IS_FP8: tl.constexpr,
    FP8_V_FP16: tl.constexpr,
    FP8_ONE_TILE: tl.constexpr,
    WRITE_LSE: tl.constexpr,
):
    # Memory traffic per program: reads L * (D + P) * sizeof(kv) bytes of cache for its
    # split of L tokens (once, for all BLOCK_H heads) + BLOCK_H * (D + P) * 2 bytes of
    # queries; writes BLOCK_H * D * sizeof(o) (+ BLOCK_H * 4 lse). Whole launch with
    # one head group: B*S*(D+P)*sizeof(kv) + B*H*(D+P)*2 read, B*H*N*D*4 (+ B*H*N*4) written.
    pid_h = tl.program_id(0)
    split = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    compute_dtype = q_ptr.dtype.element_ty

    offs_h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = offs_h < num_heads
    offs_d = tl.arange(0, HEAD_DIM)
    offs_p = tl.arange(0, ROPE_DIM)
    q = tl.load(
        q_ptr + b * stride_q_b + offs_h[:, None] * stride_q_h + offs_d[None, :], mask=h_mask[:, None], other=0.0
    )
    qpe = tl.load(
        qpe_ptr + b * stride_qpe_b + offs_h[:, None] * stride_qpe_h + offs_p[None, :], mask=h_mask[:, None], other=0.0
    )

    length = seq_len
    if HAS_KV_LENS:
        length = tl.minimum(tl.maximum(tl.load(kv_lens_ptr + b), 0), seq_len)
    start = split * kv_len_per_split
    end = tl.minimum(start + kv_len_per_split, length)
    row_scale = tl.full([BLOCK_H], 1.0, tl.float32) * score_scale
    if IS_FP8:
        kv_scale = tl.load(kv_scale_ptr)
        row_scale = row_scale * kv_scale
        if FP8_ONE_TILE:
            q, qpe, head_scale = _queries_to_fp16(q, qpe)
            row_scale = row_scale * head_scale

    kv_row = kv_ptr + b * stride_kv_b
    kpe_row = kpe_ptr + b * stride_kpe_b
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, HEAD_DIM], tl.float32)
    for n0 in tl.range(start, end, BLOCK_N, num_stages=NUM_STAGES):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        kv = tl.load(kv_row + offs_n[:, None] * stride_kv_s + offs_d[None, :], mask=n_mask[:, None], other=0.0)
        kpe = tl.load(kpe_row + offs_n[:, None] * stride_kpe_s + offs_p[None, :], mask=n_mask[:, None], other=0.0)
        if IS_FP8 and FP8_ONE_TILE:
            # One exact widening (native e4m3 -> f16 on NVIDIA); the same tile is K and V.
            kv = kv.to(tl.float16)
            kpe = kpe.to(tl.float16)
            v = kv
        elif IS_FP8:
            # Both conversions are exact. FP8_V_FP16: the V side in fp16 (one native
            # e4m3 -> f16 convert on NVIDIA; p in [0, 1] loses nothing in fp16).
            if FP8_V_FP16:
                v = kv.to(tl.float16)
            else:
                v = kv.to(compute_dtype)
            kv = kv.to(compute_dtype)
            kpe = kpe.to(compute_dtype)
        else:
            v = kv
        scores = tl.dot(qpe, tl.trans(kpe))
        scores = tl.dot(q, tl.trans(kv), scores)
        # n0 < end, so every tile has a valid token and m_new is finite.
        scores = tl.where(n_mask[None, :], scores * row_scale[:, None], float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new

    if IS_FP8:
        acc = acc * kv_scale
    nonempty = l_i > 0
    safe_l = tl.where(nonempty, l_i, 1.0)
    out = acc / safe_l[:, None]
    o_ptrs = o_ptr + b * stride_o_b + split * stride_o_n + offs_h[:, None] * stride_o_h + offs_d[None, :]
    tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty), mask=h_mask[:, None])
    if WRITE_LSE:
        lse = tl.where(nonempty, (m_i + tl.log2(safe_l)) / 1.4426950408889634, float("-inf"))
        tl.store(lse_ptr + b * stride_lse_b + split * stride_lse_n + offs_h * stride_lse_h, lse, mask=h_mask)


@triton.jit
def _queries_to_fp16(q, qpe):
    """Scale each head's (q, qpe) row by a power of two so its largest entry is near 2^14
    (far below the fp16 maximum), then cast to fp16: exact for every bf16 entry within a
    factor 2^27 of the row's largest (fp16 keeps 11 significant bits, bf16 has 8).
    Returns the per-head factor that undoes the scaling on the scores."""
    row_max = tl.maximum(tl.max(tl.abs(q.to(tl.float32)), axis=1), tl.max(tl.abs(qpe.to(tl.float32)), axis=1))
    exponent = tl.floor(tl.log2(tl.where(row_max > 0, row_max, 1.0))) - 14.0
    head_scale = tl.exp2(exponent)
    inverse = 1.0 / head_scale
    q16 = (q.to(tl.float32) * inverse[:, None]).to(tl.float16)
    qpe16 = (qpe.to(tl.float32) * inverse[:, None]).to(tl.float16)
    return q16, qpe16, head_scale


def split_plan(call: MLADecodeCall, config: KernelConfig) -> SplitPlan:
    """The split plan for this call: ``plan_splits`` with this kernel's programs per split."""
    return plan_mla_splits(
        call, heads_per_program=config.block_h, block_n=config.block_n, programs_per_sm=config.programs_per_sm
    )


def _launch_stage1(
    call: MLADecodeCall,
    config: KernelConfig,
    num_splits: int,
    kv_len_per_split: int,
    out: torch.Tensor,
    out_strides: tuple[int, int, int],
    lse: torch.Tensor | None,
    lse_strides: tuple[int, int, int],
) -> None:
    """Launch stage 1 writing ``out`` (final [B,H,D] or partial [B,H,N,D]) through the given strides."""
    placeholder = call.q  # a valid pointer for arguments a constexpr switch leaves unread
    grid = (cdiv(call.heads, config.block_h), num_splits, call.batch)
    _mla_split_kv_kernel[grid](
        call.q,
        call.qpe,
        call.kv,
        call.kpe,
        call.kv_lens if call.kv_lens is not None else placeholder,
        call.kv_scale if call.kv_scale is not None else placeholder,
        out,
        lse if lse is not None else placeholder,
        call.sm_scale * LOG2_E,
        call.heads,
        call.seq_len,
        kv_len_per_split,
        *call.q.stride()[:2],
        *call.qpe.stride()[:2],
        *call.kv.stride()[:2],
        *call.kpe.stride()[:2],
        *out_strides,
        *lse_strides,
        HEAD_DIM=call.head_dim,
        ROPE_DIM=call.rope_dim,
        BLOCK_H=config.block_h,
        BLOCK_N=config.block_n,
        NUM_STAGES=config.num_stages,
        HAS_KV_LENS=call.kv_lens is not None,
        IS_FP8=call.is_fp8,
        FP8_V_FP16=config.fp8_v_fp16,
        FP8_ONE_TILE=config.fp8_one_tile,
        WRITE_LSE=lse is not None,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )


def mla_decode_into(call: MLADecodeCall, config: KernelConfig | None = None) -> torch.Tensor | None:
    """Run both stages into ``call.out``; return lse [B, H] when ``call.return_lse``.

    ``config`` overrides the tile sizes (benchmarks sweep it); None uses ``default_config``.
    """
    config = config or default_config(call)
    batch, heads, seq_len = call.batch, call.heads, call.seq_len
    plan = split_plan(call, config)
    split_len = min(plan.kv_len_per_split, seq_len)  # same result, keeps the index math in int32
    lse = torch.empty((batch, heads), dtype=torch.float32, device=call.device) if call.return_lse else None
    if plan.num_splits == 1:
        lse_strides = (*lse.stride(), 0) if lse is not None else (0, 0, 0)
        _launch_stage1(call, config, 1, split_len, call.out, (*call.out.stride()[:2], 0), lse, lse_strides)
        return lse
    shape = (batch, heads, plan.num_splits)
    partial_out = torch.empty((*shape, call.head_dim), dtype=torch.float32, device=call.device)
    partial_lse = torch.empty(shape, dtype=torch.float32, device=call.device)
    _launch_stage1(
        call,
        config,
        plan.num_splits,
        split_len,
        partial_out,
        (partial_out.stride(0), partial_out.stride(1), partial_out.stride(2)),
        partial_lse,
        partial_lse.stride(),
    )
    splitk_reduce_into(partial_out, partial_lse, call.out, lse, config.reduce_tiles)
    return lse
