"""The public ops under torch.compile: one opaque tilegym:: op per call, no graph break."""

from __future__ import annotations

import pytest
import torch

import tilegym
from tilegym.ops import torch_library
from tilegym.testing import REL_L2_TOLERANCE, make_mla_inputs, mla_decode_float64, pack_cache, relative_error, to_pages


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
    """Checks run while tracing: a ValueError naming the argument (fullgraph: Dynamo's error carrying it)."""
    x = make_mla_inputs(2, 16, 40, 64, 16, dtype=torch.float16, kv_dtype=torch.float8_e4m3fn)

    def step(q, qpe, kv, kpe):
        return tilegym.mla_decoding_split_kv(q, qpe, kv, kpe, kv_scale=-1.0)

    with pytest.raises(ValueError, match="kv_scale must be finite and > 0"):
        torch.compile(step, backend="aot_eager")(x.q, x.qpe, x.kv, x.kpe)
    with pytest.raises((ValueError, RuntimeError), match="kv_scale must be finite and > 0"):
        compiled(step)(x.q, x.qpe, x.kv, x.kpe)


@pytest.mark.parametrize("return_lse", [False, True])
def test_custom_op_registration_is_consistent(return_lse):
    x = make_mla_inputs(2, 16, 40, 64, 16, dtype=torch.float16, kv_lens=[40, 7], q_len=2)
    args = (x.q, x.qpe, x.kv, x.kpe, x.kv_lens, None, None, None, None, 0.1, None, True, return_lse, None, "torch")
    torch.library.opcheck(torch_library.mla_decoding_split_kv_op, args)


def test_custom_op_takes_a_packed_cache():
    x = make_mla_inputs(2, 16, 40, kv_lens=[40, 7], q_len=2)
    cache = pack_cache(x, "fp8_ds_mla")
    args = (x.q, x.qpe, cache.kv, None, x.kv_lens, None, None, None, None, 0.1, None, True, True, "fp8_ds_mla", "torch")
    torch.library.opcheck(torch_library.mla_decoding_split_kv_op, args)


def test_compiled_packed_cache_matches_float64():
    x = make_mla_inputs(2, 16, 40, kv_lens=[40, 7], q_len=2)
    cache = pack_cache(x, "mxfp4")

    def step(q, qpe, kv, kpe, kv_scale):
        return tilegym.mla_decoding_split_kv(
            q, qpe, kv, kpe, kv_scale=kv_scale, kv_lens=x.kv_lens, kv_cache_format="mxfp4", backend="torch"
        )

    out = compiled(step)(x.q, x.qpe, cache.kv, cache.kpe, cache.kv_scale)
    expected, _ = mla_decode_float64(x.q, x.qpe, cache.latent, cache.rope, kv_lens=x.kv_lens)
    assert relative_error(out, expected) <= REL_L2_TOLERANCE[torch.bfloat16]


def test_compiled_paged_mtp_with_a_plan_matches_float64():
    """A plan under torch.compile: the op runs the plan's layout and options (and needs no recompile per step)."""
    x = make_mla_inputs(3, 16, 64, 64, 16, dtype=torch.float16, kv_lens=[64, 17, 0], q_len=2)
    pages = to_pages(x, 16)

    def layer(q, qpe, kv, kpe, plan):
        return tilegym.mla_decoding_split_kv(q, qpe, kv, kpe, plan=plan)

    run = compiled(layer)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):  # a fresh plan (and fresh index tensors) each step: no recompile
            kwargs = {k: v.clone() for k, v in pages.layout_kwargs("paged").items()}
            plan = tilegym.plan_mla_decoding(x.q, x.qpe, pages.kv, pages.kpe, **kwargs)
            out = run(x.q, x.qpe, pages.kv, pages.kpe, plan)
    expected, _ = mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens)
    assert out.shape == x.q.shape and relative_error(out, expected) < 2e-3
