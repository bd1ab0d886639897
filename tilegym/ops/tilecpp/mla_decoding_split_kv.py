"""Launcher of the Tile C++ MLA split-KV kernel (``mla_decoding_split_kv.cuh``) + its combine.

Stage 1 launches (splits, head groups, B) programs; each writes a float32 partial output and
lse per split. Stage 2 (``splitk_reduce.cuh``) merges the splits into ``call.out`` and the lse.
Variants: dtype (bf16, fp16) x heads per program (16, 32); sizes and strides are runtime
arguments, so a new shape never compiles anything.
"""

from __future__ import annotations

import functools
import math

import torch

from tilegym.ops.contract import MLADecodeCall
from tilegym.ops.split_plan import SplitPlan, plan_splits
from tilegym.ops.tilecpp.loader import TileCppKernel
from tilegym.ops.tilecpp.splitk_reduce import (
    C_TYPES,
    MAX_GRID_YZ,
    combine_kernel,
    device_arch,
    launch_combine,
    on_device,
)
from tilegym.utils import cdiv, multiprocessor_count

HEADER = "mla_decoding_split_kv.cuh"
KERNEL = "mla_split_kv_kernel"
HEAD_DIM, ROPE_DIM = 512, 64  # fixed by the kernel's tile shapes
BLOCK_N = 64  # KV tokens per step
BLOCK_H_CHOICES = (16, 32)  # heads per program
# One program uses ~190 KB of shared memory, so one fits per SM; two waves balance the tail.
PROGRAMS_PER_SM = 2
DTYPES = (torch.bfloat16, torch.float16)
MAX_INT32 = 2**31 - 1
PARAM_TYPES_AFTER_POINTERS = (*("int",) * 5, *("long long",) * 8, "float")


@functools.cache
def split_kv_kernel(dtype: torch.dtype, block_h: int) -> TileCppKernel:
    """The split-KV kernel for ``dtype`` inputs and ``block_h`` heads per program."""
    ctype = C_TYPES[dtype]
    params = (*(f"const {ctype}*",) * 4, "const int*", "float*", "float*", *PARAM_TYPES_AFTER_POINTERS)
    return TileCppKernel(HEADER, KERNEL, (ctype, block_h, BLOCK_N), params)


def all_kernels() -> list[TileCppKernel]:
    """Every split-KV variant the library may launch."""
    return [split_kv_kernel(dtype, block_h) for dtype in DTYPES for block_h in BLOCK_H_CHOICES]


def choose_block_h(heads: int) -> int:
    """Heads per program: 16 for up to 16 heads, else 32 (fewer re-reads of each KV tile)."""
    return 16 if heads <= 16 else 32


def split_plan(call: MLADecodeCall, block_h: int, programs_per_sm: int = PROGRAMS_PER_SM) -> SplitPlan:
    """The split count for this call (a user ``kv_len_per_split`` is honoured as is)."""
    programs_per_split = call.batch * cdiv(call.heads, block_h)
    return plan_splits(
        call.seq_len,
        programs_per_split,
        multiprocessor_count(call.device),
        kv_len_per_split=call.kv_len_per_split,
        block_n=BLOCK_N,
        programs_per_sm=programs_per_sm,
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
        if getattr(call, name).stride(1) * BLOCK_N > MAX_INT32:
            reasons.append(f"tilecpp needs {name}.stride(1) * {BLOCK_N} to fit in int32")
    return reasons


def supports(call: MLADecodeCall) -> list[str]:
    """Why the Tile C++ kernels cannot run ``call`` (empty: they can)."""
    if call.is_fp8:
        return ["tilecpp does not implement the fp8 KV cache (bf16/fp16 only)"]
    if (call.head_dim, call.rope_dim) != (HEAD_DIM, ROPE_DIM):
        return [f"tilecpp supports D={HEAD_DIM}, P={ROPE_DIM}, got D={call.head_dim}, P={call.rope_dim}"]
    reasons = _layout_reasons(call)
    block_h = choose_block_h(call.heads)
    if call.batch > MAX_GRID_YZ or cdiv(call.heads, block_h) > MAX_GRID_YZ:
        reasons.append(f"tilecpp launches (splits, H/{block_h}, B) programs: B and H/{block_h} must be <= 65535")
    if reasons:
        return reasons
    arch = device_arch(call.device)
    for stage, kernel in (
        ("split-KV", split_kv_kernel(call.q.dtype, block_h)),
        ("combine", combine_kernel(torch.float32, call.q.dtype)),
    ):
        if not kernel.available(arch):
            reasons.append(
                f"no cached cubin for the {call.q.dtype} {stage} kernel on {arch} and no Tile-capable nvcc "
                "(run `python -m tilegym precompile`)"
            )
    return reasons


def launch_split_kv(
    call: MLADecodeCall, block_h: int, plan: SplitPlan, partial_out: torch.Tensor, partial_lse: torch.Tensor
) -> None:
    """Stage 1: fill partial_out [B,H,N,D] float32 and partial_lse [B,H,N]."""
    q, qpe, kv, kpe = call.q, call.qpe, call.kv, call.kpe
    kv_len_per_split = min(plan.kv_len_per_split, call.seq_len)
    args = (
        q.data_ptr(),
        qpe.data_ptr(),
        kv.data_ptr(),
        kpe.data_ptr(),
        0 if call.kv_lens is None else call.kv_lens.data_ptr(),
        partial_out.data_ptr(),
        partial_lse.data_ptr(),
        call.heads,
        call.seq_len,
        plan.num_splits,
        kv_len_per_split,
        int(call.kv_lens is not None),
        q.stride(0),
        q.stride(1),
        qpe.stride(0),
        qpe.stride(1),
        kv.stride(0),
        kv.stride(1),
        kpe.stride(0),
        kpe.stride(1),
        call.sm_scale * math.log2(math.e),
    )
    grid = (plan.num_splits, cdiv(call.heads, block_h), call.batch)
    kernel = split_kv_kernel(q.dtype, block_h)
    kernel.launch(grid, args, torch.cuda.current_stream(call.device).cuda_stream, call.device.index)


def mla_decoding_split_kv(
    call: MLADecodeCall, *, block_h: int | None = None, programs_per_sm: int = PROGRAMS_PER_SM
) -> torch.Tensor | None:
    """Run both stages; ``block_h``/``programs_per_sm`` override the defaults (benchmarks)."""
    block_h = block_h or choose_block_h(call.heads)
    if block_h not in BLOCK_H_CHOICES:
        raise ValueError(f"block_h must be one of {BLOCK_H_CHOICES}, got {block_h}")
    plan = split_plan(call, block_h, programs_per_sm)
    batch, heads = call.batch, call.heads
    with on_device(call.device):
        partial_out = torch.empty((batch, heads, plan.num_splits, HEAD_DIM), dtype=torch.float32, device=call.device)
        partial_lse = torch.empty((batch, heads, plan.num_splits), dtype=torch.float32, device=call.device)
        lse = torch.empty((batch, heads), dtype=torch.float32, device=call.device) if call.return_lse else None
        launch_split_kv(call, block_h, plan, partial_out, partial_lse)
        launch_combine(partial_out, partial_lse, call.out, lse)
    return lse
