"""The split schedule built by one Triton program: the same tensors as ``SplitSchedule``'s torch ops
in one launch instead of 27-50 small device ops (``SplitSchedule.refresh`` uses it for GPU tensors).

One program walks the rows in chunks of ``BLOCK_B`` (lengths, blocks, running sums), then computes
every cut at once over ``BLOCK_P`` >= programs + 1 lanes, counting row ends at or before each cut
chunk by chunk (a searchsorted as a count), and finally each row's first and last piece the same way.
Memory traffic: the batch's lengths read, every schedule tensor written once, the row sums re-read
from global memory by the later phases (a few KB).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from tilegym import utils
from tilegym.ops.triton.launcher import KernelLauncher, all_aligned

if TYPE_CHECKING:
    from tilegym.ops.contract import MLADecodeCall
    from tilegym.ops.schedule import ScheduleShape

BIG = tl.constexpr(2**30)  # past any block count: masked-off lanes compare as "after"
BLOCK_B = 32  # rows per chunk of the row walks
NUM_WARPS = 4
_loaded: set[tuple] = set()  # (constexprs, device) of the variants launched in this process
SIZES = ("batch", "programs", "seq_len", "nnz", "page_size", "block_n", "min_blocks", "cost", "fixed")


@triton.jit(do_not_specialize=SIZES)  # one compiled kernel per constexpr set, whatever the sizes
def schedule_kernel(
    kv_lens_ptr,
    indptr_ptr,
    snap_ptr,
    lens_ptr,
    cum_ptr,
    units_ptr,
    bounds_ptr,
    piece_rows_ptr,
    row_pieces_ptr,
    batch,
    programs,
    seq_len,
    nnz,
    page_size,
    block_n,
    min_blocks,
    cost,
    fixed,
    HAS_LENS: tl.constexpr,
    RAGGED: tl.constexpr,
    SNAP: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    # Phase 1: lengths, blocks, cum_blocks and the unit line (row starts at `cost` units per non-empty row).
    total = 0
    nonempty = 0
    least = BIG
    most = 0
    tl.store(cum_ptr, 0)
    for c0 in range(0, batch, BLOCK_B):
        b = c0 + tl.arange(0, BLOCK_B)
        ok = b < batch
        if HAS_LENS:
            n = tl.load(kv_lens_ptr + b, mask=ok, other=0)
        else:
            n = tl.zeros([BLOCK_B], dtype=tl.int32) + seq_len
        if RAGGED:  # the tokens of the row's pages: its kv_indptr range clamped into kv_indices
            page_begin = tl.minimum(tl.maximum(tl.load(indptr_ptr + b, mask=ok, other=0), 0), nnz)
            page_end = tl.minimum(tl.maximum(tl.load(indptr_ptr + b + 1, mask=ok, other=0), 0), nnz)
            cap = tl.maximum(page_end - page_begin, 0) * page_size
        else:
            cap = tl.zeros([BLOCK_B], dtype=tl.int32) + seq_len
        n = tl.minimum(tl.maximum(n, 0), cap)
        tl.store(lens_ptr + b, n, mask=ok)
        blocks = tl.where(ok, (n + block_n - 1) // block_n, 0)
        live = (blocks > 0).to(tl.int32)
        ends = tl.cumsum(blocks, 0) + total
        tl.store(cum_ptr + b + 1, ends, mask=ok)
        starts_before = tl.cumsum(live, 0) - live + nonempty
        tl.store(units_ptr + b, ends - blocks + cost * starts_before, mask=ok)
        least = tl.minimum(least, tl.min(tl.where(ok, blocks, BIG), 0))
        most = tl.maximum(most, tl.max(blocks, 0))
        total += tl.sum(blocks, 0)
        nonempty += tl.sum(live, 0)
    line = total + cost * nonempty
    tl.debug_barrier()

    # Phase 2: the cuts, equal blocks, or (unequal rows, a cost) equal units, or (equal rows, a snap) the table's.
    p = tl.arange(0, BLOCK_P)
    if fixed > 0:
        bounds = p * fixed
    else:
        per = tl.maximum((total + programs - 1) // programs, min_blocks)
        bounds = p * per
        if cost > 0:
            per_u = tl.maximum((line + programs - 1) // programs, min_blocks + cost)
            cuts = tl.minimum(p * per_u, line)
            row = tl.zeros([BLOCK_P], dtype=tl.int32)
            for c0 in range(0, batch, BLOCK_B):
                b = c0 + tl.arange(0, BLOCK_B)
                interior = (b >= 1) & (b < batch)
                u = tl.load(units_ptr + b, mask=interior, other=BIG)
                row += tl.sum((u[None, :] <= cuts[:, None]).to(tl.int32), 1)
            row_units = tl.load(units_ptr + row)
            row_begin = tl.load(cum_ptr + row)
            row_blocks = tl.load(cum_ptr + row + 1) - row_begin
            into_row = tl.minimum(tl.maximum(cuts - cost - row_units, 0), row_blocks)
            bounds = tl.where(least == most, bounds, row_begin + into_row)
        if SNAP:
            snapped = tl.load(snap_ptr + tl.where(least == most, most, 0))
            bounds = tl.where(snapped > 0, p * snapped, bounds)
    bounds = tl.minimum(bounds, total)
    tl.store(bounds_ptr + p, bounds, mask=p <= programs)
    tl.debug_barrier()

    # Phase 3: the rows each piece meets (the row holding a block = row ends at or before it).
    on = p < programs
    start = tl.load(bounds_ptr + p, mask=on, other=0)
    end = tl.load(bounds_ptr + p + 1, mask=on, other=0)
    first = tl.zeros([BLOCK_P], dtype=tl.int32)
    last = tl.zeros([BLOCK_P], dtype=tl.int32)
    for c0 in range(0, batch, BLOCK_B):
        b = c0 + tl.arange(0, BLOCK_B)
        row_end = tl.load(cum_ptr + b + 1, mask=b < batch, other=BIG)
        first += tl.sum((row_end[None, :] <= start[:, None]).to(tl.int32), 1)
        last += tl.sum((row_end[None, :] <= (end - 1)[:, None]).to(tl.int32), 1)
    first = tl.minimum(first, batch - 1)
    tl.store(piece_rows_ptr + p, first, mask=on)
    tl.store(piece_rows_ptr + programs + p, tl.where(start < end, last, first - 1), mask=on)

    # Phase 4: the pieces each row meets (the piece holding a block = piece ends at or before it).
    piece_end = tl.load(bounds_ptr + p + 1, mask=on, other=BIG)
    for c0 in range(0, batch, BLOCK_B):
        b = c0 + tl.arange(0, BLOCK_B)
        ok = b < batch
        row_begin = tl.load(cum_ptr + b, mask=ok, other=0)
        row_end = tl.load(cum_ptr + b + 1, mask=ok, other=0)
        first_piece = tl.sum((piece_end[None, :] <= row_begin[:, None]).to(tl.int32), 1)
        last_piece = tl.sum((piece_end[None, :] <= (row_end - 1)[:, None]).to(tl.int32), 1)
        first_piece = tl.minimum(first_piece, programs - 1)
        tl.store(row_pieces_ptr + b, first_piece, mask=ok)
        tl.store(row_pieces_ptr + batch + b, tl.where(row_begin < row_end, last_piece, first_piece - 1), mask=ok)


def schedule_launch(
    call: MLADecodeCall,
    shape: ScheduleShape,
    snap_table: torch.Tensor | None,
    *,
    lens: torch.Tensor,
    cum_blocks: torch.Tensor,
    units: torch.Tensor,
    piece_bounds: torch.Tensor,
    piece_rows: torch.Tensor,
    row_pieces: torch.Tensor,
) -> Callable[[], None] | None:
    """A function that rebuilds the schedule of ``call`` (an ``MLADecodeCall``) cut as ``shape`` (a
    ``ScheduleShape``) into the given int32 tensors with one launch; ``units`` holds >= batch int32.
    The call's ``kv_lens`` and page ranges are read at each launch, so it follows in-place updates.

    None during CUDA-graph capture when this variant has not run in this process yet: its first launch
    compiles and loads a module, which a capture must not contain; the caller uses the torch ops."""
    ragged = call.kv_indptr is not None
    spare = lens  # any int32 pointer for the inputs a variant does not read
    inputs = (
        call.kv_lens if call.kv_lens is not None else spare,
        call.kv_indptr if ragged else spare,
        snap_table if snap_table is not None else spare,
    )
    outputs = (lens, cum_blocks, units, piece_bounds, piece_rows, row_pieces)
    fixed = shape.fixed_blocks or 0
    sizes = (
        shape.batch,
        shape.programs,
        call.seq_len,
        call.kv_indices.numel() if ragged else 0,
        call.page_size if ragged else 0,
        shape.block_n,
        shape.min_blocks,
        0 if fixed else shape.segment_cost,
        fixed,
    )
    constexprs = {
        "HAS_LENS": call.kv_lens is not None,
        "RAGGED": ragged,
        "SNAP": snap_table is not None,
        "BLOCK_B": BLOCK_B,
        "BLOCK_P": max(16, triton.next_power_of_2(shape.programs + 1)),
    }
    variant = (tuple(constexprs.values()), lens.device)
    if variant not in _loaded and utils.capturing(lens.device):
        return None
    launcher = KernelLauncher(schedule_kernel, grid=(1, 1, 1), constexprs=constexprs, num_warps=NUM_WARPS, num_stages=1)
    args = (*inputs, *outputs, *sizes)
    aligned = all_aligned([t.data_ptr() for t in (*inputs, *outputs)])

    def launch() -> None:
        launcher(*args, aligned=aligned)
        _loaded.add(variant)

    return launch
