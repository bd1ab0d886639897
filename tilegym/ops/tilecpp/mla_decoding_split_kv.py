"""Launcher of the Tile C++ MLA split-KV kernel (``mla_decoding_split_kv.cuh``) + its combine.

Stage 1 launches (splits, head groups, B) programs; each writes a float32 partial output and
lse per split. Stage 2 (``splitk_reduce.cuh``) merges the splits into ``call.out`` and the lse.
With a single split the first stage writes the final output itself and no combine runs.
Variants: dtype (bf16, fp16) x tile config (heads per program, tokens per step, occupancy
hint); sizes and strides are runtime arguments, so a new shape never compiles anything.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from tilegym.ops.contract import MLADecodeCall
from tilegym.ops.cubin_loader import TileCppKernel
from tilegym.ops.split_plan import SplitPlan, plan_mla_splits
from tilegym.ops.tilecpp.splitk_reduce import (
    C_TYPES,
    MAX_GRID_YZ,
    Tile,
    combine_kernel,
    default_tiles,
    device_arch,
    launch_combine,
    on_device,
)
from tilegym.utils import cdiv

HEADER = "mla_decoding_split_kv.cuh"
KERNEL = "mla_split_kv_kernel"
HEAD_DIM, ROPE_DIM = 512, 64  # fixed by the kernel's tile shapes
LOG2E = math.log2(math.e)  # the kernel's softmax works in base 2
DTYPES = (torch.bfloat16, torch.float16)
MAX_INT32 = 2**31 - 1
MAX_BLOCK_N = 128  # largest tokens-per-step of any variant
PARAM_TYPES_AFTER_POINTERS = (*("int",) * 6, *("long long",) * 8, "float")


@dataclass(frozen=True)
class TileConfig:
    """Heads per program, KV tokens per step, occupancy hint (CTAs per SM) of the split kernel."""

    block_h: int
    block_n: int
    occupancy: int

    @property
    def programs_per_sm(self) -> int:
        return self.occupancy


# Library defaults (the best of the configs measured on the H200, benchmarks/NOTES_tilecpp.md):
# up to 16 heads -> 16-head programs, 64 tokens per step; more heads -> 32-head programs, 128
# tokens per step. Each uses 150-190 KB of shared memory: one program per SM.
SMALL_HEADS = TileConfig(16, 64, 1)
MANY_HEADS = TileConfig(32, 128, 1)


@functools.cache
def split_kv_kernel(dtype: torch.dtype, config: TileConfig) -> TileCppKernel:
    """The split-KV kernel for ``dtype`` inputs with tile config ``config``."""
    ctype = C_TYPES[dtype]
    pointers = (*(f"const {ctype}*",) * 4, "const int*", "float*", "float*", f"{ctype}*", "float*")
    template_args = (ctype, config.block_h, config.block_n, config.occupancy)
    return TileCppKernel(HEADER, KERNEL, template_args, (*pointers, *PARAM_TYPES_AFTER_POINTERS))


def all_kernels() -> list[TileCppKernel]:
    """Every split-KV variant the library may launch."""
    return [split_kv_kernel(dtype, config) for dtype in DTYPES for config in (SMALL_HEADS, MANY_HEADS)]


def choose_config(heads: int) -> TileConfig:
    """Tile config for a head count: 16-head programs up to 16 heads, else 32-head programs."""
    return SMALL_HEADS if heads <= SMALL_HEADS.block_h else MANY_HEADS


def split_plan(call: MLADecodeCall, config: TileConfig, kv_len_per_split: int | None = None) -> SplitPlan:
    """The split count for this call: one wave of programs (a user ``kv_len_per_split`` wins).

    One wave of longer splits beat more, shorter splits in every case measured on the H200
    (benchmarks/NOTES_tilecpp.md); splits may be a single ``block_n`` step long.
    """
    return plan_mla_splits(
        call,
        heads_per_program=config.block_h,
        block_n=config.block_n,
        programs_per_sm=config.programs_per_sm,
        min_blocks_per_split=1,
        kv_len_per_split=kv_len_per_split,
    )


def _layout_reasons(call: MLADecodeCall) -> list[str]:
    reasons = []
    for name in ("q", "qpe", "kv", "kpe"):
        t = getattr(call, name)
        if t.data_ptr() % 16 or t.stride(0) % 8 or t.stride(1) % 8:
            reasons.append(
                f"tilecpp needs {name} rows on 16-byte boundaries (pointer aligned, strides multiples of 8 "
                f"elements), got strides {t.stride()}"
            )
    for name in ("kv", "kpe"):
        if getattr(call, name).stride(1) * MAX_BLOCK_N > MAX_INT32:
            reasons.append(f"tilecpp needs {name}.stride(1) * {MAX_BLOCK_N} to fit in int32")
    return reasons


def supports(call: MLADecodeCall) -> list[str]:
    """Why the Tile C++ kernels cannot run ``call`` (empty: they can)."""
    if call.is_fp8:
        return ["tilecpp does not implement the fp8 KV cache (bf16/fp16 only)"]
    if (call.head_dim, call.rope_dim) != (HEAD_DIM, ROPE_DIM):
        return [f"tilecpp supports D={HEAD_DIM}, P={ROPE_DIM}, got D={call.head_dim}, P={call.rope_dim}"]
    reasons = _layout_reasons(call)
    config = choose_config(call.heads)
    if call.batch > MAX_GRID_YZ or cdiv(call.heads, config.block_h) > MAX_GRID_YZ:
        reasons.append(
            f"tilecpp launches (splits, H/{config.block_h}, B) programs: B and H/{config.block_h} must be <= 65535"
        )
    # Only a user split length can make many splits (the default plan fills about one wave).
    num_splits = cdiv(call.seq_len, call.kv_len_per_split) if call.kv_len_per_split else 1
    if num_splits > 1 and call.batch * call.heads * num_splits * HEAD_DIM > MAX_INT32:
        reasons.append(f"tilecpp's {num_splits} partial outputs per head are too many for int32 offsets")
    if reasons:
        return reasons
    arch = device_arch(call.device)
    kernels = [("split-KV", split_kv_kernel(call.q.dtype, config))]
    kernels += [("combine", combine_kernel(torch.float32, call.q.dtype, tile)) for tile in default_tiles()]
    for stage, kernel in kernels:
        if not kernel.available(arch):
            reasons.append(
                f"no cached cubin for the {call.q.dtype} {stage} kernel on {arch} and no Tile-capable nvcc "
                "(run `python -m tilegym precompile`)"
            )
    return reasons


def launch_split_kv(
    call: MLADecodeCall,
    kernel: TileCppKernel,
    config: TileConfig,
    plan: SplitPlan,
    partials: tuple[torch.Tensor, torch.Tensor] | None,
    lse: torch.Tensor | None,
) -> None:
    """Stage 1: fill ``partials`` (out [B,H,N,D] float32, lse [B,H,N]), or with one split (partials
    None) ``call.out`` and ``lse`` directly."""
    q, qpe, kv, kpe = call.q, call.qpe, call.kv, call.kpe
    partial_out, partial_lse = partials if partials is not None else (None, None)
    args = (
        q.data_ptr(),
        qpe.data_ptr(),
        kv.data_ptr(),
        kpe.data_ptr(),
        0 if call.kv_lens is None else call.kv_lens.data_ptr(),
        0 if partial_out is None else partial_out.data_ptr(),
        0 if partial_lse is None else partial_lse.data_ptr(),
        call.out.data_ptr(),
        0 if lse is None else lse.data_ptr(),
        call.heads,
        call.seq_len,
        plan.num_splits,
        min(plan.kv_len_per_split, call.seq_len),
        int(call.kv_lens is not None),
        int(lse is not None),
        q.stride(0),
        q.stride(1),
        qpe.stride(0),
        qpe.stride(1),
        kv.stride(0),
        kv.stride(1),
        kpe.stride(0),
        kpe.stride(1),
        call.sm_scale * LOG2E,
    )
    grid = (plan.num_splits, cdiv(call.heads, config.block_h), call.batch)
    kernel.launch(grid, args, torch.cuda.current_stream(call.device).cuda_stream, call.device.index)


def mla_decoding_split_kv(
    call: MLADecodeCall,
    *,
    config: TileConfig | None = None,
    kv_len_per_split: int | None = None,
    combine_tile: Tile | None = None,
) -> torch.Tensor | None:
    """Run the op; the keyword arguments override the defaults (benchmarks)."""
    config = config or choose_config(call.heads)
    kernel = split_kv_kernel(call.q.dtype, config)
    plan = split_plan(call, config, kv_len_per_split)
    batch, heads, device = call.batch, call.heads, call.device
    with on_device(device):
        lse = torch.empty((batch, heads), dtype=torch.float32, device=device) if call.return_lse else None
        if plan.num_splits == 1:
            launch_split_kv(call, kernel, config, plan, None, lse)
            return lse
        partial_out = torch.empty((batch, heads, plan.num_splits, HEAD_DIM), dtype=torch.float32, device=device)
        partial_lse = torch.empty((batch, heads, plan.num_splits), dtype=torch.float32, device=device)
        launch_split_kv(call, kernel, config, plan, (partial_out, partial_lse), None)
        launch_combine(partial_out, partial_lse, call.out, lse, tile=combine_tile)
    return lse
