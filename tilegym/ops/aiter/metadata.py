"""Page table and persistent-mode metadata for aiter's MLA decode, built on the device and cached.

aiter's persistent kernels read a work schedule (``work_*``/``reduce_*`` tensors) that
``aiter.get_mla_metadata_v1`` derives from the per-row KV lengths; the schedule carries the
KV ranges, so it must be rebuilt whenever the lengths change.

Caching, without reading ``kv_lens`` on the host (no synchronisation):
- One entry per shape key (device, B, S, H, page-table row stride, q/kv dtypes, split cap)
  owns every buffer, allocated once with the sizes ``get_mla_metadata_info_v1`` gives.
- Its contents are stamped with the identity of the ``kv_lens`` tensor (weak reference),
  its ``_version`` counter and its data pointer (``None`` = every row full, a constant).
  A call whose stamp matches reuses everything; otherwise the page table is rebuilt with
  torch ops on the device and the metadata kernel rerun into the same buffers.
- Limits: ``_version`` counts in-place torch ops; writes that bypass it (``.data``, DLPack
  or numpy aliases, raw kernels) are not seen, so such callers must pass a fresh tensor.
  A new tensor with equal values is a (correct, slower) miss. During CUDA-graph capture the
  rebuild is always recorded, so graph replays follow kv_lens updates. Buffers are rewritten
  in place: calls sharing a shape must stay on one stream.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from tilegym.ops.aiter.support import AiterAPI

PAGE_SIZE = 1  # one token per page: a [tokens, 576] cache is aiter's kv_buffer as is
KV_GRANULARITY = 16  # tokens per unit when the metadata kernel cuts a row into splits


@dataclass(frozen=True)
class MetadataKey:
    """What the buffers' sizes and the page table's shape depend on."""

    device: torch.device
    batch: int
    seq_len: int
    heads: int
    row_pages: int  # page-id distance between consecutive batch rows of the cache
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    max_split_per_batch: int  # -1: the metadata kernel balances splits over the CUs


class DecodeMetadata:
    """Index tensors and the persistent schedule for one shape; contents follow kv_lens."""

    def __init__(self, api: AiterAPI, key: MetadataKey) -> None:
        self.key = key
        device, batch = key.device, key.batch
        self.qo_indptr = torch.arange(batch + 1, dtype=torch.int32, device=device)  # one query token per row
        self.kv_indptr = torch.zeros(batch + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.empty(batch * key.seq_len, dtype=torch.int32, device=device)
        self.kv_last_page_lens = torch.full((batch,), PAGE_SIZE, dtype=torch.int32, device=device)
        self._slots = torch.arange(batch * key.seq_len, dtype=torch.int32, device=device)
        info = api.get_mla_metadata_info_v1(batch, 1, key.heads, key.q_dtype, key.kv_dtype, False)
        (
            self.work_meta_data,
            self.work_indptr,
            self.work_info_set,
            self.reduce_indptr,
            self.reduce_final_map,
            self.reduce_partial_map,
        ) = (torch.empty(shape, dtype=dtype, device=device) for shape, dtype in info)
        self.empty_rows: torch.Tensor | None = None  # bool [B]; None when every row is full
        self._stamp: tuple[object, ...] | None = None

    @staticmethod
    def stamp_of(kv_lens: torch.Tensor | None) -> tuple[object, ...]:
        if kv_lens is None:
            return ("full",)
        return (kv_lens._version, kv_lens.data_ptr())

    def matches(self, kv_lens: torch.Tensor | None) -> bool:
        if self._stamp is None or self._stamp[1:] != self.stamp_of(kv_lens):
            return False
        owner = self._stamp[0]
        return owner is None if kv_lens is None else owner() is kv_lens

    def rebuild(self, api: AiterAPI, kv_lens: torch.Tensor | None) -> None:
        """Recompute page table and schedule from ``kv_lens`` (clamped to [0, S]) on the device."""
        key = self.key
        if kv_lens is None:
            lengths = torch.full((key.batch,), key.seq_len, dtype=torch.int32, device=key.device)
        else:
            lengths = kv_lens.clamp(0, key.seq_len)
        self.kv_indptr[1:].copy_(torch.cumsum(lengths, dim=0))
        self._fill_page_table()
        api.get_mla_metadata_v1(
            self.qo_indptr,
            self.kv_indptr,
            self.kv_last_page_lens,
            key.heads,  # query heads per KV head
            1,  # KV heads
            True,  # causal (a no-op for one query token)
            self.work_meta_data,
            self.work_info_set,
            self.work_indptr,
            self.reduce_indptr,
            self.reduce_final_map,
            self.reduce_partial_map,
            page_size=PAGE_SIZE,
            kv_granularity=KV_GRANULARITY,
            max_seqlen_qo=1,
            uni_seqlen_qo=1,
            fast_mode=True,
            max_split_per_batch=key.max_split_per_batch,
            dtype_q=key.q_dtype,
            dtype_kv=key.kv_dtype,
        )
        self.empty_rows = None if kv_lens is None else lengths == 0
        self._stamp = (None if kv_lens is None else weakref.ref(kv_lens), *self.stamp_of(kv_lens))

    def _fill_page_table(self) -> None:
        """kv_indices[kv_indptr[b] + t] = b * row_pages + t for t < len_b; unused slots point at page 0."""
        ends = self.kv_indptr[1:]
        row = torch.searchsorted(ends, self._slots, right=True).clamp_(max=self.key.batch - 1)
        pages = row * self.key.row_pages + (self._slots - self.kv_indptr[row])
        self.kv_indices.copy_(torch.where(self._slots < ends[-1], pages, 0))

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


class MetadataCache:
    """Least-recently-used ``DecodeMetadata`` per key; a lock keeps a checkout and its launch together."""

    def __init__(self, capacity: int = 32) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[MetadataKey, DecodeMetadata] = OrderedDict()
        self._lock = threading.RLock()

    @contextlib.contextmanager
    def checkout(
        self, api: AiterAPI, key: MetadataKey, kv_lens: torch.Tensor | None, *, force_rebuild: bool = False
    ) -> Iterator[DecodeMetadata]:
        """Metadata for ``key`` matching ``kv_lens``, held exclusively inside the block."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = DecodeMetadata(api, key)
                while len(self._entries) > self.capacity:
                    self._entries.popitem(last=False)
            self._entries.move_to_end(key)
            if force_rebuild or not entry.matches(kv_lens):
                entry.rebuild(api, kv_lens)
            yield entry

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
