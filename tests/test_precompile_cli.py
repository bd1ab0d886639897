"""CPU tests of ``python -m tilegym precompile`` with a fake nvcc (tests/fake_nvcc.py) and the tiny
test kernels: corrupt entries rebuilt and reported, unsupported archs refused in one line before
any compile, unusable cache folders reported in one line, kernels skipped for archs they cannot target.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from cuda_tiny import vadd_kernel, write_cuda_sources
from fake_nvcc import fail_with, flip_256_bytes
from tilecpp_tiny import tiny_kernel, write_tiny_sources

from tilegym.ops import cubin_loader as loader
from tilegym.ops import precompile

HAS_CUTLASS = not isinstance(loader._search_cutlass(), loader.CutlassNotFoundError)
needs_cutlass = pytest.mark.skipif(not HAS_CUTLASS, reason="nvidia-cutlass is not installed (tilegym[cutlass])")


@pytest.fixture
def tiny_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(loader.CACHE_ENV_VAR, str(tmp_path / "cache"))
    write_cuda_sources(tmp_path)
    return write_tiny_sources(tmp_path)


@pytest.fixture
def tiny_backends(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Make precompile build the tiny kernels: tile for tilecpp, a Hopper-only CUDA one for cutlass."""
    monkeypatch.setitem(precompile.BACKEND_KERNELS, "tilecpp", lambda: [tiny_kernel(tiny_dir)])
    cutlass = [vadd_kernel(tiny_dir, archs=("sm_90a",))] if HAS_CUTLASS else []
    monkeypatch.setitem(precompile.BACKEND_KERNELS, "cutlass", lambda: cutlass)
    return tiny_dir


def test_precompile_rebuilds_a_corrupt_entry_and_says_so(tiny_backends: Path, fake_nvcc, capsys) -> None:
    fake_nvcc("13.5")
    assert precompile.main(["--arch", "sm_90", "--backend", "tilecpp"]) == 0
    cubin = tiny_kernel(tiny_backends).cached_cubin("sm_90")
    flip_256_bytes(cubin)
    capsys.readouterr()
    assert precompile.main(["--arch", "sm_90", "--backend", "tilecpp"]) == 0
    printed = capsys.readouterr().out
    assert "rebuilt" in printed and "corrupt cache entry" in printed and "1/1 kernel variants ready" in printed
    assert loader.cubin_problem(cubin) is None


def test_precompile_refuses_an_unsupported_arch_in_one_line_before_compiling(
    fake_nvcc, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    tool = fake_nvcc("13.5")
    monkeypatch.setenv(loader.CACHE_ENV_VAR, str(tmp_path / "c"))  # precompile sets it; monkeypatch restores it
    assert precompile.main(["--arch", "sm_75", "--cache-dir", str(tmp_path / "c")]) == 2
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and "sm_75" in lines[0] and "sm_80 or newer" in lines[0]
    assert tool.compiles() == 0 and not (tmp_path / "c").exists()


def test_precompile_with_a_cache_path_that_is_a_file_exits_1_with_one_line(tiny_backends, fake_nvcc, capsys):
    fake_nvcc("13.5")
    blocker = tiny_backends / "cache-file"
    blocker.write_text("x")
    assert precompile.main(["--arch", "sm_90", "--backend", "tilecpp", "--cache-dir", str(blocker)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and str(blocker) in lines[0] and "--cache-dir" in lines[0]


def test_precompile_on_a_full_disk_exits_1_with_one_line(tiny_backends, fake_nvcc, monkeypatch, capsys) -> None:
    fake_nvcc("13.5")
    monkeypatch.setattr(Path, "write_text", fail_with(errno.ENOSPC))
    assert precompile.main(["--arch", "sm_90", "--backend", "tilecpp"]) == 1
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("precompile:")] != []
    assert len([line for line in out.splitlines() if "no space left" in line]) == 1
    assert "Traceback" not in out and "FAILED" not in out and "ready" not in out


def test_precompile_without_kernels_for_the_backend_exits_2(tiny_backends, monkeypatch, capsys) -> None:
    monkeypatch.setitem(precompile.BACKEND_KERNELS, "cutlass", lambda: [])
    assert precompile.main(["--arch", "sm_90", "--backend", "cutlass"]) == 2
    assert "no kernels" in capsys.readouterr().out


@needs_cutlass
def test_precompile_skips_kernels_that_cannot_target_an_arch(tiny_backends, fake_nvcc, capsys) -> None:
    tool = fake_nvcc("13.5")
    assert precompile.main(["--arch", "sm_100"]) == 0
    out = capsys.readouterr().out
    assert "sm_100: skipped 1 kernel variants" in out and "1/1 kernel variants ready" in out
    assert tool.compiles() == 1
    assert precompile.main(["--arch", "sm_100", "--backend", "cutlass"]) == 2
    assert precompile.main(["--arch", "sm_90", "--backend", "all"]) == 0
    assert "2/2 kernel variants ready" in capsys.readouterr().out
    assert sorted(p.name for p in (tiny_backends / "cache").iterdir()) == ["sm_100", "sm_90", "sm_90a"]
