"""The public ops under torch.compile: one opaque tilegym:: op per call, no graph break."""

from __future__ import annotations

import pytest
import torch

import tilegym
from tilegym.ops import torch_library
from tilegym.testing import make_mla_inputs, mla_decode_float64, relative_error


def compiled(fn):
    return torch.compile(fn, backend="aot_eager", fullgraph=True)


def test_mla_compiles_without_graph_breaks_and_matches_float64():
    x = make_mla_inputs(3, 16, 90, 64, 16, dtype=torch.float16, kv_lens=[0, 45, 90])

    def step(q, qpe, kv, kpe, kv_lens):
        out, lse = tilegym.mla_decoding_split_kv(q, qpe, kv, kpe, kv_lens=kv_lens, return_lse=True)
        return out * 2, lse

    out2, lse = compiled(step)(x.q, x.qpe, x.kv, x.kpe, x.kv_lens)
    expected, expected_lse = mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens)
    assert relative_error(out2 / 2, expected) < 5e-4
    torch.testing.assert_close(lse.double(), expected_lse, atol=1e-4, rtol=0)


def test_compiled_out_and_fp8_float_scale():
    x = make_mla_inputs(2, 16, 40, 64, 16, dtype=torch.bfloat16, kv_dtype=torch.float8_e4m3fn)
    scale = float(x.kv_scale)

    def step(q, qpe, kv, kpe, out):
        return tilegym.mla_decoding_split_kv(q, qpe, kv, kpe, 0.2, 16, kv_scale=scale, out=out)

    out = torch.full((2, 16, 64), float("nan"), dtype=torch.bfloat16)
    result = compiled(step)(x.q, x.qpe, x.kv, x.kpe, out)
    expected, _ = mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, 0.2, kv_scale=scale)
    assert relative_error(out, expected) < 4e-3
    torch.testing.assert_close(result, out, rtol=0, atol=0)


def test_compiled_splitk_reduce():
    partial_out, partial_lse = torch.randn(2, 4, 3, 32), torch.randn(2, 4, 3)
    partial_lse[0, 0] = float("-inf")
    result = compiled(lambda o, lse: tilegym.splitk_reduce(o, lse))(partial_out, partial_lse)
    torch.testing.assert_close(result, tilegym.splitk_reduce(partial_out, partial_lse), rtol=0, atol=0)
    assert (result[0, 0] == 0).all()


def test_bad_input_still_raises_under_compile():
    x = make_mla_inputs(2, 16, 40, 64, 16, dtype=torch.float16)
    with pytest.raises(ValueError, match="kv_len_per_split must be >= 1"):
        compiled(lambda q, qpe, kv, kpe: tilegym.mla_decoding_split_kv(q, qpe, kv, kpe, kv_len_per_split=0))(
            x.q, x.qpe, x.kv, x.kpe
        )


@pytest.mark.parametrize("return_lse", [False, True])
def test_custom_op_registration_is_consistent(return_lse):
    x = make_mla_inputs(2, 16, 40, 64, 16, dtype=torch.float16)
    out = torch.empty(2, 16, 64, dtype=torch.float16)
    args = (x.q, x.qpe, x.kv, x.kpe, out, None, None, None, None, return_lse, "torch")
    torch.library.opcheck(torch_library.mla_decoding_split_kv_op, args)
