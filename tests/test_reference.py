"""The torch backend against an independent float64 computation, on fresh random inputs."""

from __future__ import annotations

import itertools

import pytest
import torch

import tilegym
from tilegym.testing import make_mla_inputs, mla_decode_float64, relative_error

# Relative L2 error of the output vs float64: the kernel math is float32, so what remains is
# the rounding of the output to 16 bits (bf16 ~1e-3, fp16 ~1.5e-4); a real bug is O(1).
TOLERANCE = {torch.bfloat16: 4e-3, torch.float16: 5e-4}
LSE_ATOL = 1e-4

# One grid, sampled so that every value of each axis appears with several others.
BATCHES = (1, 3, 8)
HEADS = (1, 8, 16, 24, 128)
SEQ_LENS = (1, 63, 129, 1024)
SPLITS = (None, 1, 16, 100, 2048)
GRID = [
    (b, h, s, split, dtype)
    for i, (h, s) in enumerate(itertools.product(HEADS, SEQ_LENS))
    for b, split, dtype in [
        (
            BATCHES[i % len(BATCHES)],
            SPLITS[i % len(SPLITS)],
            (torch.bfloat16, torch.float16)[i % 2],
        )
    ]
]


def row_lengths(batch: int, seq_len: int, generator: torch.Generator) -> list[int]:
    """Per-row lengths with an empty row, a full row and random ones in between."""
    lens = torch.randint(0, seq_len + 1, (batch,), generator=generator).tolist()
    lens[0] = 0
    if batch > 1:
        lens[-1] = seq_len
    return lens


@pytest.mark.parametrize("batch, heads, seq_len, split, dtype", GRID)
@pytest.mark.parametrize("with_lens", [False, True])
def test_reference_matches_float64(batch, heads, seq_len, split, dtype, with_lens):
    g = torch.Generator().manual_seed(hash((batch, heads, seq_len, split, with_lens)) % 2**31)
    head_dim, rope_dim = (512, 64) if heads <= 16 and seq_len <= 129 else (64, 16)
    lens = row_lengths(batch, seq_len, g) if with_lens else None
    x = make_mla_inputs(batch, heads, seq_len, head_dim, rope_dim, dtype=dtype, kv_lens=lens, generator=g)
    out, lse = tilegym.mla_decoding_split_kv(
        x.q, x.qpe, x.kv, x.kpe, kv_len_per_split=split, kv_lens=x.kv_lens, return_lse=True, backend="torch"
    )
    expected, expected_lse = mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert relative_error(out, expected) < TOLERANCE[dtype]
    torch.testing.assert_close(lse.double(), expected_lse, atol=LSE_ATOL, rtol=0)
    if with_lens:
        empty = x.kv_lens == 0
        assert (out[empty] == 0).all() and torch.isneginf(lse[empty]).all()


def test_result_does_not_depend_on_split_length():
    x = make_mla_inputs(2, 16, 300, 128, 32, dtype=torch.float16)
    outs = [
        tilegym.mla_decoding_split_kv(x.q, x.qpe, x.kv, x.kpe, kv_len_per_split=n, backend="torch").float()
        for n in (1, 7, 64, 300, 5000)
    ]
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], atol=2e-3, rtol=2e-3)


def test_fp8_kv_is_dequantised_with_kv_scale():
    x = make_mla_inputs(2, 16, 200, 512, 64, dtype=torch.bfloat16, kv_dtype=torch.float8_e4m3fn)
    out = tilegym.mla_decoding_split_kv(x.q, x.qpe, x.kv, x.kpe, kv_scale=x.kv_scale, backend="torch")
    expected, _ = mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, kv_scale=x.kv_scale)
    assert relative_error(out, expected) < TOLERANCE[torch.bfloat16]
    # The scale matters: ignoring it changes the answer well beyond the tolerance.
    unscaled, _ = mla_decode_float64(x.q, x.qpe, x.kv, x.kpe)
    assert relative_error(out, unscaled) > 0.1


def test_out_of_range_kv_lens_are_clamped():
    x = make_mla_inputs(3, 8, 40, 64, 16, dtype=torch.float16, kv_lens=[-5, 1000, 40])
    out, lse = tilegym.mla_decoding_split_kv(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens, return_lse=True)
    clamped = x.kv_lens.clamp(0, 40)
    expected, expected_lse = mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, kv_lens=clamped)
    assert relative_error(out, expected) < TOLERANCE[torch.float16]
    torch.testing.assert_close(lse.double(), expected_lse, atol=LSE_ATOL, rtol=0)


def test_custom_sm_scale():
    x = make_mla_inputs(2, 8, 50, 64, 16, dtype=torch.float16)
    out = tilegym.mla_decoding_split_kv(x.q, x.qpe, x.kv, x.kpe, 0.3)
    expected, _ = mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, 0.3)
    assert relative_error(out, expected) < TOLERANCE[torch.float16]


def splitk_float64(partial_out: torch.Tensor, partial_lse: torch.Tensor) -> torch.Tensor:
    """Combine written out longhand in float64, from the definition of the split lse."""
    lse = partial_lse.double()
    total = torch.logsumexp(lse, dim=-1, keepdim=True)
    weights = torch.where(torch.isneginf(lse), 0.0, torch.exp(lse - total))
    return (weights[..., None] * partial_out.double()).sum(dim=2).nan_to_num(0.0)


@pytest.mark.parametrize("splits", [1, 3, 17])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_splitk_reduce_matches_float64(splits, out_dtype):
    g = torch.Generator().manual_seed(splits)
    partial_out = torch.randn(3, 5, splits, 64, generator=g)
    partial_lse = torch.randn(3, 5, splits, generator=g) * 4
    partial_lse[0, 0, :] = float("-inf")  # a row whose splits are all empty
    partial_lse[1, :, 0] = float("-inf")  # one empty split among others
    out = torch.empty(3, 5, 64, dtype=out_dtype)
    tilegym.splitk_reduce(partial_out, partial_lse, out=out, backend="torch")
    expected = splitk_float64(partial_out, partial_lse)
    assert (out[0, 0] == 0).all()
    tol = 1e-6 if out_dtype == torch.float32 else 4e-3
    assert relative_error(out, expected) < tol
