"""The public ops as ``torch.library`` custom ops, so ``torch.compile`` keeps them opaque.

Under ``torch.compile`` the public functions run their traceable checks (shapes, dtypes,
scalars) and then call these ops instead of tracing into selection, planning and kernel
launchers: the compiled graph holds one ``tilegym::`` op per call, whose fake
implementation gives the output shapes. The real implementation validates the values the
trace could not see (data pointers, host-side index checks), plans and runs the call with
the same rules as an eager call. The decode op returns fresh tensors (no mutated inputs),
so the compiler needs no copies around it.
"""

from __future__ import annotations

import torch

from tilegym.backend import select
from tilegym.ops.contract import validate_mla_decoding, validate_splitk_reduce
from tilegym.ops.mla_decoding import MLA_DECODING, SPLITK_REDUCE

NO_LSE_SHAPE = (0,)  # custom ops return fresh tensors: an empty one stands for "no lse"


@torch.library.custom_op(f"tilegym::{MLA_DECODING.name}", mutates_args=())
def mla_decoding_split_kv_op(
    q: torch.Tensor,
    qpe: torch.Tensor,
    kv: torch.Tensor,
    kpe: torch.Tensor | None,
    kv_lens: torch.Tensor | None,
    kv_scale: torch.Tensor | None,
    block_table: torch.Tensor | None,
    kv_indptr: torch.Tensor | None,
    kv_indices: torch.Tensor | None,
    sm_scale: float,
    kv_len_per_split: int | None,
    causal: bool,
    return_lse: bool,
    kv_cache_format: str | None,
    backend: str | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [B, Q, H, D], lse [B, Q, H] float32 or an empty tensor without ``return_lse``) for 4-D q."""
    from tilegym.ops import plan_for_call

    call = validate_mla_decoding(
        q,
        qpe,
        kv,
        kpe,
        sm_scale,
        kv_len_per_split,
        kv_lens=kv_lens,
        kv_scale=kv_scale,
        block_table=block_table,
        kv_indptr=kv_indptr,
        kv_indices=kv_indices,
        causal=causal,
        return_lse=return_lse,
        kv_cache_format=kv_cache_format,
    )
    out, lse = plan_for_call(call, backend).run(q, qpe, kv, kpe, call.caller_kv_scale, None)
    return out, lse if lse is not None else torch.empty(NO_LSE_SHAPE, dtype=torch.float32, device=q.device)


@mla_decoding_split_kv_op.register_fake
def _(
    q,
    qpe,
    kv,
    kpe,
    kv_lens,
    kv_scale,
    block_table,
    kv_indptr,
    kv_indices,
    sm_scale,
    kv_len_per_split,
    causal,
    return_lse,
    kv_cache_format,
    backend,
):
    lse_shape = q.shape[:3] if return_lse else NO_LSE_SHAPE
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op(f"tilegym::{SPLITK_REDUCE.name}", mutates_args=("out",))
def splitk_reduce_op(
    partial_out: torch.Tensor, partial_lse: torch.Tensor, out: torch.Tensor, backend: str | None
) -> None:
    """Writes the merged splits into ``out``."""
    call = validate_splitk_reduce(partial_out, partial_lse, out=out)
    select(SPLITK_REDUCE.name, call, backend).run(call)


@splitk_reduce_op.register_fake
def _(partial_out, partial_lse, out, backend):
    return None
