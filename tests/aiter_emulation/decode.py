"""Emulated ``aiter.mla.mla_decode_fwd``: aiter's documented semantics and input checks, in PyTorch.

Semantics (docs/aiter_mla_api.md): q [total_q, H, 576] contiguous; kv_buffer [pages,
page_size, 1, 576] whose rows are K and whose first 512 columns are V; a row's pages are
``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``, its last page holding ``kv_last_page_lens[b]``
tokens. Logits are ``q.k * sm_scale`` times ``q_scale`` (fp8 q) and ``kv_scale`` (fp8 kv);
the output is multiplied by ``kv_scale``. With fp8 q the unnormalised softmax weights are
rounded to fp8 before the product with V, as in aiter's own test reference. In persistent
mode the KV ranges come from the metadata schedule, split partials go to fp32 buffers and
are merged per reduce group. Rows no work writes (length 0) are undefined in aiter: the
emulation writes NaN there. Only decode (max_seqlen_q == 1) is emulated.

Checks mirror aiter's Python asserts and C++ ``AITER_CHECK``s (contiguous q, one KV head,
head sizes, dtypes, fp8 scales, heads in the kernel table) plus what the kernel assumes
silently (int32 index tensors, dense rows inside a page, the GPU's own fp8 format, page
ids in range): a violation raises instead of returning garbage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from aiter_emulation.metadata import _check_index, row_page_counts

if TYPE_CHECKING:
    from aiter_emulation.state import EmulatedAiter

QK_DIM, V_DIM = 576, 512
# (q kind, kv kind) -> heads with a kernel, per docs/aiter_mla_api.md (gfx950 table).
KERNEL_HEADS = {("bf16", "bf16"): (16, 32, 64, 128), ("bf16", "fp8"): (16,), ("fp8", "fp8"): (16, 128)}


@dataclass
class DecodeRecord:
    """What one emulated call received (for tests: zero-copy, dtypes, scales)."""

    kv_buffer_data_ptr: int
    kv_buffer_storage_ptr: int
    kv_buffer_shape: tuple[int, ...]
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    q_scale: float | None
    kv_scale: float | None
    sm_scale: float
    persistent: bool


def _kind(state: EmulatedAiter, dtype: torch.dtype, name: str) -> str:
    if dtype == torch.bfloat16:
        return "bf16"
    if dtype == state.fp8:
        return "fp8"
    if dtype.is_floating_point and dtype.itemsize == 1:
        raise RuntimeError(f"{name} is {dtype} but {state.arch} reads fp8 as {state.fp8}")
    raise RuntimeError(f"mla_decode_stage1_asm_fwd: unsupport {name} dtype: {dtype}")


def _check_scale(name: str, scale: object, device: torch.device) -> float:
    ok = isinstance(scale, torch.Tensor) and scale.dtype == torch.float32 and scale.numel() == 1
    if not ok or scale.device != device:
        raise RuntimeError(f"{name} must be a float32 tensor of shape [1] on {device}, got {scale!r}")
    return float(scale)


def _check_layout(q: torch.Tensor, kv_buffer: torch.Tensor, o: torch.Tensor, page_size: int, nhead_kv: int) -> None:
    if q.dim() != 3 or not q.is_contiguous():
        raise RuntimeError("mla_decode_stage1_asm_fwd: only support Q.is_contiguous() for now (3-D q)")
    if nhead_kv != 1:
        raise RuntimeError("mla_decode_stage1_asm_fwd: only support num_kv_heads==1 for now")
    if kv_buffer.dim() != 4 or kv_buffer.shape[1] != page_size or kv_buffer.shape[2] != nhead_kv:
        raise RuntimeError(f"kv_buffer must be [pages, page_size={page_size}, 1, 576], got {tuple(kv_buffer.shape)}")
    if q.shape[2] != kv_buffer.shape[3]:
        raise RuntimeError("mla_decode_stage1_asm_fwd: only support head_size == KV.size(3) for now")
    if q.shape[2] != QK_DIM:
        raise RuntimeError(f"the kernels are built for 576-wide q/kv rows, got {q.shape[2]}")
    width = kv_buffer.shape[3]
    if kv_buffer.stride()[1:] != (width * nhead_kv, width, 1):
        raise RuntimeError(f"kv_buffer pages must be dense (token rows 576 apart), got strides {kv_buffer.stride()}")
    if o.dtype != torch.bfloat16 or tuple(o.shape) != (q.shape[0], q.shape[1], V_DIM) or not o.is_contiguous():
        raise RuntimeError(f"o must be contiguous bf16 [total_q, H, 512], got {o.dtype} {tuple(o.shape)}")


def _scales(state, q, kv_buffer, q_scale, kv_scale) -> tuple[float | None, float | None]:
    q_kind, kv_kind = _kind(state, q.dtype, "Q"), _kind(state, kv_buffer.dtype, "KV")
    if q_kind == "fp8" and (q_scale is None or kv_scale is None):
        raise RuntimeError("mla_decode_stage1_asm_fwd: fp8 Q requires q_scale and kv_scale")
    qs = _check_scale("q_scale", q_scale, q.device) if q_kind == "fp8" else None
    ks = _check_scale("kv_scale", kv_scale, q.device) if kv_kind == "fp8" and kv_scale is not None else None
    heads = KERNEL_HEADS.get((q_kind, kv_kind), ())
    assert q.shape[1] in heads, f"nhead={q.shape[1]} not supported for {q_kind}/{kv_kind}"
    return qs, ks


def _row_tokens(kv_buffer, kv_indices, page_range, row_last_page, last_len) -> torch.Tensor:
    """Token rows [n, 576] (float32) of the pages kv_indices[page_range], the row's last page cut short."""
    start, end = page_range
    if not 0 <= start <= end <= kv_indices.numel():
        raise IndexError(f"page range [{start}, {end}) outside kv_indices (length {kv_indices.numel()})")
    ids = kv_indices[start:end].long()
    if ids.numel() and (ids.min() < 0 or ids.max() >= kv_buffer.shape[0]):
        raise IndexError(f"page ids out of range [0, {kv_buffer.shape[0]}): the kernel would read out of bounds")
    rows = kv_buffer[ids, :, 0, :].float()  # [pages, page_size, 576]
    counts = [kv_buffer.shape[1]] * len(ids)
    if end == row_last_page and counts:
        counts[-1] = last_len
    return torch.cat([r[:c] for r, c in zip(rows, counts, strict=True)]) if counts else rows.reshape(0, QK_DIM)


def _attend(q, tokens, sm_scale, q_scale, kv_scale, fp8_q, fp8_dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [qlen, H, 512] float32, lse [qlen, H]) of q [qlen, H, 576] over tokens [n, 576]."""
    logits = torch.einsum("qhd,nd->qhn", q.float(), tokens) * sm_scale * (q_scale or 1.0) * (kv_scale or 1.0)
    lse = torch.logsumexp(logits, dim=-1)
    weights = torch.exp(logits - logits.amax(dim=-1, keepdim=True))
    if fp8_q:
        weights = weights.to(fp8_dtype).float()
    out = torch.einsum("qhn,nd->qhd", weights, tokens[:, :V_DIM]) / weights.sum(-1, keepdim=True)
    return out * (kv_scale or 1.0), lse


def _merge(outs: list[torch.Tensor], lses: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    lse = torch.logsumexp(torch.stack(lses), dim=0)
    weights = torch.exp(torch.stack(lses) - lse)
    return (weights[..., None] * torch.stack(outs)).sum(0), lse


def _persistent_works(state, work_meta_data, work_indptr, work_info_set) -> list[list[int]]:
    pointers = work_meta_data.tolist() if work_meta_data.dtype == torch.uint64 else None
    if pointers != [work_indptr.data_ptr(), work_info_set.data_ptr()]:
        raise RuntimeError("work_meta_data does not point at this work_indptr / work_info_set")
    bounds = work_indptr.tolist()
    if len(bounds) != state.cu_num + 1:
        raise RuntimeError(f"work_indptr must have cu_num + 1 = {state.cu_num + 1} entries")
    return [work_info_set[w].tolist() for c in range(state.cu_num) for w in range(bounds[c], bounds[c + 1])]


def mla_decode_fwd(
    state: EmulatedAiter,
    q,
    kv_buffer,
    o,
    qo_indptr,
    kv_indptr,
    kv_indices,
    kv_last_page_lens,
    max_seqlen_q,
    page_size=1,
    nhead_kv=1,
    sm_scale=None,
    logit_cap=0.0,
    num_kv_splits=None,
    num_kv_splits_indptr=None,
    work_meta_data=None,
    work_indptr=None,
    work_info_set=None,
    reduce_indptr=None,
    reduce_final_map=None,
    reduce_partial_map=None,
    q_scale=None,
    kv_scale=None,
    intra_batch_mode=False,
    return_logits=False,
    return_lse=False,
):
    """Write attention into ``o``; return (logits, final lse [total_q, H] or None)."""
    assert logit_cap <= 0, f"{logit_cap=} is not support yet"
    _check_layout(q, kv_buffer, o, page_size, nhead_kv)
    if max_seqlen_q != 1:
        raise NotImplementedError("the emulation covers decode (max_seqlen_q == 1) only")
    qs, ks = _scales(state, q, kv_buffer, q_scale, kv_scale)
    batch = qo_indptr.numel() - 1
    device = q.device
    _check_index("qo_indptr", qo_indptr, None, device)
    _check_index("kv_indptr", kv_indptr, batch + 1, device)
    _check_index("kv_indices", kv_indices, None, device)
    _check_index("kv_last_page_lens", kv_last_page_lens, batch, device)
    if qo_indptr.tolist() != list(range(batch + 1)) or q.shape[0] != batch:
        raise RuntimeError("decode needs qo_indptr = [0, 1, ..., B] and one query row per batch row")
    pages = row_page_counts(kv_indptr, kv_last_page_lens, page_size)
    if kv_indptr[-1].item() > kv_indices.numel():
        raise RuntimeError("kv_indptr points past the end of kv_indices")
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(kv_buffer.shape[3])

    persistent = work_meta_data is not None
    if persistent:
        works = _persistent_works(state, work_meta_data, work_indptr, work_info_set)
    else:
        starts = kv_indptr.tolist()
        works = [[b, -1, b, b + 1, starts[b], starts[b + 1], 0, 0] for b in range(batch) if pages[b]]
    heads = q.shape[1]
    n_partials = reduce_partial_map.numel() if persistent else 0
    logits = torch.full((n_partials, 1, heads, V_DIM), float("nan"), dtype=torch.float32, device=device)
    attn_lse = torch.full((n_partials, 1, heads, 1), float("nan"), dtype=torch.float32, device=device)
    final_out = torch.full((batch, heads, V_DIM), float("nan"), dtype=torch.float32)
    final_lse = torch.full((batch, heads), float("nan"), dtype=torch.float32)
    row_ends = [s + n for s, n in zip(kv_indptr.tolist(), pages, strict=False)]
    last_lens = kv_last_page_lens.tolist()
    for b, partial, q_start, q_end, kv_start, kv_end, _offset, _pad in works:
        tokens = _row_tokens(kv_buffer, kv_indices, (kv_start, kv_end), row_ends[b], last_lens[b])
        if tokens.shape[0] == 0:
            continue
        out, lse = _attend(q[q_start:q_end], tokens, scale, qs, ks, q.dtype == state.fp8, state.fp8)
        if partial < 0:
            final_out[q_start:q_end], final_lse[q_start:q_end] = out, lse
        else:
            logits[partial], attn_lse[partial, 0, :, 0] = out[0], lse[0]
    if persistent:
        groups = reduce_indptr.tolist()
        for tile, (q_start, q_end) in enumerate(reduce_final_map.tolist()):
            members = reduce_partial_map[groups[tile] : groups[tile + 1]].tolist()
            if members:
                merged, lse = _merge([logits[p, 0] for p in members], [attn_lse[p, 0, :, 0] for p in members])
                final_out[q_start:q_end], final_lse[q_start:q_end] = merged, lse
    o.copy_(final_out)
    state.decode_calls.append(
        DecodeRecord(
            kv_buffer.data_ptr(),
            kv_buffer.untyped_storage().data_ptr(),
            tuple(kv_buffer.shape),
            q.dtype,
            kv_buffer.dtype,
            qs,
            ks,
            scale,
            persistent,
        )
    )

    return logits, (final_lse.to(device) if return_lse else None)
