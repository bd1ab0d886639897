"""Emulated ``aiter.get_mla_metadata_info_v1`` / ``aiter.get_mla_metadata_v1``.

The schedule follows aiter's documented layout: ``work_info_set`` rows of 8 int32
(bs_index, partial_index (-1: no split), q_start, q_end, kv_start, kv_end (pages, global
positions in kv_indices), kv_offset, pad), ``work_indptr`` per CU, reduce groups in
``reduce_indptr`` / ``reduce_final_map`` / ``reduce_partial_map``, and ``work_meta_data``
holding the addresses of work_indptr and work_info_set. The emulated decode reads the KV
ranges from this schedule, as the real kernel does, so stale metadata gives wrong results.

Simplifications (the adapter's use only): dense (not sparse), fast mode, no intra-batch
mode; one reduce tile per batch row holds all its heads and query tokens; a row is cut
into splits of a whole number of ``kv_granularity`` units so the work spreads over the
emulated CUs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from tilegym.utils import cdiv, round_up

if TYPE_CHECKING:
    from aiter_emulation.state import EmulatedAiter


def metadata_info(
    state: EmulatedAiter,
    batch_size: int,
    max_seqlen_qo: int,
    num_head_qo: int,
    q_dtype: torch.dtype,
    kv_dtype: torch.dtype,
    is_sparse: bool,
    fast_mode: bool = True,
    num_kv_splits: int = 32,
    intra_batch_mode: bool = False,
) -> list[tuple[object, torch.dtype]]:
    """Shapes and dtypes of the six metadata buffers (1-D shapes as plain ints, as aiter returns them)."""
    assert num_head_qo % 16 == 0, f"num_head_qo={num_head_qo} must be a multiple of 16"
    if is_sparse or not fast_mode or intra_batch_mode:
        raise NotImplementedError("the emulation covers dense fast-mode metadata only")
    state.info_calls += 1
    max_splits = state.cu_num
    max_work = batch_size + max_splits - 1
    return [
        (2, torch.uint64),  # work_meta_data
        (max_splits + 1, torch.int32),  # work_indptr
        ((max_work, 8), torch.int32),  # work_info_set
        (batch_size + 1, torch.int32),  # reduce_indptr
        ((batch_size, 2), torch.int32),  # reduce_final_map
        (max_work, torch.int32),  # reduce_partial_map
    ]


def _check_index(name: str, t: object, length: int | None, device: torch.device) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1 or not t.is_contiguous():
        raise RuntimeError(f"{name} must be a contiguous 1-D int32 tensor, got {t!r}")
    if length is not None and t.numel() != length:
        raise RuntimeError(f"{name} must have {length} elements, got {t.numel()}")
    if t.device != device:
        raise RuntimeError(f"{name} must be on {device}, got {t.device}")
    return t


def _check_buffers(buffers: dict[str, torch.Tensor], expected: list[tuple[object, torch.dtype]]) -> None:
    for (name, t), (shape, dtype) in zip(buffers.items(), expected, strict=True):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype != dtype:
            got = (tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else type(t).__name__
            raise RuntimeError(f"{name} must be {dtype} of shape {shape} (get_mla_metadata_info_v1), got {got}")
        if not t.is_contiguous():
            raise RuntimeError(f"{name} must be contiguous")


def row_page_counts(kv_indptr: torch.Tensor, kv_last_page_lens: torch.Tensor, page_size: int) -> list[int]:
    """Pages per row, checking the documented invariants of kv_indptr and kv_last_page_lens."""
    ptr = kv_indptr.tolist()
    if ptr[0] != 0 or any(b < a for a, b in zip(ptr, ptr[1:], strict=False)):
        raise RuntimeError(f"kv_indptr must start at 0 and never decrease, got {ptr}")
    pages = [b - a for a, b in zip(ptr, ptr[1:], strict=False)]
    for n, last in zip(pages, kv_last_page_lens.tolist(), strict=True):
        if n > 0 and not 1 <= last <= page_size:
            raise RuntimeError(f"kv_last_page_lens must be in [1, page_size={page_size}] for rows with pages")
    return pages


def _cut_rows(pages: list[int], starts: list[int], unit: int, cu_num: int, cap: int) -> list[list[tuple[int, int]]]:
    """Per row, the [start, end) page ranges of its splits."""
    chunk = max(unit, round_up(cdiv(sum(pages), cu_num), unit))
    ranges = []
    for n, start in zip(pages, starts, strict=True):
        splits = cdiv(n, chunk)
        if cap > 0 and splits > cap:
            splits = cap
        size = round_up(cdiv(n, splits), unit) if splits else 0
        ranges.append([(start + a, start + min(a + size, n)) for a in range(0, n, size)] if n else [])
    return ranges


def build_metadata(
    state: EmulatedAiter,
    seqlens_qo_indptr: torch.Tensor,
    seqlens_kv_indptr: torch.Tensor,
    kv_last_page_lens: torch.Tensor,
    num_heads_per_head_k: int,
    num_heads_k: int,
    is_causal: bool,
    work_metadata: torch.Tensor,
    work_info_set: torch.Tensor,
    work_indptr: torch.Tensor,
    reduce_indptr: torch.Tensor,
    reduce_final_map: torch.Tensor,
    reduce_partial_map: torch.Tensor,
    page_size: int = 1,
    kv_granularity: int = 16,
    max_seqlen_qo: int = -1,
    uni_seqlen_qo: int = -1,
    fast_mode: bool = True,
    topk: int = -1,
    max_split_per_batch: int = -1,
    intra_batch_mode: bool = False,
    dtype_q: torch.dtype | None = None,
    dtype_kv: torch.dtype | None = None,
) -> None:
    """Fill the six buffers with a schedule for these lengths (what the real GPU kernel does)."""
    device = seqlens_qo_indptr.device
    batch = seqlens_qo_indptr.numel() - 1
    _check_index("seqlens_qo_indptr", seqlens_qo_indptr, None, device)
    _check_index("seqlens_kv_indptr", seqlens_kv_indptr, batch + 1, device)
    _check_index("kv_last_page_lens", kv_last_page_lens, batch, device)
    if num_heads_k != 1:
        raise RuntimeError(f"only num_heads_k == 1 is supported, got {num_heads_k}")
    if page_size < 1 or page_size & (page_size - 1):
        raise RuntimeError(f"page_size must be a power of two, got {page_size}")
    if topk != -1 or intra_batch_mode or not fast_mode:
        raise NotImplementedError("the emulation covers dense fast-mode metadata only")
    q_dtype = dtype_q if dtype_q is not None else torch.bfloat16
    kv_dtype = dtype_kv if dtype_kv is not None else torch.bfloat16
    expected = metadata_info(state, batch, max(1, max_seqlen_qo), num_heads_per_head_k, q_dtype, kv_dtype, False)
    state.info_calls -= 1  # the check above is not a caller's query
    buffers = {
        "work_metadata": work_metadata,
        "work_indptr": work_indptr,
        "work_info_set": work_info_set,
        "reduce_indptr": reduce_indptr,
        "reduce_final_map": reduce_final_map,
        "reduce_partial_map": reduce_partial_map,
    }
    _check_buffers(buffers, expected)

    qo = seqlens_qo_indptr.tolist()
    starts = seqlens_kv_indptr.tolist()[:-1]
    pages = row_page_counts(seqlens_kv_indptr, kv_last_page_lens, page_size)
    unit = max(1, kv_granularity // page_size)
    ranges = _cut_rows(pages, starts, unit, state.cu_num, max_split_per_batch)

    works, partials, group_ptr, final_map = [], [], [0], []
    for b, row in enumerate(ranges):
        split = len(row) > 1
        for kv_start, kv_end in row:
            partial = len(partials) if split else -1
            if split:
                partials.append(partial)
            row_end = starts[b] + pages[b]
            works.append([b, partial, qo[b], qo[b + 1], kv_start, kv_end, row_end - kv_end, 0])
        group_ptr.append(len(partials))
        final_map.append([qo[b], qo[b + 1]])
    if len(works) > work_info_set.shape[0] or len(partials) > reduce_partial_map.numel():
        raise RuntimeError("schedule exceeds the buffers sized by get_mla_metadata_info_v1")

    cu = state.cu_num
    work_indptr.copy_(torch.tensor([c * len(works) // cu for c in range(cu + 1)], dtype=torch.int32))
    work_info_set.fill_(-(2**30))  # unused rows: poison
    if works:
        work_info_set[: len(works)] = torch.tensor(works, dtype=torch.int32)
    reduce_indptr.copy_(torch.tensor(group_ptr, dtype=torch.int32))
    reduce_final_map.copy_(torch.tensor(final_map, dtype=torch.int32))
    reduce_partial_map.fill_(-1)
    if partials:
        reduce_partial_map[: len(partials)] = torch.tensor(partials, dtype=torch.int32)
    work_metadata.copy_(torch.tensor([work_indptr.data_ptr(), work_info_set.data_ptr()], dtype=torch.uint64))
    state.metadata_builds += 1
    state.last_schedule = works
