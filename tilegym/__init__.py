"""tilegym: GPU operators with several backends behind one call.

    import tilegym
    out = tilegym.ops.mla_decoding_split_kv(q, qpe, kv, kpe, backend="triton")
    with tilegym.use_backend("torch"):
        ...

Importing compiles nothing, runs no subprocess, creates no directory and needs none of
triton, cuda-python, the CUDA Tile toolchain or aiter.
"""

from tilegym import ops
from tilegym.backend import (
    BACKENDS,
    BackendUnavailableError,
    backend_status,
    implementations,
    register_impl,
    requested_backend,
    set_backend,
    use_backend,
)
from tilegym.ops import mla_decoding_split_kv, splitk_reduce

__version__ = "0.1.0"

__all__ = [
    "BACKENDS",
    "BackendUnavailableError",
    "__version__",
    "backend_status",
    "implementations",
    "mla_decoding_split_kv",
    "ops",
    "register_impl",
    "requested_backend",
    "set_backend",
    "splitk_reduce",
    "use_backend",
]
