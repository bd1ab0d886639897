"""An emulated ``aiter`` for tests, and the switch that runs tilegym's aiter backend on it.

No AMD GPU is available to this project; this package stands in for aiter's MLA decode
API (``aiter.mla.mla_decode_fwd``, ``aiter.get_mla_metadata_info_v1``,
``aiter.get_mla_metadata_v1``, ``aiter.dtypes``) with its documented semantics and input
checks, in PyTorch on CPU tensors. Nothing outside the tests imports it.

- ``install_emulated_aiter(arch)``: puts the emulated modules into ``sys.modules`` for the
  block (restoring what was there after) and yields its ``EmulatedAiter`` state (call log,
  metadata build count).
- ``emulated_aiter_backend(arch)``: the above, plus what makes
  ``tilegym.ops.mla_decoding_split_kv(..., backend="aiter")`` run on CPU tensors: the
  adapter's hardware hooks (``support.rocm_build``, ``support.device_arch``) report a ROCm
  ``arch`` GPU, the registry entry also accepts the "cpu" vendor, and the probe cache starts
  empty. Everything is restored on exit. Used by the cross-backend parity
  suite as "aiter-emulation"; keep its name and behaviour stable. Not thread-safe.

Import it as ``from aiter_emulation import emulated_aiter_backend`` (pytest puts ``tests/``
on ``sys.path``; the package imports its own modules that way).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from aiter_emulation.state import EmulatedAiter

__all__ = ["EmulatedAiter", "emulated_aiter_backend", "install_emulated_aiter"]

_OP = "mla_decoding_split_kv"


@contextlib.contextmanager
def install_emulated_aiter(arch: str = "gfx950", cu_num: int = 8) -> Iterator[EmulatedAiter]:
    """Make ``import aiter`` return the emulation inside the block."""
    from tilegym.ops.aiter import support

    state = EmulatedAiter(arch=arch, cu_num=cu_num)
    modules = state.modules()
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    support.reset_aiter_import()
    try:
        yield state
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        support.reset_aiter_import()


@contextlib.contextmanager
def emulated_aiter_backend(arch: str = "gfx950", cu_num: int = 8) -> Iterator[EmulatedAiter]:
    """Run tilegym's aiter backend on CPU tensors against the emulated aiter (see module doc)."""
    from tilegym.backend import default_registry
    from tilegym.ops.aiter import support

    impl = default_registry.implementations(_OP)["aiter"]
    hooks = {"rocm_build": lambda: True, "device_arch": lambda device: arch}
    saved_hooks = {name: getattr(support, name) for name in hooks}
    with (
        install_emulated_aiter(arch, cu_num) as state,
        default_registry.override(_OP, "aiter", vendors=(*impl.vendors, "cpu")),
    ):
        for name, hook in hooks.items():
            setattr(support, name, hook)
        default_registry.clear_probe_cache()
        try:
            yield state
        finally:
            for name, hook in saved_hooks.items():
                setattr(support, name, hook)
            default_registry.clear_probe_cache()
