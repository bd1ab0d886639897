"""CPU tests of the Tile C++ combine launcher's kernel and tile choice (no GPU): which kernel a
tile names, when the 2-D rows kernel can address the partials, and the split-axis fallback.
The compile test needs the Tile toolchain (skipped without it)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tilegym.ops import cubin_loader as loader
from tilegym.ops.tilecpp import splitk_reduce as combine

D = 512


def partials(b: int, h: int, n: int, d: int = D) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty(b, h, n, d), torch.empty(b, h, n)


def test_tile_length_names_the_kernel() -> None:
    rows = combine.combine_kernel(torch.float32, torch.bfloat16, (32, 64))
    split_axis = combine.combine_kernel(torch.float32, torch.bfloat16, (8, 8, 64))
    assert rows.kernel_name == combine.ROWS_KERNEL and rows.template_args[2:] == ("32", "64")
    assert split_axis.kernel_name == combine.KERNEL and split_axis.template_args[2:] == ("8", "8", "64")
    assert rows.param_types.count("long long") == 4 and split_axis.param_types.count("long long") == 6


def test_row_strides_of_flattenable_layouts() -> None:
    assert combine.row_strides(*partials(4, 16, 3), 32) == (3 * D, 3)
    out, lse = partials(4, 16, 7)
    assert combine.row_strides(out[:, :, :3], lse[:, :, :3], 32) == (7 * D, 7)  # a slice of the splits
    out, lse = partials(6, 8, 2)
    assert combine.row_strides(out[::2], lse, 32) is None  # batch stride != heads * head stride
    out, lse = partials(1, 8, 2)
    assert combine.row_strides(out.transpose(0, 1), lse.transpose(0, 1), 32) == (2 * D, 2)  # heads == 1


def test_launch_tile_falls_back_to_the_split_axis_kernel() -> None:
    bf16 = torch.bfloat16
    out, lse = partials(6, 8, 2)
    assert combine.launch_tile(out, lse, bf16, (32, 64)) == (32, 64)
    assert combine.launch_tile(out, lse, bf16) == combine.FEW_SPLITS_TILE
    assert combine.launch_tile(out[::2], lse[::2], bf16, (32, 64)) == combine.ROWS_TILE  # rows do not flatten
    assert combine.launch_tile(out.to(bf16), lse, bf16, (32, 64)) == combine.ROWS_TILE  # pair not checked
    out, lse = partials(2, 3, 20, 64)
    assert combine.launch_tile(out, lse, bf16, (16, 128)) == combine.SPLITS_TILE  # 64 columns < BLOCK_D
    assert combine.launch_tile(out, lse, bf16) == combine.combine_tile(20)


def test_few_splits_default_is_the_rows_kernel_for_float32_partials() -> None:
    assert len(combine.FEW_SPLITS_TILE) == 2 and len(combine.MANY_SPLITS_TILE) == 3
    names = {(k.kernel_name, k.template_args[:2]) for k in combine.all_kernels()}
    assert (combine.ROWS_KERNEL, ("float", "__nv_bfloat16")) in names
    assert (combine.ROWS_KERNEL, ("__nv_bfloat16", "__nv_bfloat16")) not in names


def test_library_builds_the_defaults_and_the_fallbacks() -> None:
    tiles = combine.library_tiles()
    assert set(tiles) >= {*combine.default_tiles(), combine.ROWS_TILE, combine.SPLITS_TILE}
    assert len(tiles) == len(set(tiles))


@pytest.mark.skipif(loader.nvcc_or_none() is None, reason="no Tile-capable nvcc")
def test_rows_kernel_compiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(loader.CACHE_ENV_VAR, str(tmp_path))
    kernel = combine.combine_kernel(torch.bfloat16, torch.bfloat16, (16, 64))  # bf16 partials: 8-element vectors
    assert kernel.compile("sm_90").parent == tmp_path / "sm_90"
