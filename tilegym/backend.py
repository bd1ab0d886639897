"""Backend registry and selector: the only place that decides which backend runs a call.

Backends are declared (``BackendSpec``: name, registration module, ``auto`` priority per
vendor or arch); the built-in ones are ``BUILTIN_BACKENDS``, third-party packages declare
theirs through the entry-point group ``tilegym.backends``. Each implementation of an op is
registered with ``register_impl(op, backend)`` together with the device vendors it runs on
and a ``supports(call)`` check returning the reasons it cannot run the given inputs (empty
list = it can). A backend may also register a probe of the environment, run once and cached.

Selection, first match wins: ``backend=`` on the call, ``use_backend(...)`` (per context),
``set_backend(...)`` (process-wide), env ``TILEGYM_BACKEND``, then ``auto``: the backends
measured fastest for the call's regime on this arch (``tilegym.selection``), then the
vendor priority list; the first that supports the inputs runs. A backend named explicitly
never falls back silently; in ``auto`` the error lists every backend with its reasons.

Registration modules and entry points load lazily, on the first query of a registry (never
at ``import tilegym``), each at most once; one that fails to load makes its backend
unavailable with the error as the reason, and breaks nothing else. A package declares a
backend with an entry point named after it::

    [project.entry-points."tilegym.backends"]
    mybackend = "mypkg.tilegym_backend:register"

where ``register(registry)`` calls ``registry.register_backend("mybackend", priority={"nvidia": 25})``
and ``registry.register_impl(...)``. An entry point may name a module instead: importing it
runs its module-level ``register_backend``/``register_impl`` calls against the loading registry.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType, ModuleType
from typing import Any

import torch

from tilegym import selection

AUTO = "auto"
ENV_VAR = "TILEGYM_BACKEND"
ENTRY_POINT_GROUP = "tilegym.backends"
VENDORS: tuple[str, ...] = ("nvidia", "amd", "cpu")
_ARCH_KEY = re.compile(r"^(sm_\d+[a-z]?|gfx[0-9a-z]+)$")


class BackendUnavailableError(NotImplementedError):
    """No backend (or not the one asked for) can run these inputs; the message says why."""


SupportsFn = Callable[[Any], list[str]]
VendorReasonsFn = Callable[[str], list[str]]
ProbeFn = Callable[[], list[str]]


@dataclass(frozen=True)
class BackendSpec:
    """A declared backend.

    ``module``: imported on the registry's first query; its import registers the
    implementations. ``optional``: import it only if it exists (``find_spec``).
    ``priority``: vendor ("nvidia", "amd", "cpu") or arch ("sm_90", "gfx942") -> rank in
    ``auto``'s fallback order, larger first (an arch key beats its vendor's); a backend with
    no rank for a device is tried there only when a selection table ranks it.
    """

    name: str
    module: str | None = None
    priority: Mapping[str, int] = field(default_factory=dict)
    optional: bool = False
    description: str = ""

    def rank(self, vendor: str, arch: str | None = None) -> int | None:
        if arch is not None and arch in self.priority:
            return self.priority[arch]
        return self.priority.get(vendor)


BUILTIN_BACKENDS: tuple[BackendSpec, ...] = (
    BackendSpec("torch", "tilegym.ops.reference", {"nvidia": 10, "amd": 10, "cpu": 10}, description="PyTorch"),
    BackendSpec("triton", "tilegym.ops.triton", {"nvidia": 20, "amd": 20}, description="Triton"),
    BackendSpec("tilecpp", "tilegym.ops.tilecpp", {"nvidia": 30}, description="CUDA Tile C++"),
    BackendSpec("aiter", "tilegym.ops.aiter", {"amd": 30}, description="AMD aiter"),
    BackendSpec("cutlass", "tilegym.ops.cutlass", {}, optional=True, description="CuTe C++ (Hopper)"),
)


@dataclass(frozen=True)
class Implementation:
    """One backend's implementation of one op."""

    op: str
    backend: str
    run: Callable[..., Any]
    vendors: tuple[str, ...]
    supports: SupportsFn
    vendor_reasons: VendorReasonsFn
    registry: Registry | None = field(default=None, repr=False, compare=False)
    # Cache formats (short dtype names, e.g. "fp8") for which the implementation also rounds the
    # query to that format: its declared accuracy is the format's query-quantised tolerance.
    quantizes_query: frozenset[str] = frozenset()
    # Cache formats for which it computes scores with the fp8 tensor-core MMA, whose accumulator keeps
    # fewer bits than float32: its declared lse tolerance gains a term relative to |lse|.
    fp8_mma_scores: frozenset[str] = frozenset()
    # Packed cache formats (``kv_cache_format``, e.g. "fp8_ds_mla") it reads; every implementation
    # reads the plain ones its dtypes allow.
    packed_kv_formats: frozenset[str] = frozenset()

    def reasons_for_vendor(self, vendor: str) -> list[str]:
        """Why this implementation cannot run on ``vendor`` devices here, whatever the inputs."""
        reasons = (self.registry or default_registry).unavailable_reasons(self.backend)
        if reasons:
            return reasons
        if vendor not in self.vendors:
            return [f"runs on {'/'.join(self.vendors)} devices, not on {vendor}"]
        return list(self.vendor_reasons(vendor))

    def reasons(self, call: Any) -> list[str]:
        """Why this implementation cannot run ``call`` (empty list: it can)."""
        if getattr(call, "is_packed", False) and call.kv_format not in self.packed_kv_formats:
            readable = ", ".join(sorted(self.packed_kv_formats)) or "none"
            return [f"does not read the {call.kv_format} cache format (packed formats it reads: {readable})"]
        return self.reasons_for_vendor(call.vendor) or list(self.supports(call))


def _no_reasons(_: Any) -> list[str]:
    return []


_loading: contextvars.ContextVar[Registry | None] = contextvars.ContextVar("tilegym_registry_loading", default=None)
_context_backend: contextvars.ContextVar[str | None] = contextvars.ContextVar("tilegym_backend", default=None)
_global_backend: str | None = None


class Registry:
    """Declared backends, their implementations and probes, and the selector over them.

    ``backends``: the specs declared up front (default: the built-in ones). ``entry_point_group``:
    where third-party backends are discovered (None: nowhere). ``tables``: the selection tables
    ``auto`` consults (default: the package's).
    """

    def __init__(
        self,
        backends: Iterable[BackendSpec] = BUILTIN_BACKENDS,
        *,
        entry_point_group: str | None = ENTRY_POINT_GROUP,
        tables: selection.TableStore | None = None,
    ) -> None:
        self.tables = tables if tables is not None else selection.TableStore()
        self._group = entry_point_group
        self._lock = threading.RLock()
        self._specs: dict[str, BackendSpec] = {}
        self._impls: dict[tuple[str, str], Implementation] = {}
        self._probes: dict[str, ProbeFn] = {}
        self._probe_cache: dict[str, list[str]] = {}
        self._priority_cache: dict[tuple[str, str | None], tuple[str, ...]] = {}
        self._problems: dict[str, list[str]] = {}
        self._modules_loaded: set[str] = set()
        self._entry_points_scanned = False
        self._loaded = False
        self._loading_now = False
        self._modules_pending = False
        for spec in backends:
            self._declare(spec)

    # --- declaring ------------------------------------------------------------------------------

    def register_backend(
        self,
        name: str,
        *,
        module: str | None = None,
        priority: Mapping[str, int] | None = None,
        optional: bool = False,
        description: str = "",
    ) -> BackendSpec:
        """Declare a backend (see ``BackendSpec``); declaring a name twice is an error."""
        return self._declare(BackendSpec(name, module, dict(priority or {}), optional, description))

    def _declare(self, spec: BackendSpec) -> BackendSpec:
        if not isinstance(spec.name, str) or not spec.name.isidentifier() or spec.name == AUTO:
            raise ValueError(f"backend name must be an identifier other than {AUTO!r}, got {spec.name!r}")
        bad = {k: v for k, v in spec.priority.items() if not (k in VENDORS or _ARCH_KEY.match(k))}
        if bad or not all(isinstance(v, int) for v in spec.priority.values()):
            raise ValueError(f"backend {spec.name!r}: priority keys are {VENDORS} or arch names, values ints")
        spec = dataclasses.replace(spec, priority=MappingProxyType(dict(spec.priority)))
        with self._lock:
            if spec.name in self._specs:
                raise ValueError(f"backend {spec.name!r} is already declared")
            self._specs[spec.name] = spec
            self._priority_cache.clear()
            if spec.module is not None:
                self._loaded = False
                self._modules_pending = True
        return spec

    def register_impl(
        self,
        op: str,
        backend: str,
        *,
        vendors: Sequence[str],
        supports: SupportsFn | None = None,
        vendor_reasons: VendorReasonsFn | None = None,
        quantizes_query: Sequence[str] = (),
        packed_kv_formats: Sequence[str] = (),
        fp8_mma_scores: Sequence[str] = (),
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator registering ``fn`` as ``backend``'s implementation of ``op``.

        ``vendors``: device vendors it runs on ("nvidia", "amd", "cpu"). ``supports(call)``
        returns the reasons it cannot run a validated call; ``vendor_reasons(vendor)`` the
        reasons it cannot run on a vendor's devices in this environment (e.g. Triton on a CPU
        without its interpreter), which ``backend_status`` reports without any inputs.
        ``quantizes_query``: cache formats for which it also rounds the query (its declared
        accuracy, see ``tilegym.ops.accuracy``). ``packed_kv_formats``: the packed cache formats it
        reads (calls in any other are refused with a reason). ``fp8_mma_scores``: cache formats for
        which it computes the scores with fp8 MMA (a looser lse, same module). The backend must be declared;
        registering twice is an error.
        """
        self._check_declared(backend)
        bad = [v for v in vendors if v not in VENDORS]
        if bad or not vendors:
            raise ValueError(f"vendors must be a non-empty subset of {sorted(VENDORS)}, got {vendors!r}")

        def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
            impl = Implementation(
                op,
                backend,
                fn,
                tuple(vendors),
                supports or _no_reasons,
                vendor_reasons or _no_reasons,
                self,
                quantizes_query=frozenset(quantizes_query),
                fp8_mma_scores=frozenset(fp8_mma_scores),
                packed_kv_formats=frozenset(packed_kv_formats),
            )
            with self._lock:
                if (op, backend) in self._impls:
                    raise ValueError(f"an implementation of op {op!r} for backend {backend!r} is already registered")
                self._impls[(op, backend)] = impl
            return fn

        return decorator

    def register_probe(self, backend: str, probe: ProbeFn) -> None:
        """Register ``backend``'s environment probe: reasons it cannot run here at all."""
        self._check_declared(backend)
        with self._lock:
            if backend in self._probes:
                raise ValueError(f"a probe for backend {backend!r} is already registered")
            self._probes[backend] = probe

    def _check_declared(self, backend: Any) -> None:
        if backend not in self._specs:
            self._ensure_loaded()
        if backend not in self._specs:
            raise ValueError(f"backend: unknown backend {backend!r}; valid names are {', '.join(self._specs)}")

    # --- loading --------------------------------------------------------------------------------

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        with self._lock:
            if self._loaded or self._loading_now:
                return
            self._loading_now = True
            token = _loading.set(self)
            try:
                self._load_pending_modules()
                self._load_entry_points()
                self._load_pending_modules()
                self._loaded = True
            finally:
                _loading.reset(token)
                self._loading_now = False

    def _load_pending_modules(self) -> None:
        while self._modules_pending:
            self._modules_pending = False
            for spec in list(self._specs.values()):
                self._load_module(spec)

    def _load_module(self, spec: BackendSpec) -> None:
        if spec.module is None or spec.name in self._modules_loaded:
            return
        self._modules_loaded.add(spec.name)
        try:
            if spec.optional and importlib.util.find_spec(spec.module) is None:
                self._problems[spec.name] = [f"not part of this installation (no module {spec.module})"]
                return
            importlib.import_module(spec.module)
        except Exception as exc:
            self._problems[spec.name] = [f"module {spec.module} failed to load: {type(exc).__name__}: {exc}"]

    def _load_entry_points(self) -> None:
        if self._group is None or self._entry_points_scanned:
            return
        self._entry_points_scanned = True
        found = {(ep.name, ep.value): ep for ep in importlib.metadata.entry_points(group=self._group)}
        for key in sorted(found):
            self._load_entry_point(found[key])

    def _load_entry_point(self, ep: importlib.metadata.EntryPoint) -> None:
        before = set(self._specs)
        try:
            target = ep.load()
            if callable(target) and not isinstance(target, ModuleType):
                target(self)
        except Exception as exc:
            reason = f"entry point {ep.name} = {ep.value} failed to load: {type(exc).__name__}: {exc}"
            declared = [name for name in self._specs if name not in before]
            if not declared and ep.name not in self._specs and ep.name.isidentifier() and ep.name != AUTO:
                self._declare(BackendSpec(ep.name, description=f"entry point {ep.value}"))
                declared = [ep.name]
            for name in declared:
                self._problems.setdefault(name, []).append(reason)

    # --- queries --------------------------------------------------------------------------------

    def backend_names(self) -> list[str]:
        """Declared backends: built-in ones in declaration order, then entry points' by name."""
        self._ensure_loaded()
        with self._lock:
            return list(self._specs)

    def spec(self, backend: str) -> BackendSpec:
        """The declaration of ``backend`` (``ValueError`` if unknown)."""
        return self._specs[self.check_name(backend, allow_auto=False, source="backend")]

    def check_name(self, name: Any, *, allow_auto: bool, source: str) -> str:
        """``name`` if it is a declared backend (or "auto"), else ``ValueError`` listing the valid ones."""
        if isinstance(name, str) and (name in self._specs or (allow_auto and name == AUTO)):
            return name
        valid = self.backend_names() + ([AUTO] if allow_auto else [])
        if not isinstance(name, str) or name not in valid:
            raise ValueError(f"{source}: unknown backend {name!r}; valid names are {', '.join(valid)}")
        return name

    def implementations(self, op: str) -> dict[str, Implementation]:
        """Backend name -> implementation registered for ``op``."""
        self._ensure_loaded()
        with self._lock:
            return {b: impl for (o, b), impl in self._impls.items() if o == op}

    def registered_ops(self) -> list[str]:
        """Every op name that has at least one implementation."""
        self._ensure_loaded()
        with self._lock:
            return sorted({o for o, _ in self._impls})

    def missing_reasons(self, backend: str) -> list[str]:
        """Why ``backend`` has no implementations here: its module or entry point failed to load,
        or it is not part of this installation; else ``["no implementation of this op"]``."""
        self._ensure_loaded()
        with self._lock:
            return list(self._problems.get(backend, ["no implementation of this op"]))

    def unavailable_reasons(self, backend: str) -> list[str]:
        """Why ``backend`` cannot run on this machine at all: load errors, else its probe (cached)."""
        self._ensure_loaded()
        with self._lock:
            if backend in self._problems:
                return list(self._problems[backend])
            if backend in self._probe_cache:
                return list(self._probe_cache[backend])
            probe = self._probes.get(backend)
        reasons = [] if probe is None else _run_probe(probe)
        with self._lock:
            return list(self._probe_cache.setdefault(backend, reasons))

    def clear_probe_cache(self) -> None:
        """Forget cached probe results (the next query runs the probes again)."""
        with self._lock:
            self._probe_cache.clear()

    def vendor_priority(self, vendor: str, arch: str | None = None) -> tuple[str, ...]:
        """Backends ``auto`` falls back to on ``vendor`` (``arch``) devices, by declared rank."""
        self._ensure_loaded()
        with self._lock:
            cached = self._priority_cache.get((vendor, arch))
            if cached is None:
                specs = enumerate(self._specs.values())
                ranked = sorted((-r, i, s.name) for i, s in specs if (r := s.rank(vendor, arch)) is not None)
                cached = self._priority_cache[(vendor, arch)] = tuple(name for *_, name in ranked)
            return cached

    def backend_status(self, op: str, vendor: str) -> dict[str, list[str]]:
        """Backend -> reasons it cannot run ``op`` on ``vendor`` devices here (empty: available)."""
        impls = self.implementations(op)
        status: dict[str, list[str]] = {}
        for name in self.backend_names():
            impl = impls.get(name)
            status[name] = self.missing_reasons(name) if impl is None else impl.reasons_for_vendor(vendor)
        return status

    # --- selecting ------------------------------------------------------------------------------

    def requested_backend(self, explicit: str | None = None) -> tuple[str, str]:
        """The backend name in force and where it came from (kwarg, context, global, env, default)."""
        if explicit is not None:
            return self.check_name(explicit, allow_auto=True, source="backend="), "backend="
        scoped = _context_backend.get()
        if scoped is not None:
            return self.check_name(scoped, allow_auto=True, source="use_backend()"), "use_backend()"
        if _global_backend is not None:
            return self.check_name(_global_backend, allow_auto=True, source="set_backend()"), "set_backend()"
        env = os.environ.get(ENV_VAR)
        if env:
            return self.check_name(env.strip(), allow_auto=True, source=f"environment variable {ENV_VAR}"), ENV_VAR
        return AUTO, "default"

    def plan(self, op: str, call: Any, arch: str | None = None) -> selection.Plan:
        """The order ``auto`` tries backends in for ``call`` (``arch``: default the call's device's)."""
        if arch is None:
            arch = "cpu" if call.vendor == "cpu" else selection.device_arch(call.device)
        return selection.make_plan(op, call, arch, self.vendor_priority(call.vendor, arch), self.tables)

    def select(self, op: str, call: Any, backend: str | None = None) -> Implementation:
        """Pick the implementation that runs ``call`` (a validated op call with ``vendor``)."""
        name, source = self.requested_backend(backend)
        impls = self.implementations(op)
        if name != AUTO:
            return self._explicit(op, call, name, source, impls)
        plan = self.plan(op, call)
        all_reasons: dict[str, list[str]] = {}
        for candidate in plan.order:
            impl = impls.get(candidate)
            reasons = impl.reasons(call) if impl else self.missing_reasons(candidate)
            if not reasons:
                return impl
            all_reasons[candidate] = reasons
        for other in self.backend_names():
            if other not in all_reasons:
                all_reasons[other] = self._problems.get(other) or [f"not in the auto order on {plan.arch}"]
        detail = "\n".join(f"  {b}: {'; '.join(r)}" for b, r in all_reasons.items())
        raise BackendUnavailableError(
            f"{op}: no backend can run these inputs on {call.device} (order: {plan.basis}):\n{detail}"
        )

    def _explicit(
        self, op: str, call: Any, name: str, source: str, impls: Mapping[str, Implementation]
    ) -> Implementation:
        impl = impls.get(name)
        if impl is None:
            raise BackendUnavailableError(
                f"{op}: backend {name!r} (from {source}): {'; '.join(self.missing_reasons(name))}; "
                f"implemented by: {', '.join(sorted(impls))}"
            )
        reasons = impl.reasons(call)
        if reasons:
            raise BackendUnavailableError(
                f"{op}: backend {name!r} (from {source}) cannot run these inputs: {'; '.join(reasons)}"
            )
        return impl

    # --- overriding (tests, emulations) --------------------------------------------------------

    @contextlib.contextmanager
    def override(self, op: str, backend: str, **changes: Any) -> Iterator[Implementation]:
        """Replace fields (``run``, ``vendors``, ``supports``, ...) of a registered implementation
        inside the block, or register one (``run`` and ``vendors`` needed); restored on exit."""
        self._check_declared(backend)
        key = (op, backend)
        with self._lock:
            before = self.implementations(op).get(backend)
            if before is None and not {"run", "vendors"} <= changes.keys():
                raise ValueError(f"{backend!r} has no implementation of {op!r} to override: pass run= and vendors=")
            base = before or Implementation(op, backend, changes["run"], (), _no_reasons, _no_reasons, self)
            if "vendors" in changes:
                changes["vendors"] = tuple(changes["vendors"])
            replaced = dataclasses.replace(base, **changes)
            self._impls[key] = replaced
        try:
            yield replaced
        finally:
            with self._lock:
                if before is None:
                    self._impls.pop(key, None)
                else:
                    self._impls[key] = before


def _run_probe(probe: ProbeFn) -> list[str]:
    try:
        return list(probe())
    except Exception as exc:  # a probe must never take the process down
        return [f"probe failed: {type(exc).__name__}: {exc}"]


default_registry = Registry()


def _current() -> Registry:
    """The registry module-level registration goes to: the one loading modules now, else the default."""
    return _loading.get() or default_registry


# --- module-level API (the default registry) ----------------------------------------------------


def register_backend(
    name: str,
    *,
    module: str | None = None,
    priority: Mapping[str, int] | None = None,
    optional: bool = False,
    description: str = "",
) -> BackendSpec:
    """Declare a backend (see ``BackendSpec``) in the registry being loaded (else the default)."""
    return _current().register_backend(
        name, module=module, priority=priority, optional=optional, description=description
    )


def register_impl(
    op: str,
    backend: str,
    *,
    vendors: Sequence[str],
    supports: SupportsFn | None = None,
    vendor_reasons: VendorReasonsFn | None = None,
    quantizes_query: Sequence[str] = (),
    packed_kv_formats: Sequence[str] = (),
    fp8_mma_scores: Sequence[str] = (),
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering ``backend``'s implementation of ``op`` (see ``Registry.register_impl``)."""
    return _current().register_impl(
        op,
        backend,
        vendors=vendors,
        supports=supports,
        vendor_reasons=vendor_reasons,
        quantizes_query=quantizes_query,
        packed_kv_formats=packed_kv_formats,
        fp8_mma_scores=fp8_mma_scores,
    )


def register_probe(backend: str, probe: ProbeFn) -> None:
    """Register ``backend``'s environment probe: reasons it cannot run here at all."""
    _current().register_probe(backend, probe)


def backend_names() -> list[str]:
    """Every declared backend name, in a stable order."""
    return default_registry.backend_names()


def backend_unavailable_reasons(backend: str) -> list[str]:
    """Environment-level reasons ``backend`` cannot run on this machine (cached)."""
    return default_registry.unavailable_reasons(backend)


backend_unavailable_reasons.cache_clear = default_registry.clear_probe_cache  # type: ignore[attr-defined]


def implementations(op: str) -> dict[str, Implementation]:
    """Backend name -> implementation registered for ``op``."""
    return default_registry.implementations(op)


def registered_ops() -> list[str]:
    """Every op name that has at least one implementation."""
    return default_registry.registered_ops()


def vendor_priority(vendor: str, arch: str | None = None) -> tuple[str, ...]:
    """Backends ``auto`` falls back to on ``vendor`` devices, in order."""
    return default_registry.vendor_priority(vendor, arch)


def select(op: str, call: Any, backend: str | None = None) -> Implementation:
    """Pick the implementation that runs ``call`` (a validated op call with ``vendor``)."""
    return default_registry.select(op, call, backend)


def backend_status(op: str, vendor: str) -> dict[str, list[str]]:
    """Backend -> reasons it cannot run ``op`` on ``vendor`` devices here (empty: available)."""
    return default_registry.backend_status(op, vendor)


def requested_backend(explicit: str | None = None) -> tuple[str, str]:
    """The backend name in force and where it came from (kwarg, context, global, env, default)."""
    return default_registry.requested_backend(explicit)


def set_backend(name: str | None) -> None:
    """Set the process-wide backend (``None`` or ``"auto"`` restores automatic choice)."""
    global _global_backend
    _global_backend = None if name is None else default_registry.check_name(name, allow_auto=True, source="set_backend")


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Use ``name`` for op calls inside the block (per thread / asyncio context)."""
    token = _context_backend.set(default_registry.check_name(name, allow_auto=True, source="use_backend"))
    try:
        yield
    finally:
        _context_backend.reset(token)


def device_vendor(device: torch.device) -> str:
    """'nvidia', 'amd' or 'cpu' (any non-GPU device counts as 'cpu' for selection)."""
    if device.type == "cuda":
        return "amd" if torch.version.hip else "nvidia"
    return "cpu"


def __getattr__(name: str) -> Any:
    """``BACKENDS``: the declared names as a tuple (kept for old call sites; use ``backend_names()``)."""
    if name == "BACKENDS":
        return tuple(backend_names())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
