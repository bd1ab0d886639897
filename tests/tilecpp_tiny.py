"""A tiny Tile C++ kernel for the loader tests: a header that includes a second project header."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tilegym.ops import cubin_loader as loader

TINY_HEADER = """#pragma once
#include <cuda_tile.h>
#include "tiny_factor.cuh"

template <int N>
__tile_global__ void tiny_scale_kernel(float* __restrict__ x, float f) {
  namespace ct = cuda::tiles;
  auto idx = ct::iota<ct::tile<int, ct::shape<N>>>() + (int)ct::bid().x * N;
  ct::store(x + idx, ct::load(x + idx) * (f * TINY_FACTOR));
}
"""


def tiny_factor_header(factor: str = "2.0f") -> str:
    return f"#pragma once\n#define TINY_FACTOR {factor}\n"


def write_tiny_sources(folder: Path) -> Path:
    """Write tiny.cuh and the tiny_factor.cuh it includes into ``folder``; return ``folder``."""
    (folder / "tiny.cuh").write_text(TINY_HEADER)
    (folder / "tiny_factor.cuh").write_text(tiny_factor_header())
    return folder


def tiny_kernel(folder: Path, n: int = 128, flags: tuple[str, ...] = ()) -> loader.TileCppKernel:
    return loader.TileCppKernel(folder / "tiny.cuh", "tiny_scale_kernel", (n,), ("float*", "float"), flags=flags)


def write_cache_entry(cubin: Path, image: bytes) -> Path:
    """Put ``image`` in the cache as ``cubin`` with its hash file in ``sha256sum`` format."""
    cubin.parent.mkdir(parents=True, exist_ok=True)
    cubin.write_bytes(image)
    cubin.with_name(cubin.name + ".sha256").write_text(f"{hashlib.sha256(image).hexdigest()}  {cubin.name}\n")
    return cubin
