"""Launcher of the Tile C++ split-KV combine (``splitk_reduce.cuh``).

Used as the second stage of ``mla_decoding_split_kv`` and registered on its own for the
``splitk_reduce`` op. Variants: (partial dtype, output dtype) pair x tile shape, where the
shape is "many rows" for few splits and "one row" for many splits.
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
# (BLOCK_R rows, BLOCK_S splits, BLOCK_D columns) per program and step.
ROWS_TILE = (8, 8, 64)  # used when N <= 8: large batches, few splits
SPLITS_TILE = (1, 16, 64)  # used when N > 8: few rows, many splits
BLOCK_D = 64  # head_dim must be a multiple of it
MAX_ROWS_TILE_SPLITS = 8
MAX_GRID_YZ = 65535
MAX_INT32 = 2**31 - 1
C_TYPES: dict[torch.dtype, str] = {torch.float32: "float", torch.bfloat16: "__nv_bfloat16", torch.float16: "__half"}
# (partial dtype, output dtype) pairs with a built kernel: float32 partials to any output, or same dtype.
DTYPE_PAIRS: tuple[tuple[torch.dtype, torch.dtype], ...] = (
    (torch.float32, torch.float32),
    (torch.float32, torch.bfloat16),
    (torch.float32, torch.float16),
    (torch.bfloat16, torch.bfloat16),
    (torch.float16, torch.float16),
)


@functools.cache
def combine_kernel(in_dtype: torch.dtype, out_dtype: torch.dtype, tile: tuple[int, int, int]) -> TileCppKernel:
    """The combine kernel for partials of ``in_dtype`` written as ``out_dtype`` with ``tile``."""
    cin, cout = C_TYPES[in_dtype], C_TYPES[out_dtype]
    params = (f"const {cin}*", "const float*", f"{cout}*", "float*", *("int",) * 5, *("long long",) * 6)
    return TileCppKernel(HEADER, KERNEL, (cin, cout, *tile), params)


def combine_tile(num_splits: int) -> tuple[int, int, int]:
    return ROWS_TILE if num_splits <= MAX_ROWS_TILE_SPLITS else SPLITS_TILE


def all_kernels() -> list[TileCppKernel]:
    """Every combine variant the library may launch."""
    return [combine_kernel(i, o, tile) for i, o in DTYPE_PAIRS for tile in (ROWS_TILE, SPLITS_TILE)]


def device_arch(device: torch.device) -> str:
    """'sm_90'-style arch of a CUDA device."""
    return _arch_of(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _arch_of(device_index: int) -> str:
    major, minor = torch.cuda.get_device_capability(device_index)
    return f"sm_{major}{minor}"


def on_device(device: torch.device) -> contextlib.AbstractContextManager[object]:
    """Make ``device`` current for a launch (no-op, and no cost, when it already is)."""
    if device.index == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def _max_offset(t: torch.Tensor) -> int:
    return sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))


def combine_reasons(partial_out: torch.Tensor, partial_lse: torch.Tensor, out: torch.Tensor) -> list[str]:
    """Why the combine kernel cannot merge these tensors (empty: it can)."""
    batch, heads, num_splits, head_dim = partial_out.shape
    if (partial_out.dtype, out.dtype) not in DTYPE_PAIRS:
        pairs = ", ".join(f"{i}->{o}" for i, o in DTYPE_PAIRS)
        return [f"tilecpp combines {pairs}; got {partial_out.dtype}->{out.dtype}"]
    reasons = []
    if head_dim % BLOCK_D:
        reasons.append(f"tilecpp's combine needs a head dim that is a multiple of {BLOCK_D}, got {head_dim}")
    vec = 16 // partial_out.element_size()
    if partial_out.data_ptr() % 16 or any(s % vec for s in partial_out.stride()[:3]):
        reasons.append(
            f"tilecpp's combine needs partial_out rows on 16-byte boundaries (pointer aligned, strides of B, H, N "
            f"multiples of {vec}), got strides {partial_out.stride()}"
        )
    if max(_max_offset(partial_out), _max_offset(partial_lse), out.numel()) > MAX_INT32:
        reasons.append("tilecpp's combine needs every element offset to fit in int32")
    block_r = combine_tile(num_splits)[0]
    if cdiv(batch * heads, block_r) > MAX_GRID_YZ:
        reasons.append(
            f"tilecpp's combine handles at most {MAX_GRID_YZ * block_r} (batch, head) rows with {num_splits} splits"
        )
    if not reasons:
        kernel = combine_kernel(partial_out.dtype, out.dtype, combine_tile(num_splits))
        if not kernel.available(device_arch(out.device)):
            reasons.append(
                f"no cached cubin for the combine {partial_out.dtype} -> {out.dtype} on {device_arch(out.device)} "
                "and no Tile-capable nvcc (run `python -m tilegym precompile`)"
            )
    return reasons


def launch_combine(
    partial_out: torch.Tensor,
    partial_lse: torch.Tensor,
    out: torch.Tensor,
    out_lse: torch.Tensor | None,
    *,
    tile: tuple[int, int, int] | None = None,
) -> None:
    """Merge partials [B,H,N,D] (+ lse [B,H,N]) into ``out`` [B,H,D]; also the lse [B,H] when given.

    ``tile`` overrides the default tile (benchmarks; that variant must be built)."""
    batch, heads, num_splits, head_dim = partial_out.shape
    tile = tile or combine_tile(num_splits)
    kernel = combine_kernel(partial_out.dtype, out.dtype, tile)
    device = out.device
    rows = batch * heads
    args = (
        partial_out.data_ptr(),
        partial_lse.data_ptr(),
        out.data_ptr(),
        0 if out_lse is None else out_lse.data_ptr(),
        rows,
        heads,
        num_splits,
        head_dim,
        int(out_lse is not None),
        *partial_out.stride()[:3],
        *partial_lse.stride(),
    )
    grid = (head_dim // tile[2], cdiv(rows, tile[0]), 1)
    kernel.launch(grid, args, torch.cuda.current_stream(device).cuda_stream, device.index)


def splitk_reduce_supports(call: SplitKReduceCall) -> list[str]:
    return combine_reasons(call.partial_out, call.partial_lse, call.out)


def splitk_reduce(call: SplitKReduceCall) -> None:
    with on_device(call.device):
        launch_combine(call.partial_out, call.partial_lse, call.out, None)
