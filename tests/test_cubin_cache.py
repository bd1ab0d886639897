"""CPU tests of the cubin cache, with a fake nvcc (tests/fake_nvcc.py: a shell script that copies
an ELF-looking payload) instead of a compiler: hashes written and verified, corrupt entries rebuilt
or refused, the choice among toolchains, left-over temporary files, filesystem errors, the archs
each language accepts, the CUDA C++ flavour's sources and keys, and the launch parameters given to
a fake driver.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from cuda_tiny import vadd_kernel, write_cuda_sources
from fake_nvcc import FAKE_CUBIN, fail_with, flip_256_bytes
from tilecpp_tiny import tiny_kernel, write_cache_entry, write_tiny_sources

from tilegym.ops import cubin_loader as loader

HAS_CUTLASS = not isinstance(loader._search_cutlass(), loader.CutlassNotFoundError)
needs_cutlass = pytest.mark.skipif(not HAS_CUTLASS, reason="nvidia-cutlass is not installed (tilegym[cutlass])")


@pytest.fixture
def tiny_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(loader.CACHE_ENV_VAR, str(tmp_path / "cache"))
    write_cuda_sources(tmp_path)
    return write_tiny_sources(tmp_path)


def truncate(cubin: Path) -> None:
    cubin.write_bytes(cubin.read_bytes()[: cubin.stat().st_size // 2])


def empty(cubin: Path) -> None:
    cubin.write_bytes(b"")


def drop_hash(cubin: Path) -> None:
    cubin.with_name(cubin.name + ".sha256").unlink()


CORRUPTIONS: list[Callable[[Path], None]] = [truncate, empty, flip_256_bytes, drop_hash]


# ----------------------------------------------------------------------------- hashes


def test_a_build_stores_the_cubin_with_a_sha256sum_hash_file(tiny_dir: Path, fake_nvcc) -> None:
    fake_nvcc("13.5")
    cubin = tiny_kernel(tiny_dir).compile("sm_90")
    assert cubin.read_bytes() == FAKE_CUBIN
    stored = cubin.with_name(cubin.name + ".sha256").read_text()
    assert stored == f"{hashlib.sha256(FAKE_CUBIN).hexdigest()}  {cubin.name}\n"
    if shutil.which("sha256sum"):
        check = subprocess.run(["sha256sum", "-c", cubin.name + ".sha256"], cwd=cubin.parent)
        assert check.returncode == 0
    assert "-nvcc13.5-" in cubin.name


SERIALIZED = (
    "ptxas info    : (C7518) Potential Performance Loss: wgmma.mma_async instructions are serialized due to "
    "program dependence on compiler-inserted WG.DP in divergent path in the function 'tiny'"
)


def test_a_build_ptxas_reports_as_slow_warns_and_keeps_the_cubin(tiny_dir: Path, fake_nvcc) -> None:
    fake_nvcc("13.5", stderr=SERIALIZED)
    kernel = tiny_kernel(tiny_dir)
    with pytest.warns(loader.KernelPerformanceWarning, match=r"C7518.*serialized") as caught:
        cubin = kernel.compile("sm_90")
    assert kernel.instance_name in str(caught[0].message)
    assert cubin.read_bytes() == FAKE_CUBIN and loader.cubin_problem(cubin) is None


def test_a_clean_build_and_a_cache_hit_do_not_warn(tiny_dir: Path, fake_nvcc) -> None:
    fake_nvcc("13.5", stderr="ptxas info    : Used 40 registers")
    with warnings.catch_warnings():
        warnings.simplefilter("error", loader.KernelPerformanceWarning)
        first = tiny_kernel(tiny_dir).compile("sm_90")
        assert tiny_kernel(tiny_dir).compile("sm_90") == first


@pytest.mark.parametrize("corrupt", CORRUPTIONS)
def test_a_corrupt_entry_is_rebuilt_when_nvcc_is_there(tiny_dir: Path, fake_nvcc, corrupt) -> None:
    tool = fake_nvcc("13.5")
    cubin = tiny_kernel(tiny_dir).compile("sm_90")
    corrupt(cubin)
    assert tiny_kernel(tiny_dir).cached_cubin("sm_90", loader.find_nvcc()) is None
    assert tiny_kernel(tiny_dir).resolve_cubin("sm_90") == cubin
    assert tool.compiles() == 2
    assert cubin.read_bytes() == FAKE_CUBIN and loader.cubin_problem(cubin) is None


@pytest.mark.parametrize("corrupt", CORRUPTIONS)
def test_a_corrupt_entry_without_nvcc_is_refused_by_name(
    tiny_dir: Path, fake_nvcc, monkeypatch: pytest.MonkeyPatch, corrupt
) -> None:
    fake_nvcc("13.5")
    cubin = tiny_kernel(tiny_dir).compile("sm_90")
    corrupt(cubin)
    monkeypatch.setenv(loader.NVCC_ENV_VAR, str(tiny_dir / "no-nvcc"))
    loader.clear_toolchain_cache()
    kernel = tiny_kernel(tiny_dir)
    assert kernel.cached_cubin("sm_90") is None
    assert not kernel.available("sm_90")
    with pytest.raises(loader.CorruptCubinError) as err:
        kernel.verified_image("sm_90")
    assert str(cubin) in str(err.value) and "precompile --arch sm_90" in str(err.value)


def test_a_file_changed_after_the_check_is_caught_when_read(tiny_dir: Path, no_nvcc: None) -> None:
    kernel = tiny_kernel(tiny_dir)
    cubin = write_cache_entry(kernel.cubin_path("sm_90", loader.Nvcc("nvcc", (13, 5), "release 13.5")), FAKE_CUBIN)
    original = kernel.resolve_cubin

    def resolve_then_corrupt(arch: str) -> Path:
        path = original(arch)
        flip_256_bytes(path)
        return path

    kernel.resolve_cubin = resolve_then_corrupt
    with pytest.raises(loader.CorruptCubinError, match=str(cubin)):
        kernel.verified_image("sm_90")


# ----------------------------------------------------------------------------- choosing among toolchains


def test_without_nvcc_the_newest_verified_release_wins_not_the_newest_file(tiny_dir: Path, no_nvcc) -> None:
    kernel = tiny_kernel(tiny_dir)
    new = write_cache_entry(kernel.cubin_path("sm_90", loader.Nvcc("n", (13, 5), "release 13.5")), FAKE_CUBIN)
    old = write_cache_entry(kernel.cubin_path("sm_90", loader.Nvcc("n", (13, 3), "release 13.3")), FAKE_CUBIN)
    garbage = kernel.cubin_path("sm_90", loader.Nvcc("n", (13, 9), "release 13.9"))
    garbage.write_bytes(b"garbage")  # newest release and newest file, but no hash
    os.utime(new, (time.time() - 3600, time.time() - 3600))
    assert kernel.resolve_cubin("sm_90") == new
    flip_256_bytes(new)
    assert kernel.resolve_cubin("sm_90") == old


def test_with_nvcc_only_its_own_toolchain_entry_is_used(tiny_dir: Path, fake_nvcc) -> None:
    kernel = tiny_kernel(tiny_dir)
    other = write_cache_entry(kernel.cubin_path("sm_90", loader.Nvcc("n", (13, 9), "release 13.9")), FAKE_CUBIN)
    tool = fake_nvcc("13.5")
    chosen = kernel.resolve_cubin("sm_90")
    assert chosen != other and "-nvcc13.5-" in chosen.name and tool.compiles() == 1


def test_a_compiler_that_writes_garbage_cannot_replace_a_good_cubin(
    tiny_dir: Path, fake_nvcc, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_nvcc("13.5")
    good = tiny_kernel(tiny_dir).compile("sm_90")
    fake_nvcc("13.6", payload=b"garbage that is no cubin")
    with pytest.raises(loader.TileCppCompileError, match="no ELF cubin"):
        tiny_kernel(tiny_dir).compile("sm_90")
    fake_nvcc("13.7", payload=b"\x7fELF without the kernel's symbol")
    with pytest.raises(loader.TileCppCompileError, match="lacks the kernel"):
        tiny_kernel(tiny_dir).compile("sm_90")
    assert [p.name for p in good.parent.glob("*.cubin")] == [good.name]
    monkeypatch.setenv(loader.NVCC_ENV_VAR, str(tiny_dir / "no-nvcc"))
    loader.clear_toolchain_cache()
    assert tiny_kernel(tiny_dir).resolve_cubin("sm_90") == good


# ----------------------------------------------------------------------------- temporary files


def test_a_build_removes_temporary_files_a_killed_build_left(tiny_dir: Path, fake_nvcc) -> None:
    fake_nvcc("13.5")
    kernel = tiny_kernel(tiny_dir)
    final = kernel.cubin_path("sm_90", loader.find_nvcc())
    final.parent.mkdir(parents=True)
    own = final.with_name(f"{final.name}.abc123.tmp")  # this entry's: its lock is held, so it is dead
    old = final.with_name("other_kernel-sm_90-key.cubin.old.tmp")
    fresh = final.with_name("other_kernel-sm_90-key.cubin.busy.tmp")  # maybe another build's, in progress
    for path in (own, old, fresh):
        path.write_bytes(b"partial")
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    kernel.compile("sm_90")
    assert not own.exists() and not old.exists() and fresh.exists()
    assert sorted(p.name for p in final.parent.glob("*.tmp")) == [fresh.name]


# ----------------------------------------------------------------------------- filesystem errors


def test_a_cache_path_that_is_a_file_gives_one_clear_line(tiny_dir: Path, fake_nvcc, monkeypatch) -> None:
    fake_nvcc("13.5")
    blocker = tiny_dir / "cache-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(loader.CACHE_ENV_VAR, str(blocker))
    with pytest.raises(loader.CacheDirError) as err:
        tiny_kernel(tiny_dir).resolve_cubin("sm_90")
    message = str(err.value)
    assert str(blocker) in message and "not a folder" in message and loader.CACHE_ENV_VAR in message
    assert "\n" not in message


def test_a_read_only_cache_gives_one_clear_line(tiny_dir: Path, fake_nvcc, monkeypatch) -> None:
    fake_nvcc("13.5")
    monkeypatch.setattr(Path, "write_text", fail_with(errno.EROFS))
    with pytest.raises(
        loader.CacheDirError, match=f"Read-only file system.*set {loader.CACHE_ENV_VAR} to a writable folder"
    ):
        tiny_kernel(tiny_dir).compile("sm_90")


def test_a_full_disk_gives_one_clear_line_and_leaves_no_temporary_files(tiny_dir: Path, fake_nvcc, monkeypatch):
    fake_nvcc("13.5")
    monkeypatch.setattr(loader.os, "replace", fail_with(errno.ENOSPC))
    with pytest.raises(loader.CacheDirError, match="no space left") as err:
        tiny_kernel(tiny_dir).compile("sm_90")
    assert str(tiny_dir / "cache") in str(err.value) and "\n" not in str(err.value)
    monkeypatch.undo()
    assert not list((tiny_dir / "cache" / "sm_90").glob("*.tmp"))
    assert not list((tiny_dir / "cache" / "sm_90").glob("*.cubin*"))


# ----------------------------------------------------------------------------- archs


def test_tile_kernels_need_sm80_or_newer(tiny_dir: Path) -> None:
    kernel = tiny_kernel(tiny_dir)
    assert [kernel.target_arch(a) for a in ("80", "sm_90", "sm_100")] == ["sm_80", "sm_90", "sm_100"]
    # The arch-specific names map to the plain arch a device reports, which launches look up.
    assert [kernel.target_arch(a) for a in ("sm_90a", "sm_100a")] == ["sm_90", "sm_100"]
    with pytest.raises(loader.UnsupportedArchError, match="sm_80 or newer"):
        kernel.target_arch("sm_75")
    assert not kernel.available("sm_75")


@needs_cutlass
def test_cuda_kernels_map_a_device_arch_to_their_arch_specific_target(tiny_dir: Path) -> None:
    hopper_only = vadd_kernel(tiny_dir, archs=("sm_90a",))
    assert hopper_only.target_arch("sm_90") == hopper_only.target_arch("sm_90a") == "sm_90a"
    with pytest.raises(loader.UnsupportedArchError, match="sm_90a"):
        hopper_only.target_arch("sm_100")
    assert loader.CudaKernel(tiny_dir / "tiny_vadd.cuh", "k").archs == ("sm_90a",)


# ----------------------------------------------------------------------------- keys and sources of the two languages


@needs_cutlass
def test_cuda_kernels_instantiate_a_global_function_and_include_cutlass(tiny_dir: Path) -> None:
    kernel = vadd_kernel(tiny_dir)
    source = kernel.instantiation_source()
    assert "template __global__ void tiny_vadd_kernel<128>(const float*, const float*, float*, int);" in source
    command = kernel.compile_command("nvcc", "sm_90", Path("k.cu"), Path("k.cubin"))
    assert command[:4] == ["nvcc", "-cubin", "-std=c++17", "-arch=sm_90a"]
    include = loader.cutlass_include_dir()
    assert f"-I{include}" in command and (include / "cute" / "tensor.hpp").is_file()
    assert include.parts[-3:] == ("cutlass_library", "source", "include")


@needs_cutlass
def test_cuda_key_covers_language_and_cutlass_version(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    header = tiny_dir / "tiny_vadd.cuh"
    as_cuda = loader.CudaKernel(header, "tiny_vadd_kernel", (128,), archs=("sm_90",))
    as_tile = loader.TileCppKernel(header, "tiny_vadd_kernel", (128,))
    assert as_cuda.source_key("sm_90") != as_tile.source_key("sm_90")
    base = vadd_kernel(tiny_dir).source_key("sm_90a")
    include, _ = loader._search_cutlass()
    monkeypatch.setattr(loader, "_search_cutlass", lambda: (include, "nvidia-cutlass==9.9.9"))
    assert vadd_kernel(tiny_dir).source_key("sm_90a") != base


# ----------------------------------------------------------------------------- launching (fake driver)


class FakeDriver:
    """Records the driver calls a launch makes."""

    CUfunction_attribute = SimpleNamespace(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8)

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def cuCtxGetCurrent(self) -> tuple:
        return 0, 1

    def cuModuleLoadData(self, address: int) -> tuple:
        return 0, "module"

    def cuModuleGetFunction(self, module: str, name: bytes) -> tuple:
        self.calls.append(("function", name))
        return 0, "function"

    def cuFuncSetAttribute(self, function: str, attribute: int, value: int) -> tuple:
        self.calls.append(("set", function, attribute, value))
        return (0,)

    def cuLaunchKernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra) -> tuple:
        self.calls.append(("launch", (gx, gy, gz), (bx, by, bz), shared, stream))
        return (0,)


@pytest.fixture
def fake_driver(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    driver = FakeDriver()
    monkeypatch.setattr(loader, "_driver", lambda: driver)
    monkeypatch.setattr(loader, "_device_arch", lambda device_index: "sm_90")
    return driver


def test_tile_kernels_launch_one_thread_block_per_tile_without_shared_memory(tiny_dir, fake_nvcc, fake_driver):
    fake_nvcc("13.5")
    tiny_kernel(tiny_dir).launch((4, 1, 1), (1234, 2.0), 77, 0)
    assert fake_driver.calls == [
        ("function", b"_Z17tiny_scale_kernelILi128EEvPff"),
        ("launch", (4, 1, 1), (1, 1, 1), 0, 77),
    ]


@needs_cutlass
def test_cuda_kernels_opt_in_to_large_shared_memory_once(tiny_dir: Path, fake_nvcc, fake_driver) -> None:
    fake_nvcc("13.5")
    kernel = vadd_kernel(tiny_dir)
    args = (1, 2, 3, 100)
    kernel.launch((2, 1, 1), args, 5, 0, block=(128, 1, 1), shared_mem=16 * 1024)
    assert not [c for c in fake_driver.calls if c[0] == "set"]  # up to 48 KiB needs no opt-in
    for _ in range(2):
        kernel.launch((2, 1, 1), args, 5, 0, block=(128, 1, 1), shared_mem=100 * 1024)
    sets = [c for c in fake_driver.calls if c[0] == "set"]
    assert sets == [("set", "function", 8, 100 * 1024)]
    launches = [c for c in fake_driver.calls if c[0] == "launch"]
    assert launches[-1] == ("launch", (2, 1, 1), (128, 1, 1), 100 * 1024, 5)
    assert (tiny_dir / "cache" / "sm_90a").is_dir()
