"""Tiny plain CUDA C++ kernels for the loader tests: a vector add whose header includes a second
project header, and a copy written with CuTe tensors (proves the CUTLASS include path)."""

from __future__ import annotations

from pathlib import Path

from tilegym.ops import cubin_loader as loader

VADD_HEADER = """#pragma once
#include "tiny_cuda_scale.cuh"

template <int BLOCK>
__global__ void tiny_vadd_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c,
                                 int n) {
  int i = blockIdx.x * BLOCK + threadIdx.x;
  if (i < n) c[i] = TINY_CUDA_SCALE * (a[i] + b[i]);
}
"""

CUTE_HEADER = """#pragma once
#include <cute/tensor.hpp>

template <int BLOCK>
__global__ void tiny_cute_copy_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
  using namespace cute;
  Tensor src = make_tensor(make_gmem_ptr(x), make_shape(n));
  Tensor dst = make_tensor(make_gmem_ptr(y), make_shape(n));
  int i = blockIdx.x * BLOCK + threadIdx.x;
  if (i < n) dst(i) = src(i);
}
"""

VADD_SYMBOL = b"_Z16tiny_vadd_kernelILi128EEvPKfS1_Pfi"
CUTE_SYMBOL = b"_Z21tiny_cute_copy_kernelILi128EEvPKfPfi"


def scale_header(scale: str = "1.0f") -> str:
    return f"#pragma once\n#define TINY_CUDA_SCALE {scale}\n"


def write_cuda_sources(folder: Path) -> Path:
    """Write tiny_vadd.cuh (+ the tiny_cuda_scale.cuh it includes) and tiny_cute.cuh into ``folder``."""
    (folder / "tiny_vadd.cuh").write_text(VADD_HEADER)
    (folder / "tiny_cuda_scale.cuh").write_text(scale_header())
    (folder / "tiny_cute.cuh").write_text(CUTE_HEADER)
    return folder


def vadd_kernel(folder: Path, flags: tuple[str, ...] = (), archs=("sm_90a", "sm_100a")) -> loader.CudaKernel:
    params = ("const float*", "const float*", "float*", "int")
    return loader.CudaKernel(folder / "tiny_vadd.cuh", "tiny_vadd_kernel", (128,), params, flags=flags, archs=archs)


def cute_kernel(folder: Path) -> loader.CudaKernel:
    params = ("const float*", "float*", "int")
    return loader.CudaKernel(folder / "tiny_cute.cuh", "tiny_cute_copy_kernel", (128,), params)
