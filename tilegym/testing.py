"""Test and benchmark helpers: random MLA inputs and an independent float64 oracle.

The oracle does the whole softmax over S in float64 with no split structure, so it is
independent of every backend (the ``torch`` backend included).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tilegym.utils import FP8_DTYPES

# Largest relative L2 error vs float64 that a correct kernel stays under, by output dtype:
# float32 math leaves the 16-bit output rounding (bf16 ~2e-3, fp16 ~3e-4); a bug gives O(1).
REL_L2_TOLERANCE: dict[torch.dtype, float] = {torch.bfloat16: 1e-2, torch.float16: 2e-3}


@dataclass
class MLAInputs:
    """One set of decode inputs; ``kv``/``kpe`` are column views of ``cache`` [B, S, D+P]."""

    q: torch.Tensor
    qpe: torch.Tensor
    cache: torch.Tensor
    kv_lens: torch.Tensor | None = None
    kv_scale: torch.Tensor | None = None

    @property
    def head_dim(self) -> int:
        return self.q.shape[-1]

    @property
    def kv(self) -> torch.Tensor:
        return self.cache[..., : self.head_dim]

    @property
    def kpe(self) -> torch.Tensor:
        return self.cache[..., self.head_dim :]


def make_mla_inputs(
    batch: int,
    heads: int,
    seq_len: int,
    head_dim: int = 512,
    rope_dim: int = 64,
    *,
    dtype: torch.dtype = torch.bfloat16,
    kv_dtype: torch.dtype | None = None,
    device: str | torch.device = "cpu",
    kv_lens: list[int] | None = None,
    generator: torch.Generator | None = None,
) -> MLAInputs:
    """Fresh random inputs (never zeros); fp8 ``kv_dtype`` gives a quantised cache + kv_scale."""
    g = generator

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float32)

    q = rand(batch, heads, head_dim).to(dtype)
    qpe = rand(batch, heads, rope_dim).to(dtype)
    cache = rand(batch, seq_len, head_dim + rope_dim)
    kv_scale = None
    if kv_dtype is not None and kv_dtype in FP8_DTYPES:
        scale = cache.abs().amax() / torch.finfo(kv_dtype).max
        cache = (cache / scale).to(kv_dtype)
        kv_scale = scale.reshape(1).to(torch.float32).to(device)
    else:
        cache = cache.to(kv_dtype or dtype)
    lens = None if kv_lens is None else torch.tensor(kv_lens, dtype=torch.int32, device=device)
    return MLAInputs(q.to(device), qpe.to(device), cache.to(device), lens, kv_scale)


def mla_decode_float64(
    q: torch.Tensor,
    qpe: torch.Tensor,
    kv: torch.Tensor,
    kpe: torch.Tensor,
    sm_scale: float | None = None,
    *,
    kv_lens: torch.Tensor | None = None,
    kv_scale: torch.Tensor | float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Oracle: (out [B,H,D], lse [B,H]) in float64 on the CPU, one softmax over all of S."""
    q, qpe, kv, kpe = (t.detach().cpu().double() for t in (q, qpe, kv, kpe))
    if kv_scale is not None:
        scale = float(kv_scale) if not isinstance(kv_scale, torch.Tensor) else kv_scale.double().cpu()
        kv, kpe = kv * scale, kpe * scale
    if sm_scale is None:
        sm_scale = (q.shape[-1] + qpe.shape[-1]) ** -0.5
    scores = (q @ kv.transpose(1, 2) + qpe @ kpe.transpose(1, 2)) * sm_scale  # [B, H, S]
    if kv_lens is not None:
        positions = torch.arange(kv.shape[1])
        scores = scores.masked_fill(positions[None, None, :] >= kv_lens.cpu().long()[:, None, None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows with no token: zeros
    return probs @ kv, lse


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| in float64 (0 when both are all zeros)."""
    actual, expected = actual.detach().cpu().double(), expected.detach().cpu().double()
    denom = expected.norm().item()
    diff = (actual - expected).norm().item()
    return diff / denom if denom > 0 else diff
