"""tilegym: GPU operators with several backends behind one call.

    import tilegym
    out = tilegym.ops.mla_decoding_split_kv(q, qpe, kv, kpe, backend="triton")
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
from tilegym.ops import mla_decoding_split_kv, splitk_reduce
from tilegym.selection import explain

__version__ = "0.1.0"

__all__ = [
    "BACKENDS",
    "BackendSpec",
    "BackendUnavailableError",
    "Registry",
    "__version__",
    "backend_names",
    "backend_status",
    "explain",
    "implementations",
    "mla_decoding_split_kv",
    "ops",
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
