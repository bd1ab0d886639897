"""Test and benchmark helpers: random MLA inputs and an independent float64 oracle.

The oracle does the whole softmax over S in float64 with no split structure, so it is
independent of every backend (the ``torch`` backend included).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from tilegym.utils import FP8_DTYPES, cdiv

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
    q_len: int = 1,
) -> MLAInputs:
    """Fresh random inputs (never zeros); fp8 ``kv_dtype`` gives a quantised cache + kv_scale.

    ``q_len`` > 1 gives queries [B, Q, H, *] (Q new tokens per row), else [B, H, *].
    """
    g = generator

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float32)

    rows = (batch, heads) if q_len == 1 else (batch, q_len, heads)
    q = rand(*rows, head_dim).to(dtype)
    qpe = rand(*rows, rope_dim).to(dtype)
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
    causal: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Oracle on a dense cache: (out, lse) in float64 on the CPU, one softmax over all of S.

    q [B, H, D] gives out [B, H, D] and lse [B, H]; q [B, Q, H, D] (Q new tokens per row)
    gives [B, Q, H, D] and [B, Q, H], token i seeing positions < len - Q + 1 + i when
    ``causal``. Positions at or past a row's length are never read (they may hold NaN).
    """
    squeeze = q.dim() == 3
    q, qpe = (q.unsqueeze(1), qpe.unsqueeze(1)) if squeeze else (q, qpe)
    q, qpe, kv, kpe = (t.detach().cpu().double() for t in (q, qpe, kv, kpe))
    batch, q_len, _, _ = q.shape
    seq_len = kv.shape[1]
    lens = torch.full((batch,), seq_len) if kv_lens is None else kv_lens.detach().cpu().long().clamp(0, seq_len)
    positions = torch.arange(seq_len)
    valid = positions[None, :] < lens[:, None]  # [B, S]
    kv = torch.where(valid[..., None], kv, 0.0)
    kpe = torch.where(valid[..., None], kpe, 0.0)
    if kv_scale is not None:
        scale = float(kv_scale) if not isinstance(kv_scale, torch.Tensor) else kv_scale.double().cpu()
        kv, kpe = kv * scale, kpe * scale
    if sm_scale is None:
        sm_scale = (q.shape[-1] + qpe.shape[-1]) ** -0.5
    scores = (torch.einsum("bqhd,bsd->bqhs", q, kv) + torch.einsum("bqhp,bsp->bqhs", qpe, kpe)) * sm_scale
    token = torch.arange(q_len)
    limit = lens[:, None] - q_len + 1 + token[None, :] if causal else lens[:, None].expand(batch, q_len)
    visible = positions[None, None, :] < limit[:, :, None]  # [B, Q, S]
    scores = scores.masked_fill(~visible[:, :, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # rows with no token: zeros
    out = torch.einsum("bqhs,bsd->bqhd", probs, kv)
    return (out[:, 0], lse[:, 0]) if squeeze else (out, lse)


@dataclass
class PagedInputs:
    """A paged copy of a dense ``MLAInputs``: pages [N, page_size, D+P] plus both page tables.

    ``block_table`` [B, max_pages] and (``kv_indptr``, ``kv_indices``) describe the same
    pages; unused pages and table entries hold garbage (NaN pages, out-of-range ids), so a
    kernel that reads past a row shows it.
    """

    dense: MLAInputs
    pages: torch.Tensor
    block_table: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor

    @property
    def kv(self) -> torch.Tensor:
        return self.pages[..., : self.dense.head_dim]

    @property
    def kpe(self) -> torch.Tensor:
        return self.pages[..., self.dense.head_dim :]

    @property
    def page_size(self) -> int:
        return self.pages.shape[1]

    def layout_kwargs(self, layout: str) -> dict[str, torch.Tensor]:
        """The op's keyword arguments for ``layout`` ("paged" or "ragged"), kv_lens included."""
        if layout == "paged":
            return {"block_table": self.block_table, "kv_lens": self.dense.kv_lens}
        return {"kv_indptr": self.kv_indptr, "kv_indices": self.kv_indices, "kv_lens": self.dense.kv_lens}


def to_pages(
    x: MLAInputs,
    page_size: int,
    *,
    generator: torch.Generator | None = None,
    shared_prefix_pages: int = 0,
    spare_pages: int = 3,
    garbage: float = float("nan"),
) -> PagedInputs:
    """Scatter ``x``'s dense cache into randomly ordered pages of ``page_size`` tokens.

    Every row gets ``cdiv(S, page_size)`` pages (a block-table row); its slots at or past its
    length, ``spare_pages`` extra pages and every unused table entry hold garbage (``garbage``
    values; out-of-range page ids), so a kernel that reads past a row shows it. With
    ``shared_prefix_pages`` = k, rows b > 0 use row 0's first k pages (prefix sharing): the
    caller makes the dense prefixes equal first (``share_prefix``). The ragged page list
    holds exactly each row's ``cdiv(len, page_size)`` pages. Vectorised: fine for benchmarks.
    """
    cache = x.cache
    batch, seq_len, width = cache.shape
    device = cache.device
    lens = torch.full((batch,), seq_len, device=device) if x.kv_lens is None else x.kv_lens.long().clamp(0, seq_len)
    row_pages = cdiv(seq_len, page_size)
    total = batch * row_pages + spare_pages
    order = torch.randperm(total, generator=generator).to(device)
    table = order[: batch * row_pages].view(batch, row_pages)
    shared = min(shared_prefix_pages, int(lens[0]) // page_size, row_pages) if batch else 0
    if shared:
        table[1:, :shared] = table[:1, :shared]
    padded = torch.full((batch, row_pages * page_size, width), garbage, dtype=torch.float32, device=device)
    positions = torch.arange(seq_len, device=device)
    source = cache.float() if cache.dtype in FP8_DTYPES else cache
    padded[:, :seq_len] = torch.where((positions[None, :] < lens[:, None])[..., None], source.float(), garbage)
    pages = torch.full((total, page_size, width), garbage, dtype=torch.float32, device=device)
    owner = torch.ones((batch, row_pages), dtype=torch.bool, device=device)
    owner[1:, :shared] = False  # shared pages are written once, from row 0
    pages[table[owner]] = padded.view(batch, row_pages, page_size, width)[owner]
    pages = pages.to(cache.dtype)
    used = cdiv_tensor(lens, page_size)
    block_table = torch.where(torch.arange(row_pages, device=device)[None, :] < used[:, None], table, 1 << 30).to(
        torch.int32
    )  # unused entries: out of range
    indptr = torch.cat((used.new_zeros(1), used.cumsum(0))).to(torch.int32)
    indices = table[torch.arange(row_pages, device=device)[None, :] < used[:, None]].to(torch.int32)
    return PagedInputs(x, pages, block_table, indptr, indices)


def scatter_to_pages(paged: PagedInputs, dense: torch.Tensor, garbage: float | int) -> torch.Tensor:
    """``dense`` [B, S, *] (any dtype) in ``paged``'s pages: [num_pages, page_size, *], same page ids.

    Slots past a row's length and pages no row uses hold ``garbage`` (for uint8 bytes, 0xFF is a
    NaN in e4m3, in e8m0 scales, in float32 scales and in bf16 rope).
    """
    lens, page_size = paged.dense.kv_lens, paged.page_size
    batch, seq_len = dense.shape[:2]
    lens = torch.full((batch,), seq_len, device=dense.device) if lens is None else lens.long().clamp(0, seq_len)
    row_pages = cdiv(seq_len, page_size)
    pages = torch.full((paged.pages.shape[0], page_size, *dense.shape[2:]), garbage, dtype=dense.dtype)
    pages = pages.to(dense.device)
    padded = torch.full((batch, row_pages * page_size, *dense.shape[2:]), garbage, dtype=dense.dtype)
    padded = padded.to(dense.device)
    inside = torch.arange(seq_len, device=dense.device)[None, :] < lens[:, None]
    inside = inside.view(batch, seq_len, *[1] * (dense.dim() - 2))
    padded[:, :seq_len] = torch.where(inside, dense, padded[:, :seq_len])
    used = torch.arange(row_pages, device=dense.device)[None, :] < cdiv_tensor(lens, page_size)[:, None]
    table = paged.block_table[:, :row_pages].long()
    pages[table[used]] = padded.view(batch, row_pages, page_size, *dense.shape[2:])[used]
    return pages


@dataclass
class PackedCache:
    """A cache in a packed format (``kv_cache_format``): the op's arguments and, for the oracle,
    the dequantised dense values (float32 [B, S, D] latent and [B, S, P] rope)."""

    kv_cache_format: str
    kv: torch.Tensor
    kpe: torch.Tensor | None
    kv_scale: torch.Tensor | None
    latent: torch.Tensor
    rope: torch.Tensor

    def op_kwargs(self) -> dict[str, object]:
        """``kv``, ``kpe``, ``kv_scale`` and ``kv_cache_format`` as the op takes them."""
        return {"kv": self.kv, "kpe": self.kpe, "kv_scale": self.kv_scale, "kv_cache_format": self.kv_cache_format}


def pack_cache(x: MLAInputs, kv_cache_format: str) -> PackedCache:
    """``x``'s dense cache quantised into a packed format ("fp8_ds_mla" or "mxfp4")."""
    from tilegym.quant import dequantize_mxfp4, pack_fp8_ds_mla, quantize_mxfp4, unpack_fp8_ds_mla

    if kv_cache_format == "fp8_ds_mla":
        packed = pack_fp8_ds_mla(x.kv.float(), x.kpe.float())
        latent, rope = unpack_fp8_ds_mla(packed)
        return PackedCache(kv_cache_format, packed, None, None, latent, rope)
    if kv_cache_format == "mxfp4":
        codes, scales = quantize_mxfp4(x.kv.float())
        rope = x.kpe.contiguous()
        return PackedCache(kv_cache_format, codes, rope, scales, dequantize_mxfp4(codes, scales), rope.float())
    raise ValueError(f"unknown packed format {kv_cache_format!r}")


def page_packed_cache(cache: PackedCache, paged: PagedInputs) -> PackedCache:
    """``cache`` scattered into ``paged``'s pages (same page ids; garbage bytes elsewhere)."""

    def scatter(t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        return scatter_to_pages(paged, t, 0xFF if t.dtype == torch.uint8 else float("nan"))

    return PackedCache(
        cache.kv_cache_format, scatter(cache.kv), scatter(cache.kpe), scatter(cache.kv_scale), cache.latent, cache.rope
    )


def cache_kwargs(
    x: MLAInputs,
    kv_cache_format: str | None = None,
    layout: str = "dense",
    page_size: int = 64,
    generator: torch.Generator | None = None,
) -> tuple[dict[str, object], PackedCache | None]:
    """The op's cache and layout keyword arguments for ``x``'s cache, and the packed cache or None.

    ``kv_cache_format`` "fp8_ds_mla" or "mxfp4" packs the cache (``pack_cache``; its dequantised
    values are what the oracle reads); anything else passes ``x``'s own kv, kpe and kv_scale.
    ``layout`` "paged" or "ragged" scatters it into pages of ``page_size`` tokens (``to_pages``).
    """
    packed = pack_cache(x, kv_cache_format) if kv_cache_format in ("fp8_ds_mla", "mxfp4") else None
    cache = packed.op_kwargs() if packed is not None else {"kv": x.kv, "kpe": x.kpe, "kv_scale": x.kv_scale}
    if layout == "dense":
        return {**cache, "kv_lens": x.kv_lens}, packed
    pages = to_pages(x, page_size, generator=generator)
    paged = page_packed_cache(packed, pages).op_kwargs() if packed is not None else {"kv": pages.kv, "kpe": pages.kpe}
    return {**cache, **paged, **pages.layout_kwargs(layout)}, packed


def cdiv_tensor(t: torch.Tensor, d: int) -> torch.Tensor:
    """Ceiling division of a non-negative integer tensor."""
    return torch.div(t + (d - 1), d, rounding_mode="floor")


def share_prefix(x: MLAInputs, tokens: int) -> None:
    """Make every row's first ``tokens`` cached tokens equal to row 0's (in place)."""
    x.cache[1:, :tokens] = x.cache[:1, :tokens]


def splitk_reduce_float64(partial_out: torch.Tensor, partial_lse: torch.Tensor) -> torch.Tensor:
    """Oracle of ``splitk_reduce``: softmax(lse) over the splits weights the partials (float64, CPU).

    Empty splits (lse -inf) weigh nothing and are never read; a row with no live split gives zeros.
    """
    lse = partial_lse.detach().cpu().double()
    live = lse != float("-inf")
    weights = torch.where(live.any(-1, keepdim=True), torch.softmax(lse, dim=-1), 0.0)  # NaN lse stays NaN
    parts = torch.where(live[..., None], partial_out.detach().cpu().double(), 0.0)
    return torch.einsum("bhn,bhnd->bhd", torch.where(live, weights, 0.0), parts)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| in float64 (0 when both are all zeros). The shapes must
    match: a broadcast difference measures the wrong thing."""
    if actual.shape != expected.shape:
        raise ValueError(f"relative_error: shape {tuple(actual.shape)} against {tuple(expected.shape)}")
    actual, expected = actual.detach().cpu().double(), expected.detach().cpu().double()
    denom = expected.norm().item()
    diff = (actual - expected).norm().item()
    return diff / denom if denom > 0 else diff


def fresh_generator() -> tuple[torch.Generator, int]:
    """A generator with a fresh seed (report it on failure) so every run draws new inputs."""
    seed = int.from_bytes(os.urandom(4), "little")
    return torch.Generator().manual_seed(seed), seed


def assert_matches_float64(
    out: torch.Tensor,
    lse: torch.Tensor,
    expected: torch.Tensor,
    expected_lse: torch.Tensor,
    *,
    rel_tol: float,
    lse_atol: float,
    seed: object,
    lse_rtol: float = 0.0,
) -> None:
    """Check a decode's output and lse against the float64 oracle: finite output (a read past a row
    shows up as NaN), rel. L2 error within ``rel_tol``, lse -inf exactly on the empty rows and within
    ``lse_atol + lse_rtol * |expected lse|`` elsewhere. ``seed`` goes into every message. Shapes must
    match exactly: a broadcast comparison would measure the wrong thing."""
    assert out.shape == expected.shape, f"output shape {tuple(out.shape)} != expected {tuple(expected.shape)}"
    assert lse.shape == expected_lse.shape, f"lse shape {tuple(lse.shape)} != expected {tuple(expected_lse.shape)}"
    assert bool(torch.isfinite(out).all()), f"non-finite output (a read past a row?), seed {seed}"
    err = relative_error(out, expected)
    assert err <= rel_tol, f"rel. L2 error {err:.2e} > {rel_tol:.1e}, seed {seed}"
    lse = lse.detach().cpu().double()
    expected_lse = expected_lse.detach().cpu().double()
    assert torch.equal(torch.isneginf(lse), torch.isneginf(expected_lse)), f"empty rows: lse -inf, seed {seed}"
    finite = torch.isfinite(expected_lse)
    if bool(finite.any()):
        error = (lse[finite] - expected_lse[finite]).abs()
        bound = lse_atol + lse_rtol * expected_lse[finite].abs()
        i = int((error - bound).argmax())
        assert error[i] <= bound[i], (
            f"lse error {error[i]:.2e} > {bound[i]:.1e} (lse {expected_lse[finite][i]:.3g}), seed {seed}"
        )
