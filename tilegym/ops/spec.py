"""``OpSpec``: everything about an op that is not a backend, in one object per op.

An op's spec holds its name, how a call is validated (and so its call type), its float64
reference, its declared accuracy, its byte and FLOP model, its benchmark suites and demo
shapes. The public function validates through it, backends register under its name, the
custom op is registered for it, and the parity tests, the benchmark and the demo read their
oracle, tolerances, model and shapes from it. Adding an op is its spec module, its public
function, and its kernels (``docs/adding_an_op.md``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

_SPECS: dict[str, OpSpec] = {}


@dataclass(frozen=True)
class OpSpec:
    """One op's facts (see the module docstring)."""

    name: str
    summary: str
    validate: Callable[..., Any]  # the public arguments -> the validated call every backend receives
    oracle: Callable[..., Any]  # float64 reference of the op's math (tests, bench, demo)
    tolerance: Callable[[str, torch.dtype, torch.dtype], float]  # (backend, q dtype, kv dtype) -> rel. L2 vs oracle
    traffic_bytes: Callable[..., int] | None = None  # fewest bytes a call moves (the memory floor)
    flop_count: Callable[..., int] | None = None  # FLOPs of a call (the compute floor)
    suites: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)  # named benchmark shapes
    demo_shapes: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # device type -> demo shape


def register_spec(spec: OpSpec) -> OpSpec:
    """Declare an op; its name is then the registry key of its backends' implementations."""
    if spec.name in _SPECS and _SPECS[spec.name] is not spec:
        raise ValueError(f"an op named {spec.name!r} is already declared")
    _SPECS[spec.name] = spec
    return spec


def op_spec(name: str) -> OpSpec:
    """The spec of a declared op."""
    from tilegym.ops import mla_decoding  # noqa: F401  (declares the built-in ops)

    try:
        return _SPECS[name]
    except KeyError:
        raise ValueError(f"unknown op {name!r}; declared ops: {', '.join(sorted(_SPECS))}") from None
