"""Compile one CUDA kernel instantiation with nvcc, cache its cubin, load and launch it.

Two languages share this loader, each a subclass of ``CubinKernel``:

- ``TileCppKernel``: CUDA Tile C++ (``__tile_global__``, nvcc >= 13.3 with Tile support, any arch
  from sm_80). Launched with block (1, 1, 1) and no dynamic shared memory: the thread count is in
  the cubin.
- ``CudaKernel``: plain CUDA C++ (``__global__``, nvcc >= 12.3) with the CuTe/CUTLASS headers of
  the ``nvidia-cutlass`` wheel on the include path. Launched with a real block and dynamic shared
  memory; its target archs are a constructor argument (default sm_90a: wgmma and TMA).

Subclasses rather than a ``language=`` argument, because the two launch differently
(``CudaKernel.launch`` requires a block; ``TileCppKernel.launch`` has none) and accept different
archs; everything else (keys, cache, nvcc search, driver calls) lives in ``CubinKernel``.

GPU machines may have no suitable nvcc, so cubins are built ahead of time (``python -m tilegym
precompile``) into an on-disk cache and loaded with the CUDA driver API. The cache key covers
everything that can change the cubin: the language, the kernel header and every project header
it includes, the instantiation source (template arguments and signature), the flags, the
identity of external include folders (the nvidia-cutlass version), the target arch and nvcc.

Cache layout, under ``$TILEGYM_CACHE_DIR`` (else ``$XDG_CACHE_HOME/tilegym``)::

    <arch>/<kernel>-<arch>-<source key>-nvcc<major>.<minor>-<toolchain hash>.cubin
    <arch>/<same name>.cubin.sha256   "<sha256 of the cubin>  <cubin file name>" (sha256sum -c format)
    <arch>/<kernel>-...cu / .lock     the generated source (for error messages) and the build lock

A build holds the entry's file lock, writes both files to temporary names, then renames the hash
file and then the cubin into place: a cubin never appears before its hash. Every use verifies the
hash (``cubin_problem``): on a mismatch or a missing hash the entry is rebuilt when nvcc is there,
else ``CorruptCubinError`` says what to do. A build also checks that nvcc wrote an ELF file with
the kernel's symbol, so a broken compiler cannot put garbage into the cache. A build removes
temporary files that a killed build left (this entry's, and any older than ``STALE_TMP_SECONDS``).

Which cubin is used: with a usable nvcc, only the entry of that exact toolchain (built if
missing). Without one, among the entries of any toolchain whose hash verifies, the one built by
the newest nvcc release (ties: the greatest file name); file times play no part.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

OPS_DIR = Path(__file__).resolve().parent
NVCC_ENV_VAR = "TILEGYM_NVCC"
CACHE_ENV_VAR = "TILEGYM_CACHE_DIR"
HASH_SUFFIX = ".sha256"
STALE_TMP_SECONDS = 600
TILE_MIN_ARCH = 80  # the tile toolchain generates no tile code below sm_80
STATIC_SHARED_LIMIT = 48 * 1024  # dynamic shared memory a kernel may use without opting in
CUTLASS_REQUIREMENT = "nvidia-cutlass==4.2.0.0"
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)
_VERSION_RE = re.compile(r"release (\d+)\.(\d+)")
_ENTRY_VERSION_RE = re.compile(r"-nvcc(\d+)\.(\d+)-[0-9a-f]+\.cubin$")
# C parameter type -> struct code of its bytes in the kernel parameter buffer.
# A TMA tensor map travels by value (128 bytes, ``const __grid_constant__ CUtensorMap`` in the kernel).
_PARAM_CODES = {"int": "i", "long long": "q", "float": "f", "const __grid_constant__ CUtensorMap": "128s"}


class TileCppError(RuntimeError):
    """Base class of the loader's errors (both languages)."""


class NvccNotFoundError(TileCppError):
    """No nvcc new enough for the language was found; the message says what to install."""


class CutlassNotFoundError(TileCppError):
    """The CuTe/CUTLASS headers (the nvidia-cutlass wheel) are not installed."""


class TileCppCompileError(TileCppError):
    """nvcc rejected a kernel; the message holds nvcc's output and the generated source path."""


class CubinNotCachedError(TileCppError):
    """No cached cubin for this kernel and arch, and no nvcc to build one."""


class CorruptCubinError(TileCppError):
    """A cached cubin fails its hash check and no nvcc can rebuild it; the message names the file."""


class CacheDirError(TileCppError):
    """The cubin cache cannot be written or read; the message names the path and the fix."""


class UnsupportedArchError(TileCppError, ValueError):
    """The kernel's language cannot target this arch."""


class CudaDriverError(TileCppError):
    """A CUDA driver call failed; the message names the call and the CUresult."""


class KernelPerformanceWarning(UserWarning):
    """ptxas built the kernel but reports a performance loss (e.g. wgmma serialised): the cubin is
    correct and kept, but it may run far slower than its source intends."""


# ptxas's own words for a build that works but loses speed, e.g. "(C7518) Potential Performance Loss:
# wgmma.mma_async instructions are serialized due to ..." (printed without -v).
_PERFORMANCE_LOSS = "Potential Performance Loss"


# ----------------------------------------------------------------------------- languages


@dataclass(frozen=True)
class Language:
    """How kernels of one source language are compiled."""

    name: str
    title: str
    qualifier: str
    base_flags: tuple[str, ...]
    min_nvcc: tuple[int, int]
    install_hint: str
    old_nvcc_note: str
    uses_cutlass: bool = False


TILE = Language(
    name="tile",
    title="CUDA Tile C++",
    qualifier="__tile_global__",
    base_flags=("-tilecubin", "--tile-only", "-std=c++20"),
    min_nvcc=(13, 3),
    install_hint=(
        "pip install nvidia-cuda-nvcc==13.5.37 nvidia-cuda-tileiras==13.5.37 nvidia-cuda-crt "
        "nvidia-cuda-runtime nvidia-cuda-cccl   (or: pip install 'tilegym[tilecpp]')"
    ),
    old_nvcc_note="without Tile C++ support (needs 13.3 or newer)",
)
CUDA = Language(
    name="cuda",
    title="CUDA C++",
    qualifier="__global__",
    base_flags=("-cubin", "-std=c++17"),
    min_nvcc=(12, 3),
    install_hint=(
        "pip install nvidia-cuda-nvcc==13.5.37 nvidia-cuda-crt nvidia-cuda-runtime nvidia-cuda-cccl "
        "(or any CUDA toolkit >= 12.3; or: pip install 'tilegym[cutlass]')"
    ),
    old_nvcc_note="older than 12.3",
    uses_cutlass=True,
)
LANGUAGES = {language.name: language for language in (TILE, CUDA)}


def _language(name: str) -> Language:
    try:
        return LANGUAGES[name]
    except KeyError:
        raise ValueError(f"language must be one of {sorted(LANGUAGES)}, got {name!r}") from None


# ----------------------------------------------------------------------------- toolchain


@dataclass(frozen=True)
class Nvcc:
    """An nvcc: its path, CUDA release and full ``--version`` release line."""

    path: str
    version: tuple[int, int]
    version_text: str


@functools.cache
def _nvcc_version(path: str) -> tuple[tuple[int, int], str] | NvccNotFoundError:
    try:
        text = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return NvccNotFoundError(f"cannot run {path} --version: {exc}")
    match = _VERSION_RE.search(text)
    if match is None:
        return NvccNotFoundError(f"cannot read the CUDA release from `{path} --version`:\n{text}")
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
def _search_nvcc(language: Language) -> Nvcc | NvccNotFoundError:
    rejected = []
    for path, origin in _candidate_nvccs():
        if not os.access(path, os.X_OK):
            rejected.append(f"{path} (from {origin}) is not an executable file")
            continue
        found = _nvcc_version(path)
        if isinstance(found, NvccNotFoundError):
            rejected.append(str(found))
            continue
        version, text = found
        if version >= language.min_nvcc:
            return Nvcc(path, version, text)
        rejected.append(f"{path} (from {origin}) is CUDA {version[0]}.{version[1]}, {language.old_nvcc_note}")
    need = f"nvcc >= {language.min_nvcc[0]}.{language.min_nvcc[1]}"
    seen = "; ".join(rejected) if rejected else "no nvcc found"
    return NvccNotFoundError(
        f"{need} is required to compile {language.title} kernels ({seen}). Install it: {language.install_hint}"
    )


def find_nvcc(language: str = "tile") -> Nvcc:
    """The first nvcc new enough for ``language`` (searched once); ``NvccNotFoundError`` says what to install."""
    found = _search_nvcc(_language(language))
    if isinstance(found, NvccNotFoundError):
        raise found
    return found


def nvcc_or_none(language: str = "tile") -> Nvcc | None:
    """``find_nvcc(language)`` when ``language`` kernels can be compiled here (nvcc, plus the CUTLASS
    headers for CUDA C++), else None: the loader then uses the verified cached cubins."""
    if toolchain_problem(language) is not None:
        return None
    return _search_nvcc(_language(language))


@functools.cache
def _search_cutlass() -> tuple[Path, str] | CutlassNotFoundError:
    try:
        spec = importlib.util.find_spec("cutlass_library")
    except (ImportError, ValueError):
        spec = None
    for root in list(spec.submodule_search_locations or []) if spec is not None else []:
        include = Path(root) / "source" / "include"
        if (include / "cute" / "tensor.hpp").is_file():
            try:
                identity = f"nvidia-cutlass=={importlib.metadata.version('nvidia-cutlass')}"
            except importlib.metadata.PackageNotFoundError:
                identity = f"cutlass headers at {include}"
            return include, identity
    return CutlassNotFoundError(
        "the CuTe/CUTLASS headers are not installed (no cutlass_library/source/include/cute/tensor.hpp in any "
        f"installed package); install them: pip install {CUTLASS_REQUIREMENT}   (or: pip install 'tilegym[cutlass]')"
    )


def cutlass_include_dir() -> Path:
    """``cutlass_library/source/include`` of the installed nvidia-cutlass wheel (holds ``cute/`` and ``cutlass/``)."""
    found = _search_cutlass()
    if isinstance(found, CutlassNotFoundError):
        raise found
    return found[0]


def _external_includes(language: Language) -> tuple[tuple[Path, ...], str]:
    """Include folders outside the project, and a string that identifies their contents."""
    if not language.uses_cutlass:
        return (), ""
    found = _search_cutlass()
    if isinstance(found, CutlassNotFoundError):
        raise found
    return (found[0],), found[1]


def _include_identity(language: Language) -> str:
    """What identifies the external headers in cache keys. Without the headers installed: the pinned
    requirement, so a machine that only loads cubins finds those built from it elsewhere."""
    if not language.uses_cutlass:
        return ""
    found = _search_cutlass()
    return CUTLASS_REQUIREMENT if isinstance(found, CutlassNotFoundError) else found[1]


def toolchain_problem(language: str = "tile") -> str | None:
    """Why ``language`` kernels cannot be compiled here (None when they can)."""
    lang = _language(language)
    found = _search_nvcc(lang)
    if isinstance(found, NvccNotFoundError):
        return str(found)
    if lang.uses_cutlass and isinstance(_search_cutlass(), CutlassNotFoundError):
        return str(_search_cutlass())
    return None


def clear_toolchain_cache() -> None:
    """Forget the nvcc and CUTLASS search results (after changing ``$TILEGYM_NVCC``, PATH or packages)."""
    _search_nvcc.cache_clear()
    _nvcc_version.cache_clear()
    _search_cutlass.cache_clear()


@dataclass(frozen=True)
class _CompilerOutput:
    problem: str | None
    text: str


def _run_compiler(command: list[str]) -> _CompilerOutput:
    try:
        result = subprocess.run(command, capture_output=True, text=True)
    except OSError as exc:
        return _CompilerOutput(f"cannot run it: {exc}", "")
    text = result.stderr.strip() or result.stdout.strip()
    return _CompilerOutput(f"exit {result.returncode}" if result.returncode else None, text)


# ----------------------------------------------------------------------------- archs


def _arch_number(arch: str) -> str:
    match = re.fullmatch(r"(?:sm_)?(\d+[a-z]?)", arch)
    if match is None:
        raise ValueError(f"arch must look like 'sm_90', 'sm_90a' or 'sm_100', got {arch!r}")
    return match.group(1)


def normalize_arch(arch: str) -> str:
    """'90', 'sm_90' -> 'sm_90'; 'sm_90a' stays."""
    return f"sm_{_arch_number(arch)}"


def arch_generation(arch: str) -> int:
    """The numeric part of an arch: 'sm_90a' -> 90."""
    return int(re.match(r"\d+", _arch_number(arch)).group())


# ----------------------------------------------------------------------------- cache files


def cache_dir() -> Path:
    """``$TILEGYM_CACHE_DIR``, else ``$XDG_CACHE_HOME/tilegym`` (default ``~/.cache/tilegym``)."""
    explicit = os.environ.get(CACHE_ENV_VAR)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg).expanduser() / "tilegym"


def _cache_error(exc: OSError, path: Path) -> CacheDirError:
    where = Path(exc.filename) if exc.filename else path
    fix = f"set {CACHE_ENV_VAR} to a writable folder (precompile: --cache-dir DIR)"
    if exc.errno == errno.ENOSPC:
        return CacheDirError(f"no space left on the device of the cubin cache {where}: free space or {fix}")
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        return CacheDirError(f"the cubin cache {where} (or a folder above it) is a file, not a folder: {fix}")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return CacheDirError(f"no permission to use the cubin cache {where} ({exc.strerror}): {fix}")
    return CacheDirError(f"cannot use the cubin cache {where} ({exc.strerror or exc}): {fix}")


@contextlib.contextmanager
def _cache_io(path: Path) -> Iterator[None]:
    """Turn a filesystem error under ``path`` into a one-line ``CacheDirError``."""
    try:
        yield
    except OSError as exc:
        raise _cache_error(exc, path) from exc


def prepare_cache_folder(arch: str) -> Path:
    """Create ``cache_dir()/arch`` and check that files can be written there; ``CacheDirError`` if not."""
    folder = cache_dir() / normalize_arch(arch)
    with _cache_io(folder):
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    return folder


def hash_path(cubin: Path) -> Path:
    """The file holding ``cubin``'s sha256."""
    return cubin.with_name(cubin.name + HASH_SUFFIX)


def _hash_line(cubin: Path, image: bytes) -> str:
    return f"{hashlib.sha256(image).hexdigest()}  {cubin.name}\n"


def _image_problem(cubin: Path, image: bytes) -> str | None:
    """Why ``image`` (the bytes read from ``cubin``) must not be used; None when its hash matches."""
    try:
        stored = hash_path(cubin).read_text()
    except FileNotFoundError:
        return f"it has no {HASH_SUFFIX} file"
    except (OSError, UnicodeDecodeError) as exc:
        return f"its {HASH_SUFFIX} file cannot be read ({exc})"
    if stored != _hash_line(cubin, image):
        return f"its content does not match its {HASH_SUFFIX} file"
    return None


def _read_cache_file(path: Path) -> bytes:
    with _cache_io(path):
        return path.read_bytes()


def cubin_problem(cubin: Path) -> str | None:
    """Why the cached ``cubin`` must not be used (missing, no hash, hash mismatch); None when it verifies."""
    if not cubin.is_file():
        return "it does not exist"
    return _image_problem(cubin, _read_cache_file(cubin))


def _entry_version(cubin: Path) -> tuple[int, int]:
    match = _ENTRY_VERSION_RE.search(cubin.name)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def _temp_file(final: Path, tag: str = "") -> Path:
    fd, name = tempfile.mkstemp(dir=final.parent, prefix=f"{final.name}{tag}.", suffix=".tmp")
    os.close(fd)
    return Path(name)


def _remove_stale_temp_files(final: Path) -> None:
    """Delete temporary files a killed build left: this entry's (its lock is held) and old ones."""
    now = time.time()
    for tmp in final.parent.glob("*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            if tmp.name.startswith(f"{final.name}.") or now - tmp.stat().st_mtime > STALE_TMP_SECONDS:
                tmp.unlink()


def _store(final: Path, built: Path, image: bytes) -> None:
    """Put ``built`` in place as ``final`` with its hash file; the hash file lands first."""
    digest = _temp_file(final, HASH_SUFFIX)
    try:
        digest.write_text(_hash_line(final, image))
        for path in (digest, built):
            path.chmod(0o644)
        os.replace(digest, hash_path(final))
        os.replace(built, final)
    finally:
        digest.unlink(missing_ok=True)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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


def _device_arch(device_index: int) -> str:
    import torch

    major, minor = torch.cuda.get_device_capability(device_index)
    return f"sm_{major}{minor}"


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


@functools.cache
def _libcuda_launch() -> Any | None:
    """The driver's ``cuLaunchKernel`` through ctypes (a few times cheaper per call than the
    cuda-bindings wrapper), or None when libcuda cannot be opened."""
    try:
        fn = ctypes.CDLL("libcuda.so.1").cuLaunchKernel
    except OSError:
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return fn


PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID (cuda.h)


class _LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute``: the id, 4 bytes of padding, a 64-byte value union."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` (cuda.h)."""

    _fields_ = [
        ("dims", ctypes.c_uint * 6),
        ("shared_mem", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.c_void_p),
        ("num_attrs", ctypes.c_uint),
    ]


@functools.cache
def _libcuda_launch_ex() -> Any | None:
    """The driver's ``cuLaunchKernelEx`` through ctypes, or None when libcuda cannot be opened."""
    try:
        fn = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return fn


class BoundLaunch:
    """One kernel's launch with its function handle, grid, block and shared memory fixed.

    ``early_start``: launch with programmatic stream serialization, so the kernel may start before
    the previous kernel on the stream has finished, once every CTA of that kernel has executed
    ``griddepcontrol.launch_dependents`` (sm_90+). The kernel must then execute ``griddepcontrol.wait``
    before it reads what the previous kernel wrote.
    """

    def __init__(
        self,
        name: str,
        handle: Any,
        buffer: _ParamBuffer,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        early_start: bool = False,
    ) -> None:
        self._name = name
        self._handle = handle
        self._buffer = buffer
        self._dims = (*grid, *block, shared_mem)
        self._raw_handle = int(handle)
        self._early_start = early_start
        if early_start:
            self._raw = _libcuda_launch_ex()
            self._attribute = _LaunchAttribute(id=PROGRAMMATIC_STREAM_SERIALIZATION)
            self._attribute.value[0] = 1
            self._config = _LaunchConfig((ctypes.c_uint * 6)(*grid, *block), shared_mem)
            self._config.attrs = ctypes.addressof(self._attribute)
            self._config.num_attrs = 1
            self._config_address = ctypes.addressof(self._config)
        else:
            self._raw = _libcuda_launch()
        self._cu_launch = _driver().cuLaunchKernel

    def __call__(self, args: Sequence[Any], stream: int) -> None:
        """Launch with ``args`` (in ``param_types`` order) on ``stream`` (a ``cudaStream_t`` address)."""
        params = self._buffer.fill(args)
        if self._early_start:
            self._launch_early(params, stream)
            return
        if self._raw is not None:
            if self._raw(self._raw_handle, *self._dims, stream, params, None) == 0:
                return
        result = self._cu_launch(self._handle, *self._dims, stream, params, 0)
        if int(result[0]) != 0:
            _check(result, f"cuLaunchKernel({self._name}, dims={self._dims})")

    def _launch_early(self, params: int, stream: int) -> None:
        self._config.stream = stream
        if self._raw is not None and self._raw(self._config_address, self._raw_handle, params, None) == 0:
            return
        drv = _driver()
        config = drv.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ, config.blockDimX, config.blockDimY, config.blockDimZ = (
            self._dims[:6]
        )
        config.sharedMemBytes = self._dims[6]
        config.hStream = stream
        attribute = drv.CUlaunchAttribute()
        attribute.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attribute.value.programmaticStreamSerializationAllowed = 1
        config.attrs = [attribute]
        config.numAttrs = 1
        _check(
            drv.cuLaunchKernelEx(config, self._handle, params, 0), f"cuLaunchKernelEx({self._name}, dims={self._dims})"
        )


@dataclass
class _LoadedFunction:
    """A ``CUfunction`` and the dynamic shared memory it has been allowed so far."""

    handle: Any
    shared_limit: int = STATIC_SHARED_LIMIT


# ----------------------------------------------------------------------------- kernels


class CubinKernel:
    """One instantiation of a kernel template from a ``.cuh`` file (use a language subclass).

    ``header`` is absolute or relative to the subclass's ``kernel_dir``; ``template_args`` are the
    C++ template arguments (e.g. ``("__nv_bfloat16", 16, 64)``); ``param_types`` the C types of the
    kernel parameters in order (``"const T*"``-style pointers, ``int``, ``long long``, ``float``).
    Pointers are passed as integer addresses. ``flags`` are extra nvcc flags.
    """

    language: ClassVar[Language]
    kernel_dir: ClassVar[Path]

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
        self.header = header if header.is_absolute() else self.kernel_dir / header
        self.kernel_name = kernel_name
        self.template_args = tuple(str(a) for a in template_args)
        self.param_types = tuple(param_types)
        self.flags = tuple(flags)
        self._keys: dict[str, str] = {}
        self._available: set[str] = set()
        self._functions: dict[tuple[int, int], _LoadedFunction] = {}
        self._modules: list[Any] = []
        self._load_lock = threading.Lock()
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.header.name}:{self.instance_name})"

    @property
    def instance_name(self) -> str:
        args = ", ".join(self.template_args)
        return f"{self.kernel_name}<{args}>" if self.template_args else self.kernel_name

    def target_arch(self, arch: str) -> str:
        """The arch this kernel is compiled for when asked for ``arch`` (a device's 'sm_90', or a
        CLI name); ``UnsupportedArchError`` when its language cannot target it."""
        raise NotImplementedError

    def instantiation_source(self) -> str:
        """The ``.cu`` nvcc compiles: the header plus one explicit template instantiation."""
        lines = [f'#include "{self.header.name}"']
        if self.template_args:
            signature = ", ".join(self.param_types)
            lines.append(f"template {self.language.qualifier} void {self.instance_name}({signature});")
        return "\n".join(lines) + "\n"

    def compile_command(self, nvcc: str, arch: str, source: Path, output: Path) -> list[str]:
        """The nvcc command line that compiles ``source`` into the cubin ``output`` for ``arch``."""
        include_dirs, _ = _external_includes(self.language)
        return [
            nvcc,
            *self.language.base_flags,
            f"-arch={self.target_arch(arch)}",
            *self.flags,
            f"-I{self.header.parent}",
            *(f"-I{folder}" for folder in include_dirs),
            "-o",
            str(output),
            str(source),
        ]

    # ------------------------------------------------------------------ cache keys and entries

    def source_key(self, arch: str) -> str:
        """Hash of everything except the toolchain: language, headers, instantiation, flags,
        external include identity, target arch.

        Computed once per arch and kernel object: a header edited while the process runs is
        picked up by a new kernel object (or a new process), not by this one.
        """
        target = self.target_arch(arch)
        key = self._keys.get(target)
        if key is None:
            key = self._keys[target] = self._compute_source_key(target)
        return key

    def _compute_source_key(self, target: str) -> str:
        digest = hashlib.sha256()
        for path in sorted(included_headers(self.header)):
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        include_identity = _include_identity(self.language)
        flags = " ".join(self.language.base_flags + self.flags)
        for part in (self.language.name, self.instantiation_source(), flags, include_identity, target):
            digest.update(part.encode() + b"\0")
        return digest.hexdigest()[:24]

    def _stem(self, target: str) -> str:
        return f"{self.kernel_name}-{target}-{self.source_key(target)}"

    def cubin_path(self, arch: str, nvcc: Nvcc) -> Path:
        """Where the cubin built by ``nvcc`` for ``arch`` lives in the cache."""
        target = self.target_arch(arch)
        toolchain = hashlib.sha256(nvcc.version_text.encode()).hexdigest()[:12]
        release = f"nvcc{nvcc.version[0]}.{nvcc.version[1]}"
        return cache_dir() / target / f"{self._stem(target)}-{release}-{toolchain}.cubin"

    def cached_entries(self, arch: str) -> list[Path]:
        """Cached cubins of this kernel for ``arch`` from any toolchain, verified or not."""
        target = self.target_arch(arch)
        folder = cache_dir() / target
        return sorted(folder.glob(f"{self._stem(target)}-nvcc*.cubin")) if folder.is_dir() else []

    def cached_cubin(self, arch: str, nvcc: Nvcc | None = None) -> Path | None:
        """A cached cubin for ``arch`` whose hash verifies: built by ``nvcc`` when given, else the
        one built by the newest nvcc release (ties: the greatest file name)."""
        if nvcc is not None:
            path = self.cubin_path(arch, nvcc)
            return path if cubin_problem(path) is None else None
        verified = [p for p in self.cached_entries(arch) if cubin_problem(p) is None]
        return max(verified, key=lambda p: (_entry_version(p), p.name), default=None)

    # ------------------------------------------------------------------ building

    def compile(self, arch: str, nvcc: Nvcc | None = None) -> Path:
        """Build the cubin for ``arch`` into the cache unless a verified one is there; return its path."""
        nvcc = nvcc or find_nvcc(self.language.name)
        final = self.cubin_path(arch, nvcc)
        if cubin_problem(final) is None:
            return final
        with _cache_io(final.parent):
            final.parent.mkdir(parents=True, exist_ok=True)
            with _file_lock(final.with_suffix(".lock")):
                if cubin_problem(final) is None:  # another process built it while we waited
                    return final
                _remove_stale_temp_files(final)
                self._build(arch, nvcc, final)
        return final

    def _build(self, arch: str, nvcc: Nvcc, final: Path) -> None:
        source = final.with_suffix(".cu")
        source.write_text(self.instantiation_source())
        built = _temp_file(final)
        try:
            command = self.compile_command(nvcc.path, arch, source, built)
            output = _run_compiler(command)
            image = built.read_bytes()
            problem = output.problem or self._built_image_problem(image)
            if problem is not None:
                raise TileCppCompileError(
                    f"nvcc failed to compile {self.instance_name} for {self.target_arch(arch)} ({problem}); "
                    f"generated source: {source}\ncommand: {' '.join(command)}\n{output.text}"
                )
            _store(final, built, image)
        finally:
            built.unlink(missing_ok=True)
        self._warn_on_performance_loss(output.text, arch)

    def _warn_on_performance_loss(self, compiler_text: str, arch: str) -> None:
        losses = [line.strip() for line in compiler_text.splitlines() if _PERFORMANCE_LOSS in line]
        if losses:
            warnings.warn(
                f"ptxas reports a performance loss in {self.instance_name} ({self.target_arch(arch)}):\n"
                + "\n".join(losses),
                KernelPerformanceWarning,
                stacklevel=4,
            )

    def _built_image_problem(self, image: bytes) -> str | None:
        if not image.startswith(b"\x7fELF"):
            return f"it exited 0 but wrote no ELF cubin ({len(image)} bytes)"
        try:
            self.mangled_name(image)
        except CudaDriverError as exc:
            return f"it exited 0 but its cubin lacks the kernel: {exc}"
        return None

    # ------------------------------------------------------------------ choosing the cubin to load

    def resolve_cubin(self, arch: str) -> Path:
        """The cubin to load: with a complete toolchain (nvcc, plus the CUTLASS headers for CUDA C++),
        this toolchain's (built or rebuilt if missing or corrupt); without, the verified cached one
        ``cached_cubin`` picks."""
        nvcc = nvcc_or_none(self.language.name)
        if nvcc is not None:
            return self.compile(arch, nvcc)
        chosen = self.cached_cubin(arch)
        if chosen is not None:
            return chosen
        entries = self.cached_entries(arch)
        if entries:
            raise self._corrupt_error(entries[-1], cubin_problem(entries[-1]) or "unknown", arch)
        target = self.target_arch(arch)
        raise CubinNotCachedError(
            f"no cached cubin for {self.instance_name} ({target}) in {cache_dir()}, and no nvcc for "
            f"{self.language.title} to build it. Either run `python -m tilegym precompile --arch {target}` with the "
            f"same {CACHE_ENV_VAR} on a machine with the toolchain, or install it: {self.language.install_hint}"
        )

    def _corrupt_error(self, cubin: Path, problem: str, arch: str) -> CorruptCubinError:
        return CorruptCubinError(
            f"cached cubin {cubin} is corrupt: {problem}. Delete it and its {HASH_SUFFIX} file, then rebuild it: "
            f"`python -m tilegym precompile --arch {self.target_arch(arch)}` (same {CACHE_ENV_VAR}) on a machine with "
            f"nvcc for {self.language.title}, or install it here: {self.language.install_hint}"
        )

    def verified_image(self, arch: str) -> tuple[Path, bytes]:
        """The cubin to load and its bytes, checked against its hash after reading."""
        cubin = self.resolve_cubin(arch)
        image = _read_cache_file(cubin)
        problem = _image_problem(cubin, image)
        nvcc = nvcc_or_none(self.language.name)
        if problem is not None and nvcc is not None:  # replaced between the check and the read
            cubin = self.compile(arch, nvcc)
            image = _read_cache_file(cubin)
            problem = _image_problem(cubin, image)
        if problem is not None:
            raise self._corrupt_error(cubin, problem, arch)
        return cubin, image

    def available(self, arch: str) -> bool:
        """True when this kernel can run for ``arch`` here: a verified cached cubin or a usable toolchain.

        A positive answer is remembered (cheap enough to ask on every op call).
        """
        if arch in self._available:
            return True
        try:
            self.target_arch(arch)
            found = toolchain_problem(self.language.name) is None or self.cached_cubin(arch) is not None
        except TileCppError:
            found = False
        if found:
            self._available.add(arch)
        return found

    # ------------------------------------------------------------------ loading and launching

    def function(self, device_index: int) -> Any:
        """The loaded ``CUfunction`` for the current context (loaded once per context)."""
        return self._loaded(device_index).handle

    def _loaded(self, device_index: int) -> _LoadedFunction:
        key = (_current_context(), device_index)
        loaded = self._functions.get(key)
        if loaded is not None:
            return loaded
        with self._load_lock:
            loaded = self._functions.get(key)
            if loaded is None:
                loaded = self._functions[key] = _LoadedFunction(self._load(device_index))
        return loaded

    def _load(self, device_index: int) -> Any:
        cubin, image = self.verified_image(_device_arch(device_index))
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

    def _loaded_for(self, device_index: int, shared_mem: int) -> _LoadedFunction:
        """The loaded function, allowed ``shared_mem`` bytes of dynamic shared memory."""
        loaded = self._loaded(device_index)
        if shared_mem > loaded.shared_limit:
            self._allow_shared_memory(loaded, shared_mem)
        return loaded

    def _allow_shared_memory(self, loaded: _LoadedFunction, shared_mem: int) -> None:
        drv = _driver()
        attribute = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        with self._load_lock:
            if shared_mem > loaded.shared_limit:
                call = f"cuFuncSetAttribute({self.instance_name}, MAX_DYNAMIC_SHARED_SIZE_BYTES={shared_mem})"
                _check(drv.cuFuncSetAttribute(loaded.handle, attribute, shared_mem), call)
                loaded.shared_limit = shared_mem

    def bind(
        self,
        device_index: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int] = (1, 1, 1),
        shared_mem: int = 0,
        early_start: bool = False,
    ) -> BoundLaunch:
        """A launch of this kernel with a fixed grid, block and shared memory on the current context.

        Loads the function now; each call of the result then only packs the arguments and calls
        ``cuLaunchKernel`` (the fast path of a plan). Not thread-safe: one argument buffer.
        ``early_start``: programmatic dependent launch after the stream's previous kernel (``BoundLaunch``).
        """
        loaded = self._loaded_for(device_index, shared_mem)
        buffer = _ParamBuffer(self.param_types)
        return BoundLaunch(self.instance_name, loaded.handle, buffer, grid, block, shared_mem, early_start)

    def max_active_clusters(
        self, device_index: int, grid: tuple[int, int, int], block: tuple[int, int, int], shared_mem: int
    ) -> int:
        """How many of this kernel's clusters (its compiled cluster shape) the device runs at once with
        ``block`` threads and ``shared_mem`` bytes per CTA: a one-wave grid must not exceed it."""
        drv = _driver()
        loaded = self._loaded_for(device_index, shared_mem)
        config = drv.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid
        config.blockDimX, config.blockDimY, config.blockDimZ = block
        config.sharedMemBytes = shared_mem
        call = f"cuOccupancyMaxActiveClusters({self.instance_name}, block={block}, shared_mem={shared_mem})"
        return int(_check(drv.cuOccupancyMaxActiveClusters(loaded.handle, config), call))

    def _launch(
        self,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        args: Sequence[Any],
        stream: int,
        device_index: int,
    ) -> None:
        loaded = self._loaded_for(device_index, shared_mem)
        buffer = getattr(self._local, "buffer", None)
        if buffer is None:
            buffer = self._local.buffer = _ParamBuffer(self.param_types)
        params = buffer.fill(args)
        gx, gy, gz = grid
        bx, by, bz = block
        err = _driver().cuLaunchKernel(loaded.handle, gx, gy, gz, bx, by, bz, shared_mem, stream, params, 0)
        _check(err, f"cuLaunchKernel({self.instance_name}, grid={grid}, block={block}, shared_mem={shared_mem})")


class TileCppKernel(CubinKernel):
    """A ``__tile_global__`` CUDA Tile C++ kernel; targets the plain arch it is asked for, sm_80 or newer."""

    language = TILE
    kernel_dir = OPS_DIR / "tilecpp"

    def target_arch(self, arch: str) -> str:
        # A device reports the plain arch ('sm_90'), which is what a launch looks up; an arch-specific
        # name ('sm_90a', as the cutlass kernels need) maps to it, so that `precompile --arch sm_90a`
        # builds the cubins that will be used rather than ones nothing loads.
        arch = normalize_arch(arch).removesuffix("a")
        if arch_generation(arch) < TILE_MIN_ARCH:
            raise UnsupportedArchError(
                f"CUDA Tile C++ needs sm_{TILE_MIN_ARCH} or newer, got {arch} (the tile toolchain generates no tile "
                "code below sm_80; sm_90 and sm_100 are the archs built and tested)"
            )
        return arch

    def launch(self, grid: tuple[int, int, int], args: Sequence[Any], stream: int, device_index: int) -> None:
        """Launch ``grid`` tiles on ``stream`` (a ``cudaStream_t`` address) with ``args`` in ``param_types`` order."""
        self._launch(grid, (1, 1, 1), 0, args, stream, device_index)


class CudaKernel(CubinKernel):
    """A ``__global__`` CUDA C++ kernel with the CuTe/CUTLASS headers on the include path.

    ``archs`` are the targets it can be built for (default sm_90a: CuTe kernels that use wgmma or
    TMA need the arch-specific sm_90a). A device or CLI arch maps to the target of the same name or
    its arch-specific ``a`` form ('sm_90' -> 'sm_90a').
    """

    language = CUDA
    kernel_dir = OPS_DIR / "cutlass"

    def __init__(
        self,
        header: str | Path,
        kernel_name: str,
        template_args: Sequence[str | int] = (),
        param_types: Sequence[str] = (),
        *,
        flags: Sequence[str] = (),
        archs: Sequence[str] = ("sm_90a",),
    ) -> None:
        super().__init__(header, kernel_name, template_args, param_types, flags=flags)
        self.archs = tuple(normalize_arch(a) for a in archs)

    def target_arch(self, arch: str) -> str:
        arch = normalize_arch(arch)
        for target in (arch, f"{arch}a"):
            if target in self.archs:
                return target
        raise UnsupportedArchError(
            f"these CUDA C++ kernels target {', '.join(self.archs)}, got {arch} "
            "(CuTe kernels with wgmma/TMA need sm_90a)"
        )

    def launch(
        self,
        grid: tuple[int, int, int],
        args: Sequence[Any],
        stream: int,
        device_index: int,
        *,
        block: tuple[int, int, int],
        shared_mem: int = 0,
    ) -> None:
        """Launch ``grid`` blocks of ``block`` threads with ``shared_mem`` bytes of dynamic shared memory.

        Above 48 KiB the function is allowed that much first (``cuFuncSetAttribute``, once per size increase).
        """
        self._launch(grid, block, shared_mem, args, stream, device_index)
