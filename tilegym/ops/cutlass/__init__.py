"""Backend ``cutlass``: CUDA C++ kernels written with CuTe for Hopper (sm_90a: wgmma), for MLA decoding.

Nothing here imports torch's CUDA state, cuda-bindings or the toolchain at import time: the probe
and the kernel module are consulted only when an op or ``info`` asks.
"""

from __future__ import annotations

from typing import Any

from tilegym.backend import register_impl, register_probe
from tilegym.ops.contract import FP8_DS_MLA
from tilegym.ops.mla_decoding import MLA_DECODING

NVIDIA = ("nvidia",)
ARCH = (9, 0)  # wgmma kernels: sm_90a only


def probe() -> list[str]:
    """Why the cutlass backend cannot run on this machine at all (per-variant cubins are checked per call)."""
    import torch

    if not torch.cuda.is_available() or torch.version.hip:
        return ["needs an NVIDIA GPU (none visible to PyTorch)"]
    capability = torch.cuda.get_device_capability()
    if capability != ARCH:
        return [f"needs a Hopper GPU (sm_90: its kernels use wgmma), found sm_{capability[0]}{capability[1]}"]
    try:
        import cuda.bindings.driver  # noqa: F401
    except ImportError as exc:
        return [f"needs cuda-python's driver bindings (pip install cuda-bindings): {exc}"]
    return []


register_probe("cutlass", probe)


def _mla_supports(call: Any) -> list[str]:
    from tilegym.ops.cutlass.mla_decoding_split_kv import supports

    return supports(call)


# fp8 caches at up to 32 query rows: scores by fp8 wgmma (mla_decoding_split_kv_fp8.cuh); more rows: the
# wgmma kernel's fp8 variants.
@register_impl(
    MLA_DECODING.name,
    "cutlass",
    vendors=NVIDIA,
    supports=_mla_supports,
    packed_kv_formats=(FP8_DS_MLA,),
    fp8_mma_scores=("fp8", FP8_DS_MLA),
)
def plan_mla_decoding_split_kv(call: Any) -> Any:
    from tilegym.ops.cutlass.mla_decoding_split_kv import plan

    return plan(call)


def all_kernels() -> list[Any]:
    """Every kernel variant this backend may launch (for ``python -m tilegym precompile``)."""
    from tilegym.ops.cutlass.mla_decoding_split_kv import all_kernels as kernels

    return kernels()
