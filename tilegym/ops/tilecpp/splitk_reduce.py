"""Launcher of the Tile C++ split-KV combine (``splitk_reduce.cuh``).

Used as the second stage of ``mla_decoding_split_kv`` and registered on its own for the
``splitk_reduce`` op. Two kernels: the split-axis kernel (3-D tile (rows, splits, columns), rows
addressed as (batch, head)) and the rows kernel (2-D tile (rows, columns) over a flattened
[B*H] row axis, a runtime loop over the splits). A tile's length names its kernel. Variants:
(partial dtype, output dtype) pair x tile; the default tile depends on the split count.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from tilegym.ops.contract import SplitKReduceCall
from tilegym.ops.cubin_loader import TileCppKernel
from tilegym.utils import cdiv

HEADER = "splitk_reduce.cuh"
KERNEL = "splitk_reduce_kernel"
ROWS_KERNEL = "splitk_reduce_rows_kernel"
Tile = tuple[int, ...]  # (BLOCK_R, BLOCK_S, BLOCK_D): split-axis kernel; (BLOCK_R, BLOCK_D): rows kernel
# Split-axis tiles, also the fallback when the (batch, head) axes do not flatten to one row axis.
ROWS_TILE = (8, 8, 64)  # N <= 8: large batches, few splits
SPLITS_TILE = (1, 16, 64)  # N > 8: few rows, many splits
# Library defaults per split count (measured on the H200, benchmarks/NOTES_tilecpp.md round 3): the
# rows kernel for few splits (N = 2 at 64x4096x16: combine 28.0 -> 3.2 us), the split-axis kernel
# for many (N = 16, 128: the rows kernel's serial split loop over few rows was slower).
FEW_SPLITS_TILE: Tile = (16, 64)  # N <= MAX_ROWS_TILE_SPLITS
MANY_SPLITS_TILE: Tile = SPLITS_TILE  # N > MAX_ROWS_TILE_SPLITS
BLOCK_D = 64  # head_dim must be a multiple of it (the smallest column block of any tile)
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
# Pairs whose rows kernel was checked on the H200 (the split-KV launcher's float32 partials); the
# others keep the split-axis kernel until checked there.
ROWS_KERNEL_PAIRS: tuple[tuple[torch.dtype, torch.dtype], ...] = (
    (torch.float32, torch.bfloat16),
    (torch.float32, torch.float16),
)


@functools.cache
def combine_kernel(in_dtype: torch.dtype, out_dtype: torch.dtype, tile: Tile) -> TileCppKernel:
    """The combine kernel for partials of ``in_dtype`` written as ``out_dtype`` with ``tile``."""
    cin, cout = C_TYPES[in_dtype], C_TYPES[out_dtype]
    pointers = (f"const {cin}*", "const float*", f"{cout}*", "float*")
    if len(tile) == 2:
        return TileCppKernel(HEADER, ROWS_KERNEL, (cin, cout, *tile), (*pointers, *("int",) * 4, *("long long",) * 4))
    return TileCppKernel(HEADER, KERNEL, (cin, cout, *tile), (*pointers, *("int",) * 5, *("long long",) * 6))


def combine_tile(num_splits: int) -> Tile:
    """The default tile for ``num_splits`` splits."""
    return FEW_SPLITS_TILE if num_splits <= MAX_ROWS_TILE_SPLITS else MANY_SPLITS_TILE


def fallback_tile(num_splits: int) -> Tile:
    """The split-axis tile for layouts the rows kernel cannot address."""
    return ROWS_TILE if num_splits <= MAX_ROWS_TILE_SPLITS else SPLITS_TILE


def default_tiles() -> tuple[Tile, Tile]:
    """The default tiles for few and for many splits."""
    return FEW_SPLITS_TILE, MANY_SPLITS_TILE


def library_tiles() -> list[Tile]:
    """Every tile the library may launch: the defaults and the split-axis fallbacks."""
    return list(dict.fromkeys((*default_tiles(), ROWS_TILE, SPLITS_TILE)))


def all_kernels() -> list[TileCppKernel]:
    """Every combine variant the library may launch."""
    return [
        combine_kernel(i, o, tile)
        for i, o in DTYPE_PAIRS
        for tile in library_tiles()
        if len(tile) == 3 or (i, o) in ROWS_KERNEL_PAIRS
    ]


def _flat_row_stride(t: torch.Tensor) -> int | None:
    """Stride of the flattened (batch, head) row axis of ``t`` [B, H, ...], None if they do not flatten."""
    batch, heads = t.shape[:2]
    if heads == 1:
        return t.stride(0)
    if batch == 1 or t.stride(0) == heads * t.stride(1):
        return t.stride(1)
    return None


def row_strides(partial_out: torch.Tensor, partial_lse: torch.Tensor, block_r: int) -> tuple[int, int] | None:
    """(partial_out, partial_lse) strides of the flattened row axis, when the rows kernel can use them."""
    strides = (_flat_row_stride(partial_out), _flat_row_stride(partial_lse))
    if None in strides or any(block_r * s > MAX_INT32 for s in strides):
        return None
    return strides


def launch_tile(
    partial_out: torch.Tensor, partial_lse: torch.Tensor, out_dtype: torch.dtype, tile: Tile | None = None
) -> Tile:
    """``tile`` (default: the split count's), or the split-axis fallback when the rows kernel is not
    used for this dtype pair or cannot address these tensors (rows that do not flatten, a head dim
    that is not a multiple of its columns)."""
    num_splits, head_dim = partial_out.shape[2:]
    tile = tile or combine_tile(num_splits)
    if len(tile) == 2 and (
        (partial_out.dtype, out_dtype) not in ROWS_KERNEL_PAIRS
        or head_dim % tile[1]
        or row_strides(partial_out, partial_lse, tile[0]) is None
    ):
        return fallback_tile(num_splits)
    return tile


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
    tile = launch_tile(partial_out, partial_lse, out.dtype)
    if cdiv(batch * heads, tile[0]) > MAX_GRID_YZ:
        reasons.append(
            f"tilecpp's combine handles at most {MAX_GRID_YZ * tile[0]} (batch, head) rows with {num_splits} splits"
        )
    if not reasons:
        kernel = combine_kernel(partial_out.dtype, out.dtype, tile)
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
    tile: Tile | None = None,
) -> None:
    """Merge partials [B,H,N,D] (+ lse [B,H,N]) into ``out`` [B,H,D]; also the lse [B,H] when given.

    ``tile`` overrides the default tile (benchmarks; that variant must be built)."""
    batch, heads, num_splits, head_dim = partial_out.shape
    tile = launch_tile(partial_out, partial_lse, out.dtype, tile)
    kernel = combine_kernel(partial_out.dtype, out.dtype, tile)
    device = out.device
    rows = batch * heads
    pointers = (
        partial_out.data_ptr(),
        partial_lse.data_ptr(),
        out.data_ptr(),
        0 if out_lse is None else out_lse.data_ptr(),
    )
    if len(tile) == 2:
        po_sr, lse_sr = row_strides(partial_out, partial_lse, tile[0])
        sizes = (rows, num_splits, head_dim, int(out_lse is not None))
        args = (*pointers, *sizes, po_sr, partial_out.stride(2), lse_sr, partial_lse.stride(2))
    else:
        sizes = (rows, heads, num_splits, head_dim, int(out_lse is not None))
        args = (*pointers, *sizes, *partial_out.stride()[:3], *partial_lse.stride())
    grid = (head_dim // tile[-1], cdiv(rows, tile[0]), 1)
    kernel.launch(grid, args, torch.cuda.current_stream(device).cuda_stream, device.index)


def splitk_reduce_supports(call: SplitKReduceCall) -> list[str]:
    return combine_reasons(call.partial_out, call.partial_lse, call.out)


def splitk_reduce(call: SplitKReduceCall) -> None:
    with on_device(call.device):
        launch_combine(call.partial_out, call.partial_lse, call.out, None)
