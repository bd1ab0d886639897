"""H200 check + benchmark of the Triton backend, in one device call.

1. Compiles every kernel variant the run needs in parallel worker processes (the Triton
   cache is shared), so the sequential part below mostly hits the cache.
2. Correctness (bf16, fp16, fp8) with real compilation against the float64 oracle, output
   poisoned with NaN first; determinism; CUDA-graph capture/replay.
3. Ceilings measured in the same run (device-to-device copy, bf16 GEMM), then a sweep of
   kernel configs per benchmark shape, then a table (last) with ratios to the ceilings.

Run on the GPU machine from the repo root:
    PYTHONPATH=. python3 benchmarks/dev_triton.py [--quick] [--budget-s 250]
    PYTHONPATH=. python3 benchmarks/dev_triton.py --round2   # old vs new variants only
"""

from __future__ import annotations

import argparse
import concurrent.futures as futures
import multiprocessing
import sys
import time
import traceback
from dataclasses import dataclass, replace

import torch

from tilegym.bench import HEAD_DIM, ROPE_DIM, Shape, flop_count, measure_ceilings, traffic_bytes
from tilegym.ops import mla_decoding_split_kv
from tilegym.ops.contract import validate_mla_decoding
from tilegym.ops.triton.mla_decoding_split_kv import KernelConfig, default_config, mla_decode_into
from tilegym.testing import REL_L2_TOLERANCE as TOL
from tilegym.testing import make_mla_inputs, mla_decode_float64, relative_error
from tilegym.timing import capture_graph, time_graph

D, P = HEAD_DIM, ROPE_DIM
FP8 = torch.float8_e4m3fn
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: --smoke under TRITON_INTERPRET=1


@dataclass(frozen=True)
class Case:
    """One correctness or benchmark case (shapes, dtypes, options, kernel config)."""

    batch: int
    heads: int
    seq_len: int
    dtype: torch.dtype = torch.bfloat16
    kv_dtype: torch.dtype | None = None
    kv_lens: tuple[int, ...] | None = None
    split: int | None = None
    separate: bool = False  # kv / kpe as two contiguous tensors instead of views of one buffer
    return_lse: bool = True
    config: KernelConfig | None = None
    head_dim: int = D
    rope_dim: int = P

    @property
    def nbytes(self) -> int:
        """Fewest bytes moved (tilegym.bench.traffic_bytes; fp8 KV: 1 byte per cache element)."""
        shape = Shape(self.batch, self.seq_len, self.heads)
        return traffic_bytes(shape, (self.kv_dtype or self.dtype).itemsize, self.dtype.itemsize)

    @property
    def flops(self) -> int:
        return flop_count(Shape(self.batch, self.seq_len, self.heads))

    def label(self) -> str:
        kv = "fp8" if self.kv_dtype is not None else str(self.dtype).removeprefix("torch.")
        extras = [f"split={self.split}"] if self.split else []
        extras += ["lens"] if self.kv_lens else []
        extras += ["separate"] if self.separate else []
        return f"B={self.batch} H={self.heads} S={self.seq_len} {kv} {' '.join(extras)}".strip()


def gpu_inputs(case: Case, seed: int) -> dict:
    """``make_mla_inputs`` drawn on DEV by a seeded DEV generator (a CPU draw of a large cache takes
    seconds); kv / kpe are column views of one [B,S,D+P] cache unless ``case.separate``."""
    lens = None if case.kv_lens is None else list(case.kv_lens)
    with torch.device(DEV):
        g = torch.Generator(DEV).manual_seed(seed)
        shape = (case.batch, case.heads, case.seq_len, case.head_dim, case.rope_dim)
        x = make_mla_inputs(*shape, dtype=case.dtype, kv_dtype=case.kv_dtype, device=DEV, kv_lens=lens, generator=g)
    kv, kpe = (x.kv.contiguous(), x.kpe.contiguous()) if case.separate else (x.kv, x.kpe)
    return dict(q=x.q, qpe=x.qpe, kv=kv, kpe=kpe, kv_lens=x.kv_lens, kv_scale=x.kv_scale)


def run_case(case: Case, inp: dict, out: torch.Tensor | None = None):
    call = validate_mla_decoding(
        inp["q"],
        inp["qpe"],
        inp["kv"],
        inp["kpe"],
        None,
        case.split,
        kv_lens=inp["kv_lens"],
        kv_scale=inp["kv_scale"],
        return_lse=case.return_lse,
        out=out,
    )
    lse = mla_decode_into(call, case.config)
    return call.out, lse


def check_case(case: Case, seed: int, rows: int = 4) -> tuple[float, float]:
    """(rel. error of out vs float64 on the first ``rows`` batch rows, max |lse error|)."""
    inp = gpu_inputs(case, seed)
    out = torch.full((case.batch, case.heads, case.head_dim), float("nan"), dtype=case.dtype, device=DEV)
    out, lse = run_case(case, inp, out)
    if DEV == "cuda":
        torch.cuda.synchronize()
    r = min(rows, case.batch)
    lens = None if inp["kv_lens"] is None else inp["kv_lens"][:r]
    ref_out, ref_lse = mla_decode_float64(
        inp["q"][:r], inp["qpe"][:r], inp["kv"][:r], inp["kpe"][:r], kv_lens=lens, kv_scale=inp["kv_scale"]
    )
    if torch.isnan(out).any():
        return float("nan"), float("nan")
    err = relative_error(out[:r], ref_out)
    lse_err = 0.0
    if lse is not None:
        got = lse[:r].cpu().double()
        if not torch.equal(torch.isinf(got), torch.isinf(ref_lse)):
            return err, float("inf")
        finite = torch.isfinite(ref_lse)
        lse_err = (got[finite] - ref_lse[finite]).abs().max().item() if finite.any() else 0.0
    return err, lse_err


def correctness_cases() -> list[Case]:
    cases = []
    for dt in (torch.bfloat16, torch.float16):
        cases += [
            Case(1, 16, 1, dt),
            Case(3, 16, 129, dt, kv_lens=(129, 0, 77)),
            Case(2, 8, 1000, dt, kv_lens=(1000, 999), split=100),
            Case(2, 24, 1000, dt, kv_lens=(-5, 4000)),
            Case(2, 16, 777, dt, separate=True, return_lse=False),
            Case(4, 128, 517, dt, kv_lens=(517, 1, 0, 300)),
            Case(3, 16, 4096, dt, split=4096),  # one split: output written directly
            Case(64, 16, 4096, dt),
            Case(64, 128, 1024, dt),
        ]
    cases += [
        Case(2, 16, 1000, torch.bfloat16, FP8, kv_lens=(1000, 3)),
        Case(64, 16, 4096, torch.bfloat16, FP8),
        Case(2, 128, 300, torch.float16, FP8, split=64),
    ]
    return cases


def sweep_cases() -> dict[str, list[Case]]:
    """Benchmark shapes, each with the configs to try (the first is the default)."""

    def variants(base: Case, configs: list[KernelConfig]) -> list[Case]:
        default = default_for(base)
        out = [replace(base, config=default)]
        out += [replace(base, config=c) for c in configs if c != default]
        return out

    k = KernelConfig
    h16 = [
        k(16, 64, 4, 2, programs_per_sm=4),
        k(16, 64, 4, 3),
        k(16, 64, 4, 2, programs_per_sm=1),
        k(16, 32, 4, 3, programs_per_sm=4),
    ]
    h128 = [
        k(64, 64, 8, 2, programs_per_sm=1),
        k(64, 64, 8, 2),
        k(64, 32, 8, 3, programs_per_sm=1),
        k(64, 64, 8, 1, programs_per_sm=1),
        k(64, 128, 8, 1, programs_per_sm=1),
    ]
    fp8 = [
        k(16, 32, 4, 3),
        k(16, 32, 4, 3, fp8_v_fp16=False),
        k(16, 16, 4, 3),
        k(16, 16, 4, 4),
        k(16, 32, 8, 2),
        k(16, 32, 8, 3),
        k(16, 64, 8, 2),
        k(16, 64, 8, 2, fp8_v_fp16=False),
    ]
    long_one = [
        k(16, 128, 8, 2),
        k(16, 64, 4, 2, programs_per_sm=1),
        k(16, 64, 4, 3),
        k(16, 32, 4, 4),
        k(16, 128, 8, 2, programs_per_sm=1),
    ]
    small = [k(16, 32, 4, 2), k(16, 32, 4, 3), k(16, 64, 4, 2)]
    base16 = Case(64, 16, 4096, return_lse=False)
    big16 = Case(128, 16, 8192, return_lse=False)
    base128 = Case(64, 128, 4096, return_lse=False)
    # Fixed split lengths emulate a plan that rounds the split count DOWN to whole waves
    # (plan_splits rounds up): 64 rows x 4 splits = 256 programs <= 2 x 132 resident.
    waves = [
        replace(base16, split=1024, config=k(16, 64, 4, 2)),
        replace(base16, split=1024, config=k(16, 64, 4, 3)),
        replace(base16, split=512, config=k(16, 64, 4, 2)),
        replace(base16, split=1024, config=k(16, 128, 8, 2)),
        replace(base16, split=1024, config=k(16, 32, 4, 3)),
        replace(big16, split=4096, config=k(16, 64, 4, 2)),
        replace(base128, split=2048, config=k(64, 64, 8, 2)),
    ]
    return {
        "64,4096,16": variants(base16, h16),
        "128,8192,16": variants(big16, [k(16, 64, 4, 2, programs_per_sm=4)]),
        "64,4096,128": variants(base128, h128),
        "fp8 64,4096,16": variants(Case(64, 16, 4096, kv_dtype=FP8, return_lse=False), fp8),
        "1,32768,16": variants(Case(1, 16, 32768, return_lse=False), long_one),
        "4,1024,16": variants(Case(4, 16, 1024, return_lse=False), small),
        "fixed splits": waves,
    }


def default_for(case: Case) -> KernelConfig:
    """The config the library would pick for this case (tiny tensors with its B/H/D/P/dtypes)."""
    q = torch.empty(case.batch, case.heads, case.head_dim, dtype=case.dtype, device=DEV)
    qpe = torch.empty(case.batch, case.heads, case.rope_dim, dtype=case.dtype, device=DEV)
    kv_dtype = case.kv_dtype or case.dtype
    kv = torch.empty(case.batch, case.seq_len, case.head_dim, dtype=kv_dtype, device=DEV)
    kpe = torch.empty(case.batch, case.seq_len, case.rope_dim, dtype=kv_dtype, device=DEV)
    scale = 1.0 if case.kv_dtype is not None else None
    return default_config(validate_mla_decoding(q, qpe, kv, kpe, kv_scale=scale))


# ---------------------------------------------------------------- parallel compile
def _warm(case: Case) -> str:
    """Worker: run the case once so its kernels land in the shared Triton cache."""
    try:
        run_case(case, gpu_inputs(case, 0))
        torch.cuda.synchronize()
        return "ok"
    except Exception as exc:  # reported; the main process compiles it again for real
        return f"{type(exc).__name__}: {exc}"


def precompile(cases: list[Case], workers: int) -> None:
    t0 = time.time()
    ctx = multiprocessing.get_context("spawn")
    try:
        with futures.ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            results = list(pool.map(_warm, cases))
    except Exception as exc:
        print(f"precompile failed ({type(exc).__name__}: {exc}); compiling sequentially instead")
        return
    bad = [(c.label(), r) for c, r in zip(cases, results, strict=True) if r != "ok"]
    print(f"precompiled {len(cases)} variants in {time.time() - t0:.1f}s with {workers} workers; failures: {len(bad)}")
    for label, r in bad:
        print(f"  warm failure {label}: {r[:300]}")


# ---------------------------------------------------------------- timing
def graph_us(calls: list) -> float:
    """tilegym.timing.time_graph median (3 warm-up, 30 replays); on a CPU (--smoke) each call runs once: 0 us."""
    if DEV != "cuda":
        for fn in calls:
            fn()
        return 0.0
    return time_graph(calls, warmup=3, repeat=30).median_us


def rotation_sets(case: Case) -> int:
    """Input sets to rotate through so that together they do not fit in L2 (at most 16)."""
    return max(1, min(16, (200 << 20) // max(1, case.nbytes)))


def time_case(case: Case) -> float:
    """Per-call us from CUDA-graph replays (no host launch cost), rotating input sets when
    the working set would fit in L2; at least 4 calls per graph."""
    sets = rotation_sets(case)
    inputs = [gpu_inputs(case, 100 + i) for i in range(sets)]
    outs = [torch.empty(case.batch, case.heads, D, dtype=case.dtype, device=DEV) for _ in range(sets)]
    calls = [lambda i=i: run_case(case, inputs[i % sets], outs[i % sets]) for i in range(max(sets, 4))]
    return graph_us(calls)


def stage_times(case: Case) -> tuple[float, float, int]:
    """(stage-1 us, combine us, splits) of the case's config, each graph-replayed alone."""
    from tilegym.ops.triton.mla_decoding_split_kv import _launch_stage1, split_plan
    from tilegym.ops.triton.splitk_reduce import splitk_reduce_into

    sets = rotation_sets(case)
    stage1, combine = [], []
    for i in range(max(sets, 4)):
        inp = gpu_inputs(case, 200 + i) if i < sets else None
        if inp is None:
            stage1.append(stage1[i % sets])
            combine.append(combine[i % sets])
            continue
        call = validate_mla_decoding(
            inp["q"], inp["qpe"], inp["kv"], inp["kpe"], None, case.split, kv_scale=inp["kv_scale"]
        )
        plan = split_plan(call, case.config)
        po = torch.empty(case.batch, case.heads, plan.num_splits, D, dtype=torch.float32, device=DEV)
        pl = torch.empty(case.batch, case.heads, plan.num_splits, dtype=torch.float32, device=DEV)
        length = min(plan.kv_len_per_split, case.seq_len)
        stage1.append(
            lambda c=call, po=po, pl=pl, n=plan.num_splits, L=length: _launch_stage1(
                c, case.config, n, L, po, po.stride()[:3], pl, pl.stride()
            )
        )
        combine.append(lambda c=call, po=po, pl=pl: splitk_reduce_into(po, pl, c.out, None, case.config.reduce_tiles))
    return graph_us(stage1), graph_us(combine), plan.num_splits


def kernel_resources() -> list[str]:
    """Registers / spills / shared memory of every compiled stage-1 variant (best effort)."""
    from tilegym.ops.triton.mla_decoding_split_kv import _mla_split_kv_kernel

    lines = []
    try:
        for cache in _mla_split_kv_kernel.device_caches.values():
            for kernel in cache[0].values():
                c = kernel.metadata
                consts = getattr(getattr(kernel, "src", None), "constants", "")
                lines.append(
                    f"  regs={kernel.n_regs} spills={kernel.n_spills} smem={c.shared} "
                    f"warps={c.num_warps} stages={c.num_stages} {consts}"
                )
    except Exception as exc:
        lines.append(f"  (no resource report: {type(exc).__name__}: {exc})")
    return lines


def report_check(case: Case, seed: int, label: str) -> int:
    """Check ``case`` vs float64 (4 rows), print one ok/FAIL line; 1 on a failure or an exception."""
    try:
        err, lse_err = check_case(case, seed=seed)
    except Exception:
        print(f"FAIL {case.label()}: exception\n{traceback.format_exc()[-1500:]}")
        return 1
    ok = err <= TOL[case.dtype] and lse_err <= 1e-2
    print(f"{'ok  ' if ok else 'FAIL'} {label} rel={err:.2e} lse_abs={lse_err:.1e}")
    return int(not ok)


def checked_time(case: Case, seed: int) -> tuple[float, float | None]:
    """(rel. error of 2 rows vs float64, graph-replayed us or None when the error is over tolerance)."""
    err, _ = check_case(case, seed=seed, rows=2)
    return err, (time_case(case) if err <= TOL[case.dtype] else None)


# ---------------------------------------------------------------- main
def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget-s", type=float, default=250.0)
    parser.add_argument("--workers", type=int, default=12)
    parser.add_argument("--no-precompile", action="store_true")
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="CPU dry run of the script's logic (interpreter)")
    parser.add_argument("--round2", action="store_true", help="old vs new variants of performance round 2")
    args = parser.parse_args()
    t_start = time.time()
    if args.smoke:
        return smoke()
    if args.round2:
        return round2(args, t_start)
    import triton

    print(f"torch {torch.__version__} triton {triton.__version__} gpu {torch.cuda.get_device_name()}")
    checks = correctness_cases()
    sweeps = sweep_cases()
    if args.no_sweep:
        sweeps = {k: v[:1] for k, v in sweeps.items()}
    if not args.no_precompile:
        precompile(checks + [c for v in sweeps.values() for c in v], args.workers)

    print("\n== correctness vs float64 (first 4 rows; out poisoned with NaN) ==")
    failures = sum(report_check(case, i, f"{case.label():45s}") for i, case in enumerate(checks))

    print("\n== determinism, CUDA graph, public API ==")
    try:
        case = Case(4, 16, 1024)
        inp = gpu_inputs(case, 7)
        a, _ = run_case(case, inp)
        b, _ = run_case(case, inp)
        print(f"bitwise deterministic: {torch.equal(a, b)}")
        failures += not torch.equal(a, b)
        static = gpu_inputs(case, 8)
        out = torch.empty_like(a)

        def call():
            mla_decoding_split_kv(static["q"], static["qpe"], static["kv"], static["kpe"], out=out, backend="triton")

        g = capture_graph([call])
        fresh = gpu_inputs(case, 9)
        for key in ("q", "qpe", "kv", "kpe"):
            static[key].copy_(fresh[key])
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        ref, _ = mla_decode_float64(fresh["q"], fresh["qpe"], fresh["kv"], fresh["kpe"])
        err = relative_error(out, ref)
        print(f"graph replay on new inputs: rel={err:.2e} {'ok' if err < 1e-2 else 'FAIL'}")
        failures += not err < 1e-2
    except Exception:
        failures += 1
        print(f"FAIL graph/determinism\n{traceback.format_exc()[-1500:]}")

    print("\n== ceilings ==")
    ceilings = measure_ceilings(torch.device(DEV))
    copy_bw, gemm = ceilings.copy_gbps * 1e9, ceilings.matmul_tflops * 1e12
    print(f"copy {copy_bw / 1e9:.0f} GB/s (read+write), bf16 GEMM 8192^3 {gemm / 1e12:.0f} TFLOP/s")

    print("\n== sweep (time includes the combine) ==")
    rows = []
    for name, variants in sweeps.items():
        for case in variants:
            if time.time() - t_start > args.budget_s:
                print(f"budget reached, skipping {name} {case.config}")
                continue
            try:
                err, t = checked_time(case, seed=1000 + len(rows))
                if t is None:
                    failures += 1
                    print(f"FAIL {name} {case.config} split={case.split}: rel={err:.2e}")
                    continue
                bw = case.nbytes / (t * 1e-6)
                tf = case.flops / (t * 1e-6)
                rows.append((name, case, t, bw / copy_bw, tf / 1e12))
                print(
                    f"{name:16s} {case.config} split={case.split} rel={err:.1e} {t:8.1f} us "
                    f"{100 * bw / copy_bw:5.1f}% copyBW {tf / 1e12:6.1f} TF/s"
                )
            except Exception as exc:
                print(f"{name:16s} {case.config} ERROR {type(exc).__name__}: {str(exc)[:300]}")

    print("\n== stage times of the default config (graph replay, rotated inputs) ==")
    for name in ("64,4096,16", "1,32768,16", "4,1024,16", "fp8 64,4096,16"):
        try:
            t1, t2, n = stage_times(sweeps[name][0])
            print(f"{name:16s} splits={n:4d} stage1 {t1:7.1f} us  combine {t2:6.1f} us")
        except Exception as exc:
            print(f"{name:16s} stage times ERROR {type(exc).__name__}: {str(exc)[:300]}")

    print("\n== compiled stage-1 variants ==")
    print("\n".join(kernel_resources()))

    print(f"\n== best per shape (copy BW {copy_bw / 1e9:.0f} GB/s, GEMM {gemm / 1e12:.0f} TFLOP/s) ==")
    print(f"{'shape':16s} {'us':>8s} {'%copyBW':>8s} {'TFLOP/s':>8s}  config (default first row of sweep)")
    for name in sweeps:
        mine = [r for r in rows if r[0] == name]
        if not mine:
            continue
        default = mine[0]
        best = min(mine, key=lambda r: r[2])
        for tag, r in (("default", default), ("best", best)):
            c = r[1].config
            cfg = f"h{c.block_h} n{c.block_n} w{c.num_warps} s{c.num_stages} ppsm{c.programs_per_sm}"
            cfg += f" split={r[1].split}" if r[1].split else ""
            cfg += "" if c.fp8_v_fp16 or r[1].kv_dtype is None else " V-in-q-dtype"
            print(f"{name:16s} {r[2]:8.1f} {100 * r[3]:7.1f}% {r[4]:8.1f}  {tag}: {cfg}")
    print(f"\ncorrectness failures: {failures}; total {time.time() - t_start:.0f}s")
    return 1 if failures else 0


# ---------------------------------------------------------------- round 2: old vs new
def round2_cases() -> tuple[list[Case], list[tuple[str, str, Case]]]:
    """(extra correctness cases of the new variants, (shape, variant name, case) to time)."""
    from tilegym.ops.triton.splitk_reduce import ROUND1_TILES, WIDE_TILES, ReduceTiles

    k = KernelConfig
    mid = ReduceTiles(tile_elements=8192, min_block_d=32, programs_per_sm=2)  # = DEFAULT_TILES at 128 splits
    one = dict(fp8_one_tile=True)
    checks = [
        Case(2, 16, 1000, kv_dtype=FP8, kv_lens=(1000, 3), config=k(16, 64, 8, 2, **one)),
        Case(64, 16, 4096, kv_dtype=FP8, config=k(16, 64, 8, 2, **one)),
        Case(64, 16, 4096, kv_dtype=FP8, config=k(16, 32, 4, 3, **one)),
        Case(3, 16, 777, kv_dtype=FP8, kv_lens=(-1, 777, 400), config=k(16, 128, 8, 2, **one)),
        Case(2, 128, 300, torch.float16, FP8, split=64, config=k(64, 64, 8, 2, **one)),
        Case(1, 16, 32768, config=k(16, 128, 8, 2, programs_per_sm=1, reduce_tiles=WIDE_TILES)),
        Case(1, 16, 32768, config=k(16, 128, 8, 2, programs_per_sm=1, reduce_tiles=mid)),
        Case(64, 16, 4096, config=k(16, 64, 4, 2, reduce_tiles=WIDE_TILES)),
        Case(4, 16, 1024, config=k(16, 32, 4, 2, reduce_tiles=WIDE_TILES)),
    ]
    fp8 = Case(64, 16, 4096, kv_dtype=FP8, return_lse=False)
    fp8_variants = [
        ("old default n64 w8 s2 Vfp16", k(16, 64, 8, 2)),
        ("one-tile n64 w8 s2", k(16, 64, 8, 2, **one)),
        ("one-tile n64 w4 s2", k(16, 64, 4, 2, **one)),
        ("one-tile n64 w4 s3", k(16, 64, 4, 3, **one)),
        ("one-tile n32 w4 s2", k(16, 32, 4, 2, **one)),
        ("one-tile n32 w4 s3", k(16, 32, 4, 3, **one)),
        ("one-tile n128 w8 s2", k(16, 128, 8, 2, **one)),
        ("one-tile n64 w4 s2 ppsm1", k(16, 64, 4, 2, programs_per_sm=1, **one)),
    ]
    long_one = Case(1, 16, 32768, return_lse=False)
    n128 = dict(block_h=16, block_n=128, num_warps=8, num_stages=2, programs_per_sm=1)
    long_variants = [
        ("old n128 w8 ppsm1, combine round1", k(**n128, reduce_tiles=ROUND1_TILES)),
        ("n128 w8 ppsm1, combine wide(d16)", k(**n128, reduce_tiles=WIDE_TILES)),
        ("n128 w8 ppsm1, combine mid(d32)", k(**n128, reduce_tiles=mid)),
        ("n64 w4 ppsm1, combine wide(d16)", k(16, 64, 4, 2, programs_per_sm=1, reduce_tiles=WIDE_TILES)),
        ("n128 w8 split=512 (64 splits), wide", k(**n128, reduce_tiles=WIDE_TILES)),
    ]
    timed = [("fp8 64,4096,16", name, replace(fp8, config=c)) for name, c in fp8_variants]
    for name, c in long_variants:
        split = 512 if "split=512" in name else None
        timed.append(("1,32768,16", name, replace(long_one, config=c, split=split)))
    for shape, base in (
        ("64,4096,16", Case(64, 16, 4096, return_lse=False)),
        ("4,1024,16", Case(4, 16, 1024, return_lse=False)),
    ):
        default = default_for(base)
        timed.append(
            (shape, "default, combine round1", replace(base, config=replace(default, reduce_tiles=ROUND1_TILES)))
        )
        timed.append((shape, "default, combine wide", replace(base, config=replace(default, reduce_tiles=WIDE_TILES))))
    base128 = Case(64, 128, 4096, return_lse=False)
    timed.append(
        ("64,4096,128", "default h64 n64 w8 s2 ppsm1", replace(base128, config=k(64, 64, 8, 2, programs_per_sm=1)))
    )
    timed.append(("64,4096,128", "h64 n32 w8 s2 ppsm1", replace(base128, config=k(64, 32, 8, 2, programs_per_sm=1))))
    return checks, timed


def round2(args, t_start: float) -> int:
    import triton

    print(f"torch {torch.__version__} triton {triton.__version__} gpu {torch.cuda.get_device_name()}")
    checks, timed = round2_cases()
    precompile(checks + [c for _, _, c in timed], args.workers)
    print("\n== correctness of the new variants vs float64 (first 4 rows; out poisoned with NaN) ==")
    failures = sum(report_check(case, 500 + i, f"{case.label():40s} {case.config}") for i, case in enumerate(checks))
    from dev_tilecpp import copy_bandwidth  # the SM-kernel copy ceiling (see its docstring)

    copy_bw = copy_bandwidth()[0] * 1e9
    print(f"\ncopy ceiling (torch.mul 1 GiB fp32, read+write): {copy_bw / 1e9:.0f} GB/s")
    rows = []
    for shape, name, case in timed:
        if time.time() - t_start > args.budget_s:
            print(f"budget reached, skipping {shape} {name}")
            continue
        try:
            err, t = checked_time(case, seed=2000 + len(rows))
            if t is None:
                failures += 1
                print(f"FAIL {shape} {name}: rel={err:.2e}")
                continue
            rows.append((shape, name, t, case.nbytes / (t * 1e-6) / copy_bw, case.flops / (t * 1e-6)))
            print(f"{shape:16s} {name:38s} rel={err:.1e} {t:8.1f} us")
        except Exception as exc:
            print(f"{shape:16s} {name} ERROR {type(exc).__name__}: {str(exc)[:300]}")
    print("\n== combine alone (graph replay) ==")
    for shape, name, case in timed:
        if shape == "1,32768,16" and case.split is None and time.time() - t_start < args.budget_s + 20:
            try:
                t1, t2, n = stage_times(case)
                print(f"{shape:16s} {name:38s} splits={n:4d} stage1 {t1:6.1f} us combine {t2:6.1f} us")
            except Exception as exc:
                print(f"{shape} stage times ERROR {type(exc).__name__}: {str(exc)[:200]}")
    print("\n== compiled stage-1 variants ==")
    print("\n".join(kernel_resources()))
    print(f"\n== old vs new (copy {copy_bw / 1e9:.0f} GB/s; bytes with fp8 = 1 byte per cache element) ==")
    for shape, name, t, bw, fl in rows:
        print(f"{shape:16s} {name:38s} {t:8.1f} us {100 * bw:6.1f}% copyBW {fl / 1e12:7.1f} TFLOP/s")
    print(f"\ncorrectness failures: {failures}; total {time.time() - t_start:.0f}s")
    return 1 if failures else 0


def smoke() -> int:
    """Interpreter dry run: the small fp16 checks (bf16 dots are wrong in the interpreter)."""
    sweeps = sweep_cases()
    print({name: len(v) for name, v in sweeps.items()})
    failures = 0
    for i, case in enumerate(correctness_cases()):
        if case.dtype == torch.float16 and case.batch * case.seq_len * case.heads <= 40000:
            failures += report_check(case, i, f"{case.label():45s}")
    # No CUDA graphs on a CPU: graph_us runs each call once, so the plumbing is exercised.
    tiny = Case(2, 16, 300, torch.float16, return_lse=False, config=KernelConfig(16, 32, 4, 2))
    print("tiny sweep case", check_case(tiny, seed=1, rows=2), time_case(tiny), stage_times(tiny))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
