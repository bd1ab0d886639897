"""Public ops: validate the arguments once, pick a backend, run it.

Backends receive a validated call object (``tilegym.ops.contract``) whose ``out`` is
already allocated; they write ``out`` and return the lse tensor (or ``None``). Under
``torch.compile`` the calls go through the custom ops of ``tilegym.ops.torch_library``.
"""

from __future__ import annotations

import torch

from tilegym.backend import select
from tilegym.ops import torch_library
from tilegym.ops.contract import validate_mla_decoding, validate_splitk_reduce

__all__ = ["mla_decoding_split_kv", "splitk_reduce"]


def mla_decoding_split_kv(
    q: torch.Tensor,
    qpe: torch.Tensor,
    kv: torch.Tensor,
    kpe: torch.Tensor,
    sm_scale: float | None = None,
    kv_len_per_split: int | None = None,
    *,
    kv_lens: torch.Tensor | None = None,
    kv_scale: torch.Tensor | float | None = None,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Absorbed MLA attention at decode time (one query token per batch row), split over KV.

    Shapes: q [B, H, D], qpe [B, H, P], kv [B, S, D], kpe [B, S, P]. Per row b and head h:
    ``score[s] = (q.kv[s] + qpe.kpe[s]) * sm_scale`` over ``s < kv_lens[b]`` (all S when
    ``kv_lens`` is None); returns ``softmax(score) @ kv`` as [B, H, D] in q's dtype, and
    with ``return_lse`` also lse [B, H] float32 (natural log; -inf for an empty row).

    ``sm_scale`` defaults to 1/sqrt(D + P). ``kv_len_per_split`` (tokens per split) is
    chosen by the backend when None. fp8 kv/kpe need ``kv_scale`` (cache value =
    kv * kv_scale). ``backend`` overrides the selection rules of ``tilegym.backend``.
    """
    if torch.compiler.is_compiling():
        if out is None:
            out = q.new_empty(q.shape)
        if kv_scale is not None and not isinstance(kv_scale, torch.Tensor):
            kv_scale = torch.full((1,), float(kv_scale), dtype=torch.float32, device=q.device)
        lse = torch_library.mla_decoding_split_kv_op(
            q, qpe, kv, kpe, out, sm_scale, kv_len_per_split, kv_lens, kv_scale, return_lse, backend
        )
        return (out, lse) if return_lse else out
    call = validate_mla_decoding(
        q,
        qpe,
        kv,
        kpe,
        sm_scale,
        kv_len_per_split,
        kv_lens=kv_lens,
        kv_scale=kv_scale,
        return_lse=return_lse,
        out=out,
    )
    lse = select("mla_decoding_split_kv", call, backend).run(call)
    return (call.out, lse) if return_lse else call.out


def splitk_reduce(
    partial_out: torch.Tensor,
    partial_lse: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Merge per-split partial outputs [B, H, N, D] with their lse [B, H, N] into [B, H, D].

    ``partial_lse`` is float32, natural log; -inf marks an empty split. A row whose splits
    are all empty gives zeros. The output dtype is ``out``'s when given, else partial_out's.
    """
    if torch.compiler.is_compiling():
        if out is None:
            out = partial_out.new_empty(partial_out.shape[:2] + partial_out.shape[3:])
        torch_library.splitk_reduce_op(partial_out, partial_lse, out, backend)
        return out
    call = validate_splitk_reduce(partial_out, partial_lse, out=out)
    select("splitk_reduce", call, backend).run(call)
    return call.out
