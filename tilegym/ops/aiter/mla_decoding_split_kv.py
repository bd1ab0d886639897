"""Adapter: tilegym's ``mla_decoding_split_kv`` onto ``aiter.mla.mla_decode_fwd`` (persistent mode).

Mapping (``docs/aiter_mla_api.md``):
- q [B, H, 512] and qpe [B, H, 64] are concatenated into aiter's contiguous q [B, H, 576]
  (a copy of B*H*576 elements: small next to the cache).
- The cache is aiter's kv_buffer [pages, page_size, 1, 576] as a view, never a copy: kv and
  kpe must be column views of one 576-wide buffer (the serving layout; aiter's ``supports``
  reason says so otherwise). Dense rows are pages of one token; block tables and ragged
  page lists keep their page size (``tilegym.ops.aiter.metadata`` builds aiter's page table).
- The page table and aiter's persistent schedule are built in the plan, on the device, and
  rebuilt by ``refresh``; each layer's call only packs q and launches.
- sm_scale, return_lse and out (bf16, contiguous: aiter's ``o``) pass straight through;
  aiter has no fp16 kernel, so fp16 inputs get an unsupported-reason.
- Rows of length 0: aiter does not document its output for them, so the adapter writes
  zeros and lse = -inf there afterwards (tilegym's contract), on the device.
- ``kv_len_per_split`` caps the splits per row (aiter's ``max_split_per_batch``); ``None``
  leaves the split choice to aiter's metadata kernel, which balances the work over the
  GPU's CUs (aiter's scheduler replaces tilegym's here).

fp8 (DESIGN's optional capability): fp8 kv/kpe (float8_e4m3fn on gfx950, float8_e4m3fnuz
on gfx942) with ``kv_scale`` run aiter's a8w8 kernel. The public op takes no extra
argument: the adapter quantises the packed query per tensor as aiter's users do
(``scale = amax / fp8_max``) and passes q_scale and kv_scale; aiter multiplies the logits
by ``q_scale * kv_scale`` and the output by ``kv_scale``. The query quantisation adds error
beyond the cache's own fp8 rounding.

``splitk_reduce`` is not served by aiter: its ``mla_reduce_v1`` is the second stage of
``mla_decode_fwd``, reading fp32 partials laid out by the metadata's reduce maps, not
tilegym's dense [B,H,N,D] partials with -inf for empty splits.
"""

from __future__ import annotations

import contextlib

import torch

from tilegym.ops.aiter import support
from tilegym.ops.aiter.metadata import AiterMetadata, geometry, kv_buffer, max_split_per_batch
from tilegym.ops.contract import MLADecodeCall


def quantize_per_tensor(t: torch.Tensor, fp8_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(t in fp8, its float32 [1] scale) with ``t ~= t_fp8 * scale``; stays on the device."""
    fp8_max = torch.finfo(fp8_dtype).max
    t = t.float()
    scale = (t.abs().amax().clamp(min=1e-12) / fp8_max).reshape(1)
    return (t / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype), scale


def _on_device(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """aiter sizes its buffers from the current device: make it the inputs' device."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


class AiterDecodePlan:
    """aiter's page table, schedule and the packing of each layer's call."""

    def __init__(self, call: MLADecodeCall) -> None:
        self.api = support.aiter_api()
        self.call = call
        self.geo = geometry(call)
        q_dtype = call.kv.dtype if call.is_fp8 else call.q.dtype
        with _on_device(call.device):
            self.meta = AiterMetadata(self.api, call, q_dtype, max_split_per_batch(call))

    def refresh(self) -> None:
        with _on_device(self.call.device):
            self.meta.refresh()

    def run(
        self,
        q: torch.Tensor,
        qpe: torch.Tensor,
        kv: torch.Tensor,
        kpe: torch.Tensor,
        kv_scale: torch.Tensor | None,
        out: torch.Tensor,
        lse: torch.Tensor | None,
    ) -> None:
        c, meta = self.call, self.meta
        packed = torch.cat((q, qpe), dim=-1).reshape(c.batch, c.heads, -1)
        packed, q_scale = quantize_per_tensor(packed, c.kv.dtype) if c.is_fp8 else (packed, None)
        o = out.view(c.batch, c.heads, c.head_dim)
        with _on_device(c.device):
            _, final_lse = self.api.mla_decode_fwd(
                packed,
                kv_buffer(kv, self.geo),
                o,
                meta.qo_indptr,
                meta.kv_indptr,
                meta.kv_indices,
                meta.kv_last_page_lens,
                1,  # max_seqlen_q: one query token per row
                page_size=self.geo.page_size,
                nhead_kv=1,
                sm_scale=c.sm_scale,
                q_scale=q_scale,
                kv_scale=kv_scale,
                return_lse=lse is not None,
                **meta.decode_kwargs(),
            )
        o.masked_fill_(meta.empty_rows[:, None, None], 0.0)
        if lse is not None:
            lse.view(c.batch, c.heads).copy_(final_lse.masked_fill(meta.empty_rows[:, None], float("-inf")))


def plan(call: MLADecodeCall) -> AiterDecodePlan:
    """The aiter backend's plan for ``call``."""
    return AiterDecodePlan(call)
