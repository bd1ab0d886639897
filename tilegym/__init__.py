"""tilegym: GPU operators with several backends behind one call.

    import tilegym
    out = tilegym.mla_decoding_split_kv(q, qpe, kv, kpe, backend="triton")
    plan = tilegym.plan_mla_decoding(q, qpe, kv, kpe, kv_lens=lens, block_table=table)  # once per step
    out = tilegym.mla_decoding_split_kv(q, qpe, kv, kpe, plan=plan)  # every layer
    with tilegym.use_backend("torch"):
        ...

Importing compiles nothing, runs no subprocess, creates no directory and needs none of
triton, cuda-python, the CUDA Tile toolchain or aiter.
"""

from typing import Any

from tilegym import ops
from tilegym.backend import (
    BackendSpec,
    BackendUnavailableError,
    Registry,
    backend_names,
    backend_status,
    implementations,
    register_backend,
    register_impl,
    requested_backend,
    set_backend,
    use_backend,
)
from tilegym.ops import MLADecodePlan, mla_decoding_split_kv, plan_mla_decoding, splitk_reduce
from tilegym.selection import explain

__version__ = "0.1.0"

__all__ = [
    "BACKENDS",
    "BackendSpec",
    "BackendUnavailableError",
    "MLADecodePlan",
    "Registry",
    "__version__",
    "backend_names",
    "backend_status",
    "explain",
    "implementations",
    "mla_decoding_split_kv",
    "ops",
    "plan_mla_decoding",
    "register_backend",
    "register_impl",
    "requested_backend",
    "set_backend",
    "splitk_reduce",
    "use_backend",
]


def __getattr__(name: str) -> Any:
    """``BACKENDS`` is computed on access (it loads the registry; ``import tilegym`` does not)."""
    if name == "BACKENDS":
        return tuple(backend_names())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
