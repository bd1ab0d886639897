"""Backend registry and selector: the only place that decides which backend runs a call.

Each implementation of an op is registered with ``register_impl(op, backend)`` together
with the device vendors it runs on and a ``supports(call)`` check returning the reasons it
cannot run the given inputs (empty list = it can). Each backend may also register a probe of
the environment (is its toolchain importable?), run lazily once and cached.

Selection, first match wins: ``backend=`` on the call, ``use_backend(...)`` (per context),
``set_backend(...)`` (process-wide), env ``TILEGYM_BACKEND``, then ``auto``: the vendor's
priority list, first backend that supports the inputs. A backend named explicitly never
falls back silently; in ``auto`` the error lists every backend with its reasons.

Backend packages are imported lazily, on the first query of the registry, and their
registration modules import no toolchain, so ``import tilegym`` stays cheap.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

BACKENDS: tuple[str, ...] = ("torch", "triton", "tilecpp", "aiter")
AUTO = "auto"
ENV_VAR = "TILEGYM_BACKEND"

# Vendor -> backends in the order ``auto`` tries them.
VENDOR_PRIORITY: dict[str, tuple[str, ...]] = {
    "nvidia": ("tilecpp", "triton", "torch"),
    "amd": ("aiter", "triton", "torch"),
    "cpu": ("torch",),
}

# Backend -> module whose import registers its implementations.
_BACKEND_MODULES: dict[str, str] = {
    "torch": "tilegym.ops.reference",
    "triton": "tilegym.ops.triton",
    "tilecpp": "tilegym.ops.tilecpp",
    "aiter": "tilegym.ops.aiter",
}


class BackendUnavailableError(NotImplementedError):
    """No backend (or not the one asked for) can run these inputs; the message says why."""


SupportsFn = Callable[[Any], list[str]]
VendorReasonsFn = Callable[[str], list[str]]
ProbeFn = Callable[[], list[str]]


@dataclass(frozen=True)
class Implementation:
    """One backend's implementation of one op."""

    op: str
    backend: str
    run: Callable[..., Any]
    vendors: tuple[str, ...]
    supports: SupportsFn
    vendor_reasons: VendorReasonsFn

    def reasons_for_vendor(self, vendor: str) -> list[str]:
        """Why this implementation cannot run on ``vendor`` devices here, whatever the inputs."""
        reasons = backend_unavailable_reasons(self.backend)
        if reasons:
            return reasons
        if vendor not in self.vendors:
            return [f"runs on {'/'.join(self.vendors)} devices, not on {vendor}"]
        return list(self.vendor_reasons(vendor))

    def reasons(self, call: Any) -> list[str]:
        """Why this implementation cannot run ``call`` (empty list: it can)."""
        return self.reasons_for_vendor(call.vendor) or list(self.supports(call))


_registry: dict[tuple[str, str], Implementation] = {}
_probes: dict[str, ProbeFn] = {}
_registry_lock = threading.RLock()
_loaded = False
_context_backend: contextvars.ContextVar[str | None] = contextvars.ContextVar("tilegym_backend", default=None)
_global_backend: str | None = None


def _no_reasons(_: Any) -> list[str]:
    return []


def register_impl(
    op: str,
    backend: str,
    *,
    vendors: Sequence[str],
    supports: SupportsFn | None = None,
    vendor_reasons: VendorReasonsFn | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering ``fn`` as ``backend``'s implementation of ``op``.

    ``vendors``: device vendors it runs on ("nvidia", "amd", "cpu"). ``supports(call)``
    returns the reasons it cannot run a validated call; ``vendor_reasons(vendor)`` the
    reasons it cannot run on a vendor's devices in this environment (e.g. Triton on a CPU
    without its interpreter), which ``backend_status`` reports without any inputs.
    Registering twice is an error.
    """
    _check_name(backend, allow_auto=False, source="backend")
    bad = [v for v in vendors if v not in VENDOR_PRIORITY]
    if bad or not vendors:
        raise ValueError(f"vendors must be a non-empty subset of {sorted(VENDOR_PRIORITY)}, got {vendors!r}")

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        with _registry_lock:
            if (op, backend) in _registry:
                raise ValueError(f"an implementation of op {op!r} for backend {backend!r} is already registered")
            _registry[(op, backend)] = Implementation(
                op, backend, fn, tuple(vendors), supports or _no_reasons, vendor_reasons or _no_reasons
            )
        return fn

    return decorator


def register_probe(backend: str, probe: ProbeFn) -> None:
    """Register ``backend``'s environment probe: reasons it cannot run here at all."""
    _check_name(backend, allow_auto=False, source="backend")
    with _registry_lock:
        if backend in _probes:
            raise ValueError(f"a probe for backend {backend!r} is already registered")
        _probes[backend] = probe


@functools.cache
def backend_unavailable_reasons(backend: str) -> list[str]:
    """Environment-level reasons ``backend`` cannot run on this machine (cached)."""
    _ensure_loaded()
    probe = _probes.get(backend)
    if probe is None:
        return []
    try:
        return list(probe())
    except Exception as exc:  # a probe must never take the process down
        return [f"probe failed: {type(exc).__name__}: {exc}"]


def _ensure_loaded() -> None:
    global _loaded
    if _loaded:
        return
    with _registry_lock:
        if _loaded:
            return
        for module in _BACKEND_MODULES.values():
            importlib.import_module(module)
        _loaded = True


def _check_name(name: Any, *, allow_auto: bool, source: str) -> str:
    valid = BACKENDS + ((AUTO,) if allow_auto else ())
    if not isinstance(name, str) or name not in valid:
        raise ValueError(f"{source}: unknown backend {name!r}; valid names are {', '.join(valid)}")
    return name


def set_backend(name: str | None) -> None:
    """Set the process-wide backend (``None`` or ``"auto"`` restores automatic choice)."""
    global _global_backend
    _global_backend = None if name is None else _check_name(name, allow_auto=True, source="set_backend")


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Use ``name`` for op calls inside the block (per thread / asyncio context)."""
    token = _context_backend.set(_check_name(name, allow_auto=True, source="use_backend"))
    try:
        yield
    finally:
        _context_backend.reset(token)


def requested_backend(explicit: str | None = None) -> tuple[str, str]:
    """The backend name in force and where it came from (kwarg, context, global, env, default)."""
    if explicit is not None:
        return _check_name(explicit, allow_auto=True, source="backend="), "backend="
    scoped = _context_backend.get()
    if scoped is not None:
        return scoped, "use_backend()"
    if _global_backend is not None:
        return _global_backend, "set_backend()"
    env = os.environ.get(ENV_VAR)
    if env:
        return _check_name(env.strip(), allow_auto=True, source=f"environment variable {ENV_VAR}"), ENV_VAR
    return AUTO, "default"


def device_vendor(device: torch.device) -> str:
    """'nvidia', 'amd' or 'cpu' (any non-GPU device counts as 'cpu' for selection)."""
    if device.type == "cuda":
        return "amd" if torch.version.hip else "nvidia"
    return "cpu"


def implementations(op: str) -> dict[str, Implementation]:
    """Backend name -> implementation registered for ``op``."""
    _ensure_loaded()
    with _registry_lock:
        return {b: impl for (o, b), impl in _registry.items() if o == op}


def registered_ops() -> list[str]:
    """Every op name that has at least one implementation."""
    _ensure_loaded()
    with _registry_lock:
        return sorted({o for o, _ in _registry})


def select(op: str, call: Any, backend: str | None = None) -> Implementation:
    """Pick the implementation that runs ``call`` (a validated op call with ``vendor``)."""
    name, source = requested_backend(backend)
    impls = implementations(op)
    if name != AUTO:
        impl = impls.get(name)
        if impl is None:
            raise BackendUnavailableError(
                f"{op}: backend {name!r} (from {source}) has no implementation of this op; "
                f"implemented by: {', '.join(sorted(impls))}"
            )
        reasons = impl.reasons(call)
        if reasons:
            raise BackendUnavailableError(
                f"{op}: backend {name!r} (from {source}) cannot run these inputs: {'; '.join(reasons)}"
            )
        return impl
    priority = VENDOR_PRIORITY.get(call.vendor, ("torch",))
    all_reasons: dict[str, list[str]] = {}
    for candidate in priority:
        impl = impls.get(candidate)
        if impl is None:
            all_reasons[candidate] = ["no implementation of this op"]
            continue
        reasons = impl.reasons(call)
        if not reasons:
            return impl
        all_reasons[candidate] = reasons
    for other in BACKENDS:
        if other not in all_reasons:
            all_reasons[other] = [f"not in the auto priority list for {call.vendor} devices"]
    detail = "\n".join(f"  {b}: {'; '.join(r)}" for b, r in all_reasons.items())
    raise BackendUnavailableError(f"{op}: no backend can run these inputs on {call.device}:\n{detail}")


def backend_status(op: str, vendor: str) -> dict[str, list[str]]:
    """Backend -> reasons it cannot run ``op`` on ``vendor`` devices here (empty: available)."""
    impls = implementations(op)
    status: dict[str, list[str]] = {}
    for name in BACKENDS:
        impl = impls.get(name)
        status[name] = ["no implementation of this op"] if impl is None else impl.reasons_for_vendor(vendor)
    return status
