"""Backend ``torch``: plain PyTorch with the split-KV structure of the GPU kernels.

The KV positions are walked in chunks (splits); each chunk gives a float32 partial output
and its log-sum-exp, and the chunks are merged by their lse. Tokens are gathered chunk by
chunk through the layout's page table, so no copy of the whole cache is ever made. Runs
on any device: it is the CPU default and the readable statement of the math.

Garbage outside a row (positions at or past its length, pages it does not use) is zeroed
before any arithmetic, so NaN or inf there never reaches the output; NaN inside a row's
valid positions propagates to that row. Ragged page lists read their longest row on the
host (one synchronisation; while a CUDA graph is captured they walk every page of the cache
instead); the other layouts never synchronise.
"""

from __future__ import annotations

import torch

from tilegym.backend import register_impl
from tilegym.ops.contract import DENSE, FP8_DS_MLA, MXFP4, PACKED_KV_FORMATS, PAGED, MLADecodeCall, SplitKReduceCall
from tilegym.ops.mla_decoding import MLA_DECODING, SPLITK_REDUCE
from tilegym.quant import FP8_DS_MLA_GROUP, FP8_DS_MLA_GROUPS, dequantize_mxfp4
from tilegym.utils import capturing, next_power_of_2

ALL_VENDORS = ("nvidia", "amd", "cpu")
CHUNK_ELEMENTS = 1 << 24  # float32 elements of one gathered chunk [B, L, D + P] (64 MiB)


def attend_chunk(
    q: torch.Tensor,
    qpe: torch.Tensor,
    kv: torch.Tensor,
    kpe: torch.Tensor,
    visible: torch.Tensor,
    sm_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 softmax attention of q [B,Q,H,D] over one chunk kv [B,L,D]; ``visible`` [B,Q,L] masks it.

    Returns the chunk's normalised output [B,Q,H,D] and its lse [B,Q,H] (-inf where no token is visible).
    """
    scores = (torch.einsum("bqhd,bld->bqhl", q, kv) + torch.einsum("bqhp,blp->bqhl", qpe, kpe)) * sm_scale
    scores = scores.masked_fill(~visible[:, :, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.masked_fill(lse == float("-inf"), 0.0)[..., None])
    return torch.einsum("bqhl,bld->bqhd", probs, kv), lse


def merge_splits(partial_out: torch.Tensor, partial_lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge [..., N, D] partials with lse [..., N] into ([..., D] float32, lse [...]).

    Splits with lse -inf weigh nothing and their partials are never read (they may hold
    anything); NaN in a live split gives NaN.
    """
    lse = torch.logsumexp(partial_lse, dim=-1)
    live = partial_lse != float("-inf")
    weights = torch.exp(partial_lse - lse.masked_fill(lse == float("-inf"), 0.0)[..., None]).masked_fill(~live, 0.0)
    parts = torch.where(live[..., None], partial_out.float(), 0.0)
    return torch.einsum("...n,...nd->...d", weights, parts), lse


class TorchDecodeRunner:
    """The ``torch`` backend's plan: just the call's fixed sizes; lengths are read per run."""

    def __init__(self, call: MLADecodeCall) -> None:
        self.call = call
        width = call.head_dim + call.rope_dim
        default = max(16, min(16384, next_power_of_2(CHUNK_ELEMENTS // (call.batch * width)) // 2))
        self.chunk = call.kv_len_per_split or default

    def refresh(self) -> None:
        """Nothing to recompute: lengths are read when the call runs."""

    def _lengths(self) -> torch.Tensor:
        c = self.call
        if c.kv_lens is None:
            return torch.full((c.batch,), c.seq_len, dtype=torch.long, device=c.device)
        lens = c.kv_lens.long().clamp(min=0)
        if c.layout == DENSE or c.layout == PAGED:
            return lens.clamp(max=c.seq_len)
        starts, ends = self._ragged_ranges()
        return torch.minimum(lens, (ends - starts) * c.page_size)

    def _ragged_ranges(self) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.call
        nnz = c.kv_indices.numel()
        starts = c.kv_indptr[:-1].long().clamp(0, nnz)
        return starts, torch.maximum(c.kv_indptr[1:].long().clamp(0, nnz), starts)

    def _capacity(self, lens: torch.Tensor) -> int:
        c = self.call
        if c.layout == DENSE or c.layout == PAGED:
            return c.seq_len
        if capturing(c.device):
            return c.seq_len  # no sync while capturing: every page of the cache bounds a row
        return max(1, int(lens.max()))  # ragged: the longest row, read on the host

    def _gather(self, cache: torch.Tensor, start: int, positions: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """Tokens ``positions`` = start.. of every row as [B, L, width]; invalid ones are arbitrary pages."""
        c = self.call
        if c.layout == DENSE:
            return cache[:, start : start + positions.numel()]
        ps = c.page_size
        page_col = positions // ps
        if c.layout == PAGED:
            pages = c.block_table.long()[:, page_col]
        else:
            starts, _ = self._ragged_ranges()
            slot = (starts[:, None] + page_col[None, :]).clamp(max=max(0, c.kv_indices.numel() - 1))
            pages = c.kv_indices.long()[slot] if c.kv_indices.numel() else torch.zeros_like(slot)
        pages = torch.where(valid, pages, 0).clamp(0, c.num_pages - 1)
        return cache[pages, (positions % ps)[None, :].expand_as(pages)]

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
        c = self.call
        batch, q_len, heads = c.batch, c.q_len, c.heads
        q4 = q.reshape(batch, q_len, heads, c.head_dim).float()
        qpe4 = qpe.reshape(batch, q_len, heads, c.rope_dim).float()
        lens = self._lengths()
        token = torch.arange(q_len, device=c.device)
        limit = lens[:, None] - q_len + 1 + token[None, :] if c.causal else lens[:, None].expand(batch, q_len)
        outs, lses = [], []
        capacity = self._capacity(lens)
        for start in range(0, capacity, self.chunk):
            positions = torch.arange(start, min(start + self.chunk, capacity), device=c.device)
            valid = positions[None, :] < lens[:, None]  # [B, L]
            kv_chunk, kpe_chunk = self._dequantized_chunk(kv, kpe, kv_scale, start, positions, valid)
            visible = positions[None, None, :] < limit[:, :, None]  # [B, Q, L]
            chunk_out, chunk_lse = attend_chunk(q4, qpe4, kv_chunk, kpe_chunk, visible, c.sm_scale)
            outs.append(chunk_out)
            lses.append(chunk_lse)
        merged, merged_lse = merge_splits(torch.stack(outs, dim=-2), torch.stack(lses, dim=-1))
        out.copy_(merged.reshape(out.shape))
        if lse is not None:
            lse.copy_(merged_lse.reshape(lse.shape))

    def _dequantized_chunk(
        self,
        kv: torch.Tensor,
        kpe: torch.Tensor,
        kv_scale: torch.Tensor | None,
        start: int,
        positions: torch.Tensor,
        valid: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Float32 (latent, rope) of a chunk in the call's cache format, zero outside the rows
        (garbage there, NaN codes or scales included, never counts)."""
        fmt = self.call.kv_format
        latent = self._gather(kv, start, positions, valid)
        rope = self._gather(kpe, start, positions, valid).float()
        if fmt == FP8_DS_MLA:
            scales = self._gather(kv_scale, start, positions, valid)
            groups = latent.float().unflatten(-1, (FP8_DS_MLA_GROUPS, FP8_DS_MLA_GROUP))
            latent = (groups * scales[..., None]).flatten(-2)
        elif fmt == MXFP4:
            latent = dequantize_mxfp4(latent, self._gather(kv_scale, start, positions, valid))
        else:
            latent = latent.float()
            if kv_scale is not None:  # fp8 per tensor: the same scale for the rope
                latent, rope = latent * kv_scale, rope * kv_scale
        inside = valid[..., None]
        return torch.where(inside, latent, 0.0), torch.where(inside, rope, 0.0)


@register_impl(MLA_DECODING.name, "torch", vendors=ALL_VENDORS, packed_kv_formats=PACKED_KV_FORMATS)
def plan_mla_decoding_split_kv(call: MLADecodeCall) -> TorchDecodeRunner:
    return TorchDecodeRunner(call)


@register_impl(SPLITK_REDUCE.name, "torch", vendors=ALL_VENDORS)
def splitk_reduce(call: SplitKReduceCall) -> None:
    merged, _ = merge_splits(call.partial_out, call.partial_lse)
    call.out.copy_(merged)
