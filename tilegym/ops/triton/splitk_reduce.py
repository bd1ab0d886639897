"""Triton ``splitk_reduce``: [B, H, N, D] partial outputs + lse [B, H, N] -> [B, H, D].

(The decode op's own combine reads its schedule's variable slot ranges:
``mla_decoding_split_kv._mla_combine_kernel``.) Each program owns one
(batch row, head) pair and one ``BLOCK_D``-wide slice of the output; it walks the splits
``BLOCK_SPLITS`` at a time, twice: first for the largest lse (lse values only), then for
the weighted sum. Splits whose lse is -inf (empty) are masked out of the loads, so their
partial rows are never read, and a row whose splits are all empty gives zeros (lse -inf).
A NaN lse stays live (NaN in, NaN out), and so does +inf (its weight is inf/inf = NaN).

The ROCm path is the same source; it has not been run on AMD hardware.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tilegym.ops.triton.launcher import interpreter_guard, interpreting
from tilegym.ops.triton.rounding import to_nearest
from tilegym.utils import cdiv, multiprocessor_count, next_power_of_2

_MAX_BLOCK_D = 512


@dataclass(frozen=True)
class ReduceTiles:
    """Tile policy of the combine on a GPU.

    ``tile_elements``: most elements of one [BLOCK_SPLITS, BLOCK_D] partial tile a program
    loads per step. ``min_block_d``: narrowest D slice. ``programs_per_sm``: D slices are
    narrowed until the grid has at least this many programs per SM (one long request has
    few (b, h) pairs but many splits, so it needs D-parallelism to fill the GPU).
    """

    tile_elements: int = 4096
    min_block_d: int = 64
    programs_per_sm: int = 2
    num_warps: int = 4


ROUND1_TILES = ReduceTiles()  # first version, measured in NOTES_triton.md runs 1-2
WIDE_TILES = ReduceTiles(tile_elements=8192, min_block_d=16, programs_per_sm=4)
# 32-wide D slices: (1, 32768, 16) with 128 splits gets 256 programs of [128, 32] and its
# combine went from 5.4 to 3.8 us (NOTES_triton.md, round 2). Launches with >= 33 (b, h)
# pairs are the same as ROUND1_TILES.
DEFAULT_TILES = ReduceTiles(min_block_d=32)


@triton.jit
def merge_splits(
    lse_row,
    stride_lse_n,
    po_row,
    stride_po_n,
    offs_d,
    d_mask,
    num_splits,
    BLOCK_SPLITS: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Merge ``num_splits`` partial rows (split n at ``po_row + n * stride_po_n``, lse at
    ``lse_row + n * stride_lse_n``) into (float32 [BLOCK_D] output, natural-log lse).

    Two passes, BLOCK_SPLITS splits at a time: the largest lse, then the weighted sum. A split
    with lse -inf weighs nothing and its partial is never loaded; no live split gives zeros and
    lse -inf; a NaN or +inf lse gives NaN (NaN in, NaN out). Shared by ``splitk_reduce`` and the
    decode's own combine, which differ only in where the splits of a row live.
    """
    offs_n = tl.arange(0, BLOCK_SPLITS)
    running_max = tl.full([BLOCK_SPLITS], float("-inf"), tl.float32)
    for n0 in range(0, num_splits, BLOCK_SPLITS):
        n_mask = n0 + offs_n < num_splits
        lse = tl.load(lse_row + (n0 + offs_n) * stride_lse_n, mask=n_mask, other=float("-inf"))
        running_max = tl.maximum(running_max, lse, propagate_nan=tl.PropagateNan.ALL)
    lse_max = tl.max(running_max, axis=0)
    shift = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    acc = tl.zeros([BLOCK_D], tl.float32)
    weight_sum = tl.zeros([BLOCK_SPLITS], tl.float32)
    for n0 in range(0, num_splits, BLOCK_SPLITS):
        n_mask = n0 + offs_n < num_splits
        lse = tl.load(lse_row + (n0 + offs_n) * stride_lse_n, mask=n_mask, other=float("-inf"))
        live = n_mask & (lse != float("-inf"))  # NaN stays live
        weight = tl.where(live, tl.exp(lse - shift), 0.0)
        weight_sum += weight
        part = tl.load(
            po_row + (n0 + offs_n)[:, None] * stride_po_n + offs_d[None, :],
            mask=live[:, None] & d_mask[None, :],
            other=0.0,
        ).to(tl.float32)
        acc += tl.sum(weight[:, None] * part, axis=0)
    total = tl.sum(weight_sum, axis=0)
    merged = tl.where(total > 0, acc / tl.where(total > 0, total, 1.0), acc)
    merged_lse = tl.where(total > 0, shift + tl.log(tl.where(total > 0, total, 1.0)), float("-inf"))
    return merged, tl.where(total != total, total, merged_lse)


@triton.jit
def _splitk_reduce_kernel(
    po_ptr,
    plse_ptr,
    out_ptr,
    lse_out_ptr,
    num_heads,
    num_splits,
    head_dim,
    stride_po_b,
    stride_po_h,
    stride_po_n,
    stride_pl_b,
    stride_pl_h,
    stride_pl_n,
    stride_o_b,
    stride_o_h,
    stride_lo_b,
    stride_lo_h,
    BLOCK_SPLITS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    WRITE_LSE: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    # Memory traffic per program: N * 4 bytes of lse (read twice, cached), at most
    # N * BLOCK_D * sizeof(partial) bytes of partial outputs (non-empty splits only),
    # BLOCK_D * sizeof(out) bytes written. Whole launch: B*H*N*D*4 read + B*H*D*2 written
    # for fp32 partials and a 16-bit output.
    pid_bh = tl.program_id(0)
    pid_d = tl.program_id(1)
    b = (pid_bh // num_heads).to(tl.int64)
    h = (pid_bh % num_heads).to(tl.int64)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    d_mask = offs_d < head_dim
    lse_row = plse_ptr + b * stride_pl_b + h * stride_pl_h
    po_row = po_ptr + b * stride_po_b + h * stride_po_h

    merged, merged_lse = merge_splits(
        lse_row, stride_pl_n, po_row, stride_po_n, offs_d, d_mask, num_splits, BLOCK_SPLITS, BLOCK_D
    )
    merged = to_nearest(merged, out_ptr.dtype.element_ty, INTERPRETED)
    tl.store(out_ptr + b * stride_o_b + h * stride_o_h + offs_d, merged, mask=d_mask)
    if WRITE_LSE:
        if pid_d == 0:
            tl.store(lse_out_ptr + b * stride_lo_b + h * stride_lo_h, merged_lse)


def _block_sizes(
    batch: int, heads: int, num_splits: int, head_dim: int, device: torch.device, tiles: ReduceTiles
) -> tuple[int, int]:
    """(BLOCK_SPLITS, BLOCK_D) under ``tiles``. On CPU the interpreter runs programs one by
    one, so fewer, wider programs are faster: no D narrowing there."""
    block_d = min(next_power_of_2(head_dim), _MAX_BLOCK_D)
    if device.type == "cuda":
        target = tiles.programs_per_sm * multiprocessor_count(device)
        while block_d > tiles.min_block_d and batch * heads * cdiv(head_dim, block_d) < target:
            block_d //= 2
    block_splits = max(1, min(next_power_of_2(num_splits), tiles.tile_elements // block_d))
    return block_splits, block_d


def splitk_reduce_into(
    partial_out: torch.Tensor,
    partial_lse: torch.Tensor,
    out: torch.Tensor,
    lse_out: torch.Tensor | None = None,
    tiles: ReduceTiles | None = None,
) -> None:
    """Launch the combine: write ``out`` [B, H, D] (and ``lse_out`` [B, H] float32 if given).

    ``tiles`` overrides the tile policy (benchmarks compare them); None uses DEFAULT_TILES."""
    tiles = tiles or DEFAULT_TILES
    batch, heads, num_splits, head_dim = partial_out.shape
    block_splits, block_d = _block_sizes(batch, heads, num_splits, head_dim, partial_out.device, tiles)
    lse_target = out if lse_out is None else lse_out  # a valid pointer; unused without WRITE_LSE
    grid = (batch * heads, cdiv(head_dim, block_d))
    with interpreter_guard(partial_out.device):
        _splitk_reduce_kernel[grid](
            partial_out,
            partial_lse,
            out,
            lse_target,
            heads,
            num_splits,
            head_dim,
            *partial_out.stride()[:3],
            *partial_lse.stride(),
            *out.stride()[:2],
            *(lse_out.stride() if lse_out is not None else (0, 0)),
            BLOCK_SPLITS=block_splits,
            BLOCK_D=block_d,
            WRITE_LSE=lse_out is not None,
            INTERPRETED=interpreting(partial_out.device),
            num_warps=tiles.num_warps,
        )
