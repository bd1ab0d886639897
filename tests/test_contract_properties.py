"""Property-based test of the op contract: drawn shapes, layouts, lengths, splits and garbage.

Hypothesis draws a call (batch, heads, new tokens, head dims, cache length, layout, page
size, every row's length including 0 and S, a split length, causality, dtype) and fills
every position a row must not read with garbage (NaN, inf or a huge value). Each backend
CI can run (torch, Triton's interpreter, aiter's emulation where it applies) must then:

- match the float64 oracle;
- give zeros and lse -inf for a query row that sees no token;
- give the same result whatever ``kv_len_per_split`` (up to rounding);
- and, with a NaN planted in one row's valid data, keep every other row finite.

The CI budget is fixed and derandomized; the GPU-marked variant runs a larger budget on the
GPU backends.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import tilegym  # noqa: E402
from tilegym.backend import BackendUnavailableError  # noqa: E402
from tilegym.testing import REL_L2_TOLERANCE, make_mla_inputs, mla_decode_float64, relative_error, to_pages  # noqa: E402

GARBAGE = (float("nan"), float("inf"), -float("inf"), 6e4)


@dataclass(frozen=True)
class Drawn:
    batch: int
    heads: int
    q_len: int
    head_dim: int
    rope_dim: int
    seq_len: int
    layout: str
    page_size: int
    lengths: tuple[int, ...]
    split: int | None
    causal: bool
    dtype: torch.dtype
    garbage: float
    seed: int


@st.composite
def calls(draw, max_seq: int = 80, max_batch: int = 4, dims: tuple[int, int] | None = None) -> Drawn:
    batch = draw(st.integers(1, max_batch))
    seq_len = draw(st.integers(1, max_seq))
    length = st.one_of(st.just(0), st.just(seq_len), st.integers(0, seq_len))
    return Drawn(
        batch=batch,
        heads=draw(st.sampled_from([1, 3, 16])),
        q_len=draw(st.sampled_from([1, 1, 2, 3])),
        head_dim=dims[0] if dims else draw(st.sampled_from([32, 64])),
        rope_dim=dims[1] if dims else draw(st.sampled_from([16, 32])),
        seq_len=seq_len,
        layout=draw(st.sampled_from(["dense", "paged", "ragged"])),
        page_size=draw(st.sampled_from([1, 16, 64] if dims else [1, 4, 16])),
        lengths=tuple(draw(st.lists(length, min_size=batch, max_size=batch))),
        split=draw(st.one_of(st.none(), st.integers(1, 64))),
        causal=draw(st.booleans()),
        dtype=draw(st.sampled_from([torch.float16, torch.bfloat16])),
        garbage=draw(st.sampled_from(GARBAGE)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def inputs_of(c: Drawn, device: str = "cpu"):
    g = torch.Generator().manual_seed(c.seed)
    x = make_mla_inputs(
        c.batch, c.heads, c.seq_len, c.head_dim, c.rope_dim, dtype=c.dtype, kv_lens=list(c.lengths),
        q_len=c.q_len, generator=g,
    )  # fmt: skip
    if c.layout == "dense":
        for b, n in enumerate(c.lengths):
            x.cache[b, n:] = c.garbage
        return x, x.kv, x.kpe, {"kv_lens": x.kv_lens}
    pages = to_pages(x, c.page_size, generator=g, garbage=c.garbage)
    return x, pages.kv, pages.kpe, pages.layout_kwargs(c.layout)


def visible_counts(c: Drawn) -> torch.Tensor:
    """[B, Q] tokens each new token sees."""
    lens = torch.tensor(c.lengths)[:, None]
    token = torch.arange(c.q_len)[None, :]
    limit = lens - c.q_len + 1 + token if c.causal else lens.expand(-1, c.q_len)
    return limit.clamp(min=0)


@contextlib.contextmanager
def runnable(backend: str):
    context: contextlib.AbstractContextManager = contextlib.nullcontext()
    if backend == "aiter":
        from aiter_emulation import emulated_aiter_backend

        context = emulated_aiter_backend()
    with context:
        yield


def run(backend: str, c: Drawn, x, kv, kpe, kwargs, split):
    q = x.q if c.q_len > 1 else x.q
    try:
        with runnable(backend):
            return tilegym.mla_decoding_split_kv(
                q, x.qpe, kv, kpe, kv_len_per_split=split, causal=c.causal, return_lse=True, backend=backend, **kwargs
            )
    except BackendUnavailableError:
        return None


def check_contract(backend: str, c: Drawn) -> None:
    x, kv, kpe, kwargs = inputs_of(c)
    result = run(backend, c, x, kv, kpe, kwargs, c.split)
    if result is None:  # the backend says it cannot run this draw (its reasons are tested elsewhere)
        return
    out, lse = result
    expected, expected_lse = mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens, causal=c.causal)
    assert bool(torch.isfinite(out).all()), f"garbage leaked: {c}"
    assert relative_error(out, expected) <= REL_L2_TOLERANCE[c.dtype], c
    out4, lse3 = (out, lse) if c.q_len > 1 else (out[:, None], lse[:, None])
    empty = visible_counts(c) == 0
    assert bool((out4[empty] == 0).all()) and bool(torch.isneginf(lse3[empty]).all()), c
    finite = ~empty
    if bool(finite.any()):
        assert (
            lse3[finite].double() - (expected_lse if c.q_len > 1 else expected_lse[:, None])[finite]
        ).abs().max() < 1e-3
    other, _ = run(backend, c, x, kv, kpe, kwargs, None if c.split else 16)
    assert relative_error(out, other.double()) <= REL_L2_TOLERANCE[c.dtype], f"split changed the result: {c}"
    rows = [b for b, n in enumerate(c.lengths) if n > 0]
    if c.layout == "dense" and rows and c.batch > 1:
        target = rows[0]
        x.cache[target, c.lengths[target] - 1, 0] = float("nan")
        poisoned, _ = run(backend, c, x, kv, kpe, kwargs, 4)  # short splits: the NaN row is split and merged
        others = [b for b in range(c.batch) if b != target]
        assert bool(torch.isfinite(poisoned[others]).all()), f"NaN crossed into another row: {c}"
        assert bool(poisoned[target].isnan().any()), f"NaN in valid data vanished: {c}"


CI_SETTINGS = settings(
    max_examples=int(os.environ.get("TILEGYM_PROPERTY_EXAMPLES", "25")),
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@CI_SETTINGS
@given(c=calls())
def test_torch_backend_keeps_the_contract(c: Drawn) -> None:
    check_contract("torch", c)


@settings(CI_SETTINGS, max_examples=12)
@given(c=calls(max_seq=48, max_batch=3))
def test_triton_interpreter_keeps_the_contract(c: Drawn) -> None:
    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("Triton on a CPU needs its interpreter")
    check_contract("triton", c)


@settings(CI_SETTINGS, max_examples=10)
@given(c=calls(max_seq=48, max_batch=3))
def test_aiter_emulation_keeps_the_contract(c: Drawn) -> None:
    check_contract("aiter", c)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["triton", "tilecpp", "cutlass"])
def test_gpu_backends_keep_the_contract(backend: str) -> None:
    @settings(max_examples=40, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
    @given(c=calls(max_seq=700, max_batch=6, dims=(512, 64)))
    def check(c: Drawn) -> None:
        check_contract_on_gpu(backend, c)

    check()


def check_contract_on_gpu(backend: str, c: Drawn) -> None:
    x, kv, kpe, kwargs = inputs_of(c)
    moved = {k: v.cuda() for k, v in kwargs.items()}
    q, qpe = x.q.cuda(), x.qpe.cuda()
    try:
        out, lse = tilegym.mla_decoding_split_kv(
            q, qpe, kv.cuda(), kpe.cuda(), kv_len_per_split=c.split, causal=c.causal, return_lse=True,
            backend=backend, **moved,
        )  # fmt: skip
    except BackendUnavailableError:
        return
    torch.cuda.synchronize()
    expected, _ = mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens, causal=c.causal)
    assert bool(torch.isfinite(out).all()), f"garbage leaked: {c}"
    assert relative_error(out, expected) <= REL_L2_TOLERANCE[c.dtype], c
