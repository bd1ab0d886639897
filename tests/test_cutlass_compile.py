"""Compile-only CI tests of the cutlass backend (no GPU): every kernel variant it may launch builds
for sm_90a with the pip nvcc and the CUTLASS headers, into a verified cubin holding the kernel;
and a machine without nvcc or the headers still finds those cubins in the cache.

Needs the ``cutlass`` extra (nvidia-cutlass) and the pip nvcc; skipped without them.
"""

from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path

import pytest

import tilegym.ops.cutlass as backend
from tilegym.ops import cubin_loader as loader

WHEEL_NVCC = next((p for p in loader._wheel_nvcc_candidates() if os.access(p, os.X_OK)), None)
PROBLEM = loader.toolchain_problem("cuda")
pytestmark = [
    pytest.mark.skipif(WHEEL_NVCC is None, reason="no pip nvcc (nvidia-cuda-nvcc wheel; tilegym[cutlass])"),
    pytest.mark.skipif(PROBLEM is not None, reason=f"cannot compile CUDA C++ here: {PROBLEM}"),
]
KERNELS = {kernel.instance_name: kernel for kernel in backend.all_kernels()}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(loader.CACHE_ENV_VAR, str(tmp_path / "cache"))
    monkeypatch.setenv(loader.NVCC_ENV_VAR, WHEEL_NVCC)
    loader.clear_toolchain_cache()
    yield tmp_path / "cache"
    loader.clear_toolchain_cache()


def _fresh(kernel: loader.CudaKernel) -> loader.CudaKernel:
    """The same instantiation as a new object (its cache keys are computed again)."""
    return loader.CudaKernel(kernel.header, kernel.kernel_name, kernel.template_args, kernel.param_types)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_every_variant_compiles_for_sm90a_without_a_ptxas_performance_loss(cache: Path, name: str) -> None:
    kernel = _fresh(KERNELS[name])
    with warnings.catch_warnings():
        # e.g. ptxas serialising every wgmma (C7515/C7518): a correct cubin, but not the kernel its source describes.
        warnings.simplefilter("error", loader.KernelPerformanceWarning)
        cubin = kernel.compile("sm_90")
    assert cubin.parent == cache / "sm_90a"
    image = cubin.read_bytes()
    assert image.startswith(b"\x7fELF")
    assert kernel.kernel_name.encode() in kernel.mangled_name(image)
    assert loader.cubin_problem(cubin) is None


def test_cached_cubins_load_without_nvcc_or_cutlass_headers(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = _fresh(KERNELS[min(KERNELS)])  # the smallest: a combine kernel
    built = kernel.compile("sm_90")
    # A GPU machine with an nvcc but without the nvidia-cutlass wheel: cache only.
    missing = functools.cache(lambda: loader.CutlassNotFoundError("no headers"))
    monkeypatch.setattr(loader, "_search_cutlass", missing)
    loader.clear_toolchain_cache()
    assert loader.toolchain_problem("cuda") == "no headers"
    again = _fresh(kernel)
    assert again.source_key("sm_90") == kernel.source_key("sm_90")
    assert again.available("sm_90")
    assert again.resolve_cubin("sm_90") == built
