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
    snapped_sizes,
)
from tilegym.testing import make_mla_inputs, to_pages
from tilegym.utils import cdiv


def build(
    lens: list[int], seq_len: int, *, programs: int, block_n: int = 16, fixed: int | None = None, snap: float = 0.0
):
    x = make_mla_inputs(len(lens), 16, seq_len, 32, 16, dtype=torch.float16, kv_lens=lens)
    call = validate_mla_decoding(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens)
    min_blocks = fixed or 1
    return SplitSchedule(call, ScheduleShape(len(lens), block_n, programs, min_blocks, fixed, snap))


def check_cover(schedule: SplitSchedule, lens: list[int], block_n: int) -> list[tuple[int, int, int, int]]:
    """Segments tile each row's blocks exactly once, in order, in consecutive slots."""
    segments = segments_on_host(schedule)
    per = int(schedule.blocks_per_program)
    assert schedule.lens.tolist() == lens
    for b, n in enumerate(lens):
        mine = [(slot, lo, hi) for slot, row, lo, hi in segments if row == b]
        blocks = cdiv(n, block_n)
        covered = [i for _, lo, hi in mine for i in range(lo, hi)]
        assert covered == list(range(blocks)), (b, mine)
        slots = [slot for slot, _, _ in mine]
        assert slots == list(range(slots[0], slots[0] + len(slots))) if slots else True
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
    per = int(schedule.blocks_per_program)
    assert per == max(1, cdiv(total, programs))
    load = {}
    for slot, row, lo, hi in segments:
        load[slot - row] = load.get(slot - row, 0) + hi - lo
    assert all(work <= per for work in load.values())  # no piece does more than its share


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
    assert int(schedule.blocks_per_program) == per
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


@pytest.mark.parametrize("seed", range(4))
def test_snap_leaves_unequal_rows_balanced(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, 400, (int(torch.randint(2, 40, (1,), generator=g)),), generator=g).tolist()
    lens[0] = 400  # at least two lengths
    lens[1] = 1
    schedule = build(lens, 400, programs=int(torch.randint(1, 50, (1,), generator=g)), snap=0.5)
    programs = schedule.shape.programs
    assert int(schedule.blocks_per_program) == max(1, cdiv(sum(cdiv(n, 16) for n in lens), programs))
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
    assert int(schedule.blocks_per_program) == 3
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
