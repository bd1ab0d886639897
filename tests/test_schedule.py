"""The split schedule: every block of every row computed exactly once, pieces balanced, slots unique."""

from __future__ import annotations

import pytest
import torch

from tilegym.ops.contract import validate_mla_decoding
from tilegym.ops.schedule import (
    ScheduleShape,
    SplitSchedule,
    fewest_blocks_per_piece,
    schedule_shape,
    segments_on_host,
    snap_table,
    snapped_sizes,
)
from tilegym.testing import make_mla_inputs, to_pages
from tilegym.utils import cdiv


def build(
    lens: list[int],
    seq_len: int,
    *,
    programs: int,
    block_n: int = 16,
    fixed: int | None = None,
    snap: float = 0.0,
    segment_cost: int = 0,
    min_blocks: int | None = None,
):
    x = make_mla_inputs(len(lens), 16, seq_len, 32, 16, dtype=torch.float16, kv_lens=lens)
    call = validate_mla_decoding(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens)
    least = min_blocks or fixed or 1
    return SplitSchedule(call, ScheduleShape(len(lens), block_n, programs, least, fixed, snap, segment_cost))


def piece_sizes(schedule: SplitSchedule) -> list[int]:
    bounds = schedule.piece_bounds.tolist()
    assert bounds == sorted(bounds) and bounds[0] == 0
    return [end - start for start, end in zip(bounds, bounds[1:], strict=False)]


def longest_piece(schedule: SplitSchedule) -> int:
    return max(piece_sizes(schedule))


def check_cover(schedule: SplitSchedule, lens: list[int], block_n: int) -> list[tuple[int, int, int, int]]:
    """Segments tile each row's blocks exactly once, in order, in the consecutive slots the combine
    reads (row_pieces), and every block of the line is in some piece."""
    segments = segments_on_host(schedule)
    per = longest_piece(schedule)
    assert schedule.piece_bounds[-1].item() == sum(cdiv(n, block_n) for n in lens)
    first_piece, last_piece = schedule.row_pieces.tolist()
    assert schedule.lens.tolist() == lens
    for b, n in enumerate(lens):
        mine = [(slot, lo, hi) for slot, row, lo, hi in segments if row == b]
        blocks = cdiv(n, block_n)
        covered = [i for _, lo, hi in mine for i in range(lo, hi)]
        assert covered == list(range(blocks)), (b, mine)
        slots = [slot for slot, _, _ in mine]
        assert slots == list(range(first_piece[b] + b, last_piece[b] + b + 1)), (b, slots)
        assert all(hi - lo <= per for _, lo, hi in mine)
    assert len({slot for slot, *_ in segments}) == len(segments)
    assert max((slot for slot, *_ in segments), default=0) < schedule.shape.slots
    return segments


@pytest.mark.parametrize("seed", range(6))
def test_random_lengths_are_covered_and_balanced(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    batch = int(torch.randint(1, 40, (1,), generator=g))
    seq_len = int(torch.randint(1, 600, (1,), generator=g))
    lens = torch.randint(0, seq_len + 1, (batch,), generator=g).tolist()
    programs = int(torch.randint(1, 50, (1,), generator=g))
    schedule = build(lens, seq_len, programs=programs)
    segments = check_cover(schedule, lens, 16)
    total = sum(cdiv(n, 16) for n in lens)
    per = max(1, cdiv(total, programs))
    assert piece_sizes(schedule) == [max(0, min(per, total - p * per)) for p in range(programs)]
    load = {}
    for slot, row, lo, hi in segments:
        load[slot - row] = load.get(slot - row, 0) + hi - lo
    assert all(work <= per for work in load.values())  # no piece does more than its share


def piece_costs(segments: list[tuple[int, int, int, int]], segment_cost: int) -> dict[int, int]:
    """Each piece's blocks plus ``segment_cost`` per segment: what a schedule with that cost balances."""
    costs: dict[int, int] = {}
    for slot, row, lo, hi in segments:
        costs[slot - row] = costs.get(slot - row, 0) + hi - lo + segment_cost
    return costs


@pytest.mark.parametrize("seed", range(8))
def test_a_segment_cost_balances_blocks_plus_starts(seed: int) -> None:
    g = torch.Generator().manual_seed(100 + seed)
    batch = int(torch.randint(1, 60, (1,), generator=g))
    seq_len = int(torch.randint(40, 2000, (1,), generator=g))
    lens = torch.randint(0, seq_len + 1, (batch,), generator=g).tolist()
    lens[0], lens[-1] = seq_len, 1  # unequal rows (equal ones keep equal blocks)
    programs = int(torch.randint(1, 70, (1,), generator=g))
    cost = int(torch.randint(1, 8, (1,), generator=g))
    min_blocks = int(torch.randint(1, 4, (1,), generator=g))
    schedule = build(lens, seq_len, programs=programs, segment_cost=cost, min_blocks=min_blocks)
    segments = check_cover(schedule, lens, 16)
    units = sum(cdiv(n, 16) + cost for n in lens if n > 0)
    per = max(cdiv(units, programs), min_blocks + cost)
    # A piece's units hold its blocks and the starts of the rows that begin in it; its own first
    # segment may start inside a row, which it pays for without units: at most one cost more.
    assert max(piece_costs(segments, cost).values(), default=0) <= per + cost


def test_a_segment_cost_leaves_equal_rows_in_equal_blocks() -> None:
    """64 equal rows halved by 128 pieces: counting a start per row would shorten every piece that
    begins a row and lengthen the one after it; equal rows keep equal blocks (one start per piece)."""
    lens = [64 * 16] * 64
    assert build(lens, 64 * 16, programs=128, segment_cost=4).piece_bounds.tolist() == list(range(0, 4097, 32))


def test_a_segment_cost_ends_pieces_at_row_ends_when_that_is_cheaper() -> None:
    """Rows of 1, 2 and 6 blocks in 2 pieces, with starts of 3 blocks: equal blocks (5 | 4) leave piece 0
    three segments (cost 5 + 9 = 14); equal units (9 | 9) cut at row 2's start: 3 + 6 and 6 + 3."""
    lens = [16, 32, 96]
    assert build(lens, 96, programs=2).piece_bounds.tolist() == [0, 5, 9]
    weighed = build(lens, 96, programs=2, segment_cost=3)
    assert weighed.piece_bounds.tolist() == [0, 3, 9]
    assert piece_costs(check_cover(weighed, lens, 16), 3) == {0: 9, 1: 9}


@pytest.mark.parametrize(
    ("batch", "row_blocks", "programs", "snap", "per"),
    [
        (64, 64, 66, 1 / 32, 64),  # balanced 63 blocks cut every row; one row per piece is 1.6% more
        (128, 128, 66, 1 / 32, 256),  # balanced 249; two whole rows per piece is 2.8% more
        (64, 64, 132, 1 / 32, 32),  # balanced 32 already halves every row
        (64, 60, 100, 1 / 32, 39),  # balanced 39 cuts rows unevenly; whole rows (60) are 54% more: kept
        (10, 60, 9, 1 / 32, 67),  # balanced 67; whole rows (120) far more: kept
        (64, 64, 66, 0.0, 63),  # snap 0: balanced, as before
    ],
)
def test_snap_keeps_rows_whole_when_it_costs_little(batch, row_blocks, programs, snap, per) -> None:
    lens = [row_blocks * 16] * batch
    schedule = build(lens, row_blocks * 16, programs=programs, snap=snap)
    assert longest_piece(schedule) == per
    segments = check_cover(schedule, lens, 16)
    balanced = cdiv(batch * row_blocks, programs)
    if per != balanced:  # snapped: every row in one segment, or in equal ones
        assert all((hi - lo) in (row_blocks, per) for _, _, lo, hi in segments)


def test_snapped_sizes_cut_rows_evenly_and_cost_little() -> None:
    g = torch.Generator().manual_seed(3)
    for snap in (0.0, 1 / 32, 0.2):
        rows = torch.randint(0, 300, (4000,), generator=g)
        balanced = torch.randint(1, 300, (4000,), generator=g)
        sizes = snapped_sizes(rows, balanced, snap)
        for n, per, size in zip(rows.tolist(), balanced.tolist(), sizes.tolist(), strict=True):
            if size == 0:  # kept balanced: whole rows cost too much, and L / (L // per) did too or is uneven
                k = n // per
                uneven = k == 0 or n % k != 0 or n // k > per * (1 + snap)
                assert n == 0 or (-(-per // n) * n > per * (1 + snap) and (per >= n or uneven)), (n, per, snap)
                continue
            assert per <= size <= per * (1 + snap), (n, per, snap, size)
            assert size % n == 0 or n % size == 0, (n, per, snap, size)


def test_plans_of_one_shape_share_their_snap_table() -> None:
    """Every layer's plan of one shape reads the same (read-only) table, built once; another shape
    gets its own, and each equals a table built afresh."""
    first = build([160] * 6, 160, programs=5, snap=0.3)
    second = build([160] * 6, 160, programs=5, snap=0.3)
    other = build([160] * 6, 160, programs=7, snap=0.3)
    assert first._snap_table is second._snap_table
    assert other._snap_table is not first._snap_table
    for schedule in (first, other):
        assert torch.equal(schedule._snap_table, snap_table(schedule.shape, 10, torch.device("cpu")))


@pytest.mark.parametrize("seed", range(4))
def test_snap_leaves_unequal_rows_balanced(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 400, (int(torch.randint(2, 40, (1,), generator=g)),), generator=g).tolist()
    lens[0] = 400  # at least two lengths
    lens[1] = 1
    schedule = build(lens, 400, programs=int(torch.randint(1, 50, (1,), generator=g)), snap=0.5)
    programs = schedule.shape.programs
    total = sum(cdiv(n, 16) for n in lens)
    assert longest_piece(schedule) == min(total, max(1, cdiv(total, programs)))
    check_cover(schedule, lens, 16)


def test_lengths_are_clamped_and_empty_rows_own_no_segment() -> None:
    schedule = build([0, 999, -4, 40], 64, programs=3)
    segments = check_cover(schedule, [0, 64, 0, 40], 16)
    assert {row for _, row, _, _ in segments} == {1, 3}


def test_a_fixed_split_length_cuts_every_row_alike() -> None:
    x = make_mla_inputs(3, 16, 100, 32, 16, dtype=torch.float16, kv_lens=[100, 5, 64])
    call = validate_mla_decoding(x.q, x.qpe, x.kv, x.kpe, kv_len_per_split=40, kv_lens=x.kv_lens)
    shape = schedule_shape(call, block_n=16, programs_per_sm=1, head_groups=1)
    assert shape.fixed_blocks == 3 and shape.programs == cdiv(3 * cdiv(100, 16), 3)
    schedule = SplitSchedule(call, shape)
    assert piece_sizes(schedule) == [3] * 4 + [0] * (shape.programs - 4)  # 7 + 1 + 4 blocks
    check_cover(schedule, [100, 5, 64], 16)


def test_refresh_follows_lengths_in_place() -> None:
    schedule = build([10, 20], 64, programs=4)
    buffers = [t.data_ptr() for t in (schedule.lens, schedule.cum_blocks, schedule.piece_rows)]
    schedule._call.kv_lens.copy_(torch.tensor([64, 0], dtype=torch.int32))
    schedule.refresh()
    assert buffers == [t.data_ptr() for t in (schedule.lens, schedule.cum_blocks, schedule.piece_rows)]
    assert schedule.lens.tolist() == [64, 0]
    check_cover(schedule, [64, 0], 16)


def test_ragged_rows_are_clamped_to_their_pages() -> None:
    x = make_mla_inputs(2, 16, 64, 32, 16, dtype=torch.float16, kv_lens=[64, 30])
    pages = to_pages(x, 16)
    lens = torch.tensor([64, 60], dtype=torch.int32)  # row 1 owns 2 pages (32 tokens) only
    call = validate_mla_decoding(
        x.q,
        x.qpe,
        pages.kv,
        pages.kpe,
        kv_lens=lens,
        kv_indptr=pages.kv_indptr,
        kv_indices=pages.kv_indices,
        host_checks=False,
    )
    schedule = SplitSchedule(call, ScheduleShape(2, 16, 4, 1, None))
    assert schedule.lens.tolist() == [64, 32]


def test_fewest_blocks_per_piece_caps_the_pieces_of_an_average_row() -> None:
    """One row of 512 blocks in at most 64 pieces -> 8 blocks each; 4 rows of 16 blocks -> 1."""

    def call(batch: int, seq_len: int):
        x = make_mla_inputs(batch, 2, seq_len, 32, 16, dtype=torch.float16)
        return validate_mla_decoding(x.q, x.qpe, x.kv, x.kpe)

    long_row, short_rows = call(1, 32768), call(4, 1024)
    assert fewest_blocks_per_piece(long_row, 64, 64) == 8
    assert fewest_blocks_per_piece(long_row, 64, 16) == 32
    assert fewest_blocks_per_piece(short_rows, 64, 64) == 1
