"""Test session setup. Without a GPU, Triton kernels run in interpreter mode on CPU tensors.

TRITON_INTERPRET must be set before any ``@triton.jit`` runs (kernel modules import lazily,
so setting it here, first, is enough).
"""

import os

import pytest
import torch

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
