"""Launching a planned Triton kernel with little host cost.

``kernel[grid](...)`` binds every argument, computes a specialisation key and looks up the
compiled kernel on each call: tens of microseconds of Python. A plan fixes the grid, the
constexprs and every integer argument, so ``KernelLauncher`` compiles through that normal
path once, keeps the compiled kernel, and afterwards calls its launcher directly (the
argument list Triton >= 3.3 passes it: grid, stream, function, metadata, hooks, then every
kernel argument in order, constexprs included).

What the compiled kernel was specialised on must still hold: the launcher is reused only
while the call's pointers keep the 16-byte alignment they had when it was compiled (the
plan's integers never change); any other call goes through Triton's normal path, which
compiles a new variant when needed. Launch hooks (``knobs.runtime.launch_enter_hook``,
profilers) are not called on the direct path.

Under Triton's CPU interpreter every launch takes the normal path, one at a time: the
interpreter patches module-level state while it runs and is not thread-safe.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch

_INTERPRETER_LOCK = threading.Lock()
ALIGNMENT = 16


def interpreting(device: torch.device) -> bool:
    """True when Triton kernels run in its CPU interpreter for tensors on ``device``."""
    return device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"


@contextlib.contextmanager
def interpreter_guard(device: torch.device) -> Iterator[None]:
    """Serialise launches on CPU tensors (the interpreter is not thread-safe); free elsewhere."""
    if device.type != "cpu":
        yield
        return
    with _INTERPRETER_LOCK:
        yield


def all_aligned(pointers: Sequence[int]) -> bool:
    """True when every address is a multiple of 16 bytes."""
    combined = 0
    for p in pointers:
        combined |= p
    return combined % ALIGNMENT == 0


class KernelLauncher:
    """One kernel with a fixed grid, constexprs and launch options; ``launch(*args)`` runs it.

    ``args`` are the kernel's runtime arguments in signature order (the constexprs must be
    the signature's last parameters). ``aligned`` tells whether the caller's per-call
    pointers are 16-byte aligned (the direct path is taken only when it matches what the
    compiled kernel assumed).
    """

    def __init__(
        self,
        kernel: Any,
        *,
        grid: tuple[int, int, int],
        constexprs: dict[str, Any],
        num_warps: int,
        num_stages: int,
    ) -> None:
        names = list(kernel.arg_names)
        tail = names[len(names) - len(constexprs) :]
        if tail != list(constexprs):
            raise ValueError(f"constexprs {list(constexprs)} must be the last parameters of {names}")
        self.kernel = kernel
        self.grid = grid
        self.constexprs = dict(constexprs)
        self.num_warps, self.num_stages = num_warps, num_stages
        self._constexpr_values = tuple(constexprs.values())
        self._options = {**constexprs, "num_warps": num_warps, "num_stages": num_stages}
        self._direct: tuple[Any, Any, Any] | None = None
        self._direct_needs_alignment = True
        self._device_index: int | None = None

    def __call__(self, *args: Any, aligned: bool = True) -> None:
        """Launch with tensors (Triton's normal path until the kernel is compiled, then direct)."""
        if self.ready(aligned):
            self.direct(args, torch._C._cuda_getCurrentRawStream(self._device_index))
            return
        self._launch_normally(args, aligned)

    def ready(self, aligned: bool) -> bool:
        """True when ``direct`` may launch calls whose pointers have this alignment."""
        return self._direct is not None and (aligned or not self._direct_needs_alignment)

    def direct(self, args: Sequence[Any], stream: int) -> None:
        """Launch through the compiled kernel's launcher. Pointers may be plain integers: the
        launcher then skips the driver query it makes for each tensor (the plan's fast path)."""
        run, function, metadata = self._direct
        g0, g1, g2 = self.grid
        run(g0, g1, g2, stream, function, metadata, None, None, None, *args, *self._constexpr_values)

    def _launch_normally(self, args: Sequence[Any], aligned: bool) -> None:
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        if device is not None and device.type == "cpu":
            with interpreter_guard(device):
                self.kernel[self.grid](*args, **self._options)
            return
        compiled = self.kernel[self.grid](*args, **self._options)
        if self._direct is None and compiled is not None and _has_direct_launcher(compiled):
            self._direct = (compiled.run, compiled.function, compiled.packed_metadata)
            self._direct_needs_alignment = aligned
            self._device_index = device.index if device is not None and device.index is not None else 0


def _has_direct_launcher(compiled: Any) -> bool:
    return all(hasattr(compiled, name) for name in ("run", "function", "packed_metadata"))
