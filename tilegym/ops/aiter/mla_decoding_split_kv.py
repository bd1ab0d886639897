"""Adapter: tilegym's ``mla_decoding_split_kv`` onto ``aiter.mla.mla_decode_fwd`` (persistent mode).

Mapping (``docs/aiter_mla_api.md``):
- q [B,H,512] and qpe [B,H,64] are concatenated into aiter's contiguous q [B,H,576]
  (a copy of B*H*576 elements: small next to the cache).
- The cache becomes aiter's kv_buffer [pages, page_size=1, 1 KV head, 576]. When kv and kpe
  are column views of one [B,S,576] buffer whose rows are whole multiples of 576 elements
  apart (the serving layout, a slice [:, :S] of a longer buffer included), kv_buffer is a
  view of that buffer: no copy. Separately stored kv/kpe are concatenated first, which
  reads and writes the whole cache (2 * B*S*576 elements) on every call.
- kv_lens (clamped to [0, S]) become kv_indptr = cumulative lengths, kv_indices = token ids
  ``b * row_pages + t`` and kv_last_page_lens = 1; ``tilegym.ops.aiter.metadata`` builds
  them and aiter's persistent schedule on the device and caches them (see there).
- sm_scale, return_lse and out (bf16, contiguous: aiter's ``o``) pass straight through;
  aiter has no fp16 kernel, so fp16 inputs get an unsupported-reason.
- Rows of length 0: aiter does not document its output for them, so the adapter writes
  zeros and lse = -inf there afterwards (tilegym's contract), on the device.
- ``kv_len_per_split`` caps the splits per row (aiter's ``max_split_per_batch``);
  ``None`` leaves the split choice to aiter's metadata kernel, which balances the work
  over the GPU's CUs (aiter's scheduler replaces ``plan_splits`` here).

fp8 (DESIGN's optional capability): fp8 kv/kpe (float8_e4m3fn on gfx950, float8_e4m3fnuz
on gfx942) with ``kv_scale`` run aiter's a8w8 kernel. The public op takes no extra
argument: the adapter quantises the packed query per tensor as aiter's users do
(``scale = amax / fp8_max``) and passes q_scale and kv_scale; aiter multiplies the logits
by ``q_scale * kv_scale`` and the output by ``kv_scale``. The query quantisation adds error
beyond the cache's own fp8 rounding.

``splitk_reduce`` is not served by aiter: its ``mla_reduce_v1`` is the second stage of
``mla_decode_fwd``, reading fp32 partials laid out by the metadata's reduce maps, not
tilegym's dense [B,H,N,D] partials with -inf for empty splits; adapting it would mean a
transposing fp32 copy and relying on undocumented map semantics.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from tilegym.ops.aiter import support
from tilegym.ops.aiter.metadata import PAGE_SIZE, MetadataCache, MetadataKey
from tilegym.ops.contract import MLADecodeCall
from tilegym.ops.split_plan import plan_mla_splits

METADATA_CACHE = MetadataCache()


@dataclass(frozen=True)
class PagedCache:
    """The cache as aiter's kv_buffer [pages, 1, 1, D+P] and the page-id stride of a batch row."""

    kv_buffer: torch.Tensor
    row_pages: int


def quantize_per_tensor(t: torch.Tensor, fp8_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(t in fp8, its float32 [1] scale) with ``t ~= t_fp8 * scale``; stays on the device."""
    fp8_max = torch.finfo(fp8_dtype).max
    t = t.float()
    scale = (t.abs().amax().clamp(min=1e-12) / fp8_max).reshape(1)
    return (t / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype), scale


def packed_query(call: MLADecodeCall) -> tuple[torch.Tensor, torch.Tensor | None]:
    """aiter's q [B,H,576] and its q_scale (fp8 path) or None."""
    q = torch.cat((call.q, call.qpe), dim=-1)
    return quantize_per_tensor(q, call.kv.dtype) if call.is_fp8 else (q, None)


def _rows_are_whole_pages(call: MLADecodeCall, width: int) -> bool:
    """True when batch row b starts ``row_pages * width`` elements after row 0 (any batch row stride)."""
    if call.batch == 1:
        return True
    row_stride = call.kv.stride(0)
    return row_stride % width == 0 and row_stride >= call.seq_len * width


def paged_cache(call: MLADecodeCall) -> PagedCache:
    """The cache as kv_buffer: a view of the fused buffer when possible, else a concatenated copy."""
    width = call.head_dim + call.rope_dim
    if call.kv_shares_buffer_with_kpe() and _rows_are_whole_pages(call, width):
        row_pages = call.kv.stride(0) // width if call.batch > 1 else call.seq_len
        pages = (call.batch - 1) * row_pages + call.seq_len
        view = call.kv.as_strided((pages, PAGE_SIZE, 1, width), (width, width, width, 1))
        return PagedCache(view, row_pages)
    fused = torch.cat((call.kv, call.kpe), dim=-1)
    return PagedCache(fused.view(call.batch * call.seq_len, PAGE_SIZE, 1, width), call.seq_len)


def _max_split_per_batch(call: MLADecodeCall) -> int:
    if call.kv_len_per_split is None:
        return -1
    return plan_mla_splits(call, heads_per_program=call.heads).num_splits


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _on_device(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """aiter sizes its buffers from the current device: make it the inputs' device."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def mla_decoding_split_kv(call: MLADecodeCall) -> torch.Tensor | None:
    """Run ``call`` through aiter's persistent MLA decode; writes ``call.out``, returns lse or None."""
    api = support.aiter_api()
    q, q_scale = packed_query(call)
    cache = paged_cache(call)
    key = MetadataKey(
        device=call.device,
        batch=call.batch,
        seq_len=call.seq_len,
        heads=call.heads,
        row_pages=cache.row_pages,
        q_dtype=q.dtype,
        kv_dtype=cache.kv_buffer.dtype,
        max_split_per_batch=_max_split_per_batch(call),
    )
    with (
        _on_device(call.device),
        METADATA_CACHE.checkout(api, key, call.kv_lens, force_rebuild=_capturing(call.device)) as meta,
    ):
        _, lse = api.mla_decode_fwd(
            q,
            cache.kv_buffer,
            call.out,
            meta.qo_indptr,
            meta.kv_indptr,
            meta.kv_indices,
            meta.kv_last_page_lens,
            1,  # max_seqlen_q: one query token per row
            page_size=PAGE_SIZE,
            nhead_kv=1,
            sm_scale=call.sm_scale,
            q_scale=q_scale,
            kv_scale=call.kv_scale,
            return_lse=call.return_lse,
            **meta.decode_kwargs(),
        )
        empty_rows = meta.empty_rows
    if empty_rows is not None:
        call.out.masked_fill_(empty_rows[:, None, None], 0.0)
        if call.return_lse:
            lse.masked_fill_(empty_rows[:, None], float("-inf"))
    return lse if call.return_lse else None
