"""``python -m tilegym precompile --arch sm_90 [--arch sm_100] [--cache-dir DIR]``.

Builds every Tile C++ kernel variant the library may launch, for each named arch, into the
cubin cache. Needs the Tile toolchain but no GPU: this is how a GPU machine without a
Tile-capable nvcc gets its cubins (compile here, carry the cache there).
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

from tilegym.ops.cubin_loader import CACHE_ENV_VAR, TileCppError, TileCppKernel, cache_dir, find_nvcc, normalize_arch


def library_kernels() -> list[TileCppKernel]:
    """Every kernel variant the tilecpp backend may launch."""
    from tilegym.ops.tilecpp.mla_decoding_split_kv import all_kernels as split_kv_kernels
    from tilegym.ops.tilecpp.splitk_reduce import all_kernels as combine_kernels

    return split_kv_kernels() + combine_kernels()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tilegym precompile", description=__doc__.splitlines()[0])
    parser.add_argument("--arch", action="append", required=True, help="target arch, e.g. sm_90 (repeatable)")
    parser.add_argument("--cache-dir", help=f"cubin cache folder (default: ${CACHE_ENV_VAR} or the XDG cache)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel nvcc processes")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cache_dir:
        os.environ[CACHE_ENV_VAR] = args.cache_dir
    try:
        archs = [normalize_arch(a) for a in args.arch]
        nvcc = find_nvcc()
    except (ValueError, TileCppError) as exc:
        print(f"precompile: {exc}")
        return 1
    print(f"nvcc: {nvcc.path} ({nvcc.version_text}); cache: {cache_dir()}")
    jobs = [(kernel, arch) for arch in archs for kernel in library_kernels()]

    def build(job: tuple[TileCppKernel, str]) -> str:
        kernel, arch = job
        cached = kernel.cached_cubin(arch, nvcc) is not None
        start = time.perf_counter()
        path = kernel.compile(arch, nvcc)
        how = "cached" if cached else f"built in {time.perf_counter() - start:.1f} s"
        return f"{arch}  {kernel.instance_name:60s} {how:16s} {path.name}"

    failures = 0
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(build, job) for job in jobs]
        for future in futures:
            try:
                print(future.result())
            except TileCppError as exc:
                failures += 1
                print(f"FAILED: {exc}")
    print(f"{len(jobs) - failures}/{len(jobs)} kernel variants ready in {cache_dir()}")
    return 1 if failures else 0
