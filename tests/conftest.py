"""Test session setup. Without a GPU, Triton kernels run in interpreter mode on CPU tensors.

TRITON_INTERPRET must be set before any ``@triton.jit`` runs (kernel modules import lazily,
so setting it here, first, is enough).
"""

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from fake_nvcc import FAKE_CUBIN, FakeNvcc, write_fake_nvcc

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_GPU:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


# ----------------------------------------------------------------------------- stand-ins for nvcc


def _use_nvcc(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    from tilegym.ops import cubin_loader

    monkeypatch.setenv(cubin_loader.NVCC_ENV_VAR, str(path))
    cubin_loader.clear_toolchain_cache()


@pytest.fixture
def fake_nvcc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., FakeNvcc]]:
    """``make(release, payload=FAKE_CUBIN, stderr="")``: point TILEGYM_NVCC at a fake nvcc of that CUDA
    release, which prints ``stderr`` when it compiles."""
    from tilegym.ops import cubin_loader

    folder = tmp_path / "fake-nvcc"
    folder.mkdir()

    def make(release: str, payload: bytes = FAKE_CUBIN, stderr: str = "") -> FakeNvcc:
        tool = write_fake_nvcc(folder, release, payload, stderr)
        _use_nvcc(monkeypatch, tool.path)
        return tool

    yield make
    cubin_loader.clear_toolchain_cache()


@pytest.fixture
def no_nvcc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Point TILEGYM_NVCC at a path that does not exist: no toolchain of any language."""
    from tilegym.ops import cubin_loader

    _use_nvcc(monkeypatch, tmp_path / "missing" / "nvcc")
    yield
    cubin_loader.clear_toolchain_cache()
