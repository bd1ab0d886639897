"""H200 check + benchmark of the tilecpp backend, in one device call.

The GPU machine has no Tile-capable nvcc: build the cubins here first and carry the cache:
    TILEGYM_CACHE_DIR=.cache/tilecpp python -m tilegym precompile --arch sm_90
    TILEGYM_CACHE_DIR=.cache/tilecpp python benchmarks/dev_tilecpp.py --precompile-extras sm_90
then on the GPU machine, from the repo root:
    TILEGYM_CACHE_DIR=.cache/tilecpp PYTHONPATH=. python3 benchmarks/dev_tilecpp.py

1. Correctness vs the float64 oracle (bf16, fp16; kv_lens with zeros / ragged / out of range;
   user split lengths; strided views of one [B,S,576] buffer and separate tensors; H not a
   multiple of the head block; out=; lse), output poisoned with NaN first; both head blocks.
   splitk_reduce alone (empty splits, dtype mixes). Determinism. CUDA-graph capture/replay.
2. Ceiling measured in the same run (device-to-device copy), then graph-replayed timings of
   the benchmark shapes for a few launch configs, table last.
--round3 OUT_DIR: the 2-D combine tiles (checks, old vs new timings, the default each regime
   would pick and, if a default changes, the public-op checks and both benchmark suites).
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time
import traceback
from types import SimpleNamespace

import torch

from tilegym.bench import HEAD_DIM, ROPE_DIM, Shape, flop_count, traffic_bytes
from tilegym.ops import mla_decoding_split_kv, splitk_reduce
from tilegym.ops.contract import validate_mla_decoding
from tilegym.ops.cubin_loader import cache_dir, toolchain_problem
from tilegym.ops.tilecpp import splitk_reduce as combine_module
from tilegym.ops.tilecpp.mla_decoding_split_kv import (
    DTYPES,
    MANY_HEADS,
    SMALL_HEADS,
    TileConfig,
    launch_split_kv,
    split_kv_kernel,
    split_plan,
)
from tilegym.ops.tilecpp.mla_decoding_split_kv import mla_decoding_split_kv as tilecpp_mla
from tilegym.ops.tilecpp.splitk_reduce import DTYPE_PAIRS, combine_kernel, launch_combine
from tilegym.testing import REL_L2_TOLERANCE as TOL
from tilegym.testing import make_mla_inputs, mla_decode_float64, relative_error
from tilegym.timing import time_graph
from tilegym.utils import cdiv

D, P = HEAD_DIM, ROPE_DIM
DEV = "cuda"
# Tile configs beyond the library's defaults, built by --precompile-extras.
EXTRA_CONFIGS = [TileConfig(16, 64, 2), TileConfig(32, 64, 1)]
ALL_CONFIGS = [SMALL_HEADS, MANY_HEADS, *EXTRA_CONFIGS]
BENCH_SHAPES = [(64, 4096, 16), (128, 8192, 16), (64, 4096, 128), (4, 1024, 16), (1, 32768, 16)]
FAILURES: list[str] = []


def inputs(b: int, h: int, s: int, dtype: torch.dtype, seed: int, *, separate: bool = False) -> dict:
    """``make_mla_inputs`` drawn on the GPU by a seeded GPU generator (a CPU draw of a large cache
    takes seconds); kv/kpe are views of one [B,S,576] cache unless separate."""
    with torch.device(DEV):
        x = make_mla_inputs(b, h, s, D, P, dtype=dtype, device=DEV, generator=torch.Generator(DEV).manual_seed(seed))
    kv, kpe = (x.kv.contiguous(), x.kpe.contiguous()) if separate else (x.kv, x.kpe)
    return {"q": x.q, "qpe": x.qpe, "kv": kv, "kpe": kpe}


def rotation_sets(b: int, s: int, h: int) -> int:
    """Input sets to rotate through so that together they do not fit in L2 (at most 8)."""
    return max(1, min(8, math.ceil(200e6 / traffic_bytes(Shape(b, s, h), 2))))


def record(ok: bool, label: str, detail: str) -> None:
    print(f"  {'ok  ' if ok else 'FAIL'} {label:58s} {detail}", flush=True)
    if not ok:
        FAILURES.append(f"{label}: {detail}")


def check_mla(
    b: int,
    h: int,
    s: int,
    dtype: torch.dtype,
    *,
    lens: list[int] | None = None,
    split: int | None = None,
    separate: bool = False,
    config: TileConfig | None = None,
    seed: int = 0,
) -> None:
    x = inputs(b, h, s, dtype, seed, separate=separate)
    kv_lens = None if lens is None else torch.tensor(lens, dtype=torch.int32, device=DEV)
    out = torch.full((b, h, D), float("nan"), dtype=dtype, device=DEV)
    call = validate_mla_decoding(**x, kv_len_per_split=split, kv_lens=kv_lens, return_lse=True, out=out)
    lse = tilecpp_mla(call, config=config)
    torch.cuda.synchronize()
    ref, ref_lse = mla_decode_float64(**x, kv_lens=kv_lens)
    err = relative_error(out, ref)
    finite = torch.isfinite(ref_lse)
    lse_cpu = lse.cpu().double()
    lse_err = (lse_cpu[finite] - ref_lse[finite]).abs().max().item() if finite.any() else 0.0
    lse_inf_ok = bool(torch.equal(torch.isneginf(lse_cpu), ~finite))
    ok = bool(torch.isfinite(out).all()) and err < TOL[dtype] and lse_err < 1e-2 and lse_inf_ok
    cfg = "default" if config is None else f"{config.block_h}/{config.block_n}/{config.occupancy}"
    label = f"mla B={b} H={h} S={s} {str(dtype)[6:]} cfg={cfg} split={split} lens={lens is not None} sep={separate}"
    record(ok, label, f"rel.err {err:.2e}  lse max abs err {lse_err:.1e}  -inf rows ok {lse_inf_ok}")


def check_splitk(b: int, h: int, n: int, d: int, in_dtype: torch.dtype, out_dtype: torch.dtype) -> None:
    g = torch.Generator(device=DEV).manual_seed(n)
    partial = torch.randn(b, h, n, d, generator=g, device=DEV).to(in_dtype)
    lse = torch.randn(b, h, n, generator=g, device=DEV) * 3
    lse[0, 0, :] = float("-inf")  # an all-empty row -> zeros
    lse[-1, -1, ::2] = float("-inf")  # some empty splits
    out = torch.full((b, h, d), float("nan"), dtype=out_dtype, device=DEV)
    splitk_reduce(partial, lse, out=out, backend="tilecpp")
    torch.cuda.synchronize()
    ref = merged_float64(partial, lse)
    err = relative_error(out, ref)
    tol = 1e-5 if out_dtype == torch.float32 else TOL[out_dtype] / 2
    ok = bool(torch.isfinite(out).all()) and err < tol and bool((out[0, 0] == 0).all())
    record(ok, f"splitk_reduce B={b} H={h} N={n} D={d} {in_dtype}->{out_dtype}", f"rel.err {err:.2e}")


def merged_float64(partial: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Float64 merge of [B,H,N,D] partials by their lse [B,H,N] (an all -inf row gives zeros)."""
    partial, lse = partial.double().cpu(), lse.double().cpu()
    top = lse.amax(dim=-1, keepdim=True)
    weights = torch.exp(lse - top.masked_fill(top == float("-inf"), 0.0))
    total = weights.sum(dim=-1, keepdim=True)
    return torch.einsum("bhn,bhnd->bhd", weights / total.clamp_min(1e-300), partial)


def correctness() -> None:
    print("== correctness vs float64 oracle", flush=True)
    for dtype in (torch.bfloat16, torch.float16):
        for config in ALL_CONFIGS:
            opts = {"config": config}
            check_mla(1, 16, 1, dtype, **opts)
            check_mla(2, 16, 100, dtype, seed=1, **opts)
            check_mla(3, 16, 1000, dtype, seed=2, **opts)
            check_mla(4, 20, 333, dtype, seed=3, **opts)  # H not a multiple of the head block
            check_mla(2, 128, 2048, dtype, seed=4, **opts)
            check_mla(4, 16, 700, dtype, lens=[0, 1, 699, 350], seed=5, **opts)
            check_mla(3, 16, 500, dtype, lens=[-7, 10_000, 65], seed=6, **opts)  # clamped
            check_mla(2, 16, 1000, dtype, split=100, seed=7, **opts)  # not a multiple of 64
            check_mla(3, 16, 1000, dtype, split=5000, lens=[0, 999, 17], seed=8, **opts)  # one split: direct
            check_mla(2, 16, 777, dtype, split=1, lens=[3, 777], seed=9, **opts)  # 777 splits
            check_mla(2, 16, 300, dtype, separate=True, seed=10, **opts)
        check_mla(1, 16, 32768, dtype, seed=11)
        check_mla(2, 64, 4096, dtype, seed=12)
        check_mla(160, 16, 256, dtype, seed=13)  # >= 132 programs: one split, direct output
    for i, o in [(torch.float32, torch.bfloat16), (torch.float32, torch.float16), (torch.float32, torch.float32)]:
        for n in (1, 5, 8, 9, 37):  # both combine tiles
            check_splitk(3, 5, n, 512, i, o)
    check_splitk(2, 3, 1, 128, torch.bfloat16, torch.bfloat16)
    check_splitk(2, 3, 300, 64, torch.float16, torch.float16)
    check_splitk(70, 16, 6, 512, torch.float32, torch.bfloat16)  # rows not a multiple of the row tile


def check_public_api_and_graph() -> None:
    print("== public op, determinism, CUDA graph", flush=True)
    x = inputs(8, 16, 2048, torch.bfloat16, 20)
    lens = torch.tensor([2048, 0, 5, 1000, 2047, 64, 65, 3000], dtype=torch.int32, device=DEV)
    a = mla_decoding_split_kv(**x, kv_lens=lens, backend="tilecpp")
    b = mla_decoding_split_kv(**x, kv_lens=lens, backend="tilecpp")
    ref, _ = mla_decode_float64(**x, kv_lens=lens)
    record(bool(torch.equal(a, b)), "deterministic (same bits twice)", "")
    record(relative_error(a, ref) < TOL[torch.bfloat16], "public op with kv_lens", f"{relative_error(a, ref):.2e}")
    out = torch.empty_like(a)
    mla_decoding_split_kv(**x, kv_lens=lens, out=out, backend="tilecpp")  # warm-up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mla_decoding_split_kv(**x, kv_lens=lens, out=out, backend="tilecpp")
    fresh = inputs(8, 16, 2048, torch.bfloat16, 21)
    for k in ("q", "qpe"):
        x[k].copy_(fresh[k])
    x["kv"].copy_(fresh["kv"])
    x["kpe"].copy_(fresh["kpe"])
    lens.copy_(torch.tensor([17, 2048, 0, 1, 999, 4000, -3, 512], dtype=torch.int32))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref, _ = mla_decode_float64(**x, kv_lens=lens)
    err = relative_error(out, ref)
    record(err < TOL[torch.bfloat16], "CUDA graph replay on new inputs and kv_lens", f"rel.err {err:.2e}")


def copy_bandwidth() -> tuple[float, float]:
    """(SM copy kernel, graph memcpy node) device-to-device GB/s on 1 GiB, bytes read + written.

    Not tilegym.bench.measure_copy_gbps (an eager ``copy_``): the kernels here are timed as graph
    replays, where a captured ``copy_`` becomes a memcpy node, markedly slower than an SM kernel
    (NOTES_tilecpp.md); the ceiling is ``torch.mul(src, 1.0, out=dst)``, an SM kernel, and the memcpy
    node is reported beside it. dev_triton.py --round2 imports it.
    """
    src = torch.randn(256 * 2**20, device=DEV)  # 1 GiB
    dst = torch.empty_like(src)
    kernel_us = time_graph([lambda: torch.mul(src, 1.0, out=dst)], warmup=1, repeat=20).median_us
    memcpy_us = time_graph([lambda: dst.copy_(src)], warmup=1, repeat=20).median_us
    nbytes = 2 * src.numel() * 4
    return nbytes / kernel_us / 1e3, nbytes / memcpy_us / 1e3


def bench_shape(b: int, s: int, h: int, config: TileConfig, split: int | None, copy_gbs: float) -> dict:
    dtype = torch.bfloat16
    sets = rotation_sets(b, s, h)
    calls = [validate_mla_decoding(**inputs(b, h, s, dtype, 100 + i)) for i in range(sets)]
    opts = {"config": config, "kv_len_per_split": split}
    for call in calls:
        tilecpp_mla(call, **opts)
    # Spot-check the benchmarked config on its first rows against the oracle.
    rows = min(b, 2)
    c = calls[0]
    ref, _ = mla_decode_float64(c.q[:rows], c.qpe[:rows], c.kv[:rows], c.kpe[:rows])
    err = relative_error(c.out[:rows], ref)
    if err >= TOL[dtype]:
        FAILURES.append(f"bench shape {(b, s, h)} {opts}: rel.err {err:.2e}")
    plan = split_plan(calls[0], config, split)
    kernel = split_kv_kernel(dtype, config)
    partials = [
        (torch.empty(b, h, plan.num_splits, D, device=DEV), torch.empty(b, h, plan.num_splits, device=DEV))
        for _ in range(sets)
    ]
    state = {"i": 0}

    def both_stages() -> None:
        tilecpp_mla(calls[state["i"] % sets], **opts)
        state["i"] += 1

    def split_stage() -> None:
        i = state["i"] % sets
        launch_split_kv(calls[i], kernel, config, plan, partials[i] if plan.num_splits > 1 else None, None)
        state["i"] += 1

    per_graph = sets * max(1, 4 // sets)
    us = time_graph([both_stages] * per_graph, warmup=1, repeat=30).median_us
    split_us = time_graph([split_stage] * per_graph, warmup=1, repeat=30).median_us
    again_us = time_graph([both_stages] * per_graph, warmup=1, repeat=30).median_us  # spread of the same
    nbytes, flops = traffic_bytes(Shape(b, s, h), 2), flop_count(Shape(b, s, h))
    cfg = f"{config.block_h}/{config.block_n}/{config.occupancy} {plan.num_splits}x{plan.kv_len_per_split}"
    return {
        "shape": (b, s, h),
        "cfg": cfg,
        "us": us,
        "again_us": again_us,
        "split_us": split_us,
        "gbs": nbytes / us / 1e3,
        "pct": 100 * nbytes / us / 1e3 / copy_gbs,
        "tflops": flops / us / 1e6,
        "err": err,
    }


def eager_call_us(b: int, s: int, h: int, calls: int = 200) -> float:
    """Wall time per eager public-op call (validation, selection, launches), synchronised at the end."""
    x = inputs(b, h, s, torch.bfloat16, 7)
    out = torch.empty(b, h, D, dtype=torch.bfloat16, device=DEV)
    for _ in range(10):
        mla_decoding_split_kv(**x, out=out, backend="tilecpp")
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        mla_decoding_split_kv(**x, out=out, backend="tilecpp")
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def bench_configs(b: int, s: int, h: int) -> list[tuple[TileConfig, int | None]]:
    """(tile config, explicit split length or None for the default plan) to time for a shape."""
    occ2 = EXTRA_CONFIGS[0]
    if h > 16:
        return [(MANY_HEADS, None), (EXTRA_CONFIGS[1], None), (SMALL_HEADS, None), (occ2, None)]
    configs = [(SMALL_HEADS, None), (occ2, None)]
    shape = SimpleNamespace(batch=b, heads=h, seq_len=s, device=torch.device(DEV), kv_len_per_split=None)
    default_len = split_plan(shape, SMALL_HEADS).kv_len_per_split
    if 4 * default_len < s:  # fewer, longer splits: a cheaper combine against a less full GPU
        configs.append((SMALL_HEADS, 4 * default_len))
    return configs


def benchmark() -> list[dict]:
    print("== benchmark (bf16, graph replay, combine included)", flush=True)
    copy_gbs, memcpy_gbs = copy_bandwidth()
    print(f"device-to-device copy: kernel {copy_gbs:.0f} GB/s, memcpy {memcpy_gbs:.0f} GB/s (read + write)", flush=True)
    rows = []
    for b, s, h in BENCH_SHAPES:
        for config, split in bench_configs(b, s, h):
            try:
                row = bench_shape(b, s, h, config, split, copy_gbs)
            except Exception as exc:  # keep the other shapes' numbers
                traceback.print_exc()
                FAILURES.append(f"bench {(b, s, h)} {config} split={split}: {type(exc).__name__}: {exc}")
                continue
            rows.append(row)
            print(f"  {row}", flush=True)
    eager_us = eager_call_us(4, 1024, 16)
    print(f"\neager public-op call (4, 1024, 16), host-bound: {eager_us:.1f} us per call")
    print(f"copy kernel {copy_gbs:.0f} GB/s (memcpy node {memcpy_gbs:.0f}); bytes = B*S*1152 + B*H*2176;")
    print("FLOPs = 2*B*H*S*1088; us = both stages (again = 2nd measurement), split = stage 1 alone")
    print("config = heads/tokens per step/occupancy  splits x tokens per split")
    head = ("(B, S, H)", "config", "us", "again", "split", "GB/s", "%copy", "TF/s")
    print(f"{head[0]:16s} {head[1]:22s} " + " ".join(f"{x:>7s}" for x in head[2:]))
    for r in rows:
        print(
            f"{str(r['shape']):16s} {r['cfg']:22s} {r['us']:7.1f} {r['again_us']:7.1f} {r['split_us']:7.1f} "
            f"{r['gbs']:7.0f} {r['pct']:7.1f} {r['tflops']:7.1f}"
        )
    return rows


def precompile_extras(arch: str) -> None:
    """Build the benchmark-only tile variants into the cache (CPU machine, with nvcc)."""
    for dtype in DTYPES:
        for config in EXTRA_CONFIGS:
            print(split_kv_kernel(dtype, config).compile(arch))
    for tile in COMBINE_TILES:
        print(combine_kernel(torch.float32, torch.bfloat16, tile).compile(arch))
    for tile in ROUND3_TILES:
        for in_dtype, out_dtype in DTYPE_PAIRS:
            print(combine_kernel(in_dtype, out_dtype, tile).compile(arch))


# ----------------------------------------------------------------------------- round 2: the combine
# Combine tiles (rows, splits, columns) to compare (float32 -> bf16 only); v2's defaults are (8, 8, 64)
# for N <= 8 and (1, 16, 64) for N > 8. Round 2 measured these (and (8|16, 2, 64)) through a
# row-block-loop version of the kernel (commit b2f7627), which used more registers and was not kept.
COMBINE_TILES = [(8, 8, 64), (1, 16, 64), (32, 2, 64), (1, 64, 64), (1, 128, 32)]
# Combine tiles timed per benchmark shape; the first entry is the library default.
ROUND2_SHAPES: dict[tuple[int, int, int], list[tuple[int, int, int]]] = {
    (64, 4096, 16): [(8, 8, 64), (32, 2, 64)],
    (4, 1024, 16): [(1, 16, 64), (1, 64, 64)],
    (1, 32768, 16): [(1, 16, 64), (1, 64, 64), (1, 128, 32)],
}


def check_combine_tiles() -> None:
    """Every round-2 combine tile (and the capped, looping grid) vs a float64 merge."""
    print("== round 2: combine tiles vs float64", flush=True)
    for tile in COMBINE_TILES:
        for b, h, n in ((3, 5, 1), (70, 16, 2), (4, 16, 16), (1, 16, 128)):
            partial, lse = combine_case(b, h, n, torch.float32, n + b)
            check_combine(partial, lse, torch.bfloat16, tile, f"combine tile={tile} B={b} H={h} N={n}")
    for (b, s, h), combos in ROUND2_SHAPES.items():
        for tile in combos:
            for lens in (None, [0, s // 3 + 1] * (b // 2) if b > 1 else [s - 5]):
                label = f"mla {(b, s, h)} combine {tile} lens={lens is not None}"
                check_mla_tile(b, s, h, torch.bfloat16, tile, lens, 30, label, neg_inf_rows=False)


def combine_timings(b: int, s: int, h: int, tiles: list[tuple]):
    """Graph replays over rotating bf16 input sets: the split stage alone, then per combine tile
    yields (plan, split-stage us, tile, (both stages us, again, the combine alone us))."""
    sets = rotation_sets(b, s, h)
    calls = [validate_mla_decoding(**inputs(b, h, s, torch.bfloat16, 100 + i)) for i in range(sets)]
    plan = split_plan(calls[0], SMALL_HEADS)
    kernel = split_kv_kernel(torch.bfloat16, SMALL_HEADS)
    partials = (torch.randn(b, h, plan.num_splits, D, device=DEV), torch.randn(b, h, plan.num_splits, device=DEV))
    per_graph = sets * max(1, 4 // sets)
    state = {"i": 0}

    def split_stage() -> None:
        launch_split_kv(calls[state["i"] % sets], kernel, SMALL_HEADS, plan, partials, None)
        state["i"] += 1

    split_us = time_graph([split_stage] * per_graph, warmup=1, repeat=30).median_us
    for tile in tiles:

        def both(tile: tuple = tile) -> None:
            tilecpp_mla(calls[state["i"] % sets], combine_tile=tile)
            state["i"] += 1

        def combine_only(tile: tuple = tile) -> None:
            launch_combine(*partials, calls[0].out, None, tile=tile)

        us = time_graph([both] * per_graph, warmup=1, repeat=30).median_us
        again = time_graph([both] * per_graph, warmup=1, repeat=30).median_us
        comb = time_graph([combine_only] * 20, warmup=1, repeat=30).median_us
        yield plan, split_us, tile, (us, again, comb)


def round2_shape(b: int, s: int, h: int, tiles: list[tuple[int, int, int]]) -> list[tuple]:
    """Split stage alone, then per combine variant: both stages twice and the combine alone."""
    rows = []
    for plan, split_us, tile, (us, again, comb) in combine_timings(b, s, h, tiles):
        rows.append(((b, s, h), f"{plan.num_splits}x{plan.kv_len_per_split}", tile, us, again, split_us, comb))
        print(f"  {rows[-1]}", flush=True)
    return rows


def round2_bench() -> list[tuple]:
    """Graph-replayed end-to-end and combine-alone times for each shape and combine variant."""
    print("== round 2: timings (bf16, graph replay)", flush=True)
    copy_gbs, _ = copy_bandwidth()
    print(f"copy kernel (torch.mul, 1 GiB, read + write): {copy_gbs:.0f} GB/s", flush=True)
    rows = []
    for (b, s, h), combos in ROUND2_SHAPES.items():
        rows += round2_shape(b, s, h, combos)
    # Fewer, longer splits for the one long request (combine: the best-guess tile, and v2's).
    call = validate_mla_decoding(**inputs(1, 16, 32768, torch.bfloat16, 200))
    for split in (512, 1024):
        for tile in ((1, 16, 64), (1, 64, 64)):
            run = functools.partial(tilecpp_mla, call, kv_len_per_split=split, combine_tile=tile)
            us = time_graph([run], warmup=1, repeat=30).median_us
            rows.append(
                (
                    (1, 32768, 16),
                    f"{cdiv(32768, split)}x{split}",
                    tile,
                    us,
                    float("nan"),
                    float("nan"),
                    float("nan"),
                )
            )
            print(f"  {rows[-1]}", flush=True)
    print(f"\ncopy ceiling {copy_gbs:.0f} GB/s; us = both stages (again = 2nd measurement), split = stage 1 alone,")
    print("combine = the combine alone on the same partials (20 per graph); tile = (rows, splits, cols)")
    print(f"{'(B, S, H)':16s} {'splits':10s} {'tile':14s} {'us':>7s} {'again':>7s} {'split':>7s} {'comb':>7s}")
    for shape, plan_s, tile, us, again, split_us, comb in rows:
        print(f"{str(shape):16s} {plan_s:10s} {str(tile):14s} {us:7.1f} {again:7.1f} {split_us:7.1f} {comb:7.2f}")
    return rows


# ----------------------------------------------------------------------------- round 3: 2-D combine
# Rows-kernel tiles (BLOCK_R rows, BLOCK_D columns): a runtime loop over the splits, no split axis.
ROUND3_TILES = [(16, 64), (32, 64), (64, 64), (16, 128), (32, 128), (64, 128)]
ROUND3_SHAPES = [(64, 4096, 16), (32, 1024, 16), (64, 1024, 16), (4, 1024, 16), (1, 32768, 16)]
V2_DEFAULTS = (combine_module.ROWS_TILE, combine_module.SPLITS_TILE)  # v2's (few splits, many splits)
MIN_GAIN = 0.02  # a new default must beat the old by 2 % (end to end, summed over its regime's shapes)


def combine_case(b: int, h: int, n: int, in_dtype: torch.dtype, seed: int, *, n_alloc: int | None = None) -> tuple:
    """Random partials [B,H,N,D] (a view of [B,H,n_alloc,D] when given) and lse with an all-empty
    row (0, 0) and empty splits in the last row."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    partial = torch.randn(b, h, n_alloc or n, D, generator=g, device=DEV).to(in_dtype)[:, :, :n]
    lse = torch.randn(b, h, n, generator=g, device=DEV) * 3
    lse[0, 0, :] = float("-inf")
    lse[-1, -1, ::2] = float("-inf")
    return partial, lse


def check_combine(
    partial: torch.Tensor, lse: torch.Tensor, out_dtype: torch.dtype, tile: tuple | None, label: str
) -> None:
    """One launch (``tile``; None = the library default) vs a float64 merge: output and lse."""
    b, h = partial.shape[:2]
    out = torch.full((b, h, D), float("nan"), dtype=out_dtype, device=DEV)
    out_lse = torch.full((b, h), float("nan"), device=DEV)
    launch_combine(partial, lse, out, out_lse, tile=tile)
    torch.cuda.synchronize()
    err = relative_error(out, merged_float64(partial, lse))
    top = lse.double().amax(-1)
    ref_lse = top + torch.log(torch.exp(lse.double() - top.clamp_min(-1e300).unsqueeze(-1)).sum(-1))
    finite = torch.isfinite(top)
    lse_err = (out_lse.double()[finite] - ref_lse[finite]).abs().max().item()
    tol = 1e-5 if out_dtype == torch.float32 else TOL[out_dtype] / 2
    ok = err < tol and lse_err < 1e-4 and bool(torch.isneginf(out_lse[~finite]).all())
    ok = ok and bool((out[0, 0] == 0).all()) and bool(torch.isfinite(out).all())
    record(ok, label, f"rel.err {err:.2e} lse {lse_err:.1e}")


def check_round3_combines() -> None:
    """Every 2-D tile: combine alone (f32 -> bf16/fp16, N = 1, 2, 16, 128, empty rows and splits,
    rows not a multiple of the tile, a row stride that is not N * D), then end to end vs the oracle."""
    print("== round 3: 2-D combine tiles vs float64", flush=True)
    for tile in ROUND3_TILES:
        for out_dtype in DTYPES:
            for b, h, n in ((3, 5, 1), (70, 16, 2), (4, 16, 16), (1, 16, 128)):
                partial, lse = combine_case(b, h, n, torch.float32, n + b)
                check_combine(partial, lse, out_dtype, tile, f"combine {tile} B={b} H={h} N={n} {str(out_dtype)[6:]}")
        partial, lse = combine_case(5, 16, 3, torch.float32, 11, n_alloc=7)
        check_combine(partial, lse, torch.bfloat16, tile, f"combine {tile} N=3 of 7 (row stride 7*D)")
        for dtype in DTYPES:
            check_round3_end_to_end(tile, dtype)


def check_round3_end_to_end(tile: tuple, dtype: torch.dtype) -> None:
    """MLA through ``tile`` (N = 2 and N = 16), with empty and out-of-range kv_lens, vs the oracle."""
    for b, s, h in ((64, 1024, 16), (4, 1024, 16)):
        for lens in (None, [0, s // 3 + 1, -7, 10000] * (b // 4)):
            label = f"mla {(b, s, h)} {str(dtype)[6:]} combine {tile} lens={lens is not None}"
            check_mla_tile(b, s, h, dtype, tile, lens, 40, label)


def check_mla_tile(
    b: int,
    s: int,
    h: int,
    dtype: torch.dtype,
    tile: tuple,
    lens: list | None,
    seed: int,
    label: str,
    *,
    neg_inf_rows: bool = True,
) -> None:
    """MLA through combine ``tile`` vs the oracle on the first 4 rows (output poisoned with NaN);
    ``neg_inf_rows=False`` skips the check that empty rows get lse -inf (round 2 did not make it)."""
    x = inputs(b, h, s, dtype, seed)
    kv_lens = None if lens is None else torch.tensor(lens, dtype=torch.int32, device=DEV)
    out = torch.full((b, h, D), float("nan"), dtype=dtype, device=DEV)
    call = validate_mla_decoding(**x, kv_lens=kv_lens, return_lse=True, out=out)
    lse = tilecpp_mla(call, combine_tile=tile)
    rows = min(b, 4)
    sub = {k: v[:rows] for k, v in x.items()}
    ref, ref_lse = mla_decode_float64(**sub, kv_lens=None if kv_lens is None else kv_lens[:rows])
    err = relative_error(out[:rows], ref)
    finite = torch.isfinite(ref_lse)
    lse_err = (lse[:rows].cpu().double()[finite] - ref_lse[finite]).abs().max().item()
    ok = err < TOL[dtype] and lse_err < 1e-2 and bool(torch.isfinite(out).all())
    if neg_inf_rows:
        ok = ok and bool(torch.isneginf(lse[:rows].cpu()[~finite]).all())
    record(ok, label, f"rel.err {err:.2e} lse {lse_err:.1e}")


def check_public_splitk() -> None:
    """The public splitk_reduce op with the current defaults: every dtype pair, a strided view whose
    (batch, head) axes do not flatten (split-axis fallback), N = 1..128."""
    print(f"== public splitk_reduce, defaults {combine_module.default_tiles()}", flush=True)
    for in_dtype, out_dtype in DTYPE_PAIRS:
        for n in (1, 2, 5, 9, 128):
            check_splitk(3, 5, n, 512, in_dtype, out_dtype)
    partial = torch.randn(6, 8, 2, D, device=DEV)[::2]  # batch stride != heads * head stride
    lse = torch.randn(3, 8, 2, device=DEV)
    out = torch.empty(3, 8, D, dtype=torch.bfloat16, device=DEV)
    splitk_reduce(partial, lse, out=out, backend="tilecpp")
    err = relative_error(out, merged_float64(partial, lse))
    record(err < TOL[torch.bfloat16] / 2, "splitk_reduce strided batch (fallback tile)", f"rel.err {err:.2e}")


def round3_shape(b: int, s: int, h: int, tiles: list[tuple]) -> dict[tuple, tuple[float, float, float]]:
    """Split stage alone, then per combine tile: (both stages, again, the combine alone) in us."""
    results = {}
    for plan, split_us, tile, times in combine_timings(b, s, h, tiles):
        results["split"] = (split_us, plan.num_splits)
        results[tile] = times
        print(f"  {(b, s, h)} N={plan.num_splits} {tile}: {results[tile]}", flush=True)
    return results


def choose_defaults(timings: dict) -> tuple[tuple, tuple]:
    """Per regime (N <= 8, N > 8): the tile with the least end-to-end time summed over the regime's
    shapes, if it passed every check and beats v2's tile by MIN_GAIN; else v2's tile."""
    chosen = []
    for regime, old in enumerate(V2_DEFAULTS):
        shapes = [t for t in timings.values() if (t["split"][1] > combine_module.MAX_ROWS_TILE_SPLITS) == regime]
        total = {tile: sum(min(t[tile][:2]) for t in shapes) for tile in [old, *ROUND3_TILES]}
        clean = [tile for tile in ROUND3_TILES if not any(str(tile) in f for f in FAILURES)]
        best = min(clean, key=total.get, default=old)
        chosen.append(best if total[best] < (1 - MIN_GAIN) * total[old] else old)
        print(f"regime {'N > 8' if regime else 'N <= 8'}: summed us {total}; chosen {chosen[-1]}", flush=True)
    return chosen[0], chosen[1]


def round3_bench() -> tuple[tuple, tuple]:
    """Old vs new at ROUND3_SHAPES (graph replay, bf16); the table; the chosen defaults."""
    print("== round 3: timings (bf16, graph replay)", flush=True)
    timings = {shape: round3_shape(*shape, tiles=[*V2_DEFAULTS, *ROUND3_TILES]) for shape in ROUND3_SHAPES}
    print("\nus = both stages (again = 2nd measurement), split = stage 1 alone, comb = combine alone (20 per graph)")
    print(f"{'(B, S, H)':16s} {'N':>4s} {'tile':12s} {'us':>7s} {'again':>7s} {'split':>7s} {'comb':>7s}")
    for shape, t in timings.items():
        split_us, n = t["split"]
        for tile, times in t.items():
            if tile != "split":
                us, again, comb = times
                print(f"{str(shape):16s} {n:4d} {str(tile):12s} {us:7.1f} {again:7.1f} {split_us:7.1f} {comb:7.2f}")
    return choose_defaults(timings)


def round3(out_dir: str | None) -> None:
    """Checks, old-vs-new timings; if a default changes: public-op checks and the two bench suites."""
    check_round3_combines()
    few, many = round3_bench()
    if (few, many) == V2_DEFAULTS:
        print("defaults unchanged: no benchmark re-run", flush=True)
        return
    combine_module.FEW_SPLITS_TILE, combine_module.MANY_SPLITS_TILE = few, many
    check_public_splitk()
    if FAILURES:
        print("failures: no benchmark re-run", flush=True)
        return
    if out_dir:
        with open(f"{out_dir}/chosen_defaults.txt", "w") as f:
            f.write(f"FEW_SPLITS_TILE = {few}\nMANY_SPLITS_TILE = {many}\n")
    from tilegym.bench import main as bench_main

    for suite in ("deepseek", "amd-mixed-mla"):
        print(f"== bench {suite} with defaults {(few, many)}", flush=True)
        if bench_main(["--suite", suite, "--out-dir", f"benchmarks/results/{suite}"]) != 0:
            FAILURES.append(f"bench {suite} reported a failure")


def run_stages(*stages) -> int:
    """Run each stage, recording an exception as a failure; print the failures; 1 if any."""
    for stage in stages:
        try:
            stage()
        except Exception as exc:
            traceback.print_exc()
            name = getattr(stage, "func", stage).__name__  # a functools.partial: its function's name
            FAILURES.append(f"{name}: {type(exc).__name__}: {exc}")
    print(f"\n{len(FAILURES)} failure(s)" + "".join(f"\n  {f}" for f in FAILURES))
    return 1 if FAILURES else 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument("--round2", action="store_true", help="only the round-2 combine checks and timings")
    parser.add_argument("--round3", metavar="OUT_DIR", help="round-3 combine checks, timings, bench if adopted")
    parser.add_argument("--precompile-extras", metavar="ARCH", help="build benchmark-only variants, then exit")
    args = parser.parse_args()
    if args.precompile_extras:
        precompile_extras(args.precompile_extras)
        return 0
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}; cache {cache_dir()}")
    print(f"toolchain: {toolchain_problem() or 'Tile-capable nvcc found'}", flush=True)
    if args.round3:
        return run_stages(functools.partial(round3, args.round3))
    if args.round2:
        return run_stages(check_combine_tiles, round2_bench)
    return run_stages(correctness, check_public_api_and_graph, *(() if args.skip_bench else (benchmark,)))


if __name__ == "__main__":
    sys.exit(main())
