"""``TileCppKernel``: compile one CUDA Tile C++ kernel instantiation, cache its cubin, launch it.

The GPU machines may have no Tile-capable nvcc, so cubins are built ahead of time (``python -m
tilegym precompile``) into an on-disk cache and loaded with the CUDA driver API. The cache key
covers everything that can change the cubin: the kernel header and every project header it
includes, the generated instantiation source (template arguments and signature), the flags,
the target arch and the nvcc version. A machine without nvcc uses any cached cubin whose other
key parts match (it cannot know which toolchain would have been used).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import hashlib
import importlib.util
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KERNEL_DIR = Path(__file__).resolve().parent / "tilecpp"
NVCC_ENV_VAR = "TILEGYM_NVCC"
CACHE_ENV_VAR = "TILEGYM_CACHE_DIR"
MIN_NVCC_VERSION = (13, 3)
BASE_FLAGS: tuple[str, ...] = ("-tilecubin", "--tile-only", "-std=c++20")
INSTALL_HINT = (
    "pip install nvidia-cuda-nvcc==13.5.37 nvidia-cuda-tileiras==13.5.37 nvidia-cuda-crt "
    "nvidia-cuda-runtime nvidia-cuda-cccl   (or: pip install 'tilegym[tilecpp]')"
)
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)
_VERSION_RE = re.compile(r"release (\d+)\.(\d+)")
# C parameter type -> struct code of its bytes in the kernel parameter buffer.
_PARAM_CODES = {"int": "i", "long long": "q", "float": "f"}


class TileCppError(RuntimeError):
    """Base class of the Tile C++ loader's errors."""


class NvccNotFoundError(TileCppError):
    """No Tile-capable nvcc (>= 13.3) was found; the message says what to install."""


class TileCppCompileError(TileCppError):
    """nvcc rejected a kernel; the message holds nvcc's output and the generated source path."""


class CubinNotCachedError(TileCppError):
    """No cached cubin for this kernel and arch, and no nvcc to build one."""


class CudaDriverError(TileCppError):
    """A CUDA driver call failed; the message names the call and the CUresult."""


# ----------------------------------------------------------------------------- toolchain


@dataclass(frozen=True)
class Nvcc:
    """A Tile-capable nvcc: its path and full ``--version`` release line."""

    path: str
    version: tuple[int, int]
    version_text: str


def _nvcc_version(path: str) -> tuple[tuple[int, int], str]:
    try:
        text = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise NvccNotFoundError(f"cannot run {path} --version: {exc}") from exc
    match = _VERSION_RE.search(text)
    if match is None:
        raise NvccNotFoundError(f"cannot read the CUDA release from `{path} --version`:\n{text}")
    release_lines = [line for line in text.splitlines() if "release" in line]
    return (int(match.group(1)), int(match.group(2))), release_lines[-1].strip()


def _wheel_nvcc_candidates() -> list[str]:
    """``nvidia/cu13/bin/nvcc`` under every location of the ``nvidia`` namespace package."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    return [str(Path(root) / "cu13" / "bin" / "nvcc") for root in roots]


def _candidate_nvccs() -> list[tuple[str, str]]:
    """(path, where it came from) in search order: env override, pip wheel, PATH."""
    override = os.environ.get(NVCC_ENV_VAR)
    if override:
        return [(override, f"${NVCC_ENV_VAR}")]
    found = [(p, "the nvidia-cuda-nvcc wheel") for p in _wheel_nvcc_candidates() if os.access(p, os.X_OK)]
    on_path = shutil.which("nvcc")
    if on_path:
        found.append((on_path, "PATH"))
    return found


@functools.cache
def _search_nvcc() -> Nvcc | NvccNotFoundError:
    rejected = []
    for path, origin in _candidate_nvccs():
        if not os.access(path, os.X_OK):
            rejected.append(f"{path} (from {origin}) is not an executable file")
            continue
        try:
            version, text = _nvcc_version(path)
        except NvccNotFoundError as exc:
            rejected.append(str(exc))
            continue
        if version >= MIN_NVCC_VERSION:
            return Nvcc(path, version, text)
        rejected.append(f"{path} (from {origin}) is CUDA {version[0]}.{version[1]}, without Tile C++ support")
    need = f"nvcc >= {MIN_NVCC_VERSION[0]}.{MIN_NVCC_VERSION[1]} with CUDA Tile support"
    seen = "; ".join(rejected) if rejected else "no nvcc found"
    return NvccNotFoundError(f"{need} is required to compile Tile C++ kernels ({seen}). Install it: {INSTALL_HINT}")


def find_nvcc() -> Nvcc:
    """The first Tile-capable nvcc (>= 13.3), searched once; ``NvccNotFoundError`` says what to install."""
    found = _search_nvcc()
    if isinstance(found, NvccNotFoundError):
        raise found
    return found


def nvcc_or_none() -> Nvcc | None:
    """``find_nvcc()``, or None when there is no usable nvcc."""
    found = _search_nvcc()
    return None if isinstance(found, NvccNotFoundError) else found


def toolchain_problem() -> str | None:
    """Why no Tile-capable nvcc can be used here (None when one can)."""
    found = _search_nvcc()
    return str(found) if isinstance(found, NvccNotFoundError) else None


def clear_toolchain_cache() -> None:
    """Forget the nvcc search result (after changing ``$TILEGYM_NVCC`` or PATH)."""
    _search_nvcc.cache_clear()


# ----------------------------------------------------------------------------- cache


def cache_dir() -> Path:
    """``$TILEGYM_CACHE_DIR``, else ``$XDG_CACHE_HOME/tilegym`` (default ``~/.cache/tilegym``)."""
    explicit = os.environ.get(CACHE_ENV_VAR)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "tilegym"


def included_headers(header: Path) -> list[Path]:
    """``header`` and every project header it includes with ``#include "..."``, transitively."""
    seen: dict[Path, None] = {}
    pending = [header.resolve()]
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen[path] = None
        for name in _INCLUDE_RE.findall(path.read_text()):
            included = (path.parent / name).resolve()
            if included.is_file():
                pending.append(included)
    return list(seen)


def _arch_number(arch: str) -> str:
    match = re.fullmatch(r"(?:sm_)?(\d+[a-z]?)", arch)
    if match is None:
        raise ValueError(f"arch must look like 'sm_90' or 'sm_100', got {arch!r}")
    return match.group(1)


def normalize_arch(arch: str) -> str:
    """'90', 'sm_90' -> 'sm_90'."""
    return f"sm_{_arch_number(arch)}"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# ----------------------------------------------------------------------------- driver


def _driver() -> Any:
    from cuda.bindings import driver

    return driver


def _check(result: Any, call: str) -> Any:
    """Unpack a cuda-bindings result tuple; raise ``CudaDriverError`` on a non-success CUresult."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        drv = _driver()
        name = drv.cuGetErrorName(err)[1]
        text = drv.cuGetErrorString(err)[1]
        decode = lambda b: b.decode() if isinstance(b, bytes) else str(b)  # noqa: E731
        raise CudaDriverError(f"{call} failed: {decode(name)} ({int(err)}): {decode(text)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _current_context() -> int:
    """Handle of the current CUDA context (PyTorch's primary context, made current if needed)."""
    drv = _driver()
    ctx = _check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if int(ctx) == 0:
        import torch

        torch.cuda.init()
        torch.cuda.current_stream()  # makes the device's primary context current on this thread
        ctx = _check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if int(ctx) == 0:
            raise CudaDriverError("no current CUDA context after initialising PyTorch's CUDA state")
    return int(ctx)


class _ParamBuffer:
    """Kernel arguments packed into one reusable buffer plus the ``void*[]`` that points into it.

    ``cuLaunchKernel`` copies the argument bytes at launch, so the buffer can be refilled for the
    next call; one buffer per thread keeps concurrent launches apart.
    """

    def __init__(self, param_types: Sequence[str]) -> None:
        codes = ["Q" if t.strip().endswith("*") else _PARAM_CODES[t.strip()] for t in param_types]
        offsets, fmt, offset = [], "=", 0
        for code in codes:
            size = struct.calcsize(code)
            pad = -offset % size
            fmt += "x" * pad + code
            offset += pad
            offsets.append(offset)
            offset += size
        self._struct = struct.Struct(fmt)
        self._data = ctypes.create_string_buffer(max(8, self._struct.size))
        base = ctypes.addressof(self._data)
        self._pointers = (ctypes.c_void_p * max(1, len(codes)))(*[base + o for o in offsets])
        self.address = ctypes.addressof(self._pointers)

    def fill(self, args: Sequence[Any]) -> int:
        self._struct.pack_into(self._data, 0, *args)
        return self.address


# ----------------------------------------------------------------------------- kernel


class TileCppKernel:
    """One instantiation of a ``__tile_global__`` template from a ``.cuh`` file.

    ``template_args`` are the C++ template arguments (e.g. ``("__nv_bfloat16", 16, 64)``);
    ``param_types`` the C types of the kernel parameters in order (``"const T*"``-style pointers,
    ``int``, ``long long``, ``float``). Pointers are passed as integer addresses.
    """

    def __init__(
        self,
        header: str | Path,
        kernel_name: str,
        template_args: Sequence[str | int] = (),
        param_types: Sequence[str] = (),
        *,
        flags: Sequence[str] = (),
    ) -> None:
        header = Path(header)
        self.header = header if header.is_absolute() else KERNEL_DIR / header
        self.kernel_name = kernel_name
        self.template_args = tuple(str(a) for a in template_args)
        self.param_types = tuple(param_types)
        self.flags = tuple(flags)
        self._keys: dict[str, str] = {}
        self._available: set[str] = set()
        self._functions: dict[tuple[int, int], Any] = {}
        self._modules: list[Any] = []
        self._load_lock = threading.Lock()
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"TileCppKernel({self.header.name}:{self.instance_name})"

    @property
    def instance_name(self) -> str:
        args = ", ".join(self.template_args)
        return f"{self.kernel_name}<{args}>" if self.template_args else self.kernel_name

    def instantiation_source(self) -> str:
        """The ``.cu`` nvcc compiles: the header plus one explicit template instantiation."""
        lines = [f'#include "{self.header.name}"']
        if self.template_args:
            signature = ", ".join(self.param_types)
            lines.append(f"template __tile_global__ void {self.instance_name}({signature});")
        return "\n".join(lines) + "\n"

    def compile_command(self, nvcc: str, arch: str, source: Path, output: Path) -> list[str]:
        return [
            nvcc,
            *BASE_FLAGS,
            f"-arch={normalize_arch(arch)}",
            *self.flags,
            f"-I{self.header.parent}",
            "-o",
            str(output),
            str(source),
        ]

    def source_key(self, arch: str) -> str:
        """Hash of everything except the toolchain: headers, instantiation, flags, arch.

        Computed once per arch and kernel object: a header edited while the process runs is
        picked up by a new ``TileCppKernel`` (or a new process), not by this one.
        """
        key = self._keys.get(arch)
        if key is None:
            key = self._keys[arch] = self._compute_source_key(arch)
        return key

    def _compute_source_key(self, arch: str) -> str:
        digest = hashlib.sha256()
        for path in sorted(included_headers(self.header)):
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        for part in (self.instantiation_source(), " ".join(BASE_FLAGS + self.flags), normalize_arch(arch)):
            digest.update(part.encode() + b"\0")
        return digest.hexdigest()[:24]

    def _stem(self, arch: str) -> str:
        return f"{self.kernel_name}-{normalize_arch(arch)}-{self.source_key(arch)}"

    def cubin_path(self, arch: str, nvcc: Nvcc) -> Path:
        """Where the cubin built by ``nvcc`` for ``arch`` lives in the cache."""
        toolchain = hashlib.sha256(nvcc.version_text.encode()).hexdigest()[:12]
        return cache_dir() / normalize_arch(arch) / f"{self._stem(arch)}-{toolchain}.cubin"

    def cached_cubin(self, arch: str, nvcc: Nvcc | None = None) -> Path | None:
        """An existing cubin for ``arch``: built by ``nvcc`` when given, else by any toolchain."""
        if nvcc is not None:
            path = self.cubin_path(arch, nvcc)
            return path if path.is_file() else None
        folder = cache_dir() / normalize_arch(arch)
        found = sorted(folder.glob(f"{self._stem(arch)}-*.cubin"), key=lambda p: p.stat().st_mtime)
        return found[-1] if found else None

    def compile(self, arch: str, nvcc: Nvcc | None = None) -> Path:
        """Build the cubin for ``arch`` into the cache unless it is there; return its path."""
        nvcc = nvcc or find_nvcc()
        final = self.cubin_path(arch, nvcc)
        if final.is_file():
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        with _file_lock(final.with_suffix(".lock")):
            if final.is_file():  # another process built it while we waited
                return final
            source = final.with_suffix(".cu")
            source.write_text(self.instantiation_source())
            fd, tmp_name = tempfile.mkstemp(dir=final.parent, prefix=final.stem, suffix=".tmp")
            os.close(fd)
            tmp = Path(tmp_name)
            try:
                result = subprocess.run(
                    self.compile_command(nvcc.path, arch, source, tmp), capture_output=True, text=True
                )
                if result.returncode != 0 or tmp.stat().st_size == 0:
                    raise TileCppCompileError(
                        f"nvcc failed to compile {self.instance_name} for {normalize_arch(arch)} "
                        f"(exit {result.returncode}); generated source: {source}\n"
                        f"command: {' '.join(self.compile_command(nvcc.path, arch, source, tmp))}\n"
                        f"{result.stderr.strip() or result.stdout.strip()}"
                    )
                tmp.chmod(0o644)
                os.replace(tmp, final)
            finally:
                tmp.unlink(missing_ok=True)
        return final

    def resolve_cubin(self, arch: str) -> Path:
        """The cubin to load: cached (exact toolchain if nvcc exists, else any), or compiled now."""
        nvcc = nvcc_or_none()
        if nvcc is None:
            cached = self.cached_cubin(arch)
            if cached is None:
                raise CubinNotCachedError(
                    f"no cached cubin for {self.instance_name} ({normalize_arch(arch)}) in {cache_dir()}, "
                    f"and no Tile-capable nvcc to build it. Either run `python -m tilegym precompile --arch "
                    f"{normalize_arch(arch)}` with the same {CACHE_ENV_VAR} on a machine with the toolchain, "
                    f"or install it: {INSTALL_HINT}"
                )
            return cached
        return self.cached_cubin(arch, nvcc) or self.compile(arch, nvcc)

    def available(self, arch: str) -> bool:
        """True when this kernel can run for ``arch`` here: a cached cubin or a usable nvcc.

        A positive answer is remembered (cheap enough to ask on every op call).
        """
        if arch in self._available:
            return True
        if nvcc_or_none() is not None or self.cached_cubin(arch) is not None:
            self._available.add(arch)
            return True
        return False

    # ------------------------------------------------------------------ loading and launching

    def function(self, device_index: int) -> Any:
        """The loaded ``CUfunction`` for the current context (loaded once per context)."""
        ctx = _current_context()
        key = (ctx, device_index)
        func = self._functions.get(key)
        if func is not None:
            return func
        with self._load_lock:
            func = self._functions.get(key)
            if func is None:
                func = self._load(device_index)
                self._functions[key] = func
        return func

    def _load(self, device_index: int) -> Any:
        import torch

        major, minor = torch.cuda.get_device_capability(device_index)
        cubin = self.resolve_cubin(f"sm_{major}{minor}")
        image = cubin.read_bytes()
        name = self.mangled_name(image, cubin)
        drv = _driver()
        buffer = ctypes.create_string_buffer(image, len(image))  # the driver copies it while loading
        module = _check(drv.cuModuleLoadData(ctypes.addressof(buffer)), f"cuModuleLoadData({cubin})")
        self._modules.append(module)
        return _check(drv.cuModuleGetFunction(module, name), f"cuModuleGetFunction({name.decode()})")

    def mangled_name(self, image: bytes, origin: Path | str = "cubin") -> bytes:
        """The kernel's symbol, read from the cubin's ``.text.<symbol>`` section name."""
        pattern = rb"\.text\.(\w*" + re.escape(self.kernel_name.encode()) + rb"\w*)\x00"
        names = sorted(set(re.findall(pattern, image)))
        if len(names) != 1:
            raise CudaDriverError(f"expected one kernel named like {self.kernel_name} in {origin}, found {names}")
        return names[0]

    def launch(self, grid: tuple[int, int, int], args: Sequence[Any], stream: int, device_index: int) -> None:
        """Launch on ``stream`` (a ``cudaStream_t`` address) with ``args`` in ``param_types`` order."""
        func = self.function(device_index)
        buffer = getattr(self._local, "buffer", None)
        if buffer is None:
            buffer = self._local.buffer = _ParamBuffer(self.param_types)
        params = buffer.fill(args)
        gx, gy, gz = grid
        err = _driver().cuLaunchKernel(func, gx, gy, gz, 1, 1, 1, 0, stream, params, 0)
        _check(err, f"cuLaunchKernel({self.instance_name}, grid={grid})")
