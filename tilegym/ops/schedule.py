"""The split schedule: how a decode step's KV work is cut into GPU programs, by the rows' real lengths.

Work is counted in blocks of ``block_n`` tokens. Row b has ``blocks[b] = cdiv(len[b], block_n)``
blocks; laid end to end, the rows' blocks form one line of ``total`` blocks. The line is cut
into ``programs`` pieces at ``piece_bounds`` (piece p covers blocks ``[bounds[p], bounds[p + 1])``),
one program (a persistent CTA: ``programs`` is one wave) per piece, walking the rows it meets,
``first_row[p]`` to ``last_row[p]``; where piece p meets row b, that overlap is a *segment*.

Pieces are balanced in cost, not only in blocks. Each segment costs a program a fixed start (its
queries staged, its pipeline filled and drained, its partial written) on top of its blocks; a plan
states that start as ``segment_cost`` blocks. The line is then counted in units: every non-empty
row is ``segment_cost`` units of start followed by its blocks, and the pieces are equal in units
(``per = cdiv(total units, programs)``, at least ``min_blocks + segment_cost``). A cut that falls in
a row's start units moves to the row's beginning, so a piece that would take a few blocks of the
next row ends at a row end instead. Rows of equal length keep pieces of equal blocks: there every
piece already pays about one start, and units would count starts that fall on piece boundaries.
With ``segment_cost = 0`` the pieces are equal in blocks.

A plan may allow ``snap``: when every row has the same ``L`` blocks, a piece size that holds whole
rows (``m * L``, the smallest at least ``per``) or, for ``k = L // per``, cuts each row into k equal
segments (``L / k``, when k divides L) is used instead, if it is at most ``1 + snap`` times the
balanced block count. No piece then meets a row part-way: with whole rows there are no partials for
the combine and no second query staging inside a piece. Where the split kernel is compute-bound
(many query rows per block) that pays for a few percent more blocks in the longest piece. The sizes
for every possible ``L`` are tabled when the schedule is built, so a refresh looks its rows' length
up (a few device ops, capturable) instead of computing the rule.

Segment (p, b) is stored in work slot ``p + b``, which is unique (a later piece never covers an
earlier row) and at most ``programs + batch - 2``; the pieces that meet row b are the consecutive
range ``row_pieces[0][b] .. row_pieces[1][b]`` (last < first for an empty row), so its slots are
those plus b. A row covered by a single segment is written straight to the output; the combine
merges the others and writes zeros / lse -inf for empty rows.

Everything is built on the device from ``kv_lens``: no host synchronisation, capturable in a CUDA
graph, and ``refresh`` recomputes it in place (same buffers) when the lengths change. On a GPU with
Triton installed that is one launch (``tilegym/ops/triton/schedule_kernel.py``); elsewhere, the
torch ops below (27-50 small ones), which also define what the kernel must give. The split kernels
read ``lens``, ``cum_blocks``, ``piece_bounds`` and ``piece_rows`` ([2, programs]: first and last row
of each piece; last < first when empty); the combines read ``row_pieces``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import torch

from tilegym.ops.contract import DENSE, PAGED, RAGGED, MLADecodeCall
from tilegym.utils import capturing, cdiv, multiprocessor_count


@dataclass(frozen=True)
class ScheduleShape:
    """The host-side sizes of a schedule: fixed for a plan, whatever the lengths."""

    batch: int
    block_n: int  # tokens per block: the unit of work
    programs: int  # pieces the block line is cut into (per head group)
    min_blocks: int  # fewest blocks per piece
    fixed_blocks: int | None  # blocks per piece when the caller fixes kv_len_per_split
    snap: float = 0.0  # how much longer a piece may get so that no piece cuts a row (0: never)
    segment_cost: int = 0  # a segment's fixed start, in blocks: pieces are balanced in blocks + starts

    @property
    def slots(self) -> int:
        """Work slots: every (piece, row) overlap has one (its partial output, when it needs one)."""
        return self.programs + self.batch - 1


def default_programs(call: MLADecodeCall, programs_per_sm: int, head_groups: int) -> int:
    """Pieces per head group so that all head groups together fill ``programs_per_sm`` per SM."""
    return max(1, multiprocessor_count(call.device) * programs_per_sm // max(1, head_groups))


def most_blocks(call: MLADecodeCall, block_n: int) -> int:
    """An upper bound of the step's total blocks, known on the host (no device read)."""
    if call.layout == RAGGED:
        return cdiv(call.kv_indices.numel() * call.page_size, block_n) + call.batch
    return call.batch * cdiv(call.seq_len, block_n)


def fewest_blocks_per_piece(call: MLADecodeCall, block_n: int, pieces_per_row: int) -> int:
    """A ``min_blocks`` that cuts a row of average length into at most ``pieces_per_row`` pieces
    (host-known sizes only): each piece pays a fixed start and a partial for the combine, which
    dominate when few long rows are spread over every SM."""
    return max(1, most_blocks(call, block_n) // max(1, call.batch) // pieces_per_row)


def schedule_shape(
    call: MLADecodeCall,
    *,
    block_n: int,
    programs_per_sm: int,
    head_groups: int,
    min_blocks: int = 1,
    snap: float = 0.0,
    segment_cost_tokens: int = 0,
) -> ScheduleShape:
    """The schedule sizes for ``call``: balanced pieces, or fixed ones of ``call.kv_len_per_split``.
    ``segment_cost_tokens``: a segment's fixed start as the tokens a program streams in that time."""
    if call.kv_len_per_split is None:
        programs = default_programs(call, programs_per_sm, head_groups)
        cost = round(segment_cost_tokens / block_n)
        return ScheduleShape(call.batch, block_n, programs, min_blocks, None, snap, cost)
    fixed = cdiv(call.kv_len_per_split, block_n)
    return ScheduleShape(call.batch, block_n, max(1, cdiv(most_blocks(call, block_n), fixed)), fixed, fixed)


def most_row_tokens(call: MLADecodeCall) -> int:
    """A host-known bound of any one row's tokens (ragged: every page of the cache's index)."""
    if call.layout == RAGGED:
        return call.kv_indices.numel() * call.page_size
    return call.seq_len


def row_capacity(call: MLADecodeCall) -> int | torch.Tensor:
    """Most tokens each row can hold: an int for dense and paged caches, a [B] tensor for ragged."""
    if call.layout != RAGGED:
        return call.seq_len
    nnz = call.kv_indices.numel()
    starts = call.kv_indptr[:-1].clamp(0, nnz)
    ends = torch.maximum(call.kv_indptr[1:].clamp(0, nnz), starts)
    return (ends - starts) * call.page_size


def snapped_sizes(row_blocks: torch.Tensor, balanced: torch.Tensor, snap: float) -> torch.Tensor:
    """Elementwise: a piece size of at least ``balanced`` that cuts rows of L = ``row_blocks`` blocks only
    into equal segments, whole rows (the smallest ``m * L``) or, for ``k = L // balanced``, ``L / k`` when
    k divides L; kept if at most ``1 + snap`` times ``balanced``, else 0 (keep the balanced size).
    Integer tensors; device ops only."""
    rows, per = row_blocks.long(), balanced.long().clamp(min=1)
    whole = torch.div(per + rows - 1, rows.clamp(min=1), rounding_mode="floor") * rows
    cuts = torch.div(rows, per, rounding_mode="floor").clamp(min=1)
    parts = torch.where(rows % cuts == 0, torch.div(rows, cuts, rounding_mode="floor"), 0)
    candidate = torch.where(per >= rows, whole, parts)
    fits = (rows > 0) & (candidate >= per) & (candidate.double() <= per.double() * (1 + snap))
    return torch.where(fits, candidate, 0)


def snap_table(shape: ScheduleShape, most_row_blocks: int, device: torch.device) -> torch.Tensor:
    """``snapped_sizes`` for every row length L in 0..most_row_blocks when all ``shape.batch`` rows have
    L blocks (the balanced size is then known from L alone), built on the device (capturable): a
    refresh looks its rows' length up here instead of computing the rule with a dozen device ops."""
    rows = torch.arange(most_row_blocks + 1, device=device)
    balanced = torch.div(shape.batch * rows + shape.programs - 1, shape.programs, rounding_mode="floor")
    return snapped_sizes(rows, balanced.clamp(min=shape.min_blocks), shape.snap).to(torch.int32)


SNAP_TABLES_KEPT = 16
_snap_tables: dict[tuple, torch.Tensor] = {}


def shared_snap_table(shape: ScheduleShape, most_row_blocks: int, device: torch.device) -> torch.Tensor:
    """``snap_table``, built once per (shape, device) and shared by the plans made for it (every layer
    of a step plans the same shapes; building it takes about 15 small device ops). The kernels only
    read it. A table built during CUDA-graph capture belongs to the graph's pool, so it is not kept."""
    if capturing(device):
        return snap_table(shape, most_row_blocks, device)
    key = (shape.batch, shape.programs, shape.min_blocks, shape.snap, most_row_blocks, device)
    table = _snap_tables.get(key)
    if table is None:
        if len(_snap_tables) >= SNAP_TABLES_KEPT:
            _snap_tables.pop(next(iter(_snap_tables)))
        table = _snap_tables[key] = snap_table(shape, most_row_blocks, device)
    return table


def schedule_kernel_usable(device: torch.device) -> bool:
    """True when the one-launch schedule kernel can build schedules on ``device`` (a GPU, Triton)."""
    return device.type == "cuda" and importlib.util.find_spec("triton") is not None


class SplitSchedule:
    """The device tensors of a schedule (int32) and the host sizes they were built for.

    ``refresh`` runs on the host's critical path (an eager call without a plan refreshes every call;
    a captured graph replays what it launched), so on a GPU it is one Triton launch; the torch ops
    (``refresh_by_ops``) work in int32 throughout and write with ``out=``."""

    def __init__(self, call: MLADecodeCall, shape: ScheduleShape) -> None:
        self.shape = shape
        self._call = call
        device = call.device
        self.lens = torch.empty(shape.batch, dtype=torch.int32, device=device)
        self.cum_blocks = torch.zeros(shape.batch + 1, dtype=torch.int32, device=device)
        self.piece_bounds = torch.empty(shape.programs + 1, dtype=torch.int32, device=device)
        self.piece_rows = torch.empty((2, shape.programs), dtype=torch.int32, device=device)
        self.row_pieces = torch.empty((2, shape.batch), dtype=torch.int32, device=device)
        self._cuts = torch.arange(shape.programs + 1, dtype=torch.int32, device=device)
        self._starts = torch.zeros(shape.batch + 1, dtype=torch.int32, device=device)  # non-empty rows before b
        self._units = torch.empty(shape.batch + 1, dtype=torch.int32, device=device)
        # Views of the buffers above, made once: a refresh rewrites the buffers in place.
        self._row_begins, self._row_ends = self.cum_blocks[:-1], self.cum_blocks[1:]
        self._total = self.cum_blocks[-1:]
        self._piece_begins, self._piece_ends = self.piece_bounds[:-1], self.piece_bounds[1:]
        self._snap_table = None
        if shape.snap > 0 and shape.fixed_blocks is None:
            self._snap_table = shared_snap_table(shape, cdiv(most_row_tokens(call), shape.block_n), device)
        self._launch = self.kernel_launch() if schedule_kernel_usable(device) else None
        self.refresh()

    def refresh(self) -> None:
        """Recompute every tensor in place from the call's current ``kv_lens`` (and page ranges)."""
        if self._launch is not None:
            self._launch()
        else:
            self.refresh_by_ops()

    def kernel_launch(self, **outputs: torch.Tensor) -> Callable[[], None] | None:
        """A launch of the schedule kernel for this schedule, writing into its own tensors or, for a
        test, into those named in ``outputs`` (``lens``, ``cum_blocks``, ``piece_bounds``, ``piece_rows``,
        ``row_pieces``). None when the kernel cannot be launched yet (``schedule_launch``)."""
        from tilegym.ops.triton.schedule_kernel import schedule_launch

        names = ("lens", "cum_blocks", "piece_bounds", "piece_rows", "row_pieces")
        tensors = {name: outputs.get(name, getattr(self, name)) for name in names}
        units = self._units if not outputs else torch.empty_like(self._units)
        return schedule_launch(self._call, self.shape, self._snap_table, units=units, **tensors)

    def refresh_by_ops(self) -> None:
        """``refresh`` with torch ops (any device; the definition the kernel is tested against)."""
        call, shape = self._call, self.shape
        capacity = row_capacity(call)
        if call.kv_lens is None:
            self.lens.fill_(call.seq_len)
        elif isinstance(capacity, int):
            torch.clamp(call.kv_lens, 0, capacity, out=self.lens)
        else:
            torch.minimum(call.kv_lens.clamp(min=0), capacity, out=self.lens)
        blocks = torch.div(self.lens + (shape.block_n - 1), shape.block_n, rounding_mode="floor")
        torch.cumsum(blocks, 0, dtype=torch.int32, out=self._row_ends)
        total = self._total
        if shape.fixed_blocks is not None:
            bounds = self._cuts * shape.fixed_blocks
        else:
            per = torch.div(total + (shape.programs - 1), shape.programs, rounding_mode="floor")
            bounds = self._cuts * per.clamp_(min=shape.min_blocks)
            if shape.segment_cost > 0 or self._snap_table is not None:
                least, most = torch.aminmax(blocks)
                equal_rows = least == most
            if shape.segment_cost > 0:  # equal rows: equal blocks already cost each piece alike
                bounds = torch.where(equal_rows, bounds, self._equal_cost_bounds(blocks))
            if self._snap_table is not None:  # rows all of L blocks: the table's size for L, if any
                row_blocks = torch.where(equal_rows, most, 0).view(1)  # 0: unequal rows, no snap
                snapped = torch.index_select(self._snap_table, 0, row_blocks)  # no host sync
                bounds = torch.where(snapped > 0, self._cuts * snapped, bounds)
        torch.minimum(bounds, total, out=self.piece_bounds)
        self._rows_of_pieces()

    def _equal_cost_bounds(self, blocks: torch.Tensor) -> torch.Tensor:
        """Cuts of equal units (``segment_cost`` per non-empty row, then its blocks), as blocks. A cut
        that falls in a row's start units moves to the row's first block."""
        shape, cum, units = self.shape, self.cum_blocks, self._units
        cost = shape.segment_cost
        torch.cumsum(blocks > 0, 0, dtype=torch.int32, out=self._starts[1:])
        torch.add(cum, self._starts, alpha=cost, out=units)  # where each row's start units begin
        line = units[-1:]
        per = torch.div(line + (shape.programs - 1), shape.programs, rounding_mode="floor")
        cuts = torch.minimum(self._cuts * per.clamp_(min=shape.min_blocks + cost), line)
        row = torch.searchsorted(units[1:-1], cuts, right=True, out_int32=True)  # the row holding each cut
        into_row = cuts - cost - units[row]  # an empty row clamps to 0 below, as does a cut in start units
        return cum[row] + torch.minimum(into_row.clamp_(min=0), blocks[row])

    def _rows_of_pieces(self) -> None:
        """``piece_rows`` (the rows each piece meets) and ``row_pieces`` (the pieces each row meets):
        the row holding a block is the number of row ends at or before it, and likewise for pieces."""
        shape = self.shape
        row_begins, row_ends = self._row_begins, self._row_ends
        starts, ends = self._piece_begins, self._piece_ends
        first_row, first_piece = self.piece_rows[0], self.row_pieces[0]
        torch.searchsorted(row_ends, starts, right=True, out_int32=True, out=first_row)
        first_row.clamp_(max=shape.batch - 1)
        last_row = torch.searchsorted(row_ends, ends - 1, right=True, out_int32=True)
        torch.where(starts < ends, last_row, first_row - 1, out=self.piece_rows[1])
        torch.searchsorted(ends, row_begins, right=True, out_int32=True, out=first_piece)
        first_piece.clamp_(max=shape.programs - 1)
        last_piece = torch.searchsorted(ends, row_ends - 1, right=True, out_int32=True)
        torch.where(row_begins < row_ends, last_piece, first_piece - 1, out=self.row_pieces[1])


def layout_code(layout: str) -> int:
    """The integer the kernels take for a layout."""
    return {DENSE: 0, PAGED: 1, RAGGED: 2}[layout]


def segments_on_host(schedule: SplitSchedule) -> list[tuple[int, int, int, int]]:
    """(slot, row, first block, end block) of every non-empty segment, in the kernels' walk order.

    Reads the schedule back to the host (a sync): for tests.
    """
    cum = schedule.cum_blocks.cpu().tolist()
    bounds = schedule.piece_bounds.cpu().tolist()
    first, last = schedule.piece_rows.cpu().tolist()
    found = []
    for piece in range(schedule.shape.programs):
        for row in range(first[piece], last[piece] + 1):
            lo, hi = max(bounds[piece], cum[row]), min(bounds[piece + 1], cum[row + 1])
            if lo < hi:
                found.append((piece + row, row, lo - cum[row], hi - cum[row]))
    return found
