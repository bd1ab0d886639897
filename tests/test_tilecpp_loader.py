"""CPU-only tests of the Tile C++ loader and backend glue: toolchain search, cache location and
keys, cubin lookup without nvcc, argument packing, support reasons. No compiler is run here
(tests/test_tilecpp_compile.py compiles); a fake ``nvcc`` script stands in where one is needed.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tilecpp_tiny import tiny_factor_header, tiny_kernel, write_cache_entry, write_tiny_sources

import tilegym
from tilegym.backend import BackendUnavailableError, implementations
from tilegym.ops import cubin_loader as loader
from tilegym.ops.contract import validate_mla_decoding
from tilegym.ops.tilecpp import mla_decoding_split_kv as tilecpp_mla
from tilegym.testing import make_mla_inputs, to_pages


@pytest.fixture
def tiny_dir(tmp_path: Path) -> Path:
    """A folder with a tiny kernel header that includes a second project header."""
    return write_tiny_sources(tmp_path)


# ----------------------------------------------------------------------------- toolchain search


def test_missing_nvcc_says_what_to_install(no_nvcc: None) -> None:
    with pytest.raises(loader.NvccNotFoundError, match="pip install nvidia-cuda-nvcc==13.5.37 nvidia-cuda-tileiras"):
        loader.find_nvcc()
    assert loader.nvcc_or_none() is None
    assert "not an executable file" in loader.toolchain_problem()


def test_too_old_nvcc_is_rejected_with_its_version(fake_nvcc) -> None:
    path = fake_nvcc("13.0").path
    with pytest.raises(loader.NvccNotFoundError, match=r"CUDA 13\.0, without Tile C\+\+ support") as err:
        loader.find_nvcc()
    assert str(path) in str(err.value) and "pip install" in str(err.value)
    assert loader.find_nvcc("cuda").version == (13, 0)  # plain CUDA C++ needs only 12.3


def test_cuda_language_rejects_nvcc_older_than_12_3(fake_nvcc) -> None:
    fake_nvcc("12.2")
    with pytest.raises(loader.NvccNotFoundError, match=r"CUDA 12\.2, older than 12\.3"):
        loader.find_nvcc("cuda")


def test_new_enough_nvcc_is_found_with_its_version(fake_nvcc) -> None:
    path = fake_nvcc("13.5").path
    nvcc = loader.find_nvcc()
    assert (nvcc.path, nvcc.version) == (str(path), (13, 5))
    assert "release 13.5" in nvcc.version_text


def test_env_override_wins_over_wheel_and_path(fake_nvcc) -> None:
    path = fake_nvcc("13.3").path
    assert loader._candidate_nvccs() == [(str(path), f"${loader.NVCC_ENV_VAR}")]


def test_wheel_location_is_searched_before_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(loader.NVCC_ENV_VAR, raising=False)
    wheel = [p for p in loader._wheel_nvcc_candidates() if os.access(p, os.X_OK)]
    origins = [origin for _, origin in loader._candidate_nvccs()]
    if wheel:
        assert origins[0] == "the nvidia-cuda-nvcc wheel"
    assert all(p.endswith(os.path.join("nvidia", "cu13", "bin", "nvcc")) for p in loader._wheel_nvcc_candidates())


# ----------------------------------------------------------------------------- cache location and keys


def test_cache_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(loader.CACHE_ENV_VAR, str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert loader.cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv(loader.CACHE_ENV_VAR)
    assert loader.cache_dir() == tmp_path / "xdg" / "tilegym"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert loader.cache_dir() == Path.home() / ".cache" / "tilegym"


def test_import_creates_no_cache_dir_and_runs_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    code = (
        "import subprocess, tilegym, tilegym.ops.tilecpp, tilegym.ops.cubin_loader\n"
        "from tilegym.backend import implementations\n"
        "implementations('mla_decoding_split_kv')\n"
        "def no_subprocess(*a, **k): raise SystemExit('subprocess at import')\n"
        "subprocess.Popen = no_subprocess\n"
        "import sys, tilegym.ops.tilecpp.mla_decoding_split_kv, tilegym.ops.precompile as p\n"
        "kernels = p.tilecpp_kernels()\n"
        "from tilegym.ops.cubin_loader import _search_cutlass, _search_nvcc\n"
        "assert _search_nvcc.cache_info().currsize == _search_cutlass.cache_info().currsize == 0\n"
        "assert 'cutlass_library' not in sys.modules\n"
    )
    env = {**os.environ, loader.CACHE_ENV_VAR: str(cache)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)
    assert not cache.exists()


def test_included_headers_are_followed_transitively(tiny_dir: Path) -> None:
    (tiny_dir / "tiny_factor.cuh").write_text(tiny_factor_header() + '#include "deeper.cuh"\n')
    (tiny_dir / "deeper.cuh").write_text("#pragma once\n")
    names = sorted(p.name for p in loader.included_headers(tiny_dir / "tiny.cuh"))
    assert names == ["deeper.cuh", "tiny.cuh", "tiny_factor.cuh"]


def test_library_key_covers_common_header() -> None:
    names = {p.name for p in loader.included_headers(loader.TileCppKernel.kernel_dir / "mla_decoding_split_kv.cuh")}
    assert {"mla_decoding_split_kv.cuh", "common.cuh"} <= names


def test_cache_key_changes_with_every_input(tiny_dir: Path) -> None:
    base = tiny_kernel(tiny_dir).source_key("sm_90")
    assert tiny_kernel(tiny_dir).source_key("sm_90") == base  # same inputs, same key
    assert tiny_kernel(tiny_dir).source_key("90") == base  # arch spelling does not matter
    assert tiny_kernel(tiny_dir).source_key("sm_100") != base
    assert tiny_kernel(tiny_dir, n=256).source_key("sm_90") != base
    assert tiny_kernel(tiny_dir, flags=("-DFAST",)).source_key("sm_90") != base
    (tiny_dir / "tiny_factor.cuh").write_text(tiny_factor_header("3.0f"))
    assert tiny_kernel(tiny_dir).source_key("sm_90") != base  # an included header was edited


def test_cubin_path_names_arch_and_toolchain(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(loader.CACHE_ENV_VAR, str(tiny_dir / "cache"))
    kernel = tiny_kernel(tiny_dir)
    old = loader.Nvcc("nvcc", (13, 3), "release 13.3, V13.3.1")
    new = loader.Nvcc("nvcc", (13, 5), "release 13.5, V13.5.37")
    assert kernel.cubin_path("sm_90", old) != kernel.cubin_path("sm_90", new)
    assert kernel.cubin_path("sm_90", new).parent == tiny_dir / "cache" / "sm_90"


def test_without_nvcc_a_cached_cubin_of_any_toolchain_is_used(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch, no_nvcc: None
) -> None:
    monkeypatch.setenv(loader.CACHE_ENV_VAR, str(tiny_dir / "cache"))
    kernel = tiny_kernel(tiny_dir)
    assert not kernel.available("sm_90")
    with pytest.raises(loader.CubinNotCachedError, match="precompile --arch sm_90"):
        kernel.resolve_cubin("sm_90")
    built = kernel.cubin_path("sm_90", loader.Nvcc("nvcc", (13, 5), "release 13.5, V13.5.37"))
    write_cache_entry(built, b"cubin")
    assert kernel.resolve_cubin("sm_90") == built
    assert kernel.available("sm_90")
    assert tiny_kernel(tiny_dir).cached_cubin("sm_100") is None  # other arch: not this one


def test_a_stale_cubin_is_not_used_after_a_header_edit(
    tiny_dir: Path, monkeypatch: pytest.MonkeyPatch, no_nvcc: None
) -> None:
    monkeypatch.setenv(loader.CACHE_ENV_VAR, str(tiny_dir / "cache"))
    built = tiny_kernel(tiny_dir).cubin_path("sm_90", loader.Nvcc("nvcc", (13, 5), "release 13.5"))
    write_cache_entry(built, b"cubin")
    assert tiny_kernel(tiny_dir).cached_cubin("sm_90") == built
    (tiny_dir / "tiny_factor.cuh").write_text(tiny_factor_header("4.0f"))
    assert tiny_kernel(tiny_dir).cached_cubin("sm_90") is None


def test_compile_without_nvcc_raises_install_hint(tiny_dir: Path, no_nvcc: None) -> None:
    with pytest.raises(loader.NvccNotFoundError, match="pip install"):
        tiny_kernel(tiny_dir).compile("sm_90")


def test_bad_arch_is_a_value_error(tiny_dir: Path) -> None:
    with pytest.raises(ValueError, match="sm_90"):
        tiny_kernel(tiny_dir).source_key("hopper")


# ----------------------------------------------------------------------------- instantiation, names, arguments


def test_instantiation_source_has_one_explicit_instantiation(tiny_dir: Path) -> None:
    source = tiny_kernel(tiny_dir).instantiation_source()
    assert '#include "tiny.cuh"' in source
    assert "template __tile_global__ void tiny_scale_kernel<128>(float*, float);" in source


def test_mangled_name_is_read_from_the_cubin(tiny_dir: Path) -> None:
    kernel = tiny_kernel(tiny_dir)
    image = b"\x7fELF....\x00.text._Z17tiny_scale_kernelILi128EEvPff\x00.nv.info\x00"
    assert kernel.mangled_name(image) == b"_Z17tiny_scale_kernelILi128EEvPff"
    with pytest.raises(loader.CudaDriverError, match="tiny_scale_kernel"):
        kernel.mangled_name(b"\x7fELF.text._Z5otherv\x00")


def test_param_buffer_packs_each_argument_at_its_pointer() -> None:
    types = ("const float*", "int", "long long", "float", "int*", "int")
    buffer = loader._ParamBuffer(types)
    values = (0x1122334455667788, -7, -(2**40), 1.5, 2**63 + 5, 123)
    pointers = (ctypes.c_void_p * len(types)).from_address(buffer.fill(values))
    c_types = (ctypes.c_uint64, ctypes.c_int32, ctypes.c_int64, ctypes.c_float, ctypes.c_uint64, ctypes.c_int32)
    read = tuple(c.from_address(p).value for c, p in zip(c_types, pointers, strict=True))
    assert read == values
    assert all(p % ctypes.sizeof(c) == 0 for c, p in zip(c_types, pointers, strict=True))


# ----------------------------------------------------------------------------- backend glue


def test_both_ops_are_registered_for_nvidia_only() -> None:
    for op in ("mla_decoding_split_kv", "splitk_reduce"):
        assert implementations(op)["tilecpp"].vendors == ("nvidia",)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only message")
def test_named_backend_on_cpu_says_why() -> None:
    x = make_mla_inputs(1, 16, 8)
    with pytest.raises(BackendUnavailableError, match="needs an NVIDIA GPU"):
        tilegym.ops.mla_decoding_split_kv(x.q, x.qpe, x.kv, x.kpe, backend="tilecpp")


def test_supports_reasons_for_unsupported_inputs() -> None:
    x = make_mla_inputs(2, 16, 8, head_dim=256)
    call = validate_mla_decoding(x.q, x.qpe, x.kv, x.kpe)
    assert any("D=512, P=64" in r for r in tilecpp_mla.supports(call))
    fp8 = make_mla_inputs(2, 16, 8, kv_dtype=torch.float8_e4m3fn, kv_lens=[8, 3])
    pages = to_pages(fp8, 1)  # fp8 variants are built for pages of 16 tokens and more
    call = validate_mla_decoding(
        fp8.q, fp8.qpe, pages.kv, pages.kpe, kv_scale=fp8.kv_scale, **pages.layout_kwargs("paged")
    )
    assert any("fp8" in r and "page sizes 16, 32" in r for r in tilecpp_mla.supports(call))
    cache = torch.randn(2, 8, 577).to(torch.bfloat16)  # rows not 16-byte aligned
    x = make_mla_inputs(2, 16, 8)
    call = validate_mla_decoding(x.q, x.qpe, cache[..., :512], cache[..., 512:576])
    assert any("16-byte boundaries" in r for r in tilecpp_mla.supports(call))


def test_layout_kind_and_config_follow_the_page_size() -> None:
    m = tilecpp_mla
    x = make_mla_inputs(2, 16, 128, kv_lens=[128, 3])
    call = validate_mla_decoding(x.q, x.qpe, x.kv, x.kpe)
    assert m.layout_kind(call, m.choose_config(call)) == m.DENSE_ROWS
    expected = {64: m.PAGE_PER_STEP, 128: m.PAGE_PER_STEP, 16: m.PAGED_ROWS[16], 1: m.PAGED_ROWS[1], 4: None}
    for page_size, kind in expected.items():
        pages = to_pages(x, page_size)
        for layout in ("paged", "ragged"):
            call = validate_mla_decoding(x.q, x.qpe, pages.kv, pages.kpe, **pages.layout_kwargs(layout))
            assert m.choose_config(call) is m.SMALL_HEADS
            assert m.layout_kind(call, m.SMALL_HEADS) == kind, (page_size, layout)
    assert any("page sizes 1, 16, 32 and multiples of 64 for a bf16/fp16 cache, got 4" in r for r in m.supports(call))
    many = make_mla_inputs(2, 128, 128, kv_lens=[128, 3])
    pages = to_pages(many, 64)
    call = validate_mla_decoding(many.q, many.qpe, pages.kv, pages.kpe, **pages.layout_kwargs("paged"))
    assert m.choose_config(call) is m.MANY_HEADS_PAGED and m.layout_kind(call, m.MANY_HEADS_PAGED) == m.PAGE_PER_STEP


def test_every_config_has_a_kernel_for_each_of_its_layouts() -> None:
    m = tilecpp_mla
    names = {k.instance_name for k in m.all_kernels()}
    per_dtype = sum(len(m.layout_kinds(c)) for c in m.CONFIGS) + 2  # + two combine tiles
    per_dtype += sum(len(m.layout_kinds(c, m.FP8_KV)) for c in m.FP8_CONFIGS)  # fp8 caches
    assert len(names) == len(m.DTYPES) * per_dtype
    assert all(len(m.layout_kinds(c)) >= 2 for c in m.CONFIGS)


def test_combine_grid_limit_depends_on_the_tile_the_split_count_picks() -> None:
    """Many splits use one-row tiles: > 65535 rows must be a reason, not a launch error."""
    from tilegym.ops.tilecpp.splitk_reduce import combine_reasons, combine_tile

    def reasons(rows: int, splits: int) -> list[str]:
        partial = torch.empty(1, 1, splits, 64).expand(rows, 1, splits, 64)  # stride 0: no memory
        lse = torch.empty(1, 1, splits).expand(rows, 1, splits)
        return combine_reasons(partial, lse, torch.empty(rows, 1, 64, dtype=torch.bfloat16))

    for splits in (2, 9):
        limit = 65535 * combine_tile(splits)[0]
        assert any(f"at most {limit} (batch, head) rows with {splits} splits" in r for r in reasons(limit + 1, splits))
