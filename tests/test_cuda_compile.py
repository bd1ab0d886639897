"""Compile-only CI tests of plain CUDA C++ kernels (no GPU): the tiny vector add and the CuTe copy
(tests/cuda_tiny.py) build for sm_90a with the pip nvcc and the CUTLASS headers of the
nvidia-cutlass wheel; each cubin is verified by its hash file and holds the kernel's symbol; the
cache key changes with the header, the flags and the arch.

Needs the ``cutlass`` extra (nvidia-cutlass) and the pip nvcc; skipped without them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cuda_tiny import CUTE_SYMBOL, VADD_SYMBOL, cute_kernel, scale_header, vadd_kernel, write_cuda_sources

from tilegym.ops import cubin_loader as loader

WHEEL_NVCC = next((p for p in loader._wheel_nvcc_candidates() if os.access(p, os.X_OK)), None)
PROBLEM = loader.toolchain_problem("cuda")
pytestmark = [
    pytest.mark.skipif(WHEEL_NVCC is None, reason="no pip nvcc (nvidia-cuda-nvcc wheel; tilegym[cutlass])"),
    pytest.mark.skipif(PROBLEM is not None, reason=f"cannot compile CUDA C++ here: {PROBLEM}"),
]


@pytest.fixture
def cuda_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(loader.CACHE_ENV_VAR, str(tmp_path / "cache"))
    monkeypatch.setenv(loader.NVCC_ENV_VAR, WHEEL_NVCC)
    loader.clear_toolchain_cache()
    yield write_cuda_sources(tmp_path)
    loader.clear_toolchain_cache()


def assert_verified_cubin(cubin: Path, symbol: bytes) -> None:
    image = cubin.read_bytes()
    assert image.startswith(b"\x7fELF")
    assert b".text." + symbol + b"\x00" in image
    digest, name = cubin.with_name(cubin.name + ".sha256").read_text().split()
    assert (digest, name) == (hashlib.sha256(image).hexdigest(), cubin.name)


@pytest.mark.parametrize(("make", "symbol"), [(vadd_kernel, VADD_SYMBOL), (cute_kernel, CUTE_SYMBOL)])
def test_tiny_cuda_kernels_compile_for_sm90a_with_the_pip_nvcc(cuda_dir: Path, make, symbol: bytes) -> None:
    kernel = make(cuda_dir)
    cubin = kernel.compile("sm_90")
    assert cubin.parent == cuda_dir / "cache" / "sm_90a"
    assert_verified_cubin(cubin, symbol)
    assert kernel.mangled_name(cubin.read_bytes()) == symbol
    assert make(cuda_dir).cached_cubin("sm_90a", loader.find_nvcc("cuda")) == cubin
    assert "template __global__ void" in cubin.with_suffix(".cu").read_text()


def test_the_cute_kernel_really_uses_the_cutlass_include_folder(cuda_dir: Path) -> None:
    kernel = cute_kernel(cuda_dir)
    nvcc = loader.find_nvcc("cuda").path
    source = cuda_dir / "k.cu"
    source.write_text(kernel.instantiation_source())
    command = kernel.compile_command(nvcc, "sm_90a", source, cuda_dir / "k.cubin")
    without_cutlass = [part for part in command if part != f"-I{loader.cutlass_include_dir()}"]
    assert len(without_cutlass) == len(command) - 1
    failed = subprocess.run(without_cutlass, capture_output=True, text=True)
    assert failed.returncode != 0 and "cute/tensor.hpp" in failed.stderr + failed.stdout


def test_cuda_cache_key_changes_with_header_flags_and_arch(cuda_dir: Path) -> None:
    first = vadd_kernel(cuda_dir).compile("sm_90a")
    assert vadd_kernel(cuda_dir).compile("sm_90a") == first  # same inputs: the same entry
    with_flag = vadd_kernel(cuda_dir, flags=("-DTINY_EXTRA=1",)).compile("sm_90a")
    other_arch = vadd_kernel(cuda_dir).compile("sm_100a")
    (cuda_dir / "tiny_cuda_scale.cuh").write_text(scale_header("2.0f"))
    edited = vadd_kernel(cuda_dir).compile("sm_90a")
    paths = [first, with_flag, other_arch, edited]
    assert len(set(paths)) == 4 and other_arch.parent.name == "sm_100a"
    for cubin in paths:
        assert_verified_cubin(cubin, VADD_SYMBOL)
    assert first.read_bytes() != edited.read_bytes()  # the scale constant is in the code


def _path_nvcc_without_tile_support() -> str | None:
    path = shutil.which("nvcc")
    found = loader._nvcc_version(path) if path else None
    if found is None or isinstance(found, loader.NvccNotFoundError):
        return None
    return path if (12, 3) <= found[0] < (13, 3) else None


@pytest.mark.skipif(_path_nvcc_without_tile_support() is None, reason="no nvcc 12.3-13.2 on PATH")
def test_a_toolkit_nvcc_without_tile_support_builds_cuda_kernels(cuda_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv(loader.NVCC_ENV_VAR, _path_nvcc_without_tile_support())
    loader.clear_toolchain_cache()
    assert loader.toolchain_problem("tile") is not None and loader.toolchain_problem("cuda") is None
    cubin = cute_kernel(cuda_dir).resolve_cubin("sm_90")
    assert_verified_cubin(cubin, CUTE_SYMBOL)
    assert f"-nvcc{loader.find_nvcc('cuda').version[0]}." in cubin.name
