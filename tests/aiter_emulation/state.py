"""The emulated aiter's state (target GPU, call log) and the module objects it installs."""

from __future__ import annotations

import functools
import importlib.machinery
import types
from dataclasses import dataclass, field

import torch

from aiter_emulation import decode, metadata

ARCH_FP8 = {"gfx942": torch.float8_e4m3fnuz, "gfx950": torch.float8_e4m3fn}


@dataclass
class EmulatedAiter:
    """One emulated aiter: which GPU it pretends to be, and what it was asked to do."""

    arch: str = "gfx950"
    cu_num: int = 8  # a small GPU, so a few hundred tokens already split across CUs
    decode_calls: list[decode.DecodeRecord] = field(default_factory=list)
    metadata_builds: int = 0
    info_calls: int = 0
    last_schedule: list[list[int]] = field(default_factory=list)

    @property
    def fp8(self) -> torch.dtype:
        """aiter.dtypes.fp8 on this GPU."""
        return ARCH_FP8.get(self.arch, torch.float8_e4m3fnuz)

    def modules(self) -> dict[str, types.ModuleType]:
        """``aiter``, ``aiter.mla`` and ``aiter.dtypes`` as module objects bound to this state."""
        aiter = _module("aiter", is_package=True)
        mla = _module("aiter.mla")
        dtypes = _module("aiter.dtypes")
        aiter.__version__ = "emulated"
        aiter.get_mla_metadata_info_v1 = functools.partial(metadata.metadata_info, self)
        aiter.get_mla_metadata_v1 = functools.partial(metadata.build_metadata, self)
        mla.mla_decode_fwd = functools.partial(decode.mla_decode_fwd, self)
        dtypes.fp8, dtypes.bf16, dtypes.fp32, dtypes.i32 = self.fp8, torch.bfloat16, torch.float32, torch.int32
        aiter.mla, aiter.dtypes = mla, dtypes
        return {"aiter": aiter, "aiter.mla": mla, "aiter.dtypes": dtypes}


def _module(name: str, *, is_package: bool = False) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=is_package)
    if is_package:
        module.__path__ = []
    return module
