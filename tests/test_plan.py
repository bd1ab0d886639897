"""Plans: made once per step, reused by every layer; a plan used with other inputs raises."""

from __future__ import annotations

import pytest
import torch

import tilegym
from tilegym.backend import backend_unavailable_reasons
from tilegym.ops.accuracy import lse_rtol, lse_tolerance, output_tolerance
from tilegym.testing import (
    assert_matches_float64,
    fresh_generator,
    make_mla_inputs,
    mla_decode_float64,
    relative_error,
    to_pages,
)

B, H, S, D, P = 3, 16, 96, 64, 16


@pytest.fixture
def step():
    """Two layers' caches sharing one page table and one kv_lens, like a decode step's layers."""
    g = torch.Generator().manual_seed(7)
    layers = []
    for _ in range(2):
        x = make_mla_inputs(B, H, S, D, P, dtype=torch.float16, kv_lens=[96, 40, 0], generator=g)
        layers.append((x, to_pages(x, 16, generator=torch.Generator().manual_seed(3))))
    return layers


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_one_plan_serves_every_layer(step, backend):
    (x0, p0), (x1, p1) = step
    table = p0.layout_kwargs("paged")
    plan = tilegym.plan_mla_decoding(x0.q, x0.qpe, p0.kv, p0.kpe, **table, backend=backend)
    assert plan.backend == backend and "paged" in repr(plan)
    for x, pages in step:
        out = tilegym.mla_decoding_split_kv(x.q, x.qpe, pages.kv, pages.kpe, plan=plan)
        unplanned = tilegym.mla_decoding_split_kv(x.q, x.qpe, pages.kv, pages.kpe, **table, backend=backend)
        expected, _ = mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens)
        assert torch.equal(out, unplanned), "a plan must give the unplanned call's bits"
        assert relative_error(out, expected) < 2e-3
    assert p1.block_table.equal(p0.block_table)  # same seed: one table for both layers


def test_refresh_follows_lengths_changed_in_place(step):
    (x, pages), _ = step
    kwargs = pages.layout_kwargs("paged")
    plan = tilegym.plan_mla_decoding(x.q, x.qpe, pages.kv, pages.kpe, **kwargs, backend="triton", return_lse=True)
    kwargs["kv_lens"].copy_(torch.tensor([5, 30, 0], dtype=torch.int32))  # shorter: inside the written slots
    stale, _ = tilegym.mla_decoding_split_kv(x.q, x.qpe, pages.kv, pages.kpe, plan=plan)
    plan.refresh()
    out, lse = tilegym.mla_decoding_split_kv(x.q, x.qpe, pages.kv, pages.kpe, plan=plan)
    lens = kwargs["kv_lens"]
    expected, expected_lse = mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, kv_lens=lens)
    assert relative_error(out, expected) < 2e-3
    assert relative_error(stale, expected) > 1e-2, "without refresh the old schedule must show"


def test_mismatched_inputs_raise_clear_errors(step):
    (x, pages), _ = step
    kwargs = pages.layout_kwargs("paged")
    plan = tilegym.plan_mla_decoding(x.q, x.qpe, pages.kv, pages.kpe, **kwargs)
    run = tilegym.mla_decoding_split_kv
    with pytest.raises(ValueError, match="q does not match the plan: it was made for shape"):
        run(x.q[:2], x.qpe, pages.kv, pages.kpe, plan=plan)
    with pytest.raises(ValueError, match="kv does not match the plan"):
        run(x.q, x.qpe, pages.kv.float().half().contiguous(), pages.kpe, plan=plan)
    with pytest.raises(ValueError, match="qpe does not match the plan"):
        run(x.q, x.qpe.bfloat16(), pages.kv, pages.kpe, plan=plan)
    with pytest.raises(ValueError, match="kv_lens is not the tensor this plan was made with"):
        run(x.q, x.qpe, pages.kv, pages.kpe, kv_lens=kwargs["kv_lens"].clone(), plan=plan)
    with pytest.raises(ValueError, match="block_table is not the tensor"):
        run(x.q, x.qpe, pages.kv, pages.kpe, block_table=kwargs["block_table"].clone(), plan=plan)
    with pytest.raises(ValueError, match=r"sm_scale=0.5 differs from the plan's sm_scale"):
        run(x.q, x.qpe, pages.kv, pages.kpe, sm_scale=0.5, plan=plan)
    with pytest.raises(ValueError, match=r"return_lse=True differs"):
        run(x.q, x.qpe, pages.kv, pages.kpe, return_lse=True, plan=plan)
    with pytest.raises(ValueError, match="differs from the plan's backend 'torch'"):
        run(x.q, x.qpe, pages.kv, pages.kpe, backend="triton", plan=plan)
    with pytest.raises(ValueError, match=r"out must be a torch.float16 tensor of shape \(3, 16, 64\)"):
        run(x.q, x.qpe, pages.kv, pages.kpe, out=torch.empty(3, 16, 63, dtype=torch.float16), plan=plan)
    with pytest.raises(ValueError, match="kv_scale is only for fp8"):
        run(x.q, x.qpe, pages.kv, pages.kpe, kv_scale=1.0, plan=plan)
    with pytest.raises(ValueError, match="requires grad"):
        run(x.q.detach().requires_grad_(True), x.qpe, pages.kv, pages.kpe, plan=plan)


def test_fp8_layers_pass_their_own_scale():
    """Each layer may have its own kv_scale: a plan fixes the format, not the scale."""
    g = torch.Generator().manual_seed(5)
    x = make_mla_inputs(2, 16, 64, D, P, dtype=torch.float16, kv_dtype=torch.float8_e4m3fn, generator=g)
    plan = tilegym.plan_mla_decoding(x.q, x.qpe, x.kv, x.kpe, kv_scale=x.kv_scale, backend="torch")
    for scale in (x.kv_scale, float(x.kv_scale) * 2):
        out = tilegym.mla_decoding_split_kv(x.q, x.qpe, x.kv, x.kpe, kv_scale=scale, plan=plan)
        expected, _ = mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, kv_scale=scale)
        assert relative_error(out, expected) < 2e-3


def test_mtp_plan_keeps_q_len_and_causality():
    g = torch.Generator().manual_seed(9)
    x = make_mla_inputs(2, 8, 50, D, P, dtype=torch.float16, kv_lens=[50, 3], q_len=3, generator=g)
    plan = tilegym.plan_mla_decoding(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens, causal=False, backend="triton")
    out = tilegym.mla_decoding_split_kv(x.q, x.qpe, x.kv, x.kpe, plan=plan)
    expected, _ = mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens, causal=False)
    assert out.shape == (2, 3, 8, D) and relative_error(out, expected) < 2e-3
    with pytest.raises(ValueError, match="causal=True differs"):
        tilegym.mla_decoding_split_kv(x.q, x.qpe, x.kv, x.kpe, causal=True, plan=plan)


def test_unplanned_calls_reuse_a_cached_plan_that_follows_kv_lens():
    from tilegym.ops import PLAN_CACHE

    PLAN_CACHE.clear()
    g = torch.Generator().manual_seed(11)
    x = make_mla_inputs(2, 16, 96, D, P, dtype=torch.float16, kv_lens=[96, 40], generator=g)
    run = tilegym.mla_decoding_split_kv
    first = run(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens, backend="triton")
    plans = list(PLAN_CACHE._plans.values())
    x.kv_lens.copy_(torch.tensor([17, 96], dtype=torch.int32))  # in place: the cached plan must follow
    second = run(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens, backend="triton")
    assert list(PLAN_CACHE._plans.values()) == plans, "the same call must reuse its plan"
    expected, _ = mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens)
    assert relative_error(second, expected) < 2e-3 and relative_error(first, expected) > 1e-2
    other = x.kv_lens.clone()
    run(x.q, x.qpe, x.kv, x.kpe, kv_lens=other, backend="triton")
    assert len(PLAN_CACHE._plans) == 2, "another kv_lens tensor is another plan"


@pytest.mark.gpu
@pytest.mark.parametrize(("backend", "heads"), [("triton", 16), ("tilecpp", 16), ("tilecpp", 128), ("cutlass", 16)])
def test_graph_replay_reads_kv_scale_from_the_device(backend: str, heads: int) -> None:
    """Capture a planned fp8 call, change kv_scale in place, replay: the output follows the new
    scale (the kernels read it from its pointer: no host copy baked into a plan or a graph)."""
    reasons = backend_unavailable_reasons(backend)
    if reasons or not torch.cuda.is_available():
        pytest.skip(f"{backend} cannot run here: {reasons or 'no CUDA GPU'}")
    generator, seed = fresh_generator()
    fp8 = torch.float8_e4m3fn
    x = make_mla_inputs(8, heads, 2048, dtype=torch.bfloat16, kv_dtype=fp8, device="cuda", generator=generator)
    x.kv_lens = torch.randint(1, 2049, (8,), generator=generator, dtype=torch.int32).cuda()
    out = torch.full_like(x.q, float("nan"))
    plan = tilegym.plan_mla_decoding(
        x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens, kv_scale=x.kv_scale, return_lse=True, backend=backend
    )
    tilegym.mla_decoding_split_kv(x.q, x.qpe, x.kv, x.kpe, kv_scale=x.kv_scale, out=out, plan=plan)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = tilegym.mla_decoding_split_kv(x.q, x.qpe, x.kv, x.kpe, kv_scale=x.kv_scale, out=out, plan=plan)
    op = "mla_decoding_split_kv"
    tolerances = {
        "rel_tol": output_tolerance(op, backend, torch.bfloat16, fp8),
        "lse_atol": lse_tolerance(op, backend, fp8),
        "lse_rtol": lse_rtol(op, backend, fp8),
    }
    for factor in (1.0, 0.25, 3.0):
        scale = x.kv_scale.clone() * factor
        x.kv_scale.copy_(scale)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        expected = mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens, kv_scale=scale)
        assert_matches_float64(out, lse, *expected, **tolerances, seed=f"{seed} (scale x{factor})")


def test_out_next_to_an_input_takes_the_fast_path_and_overlap_is_still_rejected(monkeypatch):
    """The per-call overlap test spans out's own bytes: an out that ends exactly where q begins is not
    sent to the full check (it was, while the span counted D / P times too many bytes), and an out
    sharing one element with q is rejected."""
    g = torch.Generator().manual_seed(11)
    x = make_mla_inputs(B, H, S, D, P, dtype=torch.float16, generator=g)
    n = B * H * D
    buffer = torch.empty(3 * n, dtype=torch.float16)
    out, q = buffer[:n].view(B, H, D), buffer[n : 2 * n].view(B, H, D)
    q.copy_(x.q)
    plan = tilegym.plan_mla_decoding(q, x.qpe, x.kv, x.kpe, backend="torch")
    full_checks = []
    check_out = plan.check_out
    monkeypatch.setattr(plan, "check_out", lambda *a: full_checks.append(1) or check_out(*a))
    result = tilegym.mla_decoding_split_kv(q, x.qpe, x.kv, x.kpe, out=out, plan=plan)
    assert result is out and not full_checks
    assert relative_error(out, mla_decode_float64(x.q, x.qpe, x.kv, x.kpe)[0]) < 2e-3
    shifted = buffer[1 : n + 1].view(B, H, D)  # its last element is q's first
    with pytest.raises(ValueError, match="out overlaps q"):
        tilegym.mla_decoding_split_kv(q, x.qpe, x.kv, x.kpe, out=shifted, plan=plan)
    assert full_checks
