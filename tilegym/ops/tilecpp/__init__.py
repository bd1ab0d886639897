"""Backend ``tilecpp``: CUDA Tile C++ kernels, registered for both ops.

Nothing here imports torch's CUDA state, cuda-bindings or the toolchain at import time: the
probe and the kernel modules are consulted only when an op or ``info`` asks. The registered
functions are named ``plan_*`` / ``run_*`` so they never shadow the kernel submodules.
"""

from __future__ import annotations

from typing import Any

from tilegym.backend import register_impl, register_probe
from tilegym.ops.mla_decoding import MLA_DECODING, SPLITK_REDUCE

NVIDIA = ("nvidia",)
MIN_CAPABILITY = (8, 0)


def probe() -> list[str]:
    """Why tilecpp cannot run on this machine at all (per-variant cubins are checked per call)."""
    import torch

    if not torch.cuda.is_available() or torch.version.hip:
        return ["needs an NVIDIA GPU (none visible to PyTorch)"]
    capability = torch.cuda.get_device_capability()
    if capability < MIN_CAPABILITY:
        return [f"needs an NVIDIA GPU of sm_80 or newer, found sm_{capability[0]}{capability[1]}"]
    try:
        import cuda.bindings.driver  # noqa: F401
    except ImportError as exc:
        return [f"needs cuda-python's driver bindings (pip install cuda-bindings): {exc}"]
    from tilegym.ops.cubin_loader import cache_dir, toolchain_problem

    arch = f"sm_{capability[0]}{capability[1]}"
    problem = toolchain_problem()
    if problem is not None and not any((cache_dir() / arch).glob("*.cubin")):
        return [f"no cached cubins for {arch} in {cache_dir()}, and {problem}"]
    return []


register_probe("tilecpp", probe)


def _mla_supports(call: Any) -> list[str]:
    from tilegym.ops.tilecpp.mla_decoding_split_kv import supports

    return supports(call)


@register_impl(MLA_DECODING.name, "tilecpp", vendors=NVIDIA, supports=_mla_supports)
def plan_mla_decoding_split_kv(call: Any) -> Any:
    from tilegym.ops.tilecpp.mla_decoding_split_kv import plan

    return plan(call)


def _splitk_supports(call: Any) -> list[str]:
    from tilegym.ops.tilecpp.splitk_reduce import splitk_reduce_supports

    return splitk_reduce_supports(call)


@register_impl(SPLITK_REDUCE.name, "tilecpp", vendors=NVIDIA, supports=_splitk_supports)
def run_splitk_reduce(call: Any) -> None:
    from tilegym.ops.tilecpp.splitk_reduce import splitk_reduce as run

    run(call)
