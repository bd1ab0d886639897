"""``python -m tilegym precompile --arch sm_90 [--arch sm_100] [--backend tilecpp|cutlass|all] [--cache-dir DIR]``.

Builds every kernel variant of the NVIDIA compiled backends (tilecpp: CUDA Tile C++; cutlass:
CUDA C++ with CuTe) for each named arch into the cubin cache. Needs
the toolchain but no GPU: this is how a GPU machine without a suitable nvcc gets its cubins
(compile here, carry the cache there). A kernel that cannot target an arch is skipped for it
(one line); an arch that no selected kernel can target stops everything before any compile.

Exit status: 0 every variant ready; 1 a toolchain is missing, the cache folder is unusable or a
variant failed to build; 2 bad arguments (an arch no selected kernel supports, nothing to build).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tilegym.ops.cubin_loader import (
    CACHE_ENV_VAR,
    CacheDirError,
    CubinKernel,
    Nvcc,
    TileCppError,
    UnsupportedArchError,
    cache_dir,
    cubin_problem,
    find_nvcc,
    normalize_arch,
    prepare_cache_folder,
    toolchain_problem,
)

CUTLASS_MODULE = "tilegym.ops.cutlass"
USAGE_ERROR = 2


def tilecpp_kernels() -> list[CubinKernel]:
    """Every kernel variant the tilecpp backend may launch."""
    from tilegym.ops.tilecpp.mla_decoding_split_kv import all_kernels as split_kv_kernels
    from tilegym.ops.tilecpp.splitk_reduce import all_kernels as combine_kernels

    return split_kv_kernels() + combine_kernels()


def cutlass_kernels() -> list[CubinKernel]:
    """Every kernel variant the cutlass backend may launch (none when its module is not installed)."""
    if importlib.util.find_spec(CUTLASS_MODULE) is None:
        return []
    return list(importlib.import_module(CUTLASS_MODULE).all_kernels())


BACKEND_KERNELS: dict[str, Callable[[], list[CubinKernel]]] = {
    "tilecpp": tilecpp_kernels,
    "cutlass": cutlass_kernels,
}


def library_kernels(backend: str = "all") -> list[CubinKernel]:
    """Every kernel variant of ``backend`` (a name in ``BACKEND_KERNELS``, or "all")."""
    names = list(BACKEND_KERNELS) if backend == "all" else [backend]
    return [kernel for name in names for kernel in BACKEND_KERNELS[name]()]


@dataclass(frozen=True)
class Job:
    """One kernel variant to build for one target arch."""

    kernel: CubinKernel
    target: str


@dataclass
class Plan:
    """The jobs for the requested archs, what was skipped, and the archs nothing can target."""

    jobs: list[Job]
    skipped: list[str]
    unsupported: list[str]


def plan_jobs(kernels: list[CubinKernel], archs: list[str]) -> Plan:
    """Map each requested arch to each kernel's target arch; collect what cannot be targeted."""
    plan = Plan([], [], [])
    seen: set[tuple[int, str]] = set()
    for arch in archs:
        reasons: dict[str, int] = {}
        for kernel in kernels:
            try:
                target = kernel.target_arch(arch)
            except UnsupportedArchError as exc:
                reasons[str(exc)] = reasons.get(str(exc), 0) + 1
                continue
            if (id(kernel), target) not in seen:
                seen.add((id(kernel), target))
                plan.jobs.append(Job(kernel, target))
        if reasons and sum(reasons.values()) == len(kernels):
            plan.unsupported.append(f"{arch}: {'; '.join(reasons)}")
        else:
            plan.skipped += [f"{arch}: skipped {count} kernel variants: {why}" for why, count in reasons.items()]
    return plan


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tilegym precompile", description=__doc__.splitlines()[0])
    parser.add_argument("--arch", action="append", required=True, help="target arch, e.g. sm_90 (repeatable)")
    parser.add_argument("--backend", choices=[*BACKEND_KERNELS, "all"], default="all", help="default: all")
    parser.add_argument("--cache-dir", help=f"cubin cache folder (default: ${CACHE_ENV_VAR} or the XDG cache)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel nvcc processes")
    return parser


def _toolchains(jobs: list[Job]) -> dict[str, Nvcc] | str:
    """nvcc per language the jobs need, or the first reason one is missing."""
    found: dict[str, Nvcc] = {}
    for language in sorted({job.kernel.language.name for job in jobs}):
        problem = toolchain_problem(language)
        if problem is not None:
            return problem
        found[language] = find_nvcc(language)
    return found


def _build(job: Job, nvcc: Nvcc) -> str:
    """Build (or find) one variant; say which."""
    path = job.kernel.cubin_path(job.target, nvcc)
    existed = path.is_file()
    problem = cubin_problem(path) if existed else None
    start = time.perf_counter()
    job.kernel.compile(job.target, nvcc)
    took = f"in {time.perf_counter() - start:.1f} s"
    how = "cached" if existed and problem is None else f"built {took}" if not existed else f"rebuilt {took}"
    corrupt = f" (corrupt cache entry: {problem})" if problem else ""
    return f"{job.target:8s} {job.kernel.instance_name:60s} {how:16s} {path.name}{corrupt}"


def _run_jobs(jobs: list[Job], nvccs: dict[str, Nvcc], workers: int) -> int:
    """Build every job, printing one line each; return the number that failed.

    A ``CacheDirError`` cancels the jobs not yet started and propagates: every job would fail alike.
    """
    failures = 0
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = [pool.submit(_build, job, nvccs[job.kernel.language.name]) for job in jobs]
        try:
            for future in futures:
                try:
                    print(future.result())
                except CacheDirError:
                    raise
                except TileCppError as exc:
                    failures += 1
                    print(f"FAILED: {exc}")
        except CacheDirError:
            pool.shutdown(cancel_futures=True)
            raise
    return failures


def _no_kernels_reason(backend: str) -> str:
    if backend in ("cutlass", "all") and importlib.util.find_spec(CUTLASS_MODULE) is None:
        return f"backend {backend} has no kernels to build ({CUTLASS_MODULE} is not part of this install)"
    return f"backend {backend} has no kernels to build"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.cache_dir:
        os.environ[CACHE_ENV_VAR] = args.cache_dir
    try:
        archs = list(dict.fromkeys(normalize_arch(a) for a in args.arch))
    except ValueError as exc:
        print(f"precompile: {exc}")
        return USAGE_ERROR
    kernels = library_kernels(args.backend)
    if not kernels:
        print(f"precompile: {_no_kernels_reason(args.backend)}")
        return USAGE_ERROR
    plan = plan_jobs(kernels, archs)
    if plan.unsupported:
        print(f"precompile: unsupported arch for backend {args.backend}: {' | '.join(plan.unsupported)}")
        return USAGE_ERROR
    nvccs = _toolchains(plan.jobs)
    if isinstance(nvccs, str):
        print(f"precompile: {nvccs}")
        return 1
    try:
        for target in sorted({job.target for job in plan.jobs}):
            prepare_cache_folder(target)
        for language, nvcc in nvccs.items():
            print(f"{language}: nvcc {nvcc.path} ({nvcc.version_text})")
        print(f"cache: {cache_dir()}")
        for line in plan.skipped:
            print(line)
        failures = _run_jobs(plan.jobs, nvccs, args.jobs)
    except CacheDirError as exc:
        print(f"precompile: {exc}")
        return 1
    print(f"{len(plan.jobs) - failures}/{len(plan.jobs)} kernel variants ready in {cache_dir()}")
    return 1 if failures else 0
