"""The Tile C++ backend with an fp8 (float8_e4m3fn, per-tensor ``kv_scale``) cache.

``tests/test_parity.py`` already runs tilecpp on its dense fp8 cases (bf16 and fp16 queries, 16,
64 and 128 heads). What it does not cover is here: pages and ragged page lists with an fp8 cache,
several new tokens per row (causal MTP), 128 heads with pages, mixed lengths with empty rows,
and what ``supports()`` says about the variants that are not built (a ``kv_scale`` changed on the
device between graph replays: ``tests/test_plan.py``). Every GPU case compares against float64 on
fresh random inputs (the seed is in the message) with the tolerance the backend declares for an
fp8 cache.
"""

from __future__ import annotations

import pytest
import torch

from tilegym.ops import mla_decoding_split_kv
from tilegym.ops.accuracy import lse_tolerance
from tilegym.ops.contract import validate_mla_decoding
from tilegym.ops.mla_decoding import MLA_DECODING
from tilegym.testing import (
    assert_matches_float64,
    fresh_generator,
    make_mla_inputs,
    mla_decode_float64,
    share_prefix,
    to_pages,
)

FP8 = torch.float8_e4m3fn
BACKEND = "tilecpp"


def require_tilecpp() -> None:
    from tilegym.ops.tilecpp import probe

    reasons = probe()
    if reasons:
        pytest.skip(f"tilecpp cannot run here: {reasons}")


def check(out, lse, expected, expected_lse, dtype, seed) -> None:
    assert out.dtype == dtype, f"seed {seed}"
    tolerance = MLA_DECODING.tolerance(BACKEND, dtype, FP8)
    atol = lse_tolerance(MLA_DECODING.name, BACKEND, FP8)
    assert_matches_float64(out, lse, expected, expected_lse, rel_tol=tolerance, lse_atol=atol, seed=seed)


# (layout, page_size, batch, heads, q_len, seq_len, query dtype)
GPU_CASES = [
    ("dense", 0, 12, 16, 1, 3000, torch.bfloat16),
    ("dense", 0, 6, 16, 2, 1000, torch.float16),
    ("dense", 0, 5, 128, 1, 2000, torch.bfloat16),
    ("dense", 0, 4, 128, 2, 700, torch.float16),
    ("paged", 64, 12, 16, 1, 4096, torch.bfloat16),
    ("paged", 64, 6, 128, 1, 1500, torch.bfloat16),
    ("ragged", 128, 8, 16, 1, 2000, torch.float16),
    ("paged", 16, 8, 16, 1, 2000, torch.bfloat16),
    ("ragged", 32, 6, 16, 2, 1000, torch.bfloat16),
    ("paged", 16, 4, 128, 2, 900, torch.float16),
    ("ragged", 32, 4, 64, 1, 1200, torch.bfloat16),
]


@pytest.mark.gpu
@pytest.mark.parametrize(("layout", "page_size", "batch", "heads", "q_len", "seq_len", "dtype"), GPU_CASES, ids=str)
def test_fp8_cache_matches_float64(layout, page_size, batch, heads, q_len, seq_len, dtype) -> None:
    require_tilecpp()
    generator, seed = fresh_generator()
    lens = torch.randint(0, seq_len + 1, (batch,), generator=generator).tolist()
    lens[:3] = [0, 1, seq_len]  # an empty row, a one-token row, a full row; the rest mixed
    x = make_mla_inputs(
        batch, heads, seq_len, dtype=dtype, kv_dtype=FP8, kv_lens=lens, q_len=q_len, device="cuda", generator=generator
    )
    kwargs = {"kv_lens": x.kv_lens}
    kv, kpe = x.kv, x.kpe
    if layout != "dense":
        share_prefix(x, page_size * 2)
        pages = to_pages(x, page_size, generator=generator, shared_prefix_pages=2)
        kv, kpe, kwargs = pages.kv, pages.kpe, pages.layout_kwargs(layout)
    out, lse = mla_decoding_split_kv(
        x.q, x.qpe, kv, kpe, kv_scale=x.kv_scale, return_lse=True, backend=BACKEND, **kwargs
    )
    torch.cuda.synchronize()
    expected = mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens, kv_scale=x.kv_scale)
    check(out, lse, *expected, dtype, seed)
    empty = (x.kv_lens <= 0).cpu()
    assert bool((out.cpu()[empty] == 0).all()), f"a row with no tokens must give zeros, seed {seed}"


# --- on any machine: what supports() says ----------------------------------------------------


def fp8_call(page_size: int, kv_dtype: torch.dtype = FP8, heads: int = 16):
    x = make_mla_inputs(2, heads, 64, kv_dtype=kv_dtype, kv_lens=[64, 40])
    if page_size == 0:
        return validate_mla_decoding(x.q, x.qpe, x.kv, x.kpe, kv_scale=x.kv_scale)
    pages = to_pages(x, page_size)
    kwargs = pages.layout_kwargs("paged")
    return validate_mla_decoding(x.q, x.qpe, pages.kv, pages.kpe, kv_scale=x.kv_scale, **kwargs)


def test_pages_of_one_token_are_not_built_for_fp8_and_supports_says_so() -> None:
    from tilegym.ops.tilecpp.mla_decoding_split_kv import supports

    reasons = supports(fp8_call(1))
    assert len(reasons) == 1 and "page sizes 16, 32" in reasons[0] and "fp8" in reasons[0], reasons


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fnuz"), reason="this torch has no float8_e4m3fnuz")
def test_the_amd_fp8_format_is_refused_with_its_name() -> None:
    from tilegym.ops.tilecpp.mla_decoding_split_kv import supports

    reasons = supports(fp8_call(0, torch.float8_e4m3fnuz))
    assert len(reasons) == 1 and "float8_e4m3fn" in reasons[0] and "e4m3fnuz" in reasons[0], reasons


def test_every_fp8_layout_the_backend_accepts_has_a_variant_in_precompile() -> None:
    from tilegym.ops.tilecpp import mla_decoding_split_kv as m

    built = set(m.all_kernels())
    for dtype in m.DTYPES:
        for heads in (16, 32, 128):
            for page_size in (0, 16, 32, 64, 128, 256):
                call = fp8_call(page_size, heads=heads)
                config = m.choose_config(call)
                kind = m.layout_kind(call, config)
                assert kind in m.layout_kinds(config, FP8), (heads, page_size, config, kind)
                assert m.split_kernel(dtype, config, kind, FP8) in built, (dtype, heads, page_size)
