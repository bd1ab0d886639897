"""Cross-backend parity: every backend the registry can run here, against the float64 oracle.

Backends are the registry's (``tilegym.backend.backend_names()``); a backend that cannot run a
case here says why through the registry (``BackendUnavailableError``) and the case is
skipped with that reason, so a newly registered backend is tested without editing this
file. On a CPU: torch, Triton under its interpreter (bf16 included: the kernel widens its dot operands there),
and aiter through the emulation in ``tests/aiter_emulation`` when it exists. On a GPU the
same grid runs plus larger shapes, CUDA graph capture/replay and bitwise determinism.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import torch

from tilegym.backend import BackendUnavailableError, backend_names
from tilegym.bench import fp8_dtype
from tilegym.ops import mla_decoding_split_kv, splitk_reduce
from tilegym.ops.accuracy import lse_rtol, lse_tolerance
from tilegym.ops.mla_decoding import MLA_DECODING, SPLITK_REDUCE
from tilegym.testing import MLAInputs, fresh_generator, make_mla_inputs, relative_error

# splitk_reduce: inputs are exact, so only the rounding of the output remains.


@dataclass(frozen=True)
class Case:
    """One point of the shared grid of shapes and options."""

    batch: int
    heads: int
    seq_len: int
    dtype: torch.dtype = torch.float16
    kv_lens: tuple[int, ...] | None = None  # may hold 0, negatives and values beyond seq_len
    kv_len_per_split: int | None = None
    return_lse: bool = True
    fp8: bool = False
    fused: bool = True  # kv / kpe as column views of one [B, S, D+P] cache
    sm_scale: float | None = None
    head_dim: int = 512
    rope_dim: int = 64
    device: str = "cpu"

    @property
    def id(self) -> str:
        parts = [self.device, f"B{self.batch}H{self.heads}S{self.seq_len}", str(self.dtype).removeprefix("torch.")]
        parts += ["lens"] * (self.kv_lens is not None) + [f"split{self.kv_len_per_split}"] * bool(self.kv_len_per_split)
        parts += ["nolse"] * (not self.return_lse) + ["fp8"] * self.fp8 + ["separate"] * (not self.fused)
        parts += ["scale"] * (self.sm_scale is not None)
        return "-".join(parts)


# Small enough for Triton's interpreter (~5 ms per program per KV tile) on a 2-core CPU.
CPU_CASES = [
    Case(2, 16, 256),
    Case(4, 16, 200, kv_lens=(0, -3, 137, 999), kv_len_per_split=64),
    Case(1, 32, 300, kv_len_per_split=100, return_lse=False, sm_scale=0.07),
    Case(2, 16, 130, fused=False),
    Case(2, 16, 256, fp8=True, kv_lens=(253, 70)),
    Case(1, 128, 128, kv_lens=(100,)),
    Case(2, 16, 256, dtype=torch.bfloat16, kv_lens=(256, 0)),
    Case(3, 8, 64, head_dim=128, rope_dim=32, kv_len_per_split=16),
    Case(1, 16, 40, kv_len_per_split=1),
    Case(2, 16, 100, kv_len_per_split=4096, kv_lens=(0, 0)),
    Case(2, 24, 96, kv_lens=(96, 5)),
    Case(3, 16, 150, kv_lens=(150, 0, 120), kv_len_per_split=4096),  # one piece spans an empty row
    Case(5, 1, 64, fp8=True, fused=False),
    # bf16 (aiter's query dtype): edge lengths, fp8, 128 heads
    Case(3, 16, 200, dtype=torch.bfloat16, kv_lens=(0, -3, 999), kv_len_per_split=64),
    Case(2, 16, 256, dtype=torch.bfloat16, fp8=True, kv_lens=(256, 31)),
    Case(1, 128, 96, dtype=torch.bfloat16, fused=False, return_lse=False),
]
GRAPH_CASE = Case(16, 16, 2048, dtype=torch.bfloat16, kv_lens=tuple(range(0, 4096, 256)), device="cuda")
BIG_HEADS_CASE = Case(
    8, 128, 8192, dtype=torch.bfloat16, kv_lens=(8192, 0, 1, 4095, 4096, 7000, 9000, -1), device="cuda"
)
# On the GPU: the CPU cases again (out-of-range kv_lens can only be caught there), plus large shapes.
GPU_CASES = (
    [dataclasses.replace(c, device="cuda") for c in CPU_CASES]
    + [
        dataclasses.replace(c, device="cuda")
        for c in (
            Case(64, 16, 4096, dtype=torch.bfloat16),
            Case(32, 64, 1024, dtype=torch.bfloat16, fp8=True),
            Case(8, 128, 2048, dtype=torch.bfloat16, fp8=True, kv_lens=(2048, 0, 1, 100, 2047, 1500, 3000, 64)),
            Case(3, 16, 5000, dtype=torch.float16, kv_lens=(5000, 4999, 17), return_lse=True),
            Case(1, 16, 32768, dtype=torch.bfloat16),
            Case(16, 16, 2048, dtype=torch.bfloat16, fused=False, kv_len_per_split=256),
        )
    ]
    + [BIG_HEADS_CASE]
)
GRID = [pytest.param(c, id=c.id) for c in CPU_CASES] + [
    pytest.param(c, id=c.id, marks=pytest.mark.gpu) for c in GPU_CASES
]


# ---------------------------------------------------------------------------------------
# Running a backend, or skipping with the registry's reason.


def _aiter_emulation() -> Callable[[], contextlib.AbstractContextManager] | None:
    """``emulated_aiter_backend`` from tests/aiter_emulation, if that helper exists yet."""
    for module in ("aiter_emulation", "tests.aiter_emulation"):
        try:
            return importlib.import_module(module).emulated_aiter_backend
        except ImportError:
            continue
    return None


@contextlib.contextmanager
def runnable(backend: str, device: torch.device) -> Iterator[None]:
    """Run the block with ``backend`` made runnable on ``device``, or skip saying why it cannot run."""
    context: contextlib.AbstractContextManager = contextlib.nullcontext()
    if backend == "aiter" and device.type == "cpu":
        emulation = _aiter_emulation()
        if emulation is None:
            pytest.skip("aiter on a CPU needs tests/aiter_emulation (emulated_aiter_backend), not available")
        context = emulation()
    with context:
        try:
            yield
        except BackendUnavailableError as exc:
            pytest.skip(f"{backend}: {exc}")


def case_inputs(case: Case, generator: torch.Generator) -> MLAInputs:
    kv_dtype = fp8_dtype(torch.device(case.device)) if case.fp8 else None
    return make_mla_inputs(
        case.batch,
        case.heads,
        case.seq_len,
        case.head_dim,
        case.rope_dim,
        dtype=case.dtype,
        kv_dtype=kv_dtype,
        device=case.device,
        kv_lens=list(case.kv_lens) if case.kv_lens is not None else None,
        generator=generator,
    )


def kv_and_kpe(case: Case, x: MLAInputs) -> tuple[torch.Tensor, torch.Tensor]:
    return (x.kv, x.kpe) if case.fused else (x.kv.contiguous(), x.kpe.contiguous())


def nan_output(x: MLAInputs) -> torch.Tensor:
    """A poisoned output buffer: an element the backend does not write stays NaN and fails."""
    return torch.full_like(x.q, float("nan"))


def assert_matches_oracle(
    backend: str, case: Case, x: MLAInputs, out: torch.Tensor, lse: torch.Tensor | None, seed: int
) -> None:
    kv, kpe = kv_and_kpe(case, x)
    expected, expected_lse = MLA_DECODING.oracle(
        x.q, x.qpe, kv, kpe, case.sm_scale, kv_lens=x.kv_lens, kv_scale=x.kv_scale
    )
    err = relative_error(out, expected)
    tolerance = MLA_DECODING.tolerance(backend, case.dtype, kv.dtype)
    assert out.dtype == case.dtype, f"seed {seed}"
    assert bool(torch.isfinite(out).all()), f"output has NaN/Inf (unwritten elements?), seed {seed}"
    assert err <= tolerance, f"rel. L2 error {err:.2e} > {tolerance:.0e}, seed {seed}"
    if x.kv_lens is not None:
        empty = (x.kv_lens <= 0).cpu()
        assert bool((out.cpu()[empty] == 0).all()), f"a row with no tokens must give zeros, seed {seed}"
    if case.return_lse:
        assert lse is not None and lse.dtype == torch.float32 and lse.shape == x.q.shape[:2]
        atol = lse_tolerance(MLA_DECODING.name, backend, kv.dtype)
        rtol = lse_rtol(MLA_DECODING.name, backend, kv.dtype)
        torch.testing.assert_close(lse.cpu().double(), expected_lse, atol=atol, rtol=rtol, msg=f"lse, seed {seed}")


def run_case(backend: str, case: Case, x: MLAInputs, out: torch.Tensor) -> torch.Tensor | None:
    kv, kpe = kv_and_kpe(case, x)
    result = mla_decoding_split_kv(
        x.q,
        x.qpe,
        kv,
        kpe,
        case.sm_scale,
        case.kv_len_per_split,
        kv_lens=x.kv_lens,
        kv_scale=x.kv_scale,
        return_lse=case.return_lse,
        out=out,
        backend=backend,
    )
    out_returned, lse = result if case.return_lse else (result, None)
    assert out_returned is out, "the op must write into the given out= buffer"
    return lse


# ---------------------------------------------------------------------------------------
# mla_decoding_split_kv


@pytest.mark.parametrize("case", GRID)
@pytest.mark.parametrize("backend", backend_names())
def test_mla_decoding_matches_float64(backend: str, case: Case) -> None:
    generator, seed = fresh_generator()
    x = case_inputs(case, generator)
    out = nan_output(x)
    with runnable(backend, torch.device(case.device)):
        lse = run_case(backend, case, x, out)
    assert_matches_oracle(backend, case, x, out, lse, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", backend_names())
def test_cuda_graph_replay_matches_float64(backend: str) -> None:
    """Capture one call, copy new values (kv_lens included) into its inputs, replay, compare."""
    case = GRAPH_CASE
    generator, seed = fresh_generator()
    x = case_inputs(case, generator)
    out = nan_output(x)
    with runnable(backend, torch.device(case.device)):
        run_case(backend, case, x, out)  # compiles, loads, and skips if the backend cannot run
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run_case(backend, case, x, out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lse = run_case(backend, case, x, out)
    fresh = make_mla_inputs(
        case.batch, case.heads, case.seq_len, dtype=case.dtype, device=case.device, kv_lens=None, generator=generator
    )
    for name in ("q", "qpe", "cache"):
        getattr(x, name).copy_(getattr(fresh, name))
    x.kv_lens.copy_(torch.randint(-2, case.seq_len + 3, (case.batch,), generator=generator, dtype=torch.int32))
    x.kv_lens[0] = 0
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_matches_oracle(backend, case, x, out, lse, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("case", [GRAPH_CASE, BIG_HEADS_CASE], ids=lambda c: c.id)
@pytest.mark.parametrize("backend", backend_names())
def test_mla_decoding_is_bitwise_deterministic(backend: str, case: Case) -> None:
    generator, _ = fresh_generator()
    x = case_inputs(case, generator)
    outs, lses = [], []
    for _ in range(2):
        out = nan_output(x)
        with runnable(backend, torch.device(case.device)):
            lses.append(run_case(backend, case, x, out))
        outs.append(out)
    torch.cuda.synchronize()
    assert torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16)), "output bits differ between runs"
    assert torch.equal(lses[0].view(torch.int32), lses[1].view(torch.int32)), "lse bits differ between runs"


# ---------------------------------------------------------------------------------------
# splitk_reduce


@dataclass(frozen=True)
class ReduceCase:
    batch: int
    heads: int
    splits: int
    head_dim: int
    dtype: torch.dtype
    out_dtype: torch.dtype | None = None  # None: the dtype of partial_out
    device: str = "cpu"

    @property
    def id(self) -> str:
        dtypes = [str(d).removeprefix("torch.") for d in (self.dtype, self.out_dtype or self.dtype)]
        return f"{self.device}-B{self.batch}H{self.heads}N{self.splits}D{self.head_dim}-" + "-to-".join(dtypes)


REDUCE_CASES = [
    ReduceCase(2, 16, 4, 512, torch.float32),
    ReduceCase(3, 8, 7, 512, torch.float32, torch.bfloat16),
    ReduceCase(2, 16, 5, 128, torch.bfloat16),
    ReduceCase(1, 4, 1, 512, torch.float16),
]
REDUCE_GRID = [pytest.param(c, id=c.id) for c in REDUCE_CASES] + [
    pytest.param(c, id=c.id, marks=pytest.mark.gpu)
    for c in [dataclasses.replace(c, device="cuda") for c in REDUCE_CASES]
    + [ReduceCase(32, 128, 33, 512, torch.float32, torch.bfloat16, device="cuda")]
]


def reduce_inputs(case: ReduceCase, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random partials; lse with empty splits (-inf), and row (0, 0) entirely empty."""
    shape = (case.batch, case.heads, case.splits)
    partial_out = torch.randn(*shape, case.head_dim, generator=generator).to(case.dtype)
    partial_lse = torch.randn(*shape, generator=generator) * 3
    partial_lse[torch.rand(*shape, generator=generator) < 0.3] = float("-inf")
    partial_lse[0, 0] = float("-inf")
    return partial_out.to(case.device), partial_lse.to(case.device)


@pytest.mark.parametrize("case", REDUCE_GRID)
@pytest.mark.parametrize("backend", backend_names())
def test_splitk_reduce_matches_float64(backend: str, case: ReduceCase) -> None:
    generator, seed = fresh_generator()
    partial_out, partial_lse = reduce_inputs(case, generator)
    out_dtype = case.out_dtype or case.dtype
    out = torch.full((case.batch, case.heads, case.head_dim), float("nan"), dtype=out_dtype, device=case.device)
    with runnable(
        backend, torch.device(case.device)
    ):  # the combine has no matrix product: no interpreter limitation applies
        result = splitk_reduce(partial_out, partial_lse, out=out, backend=backend)
    expected = SPLITK_REDUCE.oracle(partial_out, partial_lse)
    assert result is out and bool(torch.isfinite(out).all()), f"unwritten or non-finite output, seed {seed}"
    assert bool((out[0, 0] == 0).all()), f"a row whose splits are all empty must give zeros, seed {seed}"
    err = relative_error(out, expected)
    assert err <= SPLITK_REDUCE.tolerance(backend, out_dtype, out_dtype), f"rel. L2 error {err:.2e}, seed {seed}"
