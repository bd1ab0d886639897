"""Backend ``triton``: one Triton source for NVIDIA (CUDA) and AMD (ROCm) GPUs.

Registers ``mla_decoding_split_kv`` (its planner) and ``splitk_reduce``. Nothing here
imports triton: the kernel modules are imported inside the registered functions, on first
use. On CPU tensors the backend runs only in Triton's interpreter (``TRITON_INTERPRET=1``,
read when Triton's kernels are first defined), which is how CI executes it. The ROCm path
is untested on hardware.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import torch

from tilegym.backend import register_impl, register_probe
from tilegym.ops.contract import MXFP4, PACKED_KV_FORMATS, MLADecodeCall, SplitKReduceCall
from tilegym.ops.mla_decoding import MLA_DECODING, SPLITK_REDUCE

VENDORS = ("nvidia", "amd", "cpu")
HEAD_DIM_RANGE = (16, 512)  # latent width D: power of two; >= 16 for tl.dot, <= 512 for registers
ROPE_DIM_RANGE = (16, 128)  # rope width P: power of two; >= 16 for tl.dot
MAX_GRID_YZ = 65535  # CUDA/HIP limit of grid dims 1 and 2
FP8_MIN_NVIDIA_CAPABILITY = (8, 9)
KERNEL_MODULES = ("tilegym.ops.triton.mla_decoding_split_kv", "tilegym.ops.triton.splitk_reduce")


def _probe() -> list[str]:
    if importlib.util.find_spec("triton") is None:
        return ["the triton package is not installed (pip install triton)"]
    return []


def _kernels_compiled_for_gpu() -> bool:
    """True when a kernel module was imported without the interpreter (its kernels are GPU JIT functions)."""
    for name in KERNEL_MODULES:
        module = sys.modules.get(name)
        if module is not None:
            kernel = next((v for k, v in vars(module).items() if k.endswith("_kernel")), None)
            if kernel is not None and type(kernel).__name__ == "JITFunction":
                return True
    return False


def _interpreter_reasons(vendor: str) -> list[str]:
    if vendor != "cpu":
        return []
    if os.environ.get("TRITON_INTERPRET") != "1":
        return [
            "CPU tensors run only in Triton's interpreter: set TRITON_INTERPRET=1 in the environment before "
            "the first Triton call (`python -m tilegym demo` and `make demo` set it themselves)"
        ]
    if _kernels_compiled_for_gpu():
        return [
            "TRITON_INTERPRET=1 was set after tilegym's Triton kernels were defined, so they are GPU kernels "
            "(Triton would report '0 active drivers'): set it before the first Triton call, e.g. in the "
            "environment of the process"
        ]
    return []


def _is_power_of_two_in(value: int, bounds: tuple[int, int]) -> bool:
    return bounds[0] <= value <= bounds[1] and value & (value - 1) == 0


def _fp8_reasons(call: MLADecodeCall) -> list[str]:
    name = str(call.kv.dtype).removeprefix("torch.")
    if name == "float8_e4m3fnuz" and call.vendor == "nvidia":
        return ["float8_e4m3fnuz is an AMD format; NVIDIA GPUs take float8_e4m3fn"]
    if call.vendor == "nvidia":
        capability = torch.cuda.get_device_capability(call.device)
        if capability < FP8_MIN_NVIDIA_CAPABILITY:
            return [
                f"the {call.kv_format} cache needs fp8 conversions (compute capability >= 8.9), "
                f"this GPU has {capability[0]}.{capability[1]}"
            ]
    return []


def mla_supports(call: MLADecodeCall) -> list[str]:
    """Reasons the Triton kernel cannot run this call (empty: it can)."""
    reasons = []
    if not _is_power_of_two_in(call.head_dim, HEAD_DIM_RANGE):
        reasons.append(
            f"head dim D={call.head_dim} is not supported: it must be a power of two in "
            f"[{HEAD_DIM_RANGE[0]}, {HEAD_DIM_RANGE[1]}] (tile widths are powers of two; a program "
            "keeps a [query rows, D] float32 accumulator in registers)"
        )
    if not _is_power_of_two_in(call.rope_dim, ROPE_DIM_RANGE):
        reasons.append(
            f"rope dim P={call.rope_dim} is not supported: it must be a power of two in "
            f"[{ROPE_DIM_RANGE[0]}, {ROPE_DIM_RANGE[1]}]"
        )
    if call.query_rows > MAX_GRID_YZ * 64:
        reasons.append(f"Q x H = {call.query_rows} query rows exceed the grid limit {MAX_GRID_YZ} x 64")
    if call.is_fp8 or call.is_packed:  # the packed formats read fp8 values or round the query to fp8
        reasons.extend(_fp8_reasons(call))
    return reasons


@register_impl(
    MLA_DECODING.name,
    "triton",
    vendors=VENDORS,
    supports=mla_supports,
    vendor_reasons=_interpreter_reasons,
    quantizes_query=(MXFP4,),
    packed_kv_formats=PACKED_KV_FORMATS,
)
def plan_mla_decoding_split_kv(call: MLADecodeCall) -> object:
    from tilegym.ops.triton.mla_decoding_split_kv import plan

    return plan(call)


@register_impl(SPLITK_REDUCE.name, "triton", vendors=VENDORS, vendor_reasons=_interpreter_reasons)
def splitk_reduce(call: SplitKReduceCall) -> None:
    from tilegym.ops.triton.splitk_reduce import splitk_reduce_into

    splitk_reduce_into(call.partial_out, call.partial_lse, call.out)


register_probe("triton", _probe)
