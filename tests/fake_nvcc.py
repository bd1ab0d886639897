"""Stand-ins for the cubin cache tests: a fake nvcc (a shell script that reports a CUDA release and
'compiles' by copying a payload), a corruption, and a filesystem call that fails with an errno."""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# An ELF-looking payload with the symbols of the tiny test kernels (tests/tilecpp_tiny.py, tests/cuda_tiny.py).
FAKE_CUBIN = (
    b"\x7fELF\x02\x01\x01"
    + bytes(57)
    + b".text._Z17tiny_scale_kernelILi128EEvPff\x00.text._Z16tiny_vadd_kernelILi128EEvPKfS1_Pfi\x00"
    + bytes(range(256)) * 8
)


@dataclass
class FakeNvcc:
    """A shell script that reports ``release`` and 'compiles' by copying ``payload`` to its -o path."""

    path: Path
    payload: Path
    log: Path

    def compiles(self) -> int:
        return len(self.log.read_text().splitlines()) if self.log.exists() else 0


def write_fake_nvcc(folder: Path, release: str, payload: bytes, stderr: str = "") -> FakeNvcc:
    """``stderr``: what the fake prints on stderr when it compiles (ptxas's diagnostics)."""
    tool = FakeNvcc(folder / f"nvcc-{release}", folder / f"payload-{release}", folder / f"compiles-{release}.log")
    tool.payload.write_bytes(payload)
    tool.path.write_text(
        "#!/bin/sh\n"
        f"if [ \"$1\" = --version ]; then echo 'Cuda compilation tools, release {release}, V{release}.0'; exit 0; fi\n"
        f'echo "$@" >> {tool.log}\n'
        'while [ $# -gt 0 ]; do if [ "$1" = -o ]; then out="$2"; fi; shift; done\n'
        f'cat {tool.payload} > "$out"\n' + (f"printf '%s\\n' {shlex.quote(stderr)} >&2\n" if stderr else "")
    )
    tool.path.chmod(0o755)
    return tool


def flip_256_bytes(cubin: Path) -> None:
    """Invert the last 256 bytes of ``cubin`` (its size stays the same)."""
    data = bytearray(cubin.read_bytes())
    for i in range(len(data) - 256, len(data)):
        data[i] ^= 0xFF
    cubin.write_bytes(bytes(data))


def fail_with(code: int) -> Callable[..., None]:
    """A replacement for a filesystem call that raises ``OSError(code)`` naming its first argument."""

    def fail(target: object, *args: object, **kwargs: object) -> None:
        raise OSError(code, os.strerror(code), str(target))

    return fail
