"""Compile-only CI tests of the Tile C++ backend (no GPU): every library kernel variant builds
for sm_90 and sm_100 with the pip toolchain; the cubin cache is reused, keyed and safe for
concurrent processes; every cubin has a matching hash file and a truncated one is rebuilt; nvcc
errors are reported; the wheel ships the .cuh sources.

Needs the ``tilecpp`` extra (nvcc >= 13.3 with Tile support); skipped without it.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from tilecpp_tiny import tiny_factor_header, tiny_kernel, write_tiny_sources

from tilegym.ops import cubin_loader as loader
from tilegym.ops.precompile import main as precompile_main
from tilegym.ops.precompile import tilecpp_kernels

REPO = Path(__file__).resolve().parents[1]
NVCC = loader.nvcc_or_none()
pytestmark = pytest.mark.skipif(NVCC is None, reason=f"no Tile-capable nvcc: {loader.toolchain_problem()}")


@pytest.fixture
def tiny_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(loader.CACHE_ENV_VAR, str(tmp_path / "cache"))
    return write_tiny_sources(tmp_path)


def test_every_library_variant_compiles_for_sm90_and_sm100(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv(loader.CACHE_ENV_VAR, str(cache))  # precompile sets it; monkeypatch restores it
    argv = ["--arch", "sm_90", "--arch", "sm_100", "--backend", "tilecpp", "--cache-dir", str(cache), "--jobs", "2"]
    assert precompile_main(argv) == 0
    printed = capsys.readouterr().out
    kernels = tilecpp_kernels()
    assert f"{2 * len(kernels)}/{2 * len(kernels)} kernel variants ready" in printed
    for arch in ("sm_90", "sm_100"):
        for kernel in kernels:
            cubin = kernel.cached_cubin(arch, NVCC)
            assert cubin is not None and cubin.parent == cache / arch, (kernel, arch)
            image = cubin.read_bytes()
            assert image.startswith(b"\x7fELF") and kernel.mangled_name(image).startswith(b"_Z"), kernel
            assert hash_file_digest(cubin) == hashlib.sha256(image).hexdigest()
    assert precompile_main(argv) == 0  # a second run finds every variant verified in the cache
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("sm_")]
    assert len(rows) == 2 * len(kernels) and all(" cached " in row for row in rows)


def hash_file_digest(cubin: Path) -> str:
    digest, name = cubin.with_name(cubin.name + ".sha256").read_text().split()
    assert name == cubin.name
    return digest


def test_precompile_reports_a_missing_toolchain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv(loader.NVCC_ENV_VAR, str(tmp_path / "no-nvcc"))
    monkeypatch.setenv(loader.CACHE_ENV_VAR, str(tmp_path / "c"))
    loader.clear_toolchain_cache()
    try:
        assert precompile_main(["--arch", "sm_90", "--cache-dir", str(tmp_path / "c")]) == 1
    finally:
        loader.clear_toolchain_cache()
    assert "pip install" in capsys.readouterr().out
    assert not (tmp_path / "c").exists()


def test_same_inputs_reuse_the_cubin_and_a_header_edit_rebuilds(tiny_dir: Path) -> None:
    first = tiny_kernel(tiny_dir).compile("sm_90")
    stamp = first.stat().st_mtime_ns
    assert tiny_kernel(tiny_dir).resolve_cubin("sm_90") == first
    assert first.stat().st_mtime_ns == stamp  # not rebuilt
    (tiny_dir / "tiny_factor.cuh").write_text(tiny_factor_header("3.0f"))
    second = tiny_kernel(tiny_dir).resolve_cubin("sm_90")
    assert second != first and second.is_file() and first.is_file()


def test_two_processes_compiling_the_same_kernel_leave_one_valid_cubin(tiny_dir: Path) -> None:
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from tilegym.ops.cubin_loader import TileCppKernel
        k = TileCppKernel(Path({str(tiny_dir)!r}) / "tiny.cuh", "tiny_scale_kernel", (128,), ("float*", "float"))
        print(k.compile("sm_90"))
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    paths = {out.strip() for out, _ in results}
    assert len(paths) == 1
    folder = tiny_dir / "cache" / "sm_90"
    assert [p.name for p in folder.glob("*.cubin")] == [Path(paths.pop()).name]
    assert not list(folder.glob("*.tmp"))
    cubin = next(folder.glob("*.cubin"))
    assert tiny_kernel(tiny_dir).mangled_name(cubin.read_bytes()) == b"_Z17tiny_scale_kernelILi128EEvPff"
    assert hash_file_digest(cubin) == hashlib.sha256(cubin.read_bytes()).hexdigest()


def test_a_truncated_cubin_is_rebuilt_into_a_working_one(tiny_dir: Path) -> None:
    cubin = tiny_kernel(tiny_dir).compile("sm_90")
    good = cubin.read_bytes()
    cubin.write_bytes(good[: len(good) // 2])
    assert tiny_kernel(tiny_dir).verified_image("sm_90") == (cubin, cubin.read_bytes())
    assert cubin.read_bytes().startswith(b"\x7fELF") and len(cubin.read_bytes()) == len(good)


def test_compile_error_shows_nvcc_message_and_source_path(tiny_dir: Path) -> None:
    (tiny_dir / "tiny_factor.cuh").write_text(tiny_factor_header("this_is_not_defined"))
    with pytest.raises(loader.TileCppCompileError) as err:
        tiny_kernel(tiny_dir).compile("sm_90")
    message = str(err.value)
    assert "this_is_not_defined" in message and "error" in message
    source = Path(message.split("generated source: ")[1].split("\n")[0])
    assert source.is_file() and "tiny_scale_kernel<128>" in source.read_text()
    assert not list((tiny_dir / "cache" / "sm_90").glob("*.cubin"))


def test_wheel_contains_the_kernel_sources(tmp_path: Path) -> None:
    # Build from a copy so the checkout gets no build/ or egg-info folders.
    src = tmp_path / "src"
    shutil.copytree(REPO / "tilegym", src / "tilegym", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "pyproject.toml", "README.md"):
        if (REPO / name).exists():
            shutil.copy(REPO / name, src / name)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), "."]
    subprocess.run(cmd, cwd=src, check=True, timeout=600)
    wheel = next(tmp_path.glob("tilegym-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {f"tilegym/ops/tilecpp/{p.name}" for p in (REPO / "tilegym/ops/tilecpp").glob("*.cuh")}
    assert len(expected) >= 3 and expected <= names
