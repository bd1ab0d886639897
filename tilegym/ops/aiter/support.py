"""What the aiter backend needs from the machine and the inputs: probe, guarded import, reasons.

Facts come from aiter's MLA decode API as of v0.1.11-v0.1.12 (``docs/aiter_mla_api.md``):
the kernels take 576-wide rows (latent 512 + rope 64), one KV head, bf16 or fp8 queries,
and run on gfx942 (MI300X/MI325X) and gfx950 (MI350X/MI355X).

Importing aiter without ROCm raises ``RuntimeError``, and a half-present ROCm toolchain can
make its JIT build raise ``SystemExit``; the import is therefore attempted at most once,
only on a ROCm build of torch, guarded, and its outcome cached.

Test hooks: ``rocm_build`` and ``device_arch`` are looked up at call time, so tests replace
them (``tests/aiter_emulation``) to run the adapter on CPU tensors against an emulated
aiter; ``reset_aiter_import`` forgets the cached import.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from tilegym.ops.contract import MLADecodeCall
from tilegym.utils import DTYPE_SHORT_NAMES

SUPPORTED_ARCHS: dict[str, str] = {"gfx942": "MI300X/MI325X", "gfx950": "MI350X/MI355X"}
# The fp8 format each architecture's kernels read (aiter.dtypes.fp8 on that GPU).
ARCH_FP8: dict[str, torch.dtype] = {
    arch: getattr(torch, name)
    for arch, name in (("gfx942", "float8_e4m3fnuz"), ("gfx950", "float8_e4m3fn"))
    if hasattr(torch, name)
}
LATENT_DIM = 512  # kv_lora_rank: V and the first part of K
ROPE_DIM = 64
# (q, kv) dtype kind -> query heads per KV head with a decode kernel (q_len 1, persistent mode).
KERNEL_HEADS: dict[tuple[str, str], tuple[int, ...]] = {
    ("bf16", "bf16"): (16, 32, 64, 128),
    ("fp8", "fp8"): (16, 128),
}
# Parameters of mla_decode_fwd that older aiter releases (PyPI 0.1.7) lack.
REQUIRED_DECODE_PARAMS = ("page_size", "nhead_kv", "kv_last_page_lens", "work_meta_data", "q_scale", "kv_scale")
METADATA_FUNCTIONS = ("get_mla_metadata_info_v1", "get_mla_metadata_v1")


@dataclass(frozen=True)
class AiterAPI:
    """The aiter entry points the adapter calls."""

    mla_decode_fwd: Any
    get_mla_metadata_info_v1: Any
    get_mla_metadata_v1: Any


def rocm_build() -> bool:
    """True when torch is a ROCm build (test hook)."""
    return torch.version.hip is not None


@functools.cache
def _gcn_arch(device_index: int) -> str:
    return torch.cuda.get_device_properties(device_index).gcnArchName.split(":")[0]


def device_arch(device: torch.device) -> str | None:
    """The gfx name of a ROCm GPU (e.g. 'gfx942'); None for any other device (test hook)."""
    if device.type != "cuda" or not rocm_build():
        return None
    return _gcn_arch(device.index if device.index is not None else torch.cuda.current_device())


def _api_from(aiter: ModuleType, mla: ModuleType) -> AiterAPI:
    missing = [name for name in METADATA_FUNCTIONS if not hasattr(aiter, name)]
    decode = getattr(mla, "mla_decode_fwd", None)
    if decode is None:
        missing.append("mla.mla_decode_fwd")
    else:
        params = inspect.signature(decode).parameters
        missing += [f"mla_decode_fwd({p}=)" for p in REQUIRED_DECODE_PARAMS if p not in params]
    if missing:
        version = getattr(aiter, "__version__", "unknown version")
        raise ImportError(
            f"aiter ({version}) predates the MLA decode API this backend uses (missing: {', '.join(missing)}); "
            "build aiter from source (v0.1.11 or newer)"
        )
    return AiterAPI(decode, aiter.get_mla_metadata_info_v1, aiter.get_mla_metadata_v1)


@functools.cache
def _import_aiter() -> tuple[AiterAPI | None, str | None]:
    try:
        aiter = importlib.import_module("aiter")
        mla = importlib.import_module("aiter.mla")
        return _api_from(aiter, mla), None
    except (ImportError, RuntimeError, SystemExit, OSError) as exc:
        return None, f"aiter cannot be imported ({type(exc).__name__}: {exc})"


def reset_aiter_import() -> None:
    """Forget the cached import attempt (tests swap the ``aiter`` module)."""
    _import_aiter.cache_clear()


def aiter_api() -> AiterAPI:
    """aiter's entry points; raises RuntimeError with the reason when it cannot be imported."""
    api, error = _import_aiter()
    if api is None:
        raise RuntimeError(error)
    return api


def probe() -> list[str]:
    """Environment reasons the aiter backend cannot run here; cheap checks before the import."""
    if not rocm_build():
        return ["torch is not a ROCm build (torch.version.hip is None); aiter needs ROCm"]
    _, error = _import_aiter()
    return [error] if error else []


def kernel_dtypes(call: MLADecodeCall) -> tuple[str, str]:
    """(q, kv) dtype kinds of the aiter kernel serving ``call``: fp8 kv runs the a8w8 kernel."""
    return ("fp8", "fp8") if call.is_fp8 else (DTYPE_SHORT_NAMES[call.q.dtype], DTYPE_SHORT_NAMES[call.kv.dtype])


def _arch_reasons(call: MLADecodeCall) -> tuple[str | None, list[str]]:
    arch = device_arch(call.device)
    if arch in SUPPORTED_ARCHS:
        return arch, []
    wanted = ", ".join(f"{a} ({names})" for a, names in SUPPORTED_ARCHS.items())
    return arch, [f"aiter's MLA decode kernels need a {wanted} GPU, got {arch or call.device}"]


def _dtype_reasons(call: MLADecodeCall, arch: str | None) -> list[str]:
    if call.q.dtype != torch.bfloat16:
        return [f"aiter's MLA decode has bf16 and fp8 query kernels and writes bf16 output; q is {call.q.dtype}"]
    expected_fp8 = ARCH_FP8.get(arch) if arch else None
    if call.is_fp8 and expected_fp8 is not None and call.kv.dtype != expected_fp8:
        return [f"{arch} kernels read fp8 as {expected_fp8}, got kv in {call.kv.dtype}"]
    return []


def _shape_reasons(call: MLADecodeCall) -> list[str]:
    reasons = []
    if (call.head_dim, call.rope_dim) != (LATENT_DIM, ROPE_DIM):
        reasons.append(
            f"aiter's MLA kernels are built for D={LATENT_DIM}, P={ROPE_DIM} (576-wide rows), "
            f"got D={call.head_dim}, P={call.rope_dim}"
        )
    combo = kernel_dtypes(call)
    heads = KERNEL_HEADS.get(combo)
    if call.heads % 16:
        reasons.append(f"aiter's MLA decode needs a multiple of 16 query heads per KV head, got {call.heads}")
    elif heads is not None and call.heads not in heads:
        reasons.append(
            f"aiter has no {combo[0]}/{combo[1]} MLA decode kernel for {call.heads} heads "
            f"(heads must be one of {', '.join(map(str, heads))})"
        )
    return reasons


def _layout_reasons(call: MLADecodeCall) -> list[str]:
    from tilegym.ops.aiter.metadata import cache_reasons

    reasons = []
    if call.q_len > 1:
        reasons.append(
            f"the aiter adapter maps one new token per row; got Q = {call.q_len} (aiter's multi-token "
            "decode kernels are not mapped yet)"
        )
    return reasons + cache_reasons(call)


def mla_decode_reasons(call: MLADecodeCall) -> list[str]:
    """Why aiter's MLA decode cannot run ``call`` (one KV head always holds in tilegym's contract)."""
    arch, reasons = _arch_reasons(call)
    dtype_reasons = _dtype_reasons(call, arch)
    shape_reasons = _shape_reasons(call) if not dtype_reasons else []
    return reasons + dtype_reasons + shape_reasons + _layout_reasons(call)
