"""How to cut the KV sequence into splits: the one heuristic every backend uses."""

from __future__ import annotations

from dataclasses import dataclass

from tilegym.utils import cdiv, round_up


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
