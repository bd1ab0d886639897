"""Launcher of the CuTe (sm_90a, wgmma) MLA decode over a split schedule, and its plan.

Stage 1 (``mla_decoding_split_kv.cuh``) launches (pieces, 64-row query groups) CTAs of 256 threads,
one wave of persistent CTAs each walking one piece of the schedule (``tilegym.ops.schedule``); a
segment that is a whole row writes the final output, the others float32 partials. Stage 2
(``mla_decoding_combine.cuh``, plain CUDA) merges the rows split over several segments and zeroes
empty rows. Variants: the dtype only (bf16, fp16); layout (dense, paged, ragged, any page size),
sizes, strides, lengths and the schedule are runtime arguments, so a new shape never compiles.
"""

from __future__ import annotations

import functools
import math

import torch

from tilegym.ops.contract import DENSE, RAGGED, MLADecodeCall
from tilegym.ops.cubin_loader import CudaKernel
from tilegym.ops.schedule import SplitSchedule, schedule_shape
from tilegym.utils import cdiv

HEADER = "mla_decoding_split_kv.cuh"
KERNEL = "mla_decode_cute_split_kernel"
COMBINE_HEADER = "mla_decoding_combine.cuh"
COMBINE_KERNEL = "mla_decode_cute_combine_kernel"
HEAD_DIM, ROPE_DIM = 512, 64  # fixed by the kernel's tile shapes
ROWS_PER_CTA = 64  # query rows per CTA (the wgmma M)
TOKENS_PER_BLOCK = 64  # KV tokens per step: the schedule's block
THREADS = 256  # two warpgroups
# Shared memory: Q (72 KB) + 2 stages of KV (144 KB) + P (8 KB) + 512 B of row statistics, in the
# kernel's SharedStorage (1 KB aligned), plus 1 KB so the kernel can align the dynamic buffer.
SHARED_BYTES = 64 * 576 * 2 * 3 + 64 * 64 * 2 + 1024 + 1024
COMBINE_THREADS = 128
MIN_QUERY_ROWS, MAX_QUERY_ROWS = 1, 128  # Q*H served (64-row groups; 16..128 is the intended range)
LOG2E = math.log2(math.e)  # the kernel's softmax works in base 2
C_TYPES = {torch.bfloat16: "__nv_bfloat16", torch.float16: "__half"}
MAX_INT32 = 2**31 - 1
MAX_GRID_Y = 65535
SPLIT_PARAMS = (*("int",) * 11, *("long long",) * 11, "float")


@functools.cache
def split_kernel(dtype: torch.dtype) -> CudaKernel:
    """The split kernel for ``dtype`` (bf16 or fp16) inputs."""
    ctype = C_TYPES[dtype]
    pointers = (*(f"const {ctype}*",) * 4, *("const int*",) * 6, f"{ctype}*", "float*", "float*", "float*")
    return CudaKernel(HEADER, KERNEL, (ctype,), (*pointers, *SPLIT_PARAMS))


@functools.cache
def combine_kernel(dtype: torch.dtype) -> CudaKernel:
    """The combine kernel writing ``dtype`` output."""
    pointers = ("const float*", "const float*", "const int*", "const int*", f"{C_TYPES[dtype]}*", "float*")
    return CudaKernel(COMBINE_HEADER, COMBINE_KERNEL, (C_TYPES[dtype],), (*pointers, "int", "int"))


def all_kernels() -> list[CudaKernel]:
    """Every kernel variant the backend may launch."""
    return [k for d in C_TYPES for k in (split_kernel(d), combine_kernel(d))]


def _arch_reasons(call: MLADecodeCall) -> list[str]:
    if call.device.type != "cuda" or torch.version.hip:
        return [f"cutlass runs on NVIDIA GPUs only, got a tensor on {call.device}"]
    index = call.device.index if call.device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    if (major, minor) != (9, 0):
        return [f"cutlass kernels are built for sm_90a (Hopper wgmma) only, got sm_{major}{minor}"]
    return []


def _layout_reasons(call: MLADecodeCall) -> list[str]:
    reasons = []
    for name in ("q", "qpe", "kv", "kpe"):
        t = getattr(call, name)
        if t.data_ptr() % 16 or any(s % 8 for s in t.stride()[:-1]):
            reasons.append(
                f"cutlass needs {name} rows on 16-byte boundaries (pointer aligned, strides multiples of 8 "
                f"elements), got strides {t.stride()}"
            )
    for name in ("q", "qpe"):
        t = getattr(call, name)
        if (call.q_len - 1) * t.stride(1) + (call.heads - 1) * t.stride(2) + t.shape[3] > MAX_INT32:
            reasons.append(f"cutlass needs one batch row of {name} to fit in int32 offsets")
    return reasons


def supports(call: MLADecodeCall) -> list[str]:
    """Why the CuTe kernels cannot run ``call`` (empty: they can)."""
    if call.is_fp8 or call.is_packed:
        return [f"cutlass does not implement the {call.kv_format} KV cache (bf16/fp16 only)"]
    if call.q.dtype not in C_TYPES or call.kv.dtype != call.q.dtype:
        return [f"cutlass supports bf16 and fp16 (the same for q and kv), got q {call.q.dtype}, kv {call.kv.dtype}"]
    if (call.head_dim, call.rope_dim) != (HEAD_DIM, ROPE_DIM):
        return [f"cutlass supports D={HEAD_DIM}, P={ROPE_DIM}, got D={call.head_dim}, P={call.rope_dim}"]
    if not MIN_QUERY_ROWS <= call.query_rows <= MAX_QUERY_ROWS:
        return [
            f"cutlass serves {MIN_QUERY_ROWS}..{MAX_QUERY_ROWS} query rows per KV read (new tokens x heads), "
            f"got {call.q_len} x {call.heads} = {call.query_rows}"
        ]
    if call.batch > MAX_GRID_Y:
        return [f"cutlass launches its combine with the batch on grid.y: at most {MAX_GRID_Y} rows, got {call.batch}"]
    reasons = _arch_reasons(call) + _layout_reasons(call)
    if reasons:
        return reasons
    for stage, kernel in (("split", split_kernel(call.q.dtype)), ("combine", combine_kernel(call.q.dtype))):
        if not kernel.available("sm_90a"):
            reasons.append(
                f"no cached cubin for the {call.q.dtype} {stage} kernel on sm_90a and no nvcc with the CUTLASS "
                "headers (run `python -m tilegym precompile --backend cutlass`)"
            )
    return reasons


class CutlassDecodePlan:
    """Schedule, workspace and pre-bound launches of both kernels for one call's shapes."""

    def __init__(self, call: MLADecodeCall) -> None:
        self.call = call
        groups = cdiv(call.query_rows, ROWS_PER_CTA)
        shape = schedule_shape(call, block_n=TOKENS_PER_BLOCK, programs_per_sm=1, head_groups=groups, min_blocks=1)
        self.schedule = s = SplitSchedule(call, shape)
        rows, device = call.query_rows, call.device
        self.part_out = torch.empty((shape.slots, rows, HEAD_DIM), dtype=torch.float32, device=device)
        self.part_lse = torch.empty((shape.slots, rows), dtype=torch.float32, device=device)
        self.device_index = device.index if device.index is not None else torch.cuda.current_device()
        table = call.block_table if call.block_table is not None else call.kv_indices
        self._split_schedule = (
            0 if table is None or table.numel() == 0 else table.data_ptr(),
            0 if call.kv_indptr is None else call.kv_indptr.data_ptr(),
            s.lens.data_ptr(),
            s.cum_blocks.data_ptr(),
            s.blocks_per_program.data_ptr(),
            s.piece_rows.data_ptr(),
        )
        self._split_sizes = (
            call.heads,
            call.q_len,
            rows,
            int(call.causal and call.q_len > 1),
            int(call.return_lse),
            int(call.layout != DENSE),
            call.page_size if call.is_paged else 1,
            call.num_pages if call.is_paged else 1,
            0 if call.kv_indices is None else call.kv_indices.numel(),
            int(call.layout == RAGGED),
            shape.programs,
            *call.q.stride()[:3],
            *call.qpe.stride()[:3],
            *call.kv.stride()[:2],
            *call.kpe.stride()[:2],
            0 if call.block_table is None else call.block_table.stride(0),
            call.sm_scale * LOG2E,
        )
        self._workspace = (self.part_out.data_ptr(), self.part_lse.data_ptr())
        self._combine_schedule = (*self._workspace, s.cum_blocks.data_ptr(), s.blocks_per_program.data_ptr())
        self._combine_sizes = (rows, int(call.return_lse))
        split, combine = split_kernel(call.q.dtype), combine_kernel(call.q.dtype)
        self._launch_split = split.bind(self.device_index, (shape.programs, groups, 1), (THREADS, 1, 1), SHARED_BYTES)
        self._launch_combine = combine.bind(self.device_index, (rows, call.batch, 1), (COMBINE_THREADS, 1, 1))

    def refresh(self) -> None:
        self.schedule.refresh()

    def run(
        self,
        q: torch.Tensor,
        qpe: torch.Tensor,
        kv: torch.Tensor,
        kpe: torch.Tensor,
        kv_scale: torch.Tensor | None,
        out: torch.Tensor,
        lse: torch.Tensor | None,
    ) -> None:
        """Both launches on the current stream: write ``out`` (and ``lse`` when given)."""
        stream = torch._C._cuda_getCurrentRawStream(self.device_index)
        out_ptr, lse_ptr = out.data_ptr(), 0 if lse is None else lse.data_ptr()
        split_args = (
            q.data_ptr(),
            qpe.data_ptr(),
            kv.data_ptr(),
            kpe.data_ptr(),
            *self._split_schedule,
            out_ptr,
            lse_ptr,
            *self._workspace,
            *self._split_sizes,
        )
        self._launch_split(split_args, stream)
        self._launch_combine((*self._combine_schedule, out_ptr, lse_ptr, *self._combine_sizes), stream)


def plan(call: MLADecodeCall) -> CutlassDecodePlan:
    """The cutlass backend's plan for ``call``."""
    return CutlassDecodePlan(call)
