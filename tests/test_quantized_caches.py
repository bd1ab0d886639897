"""The packed cache formats (``kv_cache_format="fp8_ds_mla"`` and ``"mxfp4"``) against float64.

The oracle is fed the dequantised cache (``tilegym.testing.pack_cache``: the float32 values the
bytes stand for, from ``tilegym.quant``'s independent decoders), so only a kernel's own rounding
counts. The ``mxfp4`` path also rounds the query (declared: ``quantizes_query``); it is checked
twice: against an oracle fed the same documented MXFP8 rounding of the query
(``tilegym.quant.round_query_mxfp8``) with the tight bf16 tolerance, and against the exact query
with the declared, looser tolerance. Pages hold 0xFF bytes (NaN values, scales and rope) wherever
a row must not read. Triton runs in its interpreter on CPU; GPU-marked cases run on CUDA.
"""

from __future__ import annotations

import pytest
import torch

from tilegym.backend import implementations
from tilegym.ops import mla_decoding_split_kv, plan_mla_decoding
from tilegym.ops.accuracy import FP8_MMA_LSE_RTOL, LSE_ATOL, lse_rtol, lse_tolerance, output_tolerance
from tilegym.ops.contract import validate_mla_decoding
from tilegym.quant import pack_fp8_ds_mla, quantize_mxfp4, round_query_mxfp8
from tilegym.testing import (
    REL_L2_TOLERANCE,
    assert_matches_float64,
    cache_kwargs,
    fresh_generator,
    make_mla_inputs,
    mla_decode_float64,
    pack_cache,
    relative_error,
)

OP = "mla_decoding_split_kv"
FORMATS = ["fp8_ds_mla", "mxfp4"]
BACKENDS = ["torch", "triton"]


def expected(x, cache, *, causal: bool, round_query: bool):
    q = round_query_mxfp8(x.q) if round_query else x.q
    return mla_decode_float64(q, x.qpe, cache.latent, cache.rope, kv_lens=x.kv_lens, causal=causal)


def check(out, lse, reference, rel_tol: float, lse_tol: float, seed: int, lse_rel: float = 0.0) -> None:
    assert_matches_float64(out, lse, *reference, rel_tol=rel_tol, lse_atol=lse_tol, lse_rtol=lse_rel, seed=seed)


def run_and_check(backend: str, fmt: str, x, layout: str, page_size: int, causal: bool, generator, seed) -> None:
    kwargs, cache = cache_kwargs(x, fmt, layout, page_size, generator=generator)
    out, lse = mla_decoding_split_kv(x.q, x.qpe, causal=causal, return_lse=True, backend=backend, **kwargs)
    rounds_query = fmt == "mxfp4" and backend == "triton"
    tight = REL_L2_TOLERANCE[torch.bfloat16]
    check(out, lse, expected(x, cache, causal=causal, round_query=rounds_query), tight, LSE_ATOL, seed)
    declared = (output_tolerance(OP, backend, x.q.dtype, fmt), lse_tolerance(OP, backend, fmt))
    check(out, lse, expected(x, cache, causal=causal, round_query=False), *declared, seed, lse_rtol(OP, backend, fmt))


@pytest.mark.parametrize("layout", ["dense", "paged", "ragged"])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_cache_matches_float64(backend: str, fmt: str, layout: str) -> None:
    generator, seed = fresh_generator()
    x = make_mla_inputs(4, 16, 48, kv_lens=[48, 17, 1, 0], generator=generator)
    run_and_check(backend, fmt, x, layout, 16, True, generator, seed)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_cache_with_several_new_tokens(backend: str, fmt: str, causal: bool) -> None:
    generator, seed = fresh_generator()
    x = make_mla_inputs(3, 8, 40, kv_lens=[40, 2, 1], q_len=3, generator=generator)  # lengths below Q too
    run_and_check(backend, fmt, x, "paged", 16, causal, generator, seed)


def test_the_query_rounding_is_what_the_tight_check_relies_on() -> None:
    """The MXFP8 query differs from the exact one by far more than the bf16 tolerance, so the tight
    check against the rounded query would fail for a kernel that did not round it as declared."""
    generator, seed = fresh_generator()
    x = make_mla_inputs(2, 16, 32, generator=generator)
    cache = pack_cache(x, "mxfp4")
    exact = expected(x, cache, causal=True, round_query=False)[0]
    rounded = expected(x, cache, causal=True, round_query=True)[0]
    assert relative_error(rounded, exact) > 2 * REL_L2_TOLERANCE[torch.bfloat16] / 5, f"seed {seed}"
    assert relative_error(round_query_mxfp8(x.q), x.q.float()) > 0.01


def test_fp8_mma_scores_declare_a_relative_lse_bound() -> None:
    """The part of |lse| added to the lse bound comes from ``fp8_mma_scores`` at registration: cutlass
    declares it for its fp8 formats (its 16-row kernel scores with fp8 MMA), not for bf16; the
    backends that widen fp8 before their matmuls do not declare it."""
    for fmt in ("fp8", "fp8_ds_mla"):
        assert lse_rtol(OP, "cutlass", fmt) == FP8_MMA_LSE_RTOL
    assert lse_rtol(OP, "cutlass", torch.bfloat16) == 0.0
    for backend in ("torch", "triton", "tilecpp", "aiter"):
        assert lse_rtol(OP, backend, "fp8") == 0.0, backend


def test_declared_cache_formats_are_known_formats() -> None:
    """Every cache format an implementation names at registration (query rounding, fp8 MMA scores,
    packed formats it reads) is a format ``tilegym.quant`` knows: a misspelt name would silently
    drop the declaration."""
    from tilegym.quant import CACHE_FORMATS

    for backend, impl in implementations(OP).items():
        named = impl.quantizes_query | impl.fp8_mma_scores | impl.packed_kv_formats
        assert named <= set(CACHE_FORMATS), (backend, sorted(named - set(CACHE_FORMATS)))


def test_the_relative_lse_bound_scales_with_each_row() -> None:
    """``assert_matches_float64`` bounds each row's lse error by atol + rtol * |its lse|: an error of
    0.01 passes at lse 50 with rtol 3e-4 (bound 0.016) but not at lse 2 (bound 0.0016), nor at lse 50
    without rtol."""
    generator, seed = fresh_generator()
    out = torch.randn(2, 4, 8, generator=generator, dtype=torch.float64)
    expected_lse = torch.tensor([[50.0, -50.0, 3.0, -2.5], [1.0, 7.0, -4.0, 0.5]], dtype=torch.float64)
    off = expected_lse.clone()
    off[0, 0] += 0.01
    off[0, 1] -= 0.01
    assert_matches_float64(out, off, out, expected_lse, rel_tol=0.0, lse_atol=1e-3, lse_rtol=3e-4, seed=seed)
    with pytest.raises(AssertionError, match="lse error"):
        assert_matches_float64(out, off, out, expected_lse, rel_tol=0.0, lse_atol=1e-3, seed=seed)
    off[1, 0] += 0.01
    with pytest.raises(AssertionError, match=r"\(lse 1\)"):
        assert_matches_float64(out, off, out, expected_lse, rel_tol=0.0, lse_atol=1e-3, lse_rtol=3e-4, seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize(("layout", "page_size"), [("dense", 0), ("paged", 64), ("ragged", 1)], ids=str)
@pytest.mark.parametrize(("heads", "q_len"), [(16, 1), (16, 2), (64, 1), (128, 1)], ids=str)
@pytest.mark.parametrize("fmt", FORMATS)
def test_gpu_packed_cache_matches_float64(fmt: str, heads: int, q_len: int, layout: str, page_size: int) -> None:
    generator, seed = fresh_generator()
    seq_len = 700
    lens = torch.randint(0, seq_len + 1, (12,), generator=generator).tolist()
    lens[:3] = [0, 1, seq_len]
    x = make_mla_inputs(12, heads, seq_len, kv_lens=lens, q_len=q_len, device="cuda", generator=generator)
    run_and_check("triton", fmt, x, layout, page_size, True, generator, seed)


# ----------------------------------------------------------------------------------------- contract


def small_inputs(q_len: int = 1):
    return make_mla_inputs(2, 4, 8, kv_lens=[8, 3], q_len=q_len, generator=torch.Generator().manual_seed(1))


def test_fp8_ds_mla_refuses_separate_rope_or_scales() -> None:
    x = small_inputs()
    packed = pack_fp8_ds_mla(x.kv.float(), x.kpe.float())
    with pytest.raises(ValueError, match="kpe must be None"):
        validate_mla_decoding(x.q, x.qpe, packed, x.kpe, kv_cache_format="fp8_ds_mla")
    with pytest.raises(ValueError, match="kv_scale must be None"):
        validate_mla_decoding(x.q, x.qpe, packed, None, kv_scale=1.0, kv_cache_format="fp8_ds_mla")


def test_fp8_ds_mla_checks_bytes_dtype_and_alignment() -> None:
    x = small_inputs()
    packed = pack_fp8_ds_mla(x.kv.float(), x.kpe.float())
    with pytest.raises(TypeError, match="q must be bfloat16"):
        validate_mla_decoding(x.q.half(), x.qpe.half(), packed, None, kv_cache_format="fp8_ds_mla")
    with pytest.raises(ValueError, match="last dim 656"):
        validate_mla_decoding(x.q, x.qpe, packed[..., :640], None, kv_cache_format="fp8_ds_mla")
    shifted = torch.zeros(packed.numel() + 2, dtype=torch.uint8)[2:].view(packed.shape)
    with pytest.raises(ValueError, match="4-byte boundaries"):
        validate_mla_decoding(x.q, x.qpe, shifted, None, kv_cache_format="fp8_ds_mla")
    with pytest.raises(TypeError, match="kv_cache_format="):
        validate_mla_decoding(x.q, x.qpe, packed, None)
    with pytest.raises(ValueError, match="D=512 and P=64"):
        small = make_mla_inputs(2, 4, 8, head_dim=256)
        validate_mla_decoding(small.q, small.qpe, packed, None, kv_cache_format="fp8_ds_mla")


def test_mxfp4_checks_codes_and_block_scales() -> None:
    x = small_inputs()
    codes, scales = quantize_mxfp4(x.kv.float())
    call = validate_mla_decoding(x.q, x.qpe, codes, x.kpe, kv_scale=scales, kv_cache_format="mxfp4")
    assert call.kv_format == "mxfp4" and call.is_packed and not call.is_fp8
    with pytest.raises(ValueError, match="kv_scale .* is required"):
        validate_mla_decoding(x.q, x.qpe, codes, x.kpe, kv_cache_format="mxfp4")
    with pytest.raises(ValueError, match="kv_scale must have shape"):
        validate_mla_decoding(x.q, x.qpe, codes, x.kpe, kv_scale=scales[..., :8], kv_cache_format="mxfp4")
    with pytest.raises(TypeError, match="kv_scale must be uint8"):
        validate_mla_decoding(x.q, x.qpe, codes, x.kpe, kv_scale=scales.float(), kv_cache_format="mxfp4")
    with pytest.raises(ValueError, match=r"q.shape\[-1\] // 2"):
        validate_mla_decoding(x.q, x.qpe, codes[..., :128], x.kpe, kv_scale=scales, kv_cache_format="mxfp4")
    with pytest.raises(TypeError, match="kpe must have the dtype of q"):
        validate_mla_decoding(x.q, x.qpe, codes, x.kpe.half(), kv_scale=scales, kv_cache_format="mxfp4")


def test_kv_cache_format_must_name_a_known_format_matching_kv() -> None:
    x = small_inputs()
    with pytest.raises(ValueError, match="one of bf16, fp16, fp8, fp8_ds_mla, mxfp4"):
        validate_mla_decoding(x.q, x.qpe, x.kv, x.kpe, kv_cache_format="int4")
    with pytest.raises(ValueError, match="does not match kv's dtype"):
        validate_mla_decoding(x.q, x.qpe, x.kv, x.kpe, kv_cache_format="fp8")
    assert validate_mla_decoding(x.q, x.qpe, x.kv, x.kpe, kv_cache_format="bf16").kv_format == "bf16"


@pytest.mark.parametrize("backend", ["tilecpp", "aiter"])
def test_backends_without_the_format_say_so(backend: str) -> None:
    x = small_inputs()
    call = validate_mla_decoding(x.q, x.qpe, **pack_cache(x, "fp8_ds_mla").op_kwargs())
    reasons = implementations(OP)[backend].reasons(call)
    assert reasons and "does not read the fp8_ds_mla cache format" in reasons[0]


def test_a_plan_takes_the_packed_bytes_and_checks_them() -> None:
    x = small_inputs(q_len=2)
    cache = pack_cache(x, "fp8_ds_mla")
    plan = plan_mla_decoding(
        x.q, x.qpe, cache.kv, None, kv_lens=x.kv_lens, kv_cache_format="fp8_ds_mla", backend="torch"
    )
    out = mla_decoding_split_kv(x.q, x.qpe, cache.kv, None, plan=plan)
    reference = mla_decode_float64(x.q, x.qpe, cache.latent, cache.rope, kv_lens=x.kv_lens)[0]
    assert relative_error(out, reference) <= REL_L2_TOLERANCE[torch.bfloat16]
    with pytest.raises(ValueError, match="kpe must be None"):
        mla_decoding_split_kv(x.q, x.qpe, cache.kv, x.kpe, plan=plan)
    with pytest.raises(ValueError, match="kv_cache_format='mxfp4' differs"):
        mla_decoding_split_kv(x.q, x.qpe, cache.kv, None, kv_cache_format="mxfp4", plan=plan)
    mx = pack_cache(x, "mxfp4")
    mx_plan = plan_mla_decoding(x.q, x.qpe, **mx.op_kwargs(), kv_lens=x.kv_lens, backend="torch")
    wide = torch.zeros((*mx.kv_scale.shape[:-1], 2 * mx.kv_scale.shape[-1]), dtype=torch.uint8)
    strided_scales = wide[..., : mx.kv_scale.shape[-1]]  # same shape, other strides
    with pytest.raises(ValueError, match="kv_scale does not match the plan"):
        mla_decoding_split_kv(x.q, x.qpe, mx.kv, mx.kpe, kv_scale=strided_scales, plan=mx_plan)
