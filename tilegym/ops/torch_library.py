"""The public ops as ``torch.library`` custom ops, so ``torch.compile`` keeps them opaque.

Under ``torch.compile`` the public functions route here instead of tracing into validation,
backend selection and kernel launchers: the compiled graph holds one ``tilegym::`` op per
call, whose fake implementation gives the output shapes. The real implementation validates
and selects a backend when the graph runs, with the same rules as an eager call.
"""

from __future__ import annotations

import torch

from tilegym.backend import select
from tilegym.ops.contract import validate_mla_decoding, validate_splitk_reduce

NO_LSE_SHAPE = (0,)  # custom ops return fresh tensors: an empty one stands for "no lse"


@torch.library.custom_op("tilegym::mla_decoding_split_kv", mutates_args=("out",))
def mla_decoding_split_kv_op(
    q: torch.Tensor,
    qpe: torch.Tensor,
    kv: torch.Tensor,
    kpe: torch.Tensor,
    out: torch.Tensor,
    sm_scale: float | None,
    kv_len_per_split: int | None,
    kv_lens: torch.Tensor | None,
    kv_scale: torch.Tensor | None,
    return_lse: bool,
    backend: str | None,
) -> torch.Tensor:
    """Writes ``out``; returns lse [B, H] float32, or an empty tensor without ``return_lse``."""
    call = validate_mla_decoding(
        q, qpe, kv, kpe, sm_scale, kv_len_per_split, kv_lens=kv_lens, kv_scale=kv_scale, return_lse=return_lse, out=out
    )
    lse = select("mla_decoding_split_kv", call, backend).run(call)
    return lse if lse is not None else torch.empty(NO_LSE_SHAPE, dtype=torch.float32, device=q.device)


@mla_decoding_split_kv_op.register_fake
def _(q, qpe, kv, kpe, out, sm_scale, kv_len_per_split, kv_lens, kv_scale, return_lse, backend):
    shape = q.shape[:2] if return_lse else NO_LSE_SHAPE
    return q.new_empty(shape, dtype=torch.float32)


@torch.library.custom_op("tilegym::splitk_reduce", mutates_args=("out",))
def splitk_reduce_op(
    partial_out: torch.Tensor, partial_lse: torch.Tensor, out: torch.Tensor, backend: str | None
) -> None:
    """Writes the merged splits into ``out``."""
    call = validate_splitk_reduce(partial_out, partial_lse, out=out)
    select("splitk_reduce", call, backend).run(call)


@splitk_reduce_op.register_fake
def _(partial_out, partial_lse, out, backend):
    return None
