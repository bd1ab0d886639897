"""Backend ``torch``: plain PyTorch, with the same split-KV structure as the GPU kernels.

Each split yields a float32 partial output and its log-sum-exp; ``splitk_reduce`` merges
them. Runs on any device; it is the CPU default and the readable statement of the math.
"""

from __future__ import annotations

import torch

from tilegym.backend import register_impl
from tilegym.ops.contract import MLADecodeCall, SplitKReduceCall
from tilegym.ops.split_plan import plan_mla_splits

ALL_VENDORS = ("nvidia", "amd", "cpu")


def _dequantized(t: torch.Tensor, kv_scale: torch.Tensor | None) -> torch.Tensor:
    t = t.float()
    return t * kv_scale if kv_scale is not None else t


def attend_one_split(
    q: torch.Tensor,
    qpe: torch.Tensor,
    kv: torch.Tensor,
    kpe: torch.Tensor,
    valid: torch.Tensor,
    sm_scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 softmax attention of q [B,H,D] over one KV chunk [B,L,D]; ``valid`` [B,L] masks it.

    Returns the chunk's normalised output [B,H,D] and its lse [B,H] (-inf where no token is valid).
    """
    scores = (torch.einsum("bhd,bld->bhl", q, kv) + torch.einsum("bhp,blp->bhl", qpe, kpe)) * sm_scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.masked_fill(lse == float("-inf"), 0.0)[..., None])
    return torch.einsum("bhl,bld->bhd", probs, kv), lse


def merge_splits(partial_out: torch.Tensor, partial_lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge [B,H,N,D] partials with lse [B,H,N] into ([B,H,D] float32, lse [B,H])."""
    lse = torch.logsumexp(partial_lse, dim=-1)
    weights = torch.exp(partial_lse - lse.masked_fill(lse == float("-inf"), 0.0)[..., None])
    merged = torch.einsum("bhn,bhnd->bhd", weights, partial_out.float())
    return merged, lse


@register_impl("mla_decoding_split_kv", "torch", vendors=ALL_VENDORS)
def mla_decoding_split_kv(call: MLADecodeCall) -> torch.Tensor | None:
    batch, seq_len = call.batch, call.seq_len
    plan = plan_mla_splits(call, heads_per_program=call.heads)
    lengths = (
        torch.full((batch,), seq_len, device=call.device) if call.kv_lens is None else call.kv_lens.clamp(0, seq_len)
    )
    q, qpe = call.q.float(), call.qpe.float()
    outs, lses = [], []
    for start in range(0, seq_len, plan.kv_len_per_split):
        stop = min(start + plan.kv_len_per_split, seq_len)
        kv = _dequantized(call.kv[:, start:stop], call.kv_scale)
        kpe = _dequantized(call.kpe[:, start:stop], call.kv_scale)
        positions = torch.arange(start, stop, device=call.device)
        split_out, split_lse = attend_one_split(q, qpe, kv, kpe, positions[None, :] < lengths[:, None], call.sm_scale)
        outs.append(split_out)
        lses.append(split_lse)
    merged, lse = merge_splits(torch.stack(outs, dim=2), torch.stack(lses, dim=2))
    call.out.copy_(merged)
    return lse if call.return_lse else None


@register_impl("splitk_reduce", "torch", vendors=ALL_VENDORS)
def splitk_reduce(call: SplitKReduceCall) -> None:
    merged, _ = merge_splits(call.partial_out, call.partial_lse)
    call.out.copy_(merged)
