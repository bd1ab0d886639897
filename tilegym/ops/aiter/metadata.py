"""aiter's page table and persistent-mode schedule for one plan, built on the device.

aiter's MLA decode reads a page table (``kv_indptr`` = cumulative pages per row,
``kv_indices`` = page ids, ``kv_last_page_lens`` = tokens in each row's last page) over a
``kv_buffer`` [pages, page_size, 1, 576], plus a work schedule (``work_*`` / ``reduce_*``)
that ``aiter.get_mla_metadata_v1`` derives from it. Each tilegym layout maps onto that
natively, with no copy of the cache:

- dense [B, S, 576] rows: pages of one token; row b's token t is page ``b * row_pages + t``;
- block table: row b's first ``cdiv(len, page_size)`` entries, compacted;
- ragged page list: row b's first ``cdiv(len, page_size)`` pages of
  ``kv_indices[kv_indptr[b]:]`` (a row may own more pages than its length needs), compacted.

Buffers are allocated once per plan with sizes known on the host (no read of the lengths);
``refresh`` recomputes their contents from ``kv_lens`` with torch ops and reruns aiter's
metadata kernel, all on the device (no synchronisation, capturable). Page ids are clamped
to the cache so a bad table can never make aiter read outside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tilegym.ops.aiter.support import AiterAPI
from tilegym.ops.contract import DENSE, PAGED, MLADecodeCall
from tilegym.utils import cdiv

KV_GRANULARITY = 16  # tokens per unit when the metadata kernel cuts a row into splits
WIDTH = 576  # latent 512 + rope 64: one aiter cache row


@dataclass(frozen=True)
class CacheGeometry:
    """How the call's cache is aiter's kv_buffer: page size, dense row stride in pages, page count."""

    page_size: int
    row_pages: int  # dense only: page-id distance between consecutive batch rows
    num_pages: int
    dense: bool


def cache_reasons(call: MLADecodeCall) -> list[str]:
    """Why the cache cannot be viewed as aiter's kv_buffer without a copy (empty: it can)."""
    if not call.kv_shares_buffer_with_kpe():
        return [
            "aiter reads 576-wide cache rows: kv and kpe must be column views of one [..., 576] buffer "
            "(separately stored kv/kpe would need a copy of the whole cache on every call)"
        ]
    if call.layout == DENSE and call.batch > 1:
        row_stride = call.kv.stride(0)
        if row_stride % WIDTH or row_stride < call.seq_len * WIDTH:
            return [f"aiter needs dense batch rows a whole number of 576-wide tokens apart, got stride {row_stride}"]
    return []


def geometry(call: MLADecodeCall) -> CacheGeometry:
    if call.layout == DENSE:
        row_pages = call.kv.stride(0) // WIDTH if call.batch > 1 else call.seq_len
        return CacheGeometry(1, row_pages, (call.batch - 1) * row_pages + call.seq_len, True)
    return CacheGeometry(call.page_size, 0, call.num_pages, False)


def kv_buffer(kv: torch.Tensor, geo: CacheGeometry) -> torch.Tensor:
    """aiter's kv_buffer [pages, page_size, 1, 576]: a view of the buffer ``kv`` is a column view of."""
    page_stride = WIDTH if geo.dense else kv.stride(0)
    return kv.as_strided((geo.num_pages, geo.page_size, 1, WIDTH), (page_stride, WIDTH, WIDTH, 1))


class AiterMetadata:
    """Page table and persistent schedule for one plan; ``refresh`` follows ``kv_lens``."""

    def __init__(self, api: AiterAPI, call: MLADecodeCall, q_dtype: torch.dtype, max_split_per_batch: int) -> None:
        self.api, self.call = api, call
        self.geo = geometry(call)
        self.max_split_per_batch = max_split_per_batch
        self.q_dtype = q_dtype
        batch, device = call.batch, call.device
        entries = max(1, self._most_entries())
        self.qo_indptr = torch.arange(batch + 1, dtype=torch.int32, device=device)  # one query token per row
        self.kv_indptr = torch.zeros(batch + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(entries, dtype=torch.int32, device=device)
        self.kv_last_page_lens = torch.ones(batch, dtype=torch.int32, device=device)
        self.empty_rows = torch.zeros(batch, dtype=torch.bool, device=device)
        self._slots = torch.arange(entries, dtype=torch.int64, device=device)
        info = api.get_mla_metadata_info_v1(batch, 1, call.heads, q_dtype, call.kv.dtype, False)
        (
            self.work_meta_data,
            self.work_indptr,
            self.work_info_set,
            self.reduce_indptr,
            self.reduce_final_map,
            self.reduce_partial_map,
        ) = (torch.empty(shape, dtype=dtype, device=device) for shape, dtype in info)
        self.refresh()

    def _most_entries(self) -> int:
        c = self.call
        if c.layout == DENSE:
            return c.batch * c.seq_len
        if c.layout == PAGED:
            return c.batch * c.block_table.shape[1]
        return c.kv_indices.numel()

    def _lengths_and_pages(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(tokens, pages, first own page in kv_indices for ragged rows) per row, on the device."""
        c, ps = self.call, self.geo.page_size
        if c.kv_lens is None:
            lens = torch.full((c.batch,), c.seq_len, dtype=torch.int64, device=c.device)
        else:
            lens = c.kv_lens.long().clamp(0, c.seq_len)
        starts = None
        if c.layout == "ragged":
            nnz = c.kv_indices.numel()
            starts = c.kv_indptr[:-1].long().clamp(0, nnz)
            own = torch.maximum(c.kv_indptr[1:].long().clamp(0, nnz), starts) - starts
            lens = torch.minimum(lens, own * ps)
        return lens, torch.div(lens + (ps - 1), ps, rounding_mode="floor"), starts

    def refresh(self) -> None:
        """Recompute the page table and aiter's schedule from the call's current lengths."""
        c, geo = self.call, self.geo
        lens, pages, starts = self._lengths_and_pages()
        self.kv_indptr[1:].copy_(torch.cumsum(pages, 0))
        ends = self.kv_indptr[1:].long()
        row = torch.searchsorted(ends, self._slots, right=True).clamp_(max=c.batch - 1)
        within = self._slots - self.kv_indptr[row].long()
        if c.layout == DENSE:
            ids = row * geo.row_pages + within
        elif c.layout == PAGED:
            ids = c.block_table.long()[row, within.clamp(0, c.block_table.shape[1] - 1)]
        else:
            ids = c.kv_indices.long()[(starts[row] + within).clamp(0, max(0, c.kv_indices.numel() - 1))]
        used = self._slots < ends[-1]
        self.kv_indices.copy_(torch.where(used, ids.clamp(0, geo.num_pages - 1), 0))
        last = lens - (pages - 1) * geo.page_size
        self.kv_last_page_lens.copy_(torch.where(pages > 0, last, geo.page_size))
        self.empty_rows.copy_(lens == 0)
        self.api.get_mla_metadata_v1(
            self.qo_indptr,
            self.kv_indptr,
            self.kv_last_page_lens,
            c.heads,  # query heads per KV head
            1,  # KV heads
            True,  # causal (a no-op for one query token)
            self.work_meta_data,
            self.work_info_set,
            self.work_indptr,
            self.reduce_indptr,
            self.reduce_final_map,
            self.reduce_partial_map,
            page_size=geo.page_size,
            kv_granularity=KV_GRANULARITY,
            max_seqlen_qo=1,
            uni_seqlen_qo=1,
            fast_mode=True,
            max_split_per_batch=self.max_split_per_batch,
            dtype_q=self.q_dtype,
            dtype_kv=c.kv.dtype,
        )

    def decode_kwargs(self) -> dict[str, torch.Tensor]:
        """The persistent-mode keyword arguments of ``mla_decode_fwd``."""
        return {
            "work_meta_data": self.work_meta_data,
            "work_indptr": self.work_indptr,
            "work_info_set": self.work_info_set,
            "reduce_indptr": self.reduce_indptr,
            "reduce_final_map": self.reduce_final_map,
            "reduce_partial_map": self.reduce_partial_map,
        }


def max_split_per_batch(call: MLADecodeCall) -> int:
    """aiter's cap on splits per row: from ``kv_len_per_split``, else -1 (its scheduler balances)."""
    if call.kv_len_per_split is None:
        return -1
    return max(1, cdiv(call.length_hint, call.kv_len_per_split))
