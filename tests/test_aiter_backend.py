"""The aiter backend: its behaviour without ROCm, and its adapter run against the emulated aiter.

No AMD GPU is available: ``aiter_emulation`` implements aiter's documented MLA decode API in
PyTorch with aiter's input checks, so the adapter's full path (packing, zero-copy cache
view, page table, persistent metadata, fp8 scales, lse) runs on CPU tensors and is
compared with the float64 oracle.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import textwrap

import pytest
import torch
from aiter_emulation import emulated_aiter_backend, install_emulated_aiter

from tilegym import backend as registry
from tilegym.ops import mla_decoding_split_kv, plan_mla_decoding
from tilegym.ops.aiter import support
from tilegym.ops.aiter.mla_decoding_split_kv import quantize_per_tensor
from tilegym.ops.contract import MLADecodeCall, validate_mla_decoding
from tilegym.testing import (
    REL_L2_TOLERANCE,
    make_mla_inputs,
    mla_decode_float64,
    relative_error,
    share_prefix,
    to_pages,
)

OP = "mla_decoding_split_kv"
BF16_TOLERANCE = REL_L2_TOLERANCE[torch.bfloat16]
FP8_TOLERANCE = 6e-2  # fp8 query + fp8 softmax weights on top of the fp8 cache (measured ~3.3e-2)
FP8_QUANTISED_Q_TOLERANCE = 3.5e-2  # vs the oracle fed the adapter's fp8 query (measured ~2e-2)
NOT_ROCM = "torch is not a ROCm build"


def run_aiter(inputs, **kwargs):
    return mla_decoding_split_kv(inputs.q, inputs.qpe, inputs.kv, inputs.kpe, backend="aiter", **kwargs)


def oracle(inputs, **kwargs):
    return mla_decode_float64(inputs.q, inputs.qpe, inputs.kv, inputs.kpe, **kwargs)


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


@pytest.fixture
def fresh_import():
    """Forget aiter's cached import (and any ``aiter`` module the test imported) afterwards."""
    support.reset_aiter_import()
    registry.backend_unavailable_reasons.cache_clear()
    yield
    for name in ("aiter", "aiter.mla"):
        sys.modules.pop(name, None)
    support.reset_aiter_import()
    registry.backend_unavailable_reasons.cache_clear()


# --- without ROCm (this machine) -------------------------------------------------------------


def test_probe_without_rocm_gives_reason_without_importing(monkeypatch):
    def must_not_import():
        raise AssertionError("aiter import attempted on a non-ROCm torch")

    monkeypatch.setattr(support, "_import_aiter", must_not_import)
    assert support.probe() == [f"{NOT_ROCM} (torch.version.hip is None); aiter needs ROCm"]


def test_named_aiter_backend_on_cpu_says_why(gen):
    inputs = make_mla_inputs(1, 16, 8, generator=gen)
    with pytest.raises(registry.BackendUnavailableError, match=NOT_ROCM):
        run_aiter(inputs)
    assert "aiter" not in sys.modules


def test_auto_on_amd_skips_aiter_with_its_reason(gen):
    class AMDCall(MLADecodeCall):
        vendor = "amd"

    inputs = make_mla_inputs(1, 16, 8, generator=gen)
    fields = dataclasses.asdict(validate_mla_decoding(inputs.q, inputs.qpe, inputs.kv, inputs.kpe))
    call = AMDCall(**fields)
    assert NOT_ROCM in registry.implementations(OP)["aiter"].reasons(call)[0]
    assert registry.select(OP, call).backend in ("triton", "torch")
    assert NOT_ROCM in registry.backend_status(OP, "amd")["aiter"][0]


def test_cli_info_reports_aiter_unavailable():
    result = subprocess.run(
        [sys.executable, "-m", "tilegym", "info"], capture_output=True, text=True, timeout=120, check=True
    )
    aiter_lines = [line for line in result.stdout.splitlines() if line.strip().startswith("aiter")]
    assert aiter_lines[0].split(None, 1)[1].startswith(f"unavailable: {NOT_ROCM}")
    assert aiter_lines[1].split(None, 1)[1] == "unavailable: no implementation of this op"  # splitk_reduce


def test_splitk_reduce_has_no_aiter_implementation():
    assert "aiter" not in registry.implementations("splitk_reduce")


def _fake_aiter_package(root, init_body: str, mla_body: str = "") -> None:
    package = root / "aiter"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent(init_body))
    (package / "mla.py").write_text(textwrap.dedent(mla_body))


@pytest.mark.parametrize(
    "failure",
    [
        "RuntimeError('ROCm version file not found')",
        "SystemExit(1)",
        "ImportError('No module named packaging')",
        "OSError('libamdhip64.so: cannot open shared object file')",
    ],
)
def test_failing_aiter_import_becomes_a_cached_reason(failure, tmp_path, monkeypatch, fresh_import):
    attempts = tmp_path / "attempts"
    _fake_aiter_package(tmp_path, f"open({str(attempts)!r}, 'a').write('x')\nraise {failure}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "aiter", raising=False)
    monkeypatch.setattr(support, "rocm_build", lambda: True)
    reasons = support.probe()
    assert len(reasons) == 1 and reasons[0].startswith(f"aiter cannot be imported ({failure.split('(')[0]}")
    assert support.probe() == reasons
    assert attempts.read_text() == "x"  # imported once, then cached


def test_aiter_without_the_persistent_api_is_reported(tmp_path, monkeypatch, fresh_import):
    old_api = """
        def mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, max_seqlen_q, sm_scale=None):
            pass
    """
    _fake_aiter_package(tmp_path, "__version__ = '0.1.7'\n", old_api)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("aiter", "aiter.mla"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setattr(support, "rocm_build", lambda: True)
    (reason,) = support.probe()
    assert "aiter (0.1.7) predates" in reason
    assert "get_mla_metadata_v1" in reason and "mla_decode_fwd(page_size=)" in reason


# --- the adapter on the emulated aiter -------------------------------------------------------


@pytest.mark.parametrize(
    "batch, heads, seq_len, kv_lens",
    [
        (2, 16, 256, None),
        (3, 16, 300, [300, 57, 0]),
        (2, 128, 40, [-3, 99]),  # out-of-range lengths are clamped to [0, S]
        (1, 64, 130, [129]),
    ],
)
def test_matches_float64_oracle(batch, heads, seq_len, kv_lens, gen):
    inputs = make_mla_inputs(batch, heads, seq_len, kv_lens=kv_lens, generator=gen)
    with emulated_aiter_backend() as aiter:
        out, lse = run_aiter(inputs, kv_lens=inputs.kv_lens, return_lse=True)
    expected, expected_lse = oracle(inputs, kv_lens=inputs.kv_lens)
    assert out.dtype == torch.bfloat16 and lse.shape == (batch, heads) and lse.dtype == torch.float32
    assert relative_error(out, expected) < BF16_TOLERANCE
    assert torch.equal(torch.isinf(lse), torch.isinf(expected_lse))
    finite = torch.isfinite(expected_lse)
    assert (lse.double()[finite] - expected_lse[finite]).abs().max() < 1e-3
    assert torch.all(out[~finite.all(dim=1)] == 0)  # empty rows: zeros (aiter leaves them undefined)
    assert [call.persistent for call in aiter.decode_calls] == [True]
    assert aiter.metadata_builds == 1


def test_splits_are_merged(gen):
    """Long rows are cut into several works whose partials aiter's reduce merges."""
    inputs = make_mla_inputs(2, 16, 400, generator=gen)
    with emulated_aiter_backend() as aiter:
        out = run_aiter(inputs)
    assert sum(work[1] >= 0 for work in aiter.last_schedule) >= 4  # split works (partial index set)
    assert relative_error(out, oracle(inputs)[0]) < BF16_TOLERANCE


def test_kv_len_per_split_caps_the_splits(gen):
    inputs = make_mla_inputs(2, 16, 200, generator=gen)
    with emulated_aiter_backend() as aiter:
        one = run_aiter(inputs, kv_len_per_split=200)
        assert [work[1] for work in aiter.last_schedule] == [-1, -1]  # one unsplit work per row
        two = run_aiter(inputs, kv_len_per_split=100)
        assert [work[0] for work in aiter.last_schedule] == [0, 0, 1, 1]
    for out in (one, two):
        assert relative_error(out, oracle(inputs)[0]) < BF16_TOLERANCE


def test_fused_cache_is_passed_without_a_copy(gen):
    inputs = make_mla_inputs(3, 16, 64, generator=gen)
    with emulated_aiter_backend() as aiter:
        out = run_aiter(inputs)
    (record,) = aiter.decode_calls
    assert record.kv_buffer_storage_ptr == inputs.cache.untyped_storage().data_ptr()
    assert record.kv_buffer_data_ptr == inputs.cache.data_ptr()
    assert record.kv_buffer_shape == (3 * 64, 1, 1, 576)
    assert relative_error(out, oracle(inputs)[0]) < BF16_TOLERANCE


def test_slice_of_a_longer_cache_is_passed_without_a_copy(gen):
    """A [B, S_max, 576] cache sliced to [:, :S]: rows S_max pages apart, still a view."""
    full = make_mla_inputs(3, 16, 96, kv_lens=[40, 7, 48], generator=gen)
    sliced = dataclasses.replace(full, cache=full.cache[:, :48])
    with emulated_aiter_backend() as aiter:
        out = run_aiter(sliced, kv_lens=sliced.kv_lens)
    (record,) = aiter.decode_calls
    assert record.kv_buffer_data_ptr == full.cache.data_ptr()
    assert record.kv_buffer_shape == (2 * 96 + 48, 1, 1, 576)
    assert relative_error(out, oracle(sliced, kv_lens=sliced.kv_lens)[0]) < BF16_TOLERANCE


def test_separately_stored_kv_and_kpe_are_refused_not_copied(gen):
    """aiter reads 576-wide rows: separate kv/kpe would need a copy of the cache on every call."""
    inputs = make_mla_inputs(2, 16, 64, generator=gen)
    kv, kpe = inputs.kv.contiguous(), inputs.kpe.contiguous()
    with (
        emulated_aiter_backend() as aiter,
        pytest.raises(registry.BackendUnavailableError, match="column views of one"),
    ):
        mla_decoding_split_kv(inputs.q, inputs.qpe, kv, kpe, backend="aiter")
    assert aiter.decode_calls == []


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("layout", ["paged", "ragged"])
def test_page_layouts_map_natively(layout, page_size, gen):
    """Block tables and ragged page lists become aiter's page table over the page pool: no copy."""
    inputs = make_mla_inputs(4, 16, 160, kv_lens=[0, 1, page_size + 1, 160], generator=gen)
    share_prefix(inputs, page_size)
    pages = to_pages(inputs, page_size, generator=gen, shared_prefix_pages=1)
    with emulated_aiter_backend() as aiter:
        out, lse = mla_decoding_split_kv(
            inputs.q, inputs.qpe, pages.kv, pages.kpe, return_lse=True, backend="aiter", **pages.layout_kwargs(layout)
        )
    (record,) = aiter.decode_calls
    assert record.kv_buffer_data_ptr == pages.pages.data_ptr()
    assert record.kv_buffer_shape == (pages.pages.shape[0], page_size, 1, 576)
    expected, expected_lse = oracle(inputs, kv_lens=inputs.kv_lens)
    assert relative_error(out, expected) < BF16_TOLERANCE
    assert torch.all(out[0] == 0) and torch.isneginf(lse[0]).all()
    assert (lse[1:].double() - expected_lse[1:]).abs().max() < 1e-3


def test_out_is_written_in_place(gen):
    inputs = make_mla_inputs(2, 32, 48, generator=gen)
    out = torch.full((2, 32, 512), float("nan"), dtype=torch.bfloat16)
    with emulated_aiter_backend():
        result = run_aiter(inputs, out=out, sm_scale=0.05)
    assert result is out
    assert relative_error(out, oracle(inputs, sm_scale=0.05)[0]) < BF16_TOLERANCE


@pytest.mark.parametrize("arch, fp8", [("gfx950", torch.float8_e4m3fn), ("gfx942", torch.float8_e4m3fnuz)])
def test_fp8_cache_runs_the_a8w8_kernel_with_both_scales(arch, fp8, gen):
    inputs = make_mla_inputs(2, 16, 200, kv_dtype=fp8, kv_lens=[200, 77], generator=gen)
    with emulated_aiter_backend(arch) as aiter:
        out, lse = run_aiter(inputs, kv_lens=inputs.kv_lens, kv_scale=inputs.kv_scale, return_lse=True)
    (record,) = aiter.decode_calls
    q8, q_scale = quantize_per_tensor(torch.cat((inputs.q, inputs.qpe), dim=-1), fp8)
    assert (record.q_dtype, record.kv_dtype) == (fp8, fp8)
    assert record.q_scale == pytest.approx(q_scale.item()) and record.kv_scale == inputs.kv_scale.item()
    expected, expected_lse = oracle(inputs, kv_lens=inputs.kv_lens, kv_scale=inputs.kv_scale)
    assert relative_error(out, expected) < FP8_TOLERANCE
    assert (lse.double() - expected_lse).abs().max() < 5e-2
    q_seen = q8.double() * q_scale.double()
    seen, _ = mla_decode_float64(
        q_seen[..., :512], q_seen[..., 512:], inputs.kv, inputs.kpe, kv_lens=inputs.kv_lens, kv_scale=inputs.kv_scale
    )
    assert relative_error(out, seen) < FP8_QUANTISED_Q_TOLERANCE


def test_quantize_per_tensor_round_trips():
    t = torch.randn(4, 16, 576, generator=torch.Generator().manual_seed(3)) * 7
    t8, scale = quantize_per_tensor(t, torch.float8_e4m3fn)
    assert t8.dtype == torch.float8_e4m3fn and scale.shape == (1,) and scale.dtype == torch.float32
    assert t8.float().abs().max() == torch.finfo(torch.float8_e4m3fn).max  # amax maps onto the fp8 max
    assert relative_error(t8.float() * scale, t) < 4e-2


def test_plan_builds_metadata_once_and_refresh_follows_kv_lens(gen):
    inputs = make_mla_inputs(2, 16, 128, kv_lens=[128, 50], generator=gen)
    lens = inputs.kv_lens
    with emulated_aiter_backend() as aiter:
        plan = plan_mla_decoding(inputs.q, inputs.qpe, inputs.kv, inputs.kpe, kv_lens=lens, backend="aiter")
        for _ in range(3):
            mla_decoding_split_kv(inputs.q, inputs.qpe, inputs.kv, inputs.kpe, plan=plan)
        assert (aiter.info_calls, aiter.metadata_builds, len(aiter.decode_calls)) == (1, 1, 3)
        lens[0] = 20
        plan.refresh()  # same buffers, contents rebuilt from the new lengths
        out = mla_decoding_split_kv(inputs.q, inputs.qpe, inputs.kv, inputs.kpe, plan=plan)
        assert (aiter.info_calls, aiter.metadata_builds) == (1, 2)
    assert relative_error(out, oracle(inputs, kv_lens=lens)[0]) < BF16_TOLERANCE


@pytest.mark.parametrize(
    "make, arch, reason",
    [
        (dict(dtype=torch.float16), "gfx950", "q is torch.float16"),
        (dict(heads=8), "gfx950", "multiple of 16 query heads per KV head, got 8"),
        (dict(heads=48), "gfx950", "no bf16/bf16 MLA decode kernel for 48 heads"),
        (dict(heads=64, kv_dtype=torch.float8_e4m3fn), "gfx950", "no fp8/fp8 MLA decode kernel for 64 heads"),
        (dict(head_dim=256), "gfx950", "built for D=512, P=64 (576-wide rows), got D=256, P=64"),
        (dict(), "gfx90a", "need a gfx942 (MI300X/MI325X), gfx950 (MI350X/MI355X) GPU, got gfx90a"),
        (dict(kv_dtype=torch.float8_e4m3fnuz), "gfx950", "gfx950 kernels read fp8 as torch.float8_e4m3fn"),
        (dict(kv_dtype=torch.float8_e4m3fn), "gfx942", "gfx942 kernels read fp8 as torch.float8_e4m3fnuz"),
    ],
)
def test_unsupported_inputs_get_a_reason(make, arch, reason, gen):
    spec = {"batch": 1, "heads": 16, "seq_len": 8, **make}
    inputs = make_mla_inputs(**spec, generator=gen)
    with (
        emulated_aiter_backend(arch) as aiter,
        pytest.raises(registry.BackendUnavailableError, match=re.escape(reason)),
    ):
        run_aiter(inputs, kv_scale=inputs.kv_scale)
    assert aiter.decode_calls == []


def test_emulated_backend_restores_everything(gen):
    before = registry.implementations(OP)["aiter"]
    with emulated_aiter_backend():
        assert "cpu" in registry.implementations(OP)["aiter"].vendors
        assert registry.backend_unavailable_reasons("aiter") == []
    assert registry.implementations(OP)["aiter"] is before
    assert "aiter" not in sys.modules
    assert registry.backend_unavailable_reasons("aiter")[0].startswith(NOT_ROCM)


# --- the emulation is strict (so adapter mistakes fail loudly) --------------------------------


def _decode_args(batch=2, heads=16, seq_len=32):
    """A valid non-persistent call of the emulated mla_decode_fwd, as a dict."""
    q = torch.randn(batch, heads, 576).to(torch.bfloat16)
    return dict(
        q=q,
        kv_buffer=torch.randn(batch * seq_len, 1, 1, 576).to(torch.bfloat16),
        o=torch.empty(batch, heads, 512, dtype=torch.bfloat16),
        qo_indptr=torch.arange(batch + 1, dtype=torch.int32),
        kv_indptr=torch.arange(0, batch * seq_len + 1, seq_len, dtype=torch.int32),
        kv_indices=torch.arange(batch * seq_len, dtype=torch.int32),
        kv_last_page_lens=torch.ones(batch, dtype=torch.int32),
        max_seqlen_q=1,
    )


@pytest.mark.parametrize(
    "change, error",
    [
        (lambda a: a.update(q=a["q"].transpose(0, 1).contiguous().transpose(0, 1)), "Q.is_contiguous"),
        (lambda a: a.update(kv_indptr=a["kv_indptr"].long()), "kv_indptr must be a contiguous 1-D int32"),
        (lambda a: a.update(kv_indices=a["kv_indices"] + 1), "page ids out of range"),
        (lambda a: a.update(kv_buffer=a["kv_buffer"].view(-1, 2, 1, 576)), r"kv_buffer must be \[pages, page_size=1"),
        (lambda a: a.update(q=a["q"].to(torch.float8_e4m3fn)), "fp8 Q requires q_scale and kv_scale"),
        (lambda a: a.update(q=a["q"].to(torch.float8_e4m3fnuz)), "gfx950 reads fp8 as torch.float8_e4m3fn"),
        (lambda a: a.update(o=a["o"].float()), "o must be contiguous bf16"),
        (lambda a: a.update(q=a["q"][:, :8].contiguous(), o=a["o"][:, :8].contiguous()), "nhead=8 not supported"),
    ],
)
def test_emulation_rejects_what_aiter_rejects(change, error):
    with install_emulated_aiter() as aiter:
        import aiter as emulated

        args = _decode_args()
        emulated.mla.mla_decode_fwd(**args)  # the unchanged call is accepted
        change(args)
        with pytest.raises((RuntimeError, AssertionError, IndexError), match=error):
            emulated.mla.mla_decode_fwd(**args)
    assert len(aiter.decode_calls) == 1


def test_emulated_metadata_checks_its_buffers():
    with install_emulated_aiter() as aiter:
        import aiter as emulated

        with pytest.raises(AssertionError, match="multiple of 16"):
            emulated.get_mla_metadata_info_v1(2, 1, 8, torch.bfloat16, torch.bfloat16, False)
        info = emulated.get_mla_metadata_info_v1(2, 1, 16, torch.bfloat16, torch.bfloat16, False)
        work = [torch.empty(shape, dtype=dtype) for shape, dtype in info]
        indptrs = (torch.arange(3, dtype=torch.int32), torch.tensor([0, 5, 9], dtype=torch.int32))
        lens = torch.ones(2, dtype=torch.int32)
        swapped = list(work)  # info order: work_indptr where work_info_set belongs
        with pytest.raises(RuntimeError, match="work_indptr must be torch.int32 of shape"):
            emulated.get_mla_metadata_v1(*indptrs, lens, 16, 1, True, *swapped)
        emulated.get_mla_metadata_v1(*indptrs, lens, 16, 1, True, work[0], work[2], work[1], *work[3:])
    assert aiter.metadata_builds == 1
