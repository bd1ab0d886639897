"""How to cut the KV sequence into splits: the one heuristic every backend uses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tilegym.utils import cdiv, multiprocessor_count, round_up

if TYPE_CHECKING:
    from tilegym.ops.contract import MLADecodeCall


@dataclass(frozen=True)
class SplitPlan:
    """``num_splits`` splits of ``kv_len_per_split`` tokens (the last may be shorter or empty)."""

    kv_len_per_split: int
    num_splits: int


def plan_splits(
    seq_len: int,
    programs_per_split: int,
    num_sms: int,
    *,
    kv_len_per_split: int | None = None,
    block_n: int = 64,
    programs_per_sm: int = 2,
    min_blocks_per_split: int = 2,
) -> SplitPlan:
    """Choose the split length so that ``programs_per_split * num_splits`` fills the GPU.

    ``programs_per_split``: programs a kernel launches per split (batch x head groups).
    A user-given ``kv_len_per_split`` is honoured as is. Otherwise aim for
    ``programs_per_sm`` programs per SM (never more: rounded down to whole waves), with
    splits of at least ``min_blocks_per_split`` KV blocks of ``block_n`` tokens and a
    length that is a multiple of ``block_n``.
    """
    if kv_len_per_split is not None:
        return SplitPlan(kv_len_per_split, max(1, cdiv(seq_len, kv_len_per_split)))
    # Round down to whole waves: a partial last wave costs as much as a full one.
    target = num_sms * programs_per_sm
    wanted = target // max(1, programs_per_split)
    most = max(1, cdiv(seq_len, block_n * min_blocks_per_split))
    splits = max(1, min(wanted, most))
    length = round_up(cdiv(seq_len, splits), block_n)
    return SplitPlan(length, cdiv(seq_len, length))


def plan_mla_splits(
    call: MLADecodeCall,
    *,
    heads_per_program: int,
    block_n: int = 64,
    programs_per_sm: int = 2,
    min_blocks_per_split: int = 2,
    kv_len_per_split: int | None = None,
) -> SplitPlan:
    """``plan_splits`` for an MLA decode call whose programs each hold ``heads_per_program`` heads
    of one batch row (so a split launches batch x head-group programs). ``kv_len_per_split``
    overrides the call's own value (benchmarks sweep it)."""
    return plan_splits(
        call.seq_len,
        call.batch * cdiv(call.heads, heads_per_program),
        multiprocessor_count(call.device),
        kv_len_per_split=kv_len_per_split or call.kv_len_per_split,
        block_n=block_n,
        programs_per_sm=programs_per_sm,
        min_blocks_per_split=min_blocks_per_split,
    )
