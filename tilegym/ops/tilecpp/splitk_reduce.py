"""Launcher of the Tile C++ split-KV combine (``splitk_reduce.cuh``).

Used as the second stage of ``mla_decoding_split_kv`` and registered on its own for the
``splitk_reduce`` op. Variants: partial dtype x output dtype (float32, bf16, fp16); the tile
shape is fixed.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from tilegym.ops.contract import SplitKReduceCall
from tilegym.ops.tilecpp.loader import TileCppKernel
from tilegym.utils import cdiv

HEADER = "splitk_reduce.cuh"
KERNEL = "splitk_reduce_kernel"
BLOCK_S = 16  # splits merged per step
BLOCK_D = 64  # output columns per program
MAX_GRID_YZ = 65535
C_TYPES: dict[torch.dtype, str] = {torch.float32: "float", torch.bfloat16: "__nv_bfloat16", torch.float16: "__half"}


@functools.cache
def combine_kernel(in_dtype: torch.dtype, out_dtype: torch.dtype) -> TileCppKernel:
    """The combine kernel for partials of ``in_dtype`` written as ``out_dtype``."""
    cin, cout = C_TYPES[in_dtype], C_TYPES[out_dtype]
    params = (f"const {cin}*", "const float*", f"{cout}*", "float*", *("int",) * 4, *("long long",) * 6)
    return TileCppKernel(HEADER, KERNEL, (cin, cout, BLOCK_S, BLOCK_D), params)


def all_kernels() -> list[TileCppKernel]:
    """Every combine variant the library may launch."""
    return [combine_kernel(i, o) for i in C_TYPES for o in C_TYPES]


def device_arch(device: torch.device) -> str:
    """'sm_90'-style arch of a CUDA device."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def on_device(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """Make ``device`` current for a launch (no-op, and no cost, when it already is)."""
    if device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def combine_reasons(partial_out: torch.Tensor, partial_lse: torch.Tensor, out: torch.Tensor) -> list[str]:
    """Why the combine kernel cannot merge these tensors (empty: it can)."""
    batch, heads, _, head_dim = partial_out.shape
    reasons = []
    if partial_out.dtype not in C_TYPES or out.dtype not in C_TYPES:
        reasons.append(f"tilecpp combines float32/bf16/fp16, got {partial_out.dtype} -> {out.dtype}")
        return reasons
    if head_dim % BLOCK_D:
        reasons.append(f"tilecpp's combine needs a head dim that is a multiple of {BLOCK_D}, got {head_dim}")
    vec = 16 // partial_out.element_size()
    if partial_out.data_ptr() % 16 or any(s % vec for s in partial_out.stride()[:3]):
        reasons.append(
            f"tilecpp's combine needs partial_out rows on 16-byte boundaries (pointer aligned, strides of B, H, N "
            f"multiples of {vec}), got strides {partial_out.stride()}"
        )
    if batch > MAX_GRID_YZ or heads > MAX_GRID_YZ:
        reasons.append(f"tilecpp's combine launches B x H programs with B, H <= {MAX_GRID_YZ}")
    if not reasons and not combine_kernel(partial_out.dtype, out.dtype).available(device_arch(out.device)):
        reasons.append(
            f"no cached cubin for the combine {partial_out.dtype} -> {out.dtype} on {device_arch(out.device)} and no "
            "Tile-capable nvcc (run `python -m tilegym precompile`)"
        )
    return reasons


def launch_combine(
    partial_out: torch.Tensor, partial_lse: torch.Tensor, out: torch.Tensor, out_lse: torch.Tensor | None
) -> None:
    """Merge partials [B,H,N,D] (+ lse [B,H,N]) into ``out`` [B,H,D]; also the lse [B,H] when given."""
    batch, heads, num_splits, head_dim = partial_out.shape
    kernel = combine_kernel(partial_out.dtype, out.dtype)
    device = out.device
    args = (
        partial_out.data_ptr(),
        partial_lse.data_ptr(),
        out.data_ptr(),
        0 if out_lse is None else out_lse.data_ptr(),
        heads,
        num_splits,
        head_dim,
        int(out_lse is not None),
        *partial_out.stride()[:3],
        *partial_lse.stride(),
    )
    grid = (cdiv(head_dim, BLOCK_D), heads, batch)
    kernel.launch(grid, args, torch.cuda.current_stream(device).cuda_stream, device.index)


def splitk_reduce_supports(call: SplitKReduceCall) -> list[str]:
    return combine_reasons(call.partial_out, call.partial_lse, call.out)


def splitk_reduce(call: SplitKReduceCall) -> None:
    with on_device(call.device):
        launch_combine(call.partial_out, call.partial_lse, call.out, None)
