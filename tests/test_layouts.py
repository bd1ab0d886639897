"""Every cache layout on every backend against float64: page sizes, edge lengths, permuted and shared pages.

Pages come from ``tilegym.testing.to_pages``: randomly ordered, rows may share a prefix page,
and every slot a row must not read (past its length, spare pages, unused table entries)
holds NaN or an out-of-range page id, so a read outside the row fails the comparison.
Backends the registry says cannot run here are skipped with their reason; aiter runs
through its emulation on CPU tensors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch

from tilegym.backend import BackendUnavailableError, backend_names
from tilegym.ops import mla_decoding_split_kv, plan_mla_decoding
from tilegym.testing import (
    REL_L2_TOLERANCE,
    assert_matches_float64,
    fresh_generator,
    make_mla_inputs,
    mla_decode_float64,
    relative_error,
    share_prefix,
    to_pages,
)

LSE_ATOL = 1e-3
BACKENDS = backend_names()


@contextlib.contextmanager
def runnable(backend: str, device: str) -> Iterator[None]:
    context: contextlib.AbstractContextManager = contextlib.nullcontext()
    if backend == "aiter" and device == "cpu":
        from aiter_emulation import emulated_aiter_backend

        context = emulated_aiter_backend()
    with context:
        try:
            yield
        except BackendUnavailableError as exc:
            pytest.skip(f"{backend}: {exc}")


def edge_lengths(page_size: int, seq_len: int) -> list[int]:
    """0, 1, a page boundary - 1, + 0 and + 1, and a full row."""
    return [0, 1, page_size - 1 if page_size > 1 else 2, page_size, page_size + 1, seq_len]


def check(out, lse, expected, expected_lse, dtype, seed) -> None:
    rel_tol = REL_L2_TOLERANCE[dtype]
    assert_matches_float64(out, lse, expected, expected_lse, rel_tol=rel_tol, lse_atol=LSE_ATOL, seed=seed)


CPU_PAGE_CASES = [(1, 16, 40), (16, 16, 80), (64, 16, 160)]  # (page_size, heads, seq_len)


@pytest.mark.parametrize("layout", ["paged", "ragged"])
@pytest.mark.parametrize(("page_size", "heads", "seq_len"), CPU_PAGE_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("backend", BACKENDS)
def test_pages_match_float64(backend: str, layout: str, page_size: int, heads: int, seq_len: int) -> None:
    dtype = torch.bfloat16 if backend == "aiter" else torch.float16
    generator, seed = fresh_generator()
    lens = edge_lengths(page_size, seq_len)
    x = make_mla_inputs(len(lens), heads, seq_len, dtype=dtype, kv_lens=lens, generator=generator)
    share_prefix(x, page_size)
    pages = to_pages(x, page_size, generator=generator, shared_prefix_pages=1)
    with runnable(backend, "cpu"):
        out, lse = mla_decoding_split_kv(
            x.q, x.qpe, pages.kv, pages.kpe, return_lse=True, backend=backend, **pages.layout_kwargs(layout)
        )
    check(out, lse, *mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens), dtype, seed)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_paged_equals_dense_on_the_same_rows(backend: str) -> None:
    """The same rows stored densely and in pages give the same result (up to summation order)."""
    generator, seed = fresh_generator()
    x = make_mla_inputs(3, 16, 100, dtype=torch.float16, kv_lens=[100, 33, 64], generator=generator)
    pages = to_pages(x, 16, generator=generator)
    with runnable(backend, "cpu"):
        dense = mla_decoding_split_kv(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens, backend=backend)
        paged = mla_decoding_split_kv(x.q, x.qpe, pages.kv, pages.kpe, backend=backend, **pages.layout_kwargs("paged"))
        ragged = mla_decoding_split_kv(
            x.q, x.qpe, pages.kv, pages.kpe, backend=backend, **pages.layout_kwargs("ragged")
        )
    for result in (paged, ragged):
        assert relative_error(result, dense.double()) < 1e-3, f"seed {seed}"


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("backend", BACKENDS)
def test_several_new_tokens_per_row(backend: str, causal: bool) -> None:
    """MTP: Q new tokens, causal within the row, including rows shorter than Q."""
    generator, seed = fresh_generator()
    x = make_mla_inputs(4, 8, 70, dtype=torch.float16, kv_lens=[0, 2, 40, 70], q_len=4, generator=generator)
    pages = to_pages(x, 16, generator=generator)
    with runnable(backend, "cpu"):
        out, lse = mla_decoding_split_kv(
            x.q,
            x.qpe,
            pages.kv,
            pages.kpe,
            causal=causal,
            return_lse=True,
            backend=backend,
            **pages.layout_kwargs("paged"),
        )
    assert out.shape == x.q.shape and lse.shape == x.q.shape[:3]
    check(out, lse, *mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens, causal=causal), x.q.dtype, seed)


# --- on the GPU -----------------------------------------------------------------------------

GPU_CASES = [
    # (layout, page_size, batch, heads, q_len, seq_len)
    ("paged", 64, 16, 16, 1, 4096),
    ("paged", 1, 8, 16, 1, 2048),
    ("ragged", 1, 8, 16, 1, 2048),
    ("ragged", 16, 8, 128, 1, 1500),
    ("paged", 16, 8, 64, 1, 3000),
    ("paged", 128, 4, 16, 1, 5000),
    ("paged", 32, 6, 16, 2, 1000),
    ("paged", 64, 6, 16, 4, 1000),
    ("dense", 0, 6, 32, 4, 1000),
]


@pytest.mark.gpu
@pytest.mark.parametrize(("layout", "page_size", "batch", "heads", "q_len", "seq_len"), GPU_CASES, ids=str)
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_layouts_match_float64(backend, layout, page_size, batch, heads, q_len, seq_len) -> None:
    generator, seed = fresh_generator()
    lens = torch.randint(0, seq_len + 1, (batch,), generator=generator).tolist()
    lens[:3] = [0, 1, seq_len]
    x = make_mla_inputs(
        batch, heads, seq_len, dtype=torch.bfloat16, kv_lens=lens, q_len=q_len, device="cuda", generator=generator
    )
    kwargs = {"kv_lens": x.kv_lens}
    kv, kpe = x.kv, x.kpe
    if layout != "dense":
        share_prefix(x, page_size * 2)
        pages = to_pages(x, page_size, generator=generator, shared_prefix_pages=2)
        kv, kpe, kwargs = pages.kv, pages.kpe, pages.layout_kwargs(layout)
    with runnable(backend, "cuda"):
        out, lse = mla_decoding_split_kv(x.q, x.qpe, kv, kpe, return_lse=True, backend=backend, **kwargs)
    torch.cuda.synchronize()
    check(out, lse, *mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens), torch.bfloat16, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["paged", "ragged"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_gpu_graph_replays_a_plan_that_follows_new_lengths(backend: str, layout: str) -> None:
    """Plan outside the graph, capture a layer, change kv_lens in place, refresh inside the graph, replay."""
    generator, seed = fresh_generator()
    batch, seq_len = 16, 2048
    x = make_mla_inputs(batch, 16, seq_len, dtype=torch.bfloat16, kv_lens=[seq_len] * batch, device="cuda")
    pages = to_pages(x, 64, generator=generator)
    kwargs = pages.layout_kwargs(layout)
    lens = kwargs["kv_lens"]
    out = torch.full_like(x.q, float("nan"))
    with runnable(backend, "cuda"):
        plan = plan_mla_decoding(x.q, x.qpe, pages.kv, pages.kpe, **kwargs, backend=backend)
        mla_decoding_split_kv(x.q, x.qpe, pages.kv, pages.kpe, out=out, plan=plan)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        plan.refresh()
        mla_decoding_split_kv(x.q, x.qpe, pages.kv, pages.kpe, out=out, plan=plan)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.refresh()
        mla_decoding_split_kv(x.q, x.qpe, pages.kv, pages.kpe, out=out, plan=plan)
    new = torch.randint(0, seq_len + 1, (batch,), generator=generator, dtype=torch.int32)
    new[0] = 0
    lens.copy_(new)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    expected, _ = mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, kv_lens=new)
    assert bool(torch.isfinite(out).all()) and relative_error(out, expected) < REL_L2_TOLERANCE[torch.bfloat16], seed
