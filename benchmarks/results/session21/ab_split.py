"""Same-process A/B of the cutlass wgmma split kernel across source trees (session 15's tool; session 21
added the tree's TMA map encoding and --layout).

    python .ab/ab_split.py --precompile TREE...      # CPU machine: the bf16 (and fp8) variants of each tree
    python .ab/ab_split.py [--fp8] [--l2] [--reps N] TREE...   # GPU: one table, trees timed per shape in turn

Every tree's kernel is built from TREE/tilegym/ops/cutlass/mla_decoding_split_kv.cuh with this
tree's Python (the header is swapped and split_kernel's cache cleared), and the bf16 plan encodes its
TMA maps with TREE's own CutlassDecodePlan._encode_maps (loaded from TREE's mla_decoding_split_kv.py),
and launches it with TREE's thread counts and SHARED_BYTES. --l2: a paged copy of each shape whose page
table points every row at the same 128 pages (the KV stays in L2): a diagnostic of
how much of the time is waiting on DRAM; its results are wrong by construction and not checked.
"""

import argparse
import importlib.util
from pathlib import Path

import torch

from tilegym import bench
from tilegym.ops.cutlass import mla_decoding_split_kv as m
from tilegym.ops.mla_decoding import SUITES
from tilegym.timing import time_calls

ENCODERS = {}


def tree_encoder(tree: str):
    if tree not in ENCODERS:
        path = Path(tree).resolve() / "tilegym/ops/cutlass/mla_decoding_split_kv.py"
        spec = importlib.util.spec_from_file_location(f"ab_tree_{len(ENCODERS)}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        plans = (mod.CutlassDecodePlan, mod.CutlassFp8WideDecodePlan)
        ENCODERS[tree] = (plans[0]._encode_maps, plans[0].threads, plans[1].threads, mod.SHARED_BYTES)
    return ENCODERS[tree]


def use_tree(tree: str) -> None:
    m.HEADER = str(Path(tree).resolve() / "tilegym/ops/cutlass/mla_decoding_split_kv.cuh")
    m.split_kernel.cache_clear()
    encode, threads, fp8_threads, m.SHARED_BYTES = tree_encoder(tree)
    m.CutlassDecodePlan._encode_maps, m.CutlassDecodePlan.threads = encode, threads
    m.CutlassFp8WideDecodePlan.threads = fp8_threads


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--precompile", action="store_true")
    ap.add_argument("--fp8", action="store_true")
    ap.add_argument("--l2", action="store_true")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--suites", default="many-heads,mtp")
    ap.add_argument("--layout", default="dense")
    ap.add_argument("--page-size", type=int, default=64)
    a = ap.parse_args()
    if a.precompile:
        for tree in a.trees:
            use_tree(tree)
            for fp8 in (False, True):
                for pair in (False, True):
                    m.split_kernel(torch.bfloat16, pair, fp8=fp8).compile("sm_90a")
            print("built", tree, flush=True)
        return
    dev = torch.device("cuda")
    ceil = bench.measure_ceilings(dev)
    kv = torch.float8_e4m3fn if a.fp8 else torch.bfloat16
    layout = "paged" if a.l2 else a.layout
    cfg = bench.BenchConfig(
        device=dev,
        dtype=torch.bfloat16,
        kv_dtype=kv,
        warmup=5,
        repeat=30,
        ceilings=ceil,
        layout=layout,
        page_size=a.page_size,
    )
    print(
        f"copy {ceil.copy_gbps:.0f} GB/s, matmul {ceil.matmul_tflops:.0f} TFLOP/s; kv {kv}; l2 {a.l2}; "
        f"layout {layout} (pages of {a.page_size})",
        flush=True,
    )
    print("| shape | " + " | ".join(f"{t} #{r}" for r in range(a.reps) for t in a.trees) + " |", flush=True)
    for suite in a.suites.split(","):
        for shape in SUITES[suite]:
            data = bench.make_shape_data(shape, cfg)
            if a.l2:
                data.index["block_table"] = data.index["block_table"] % 128
            cells = []
            for _ in range(a.reps):
                for tree in a.trees:
                    use_tree(tree)
                    try:
                        plan = bench.make_plan("cutlass", data, None)
                    except Exception as exc:  # a shape this kernel does not serve
                        cells.append(type(exc).__name__)
                        continue
                    err = ""
                    if not a.l2:
                        e, problem = bench.check_result(bench.planned_call(plan, data, 0), data, 1.0)
                        err = f" ({e:.1e}{' ' + problem if problem else ''})"
                    calls = [bench.planned_call(plan, data, i) for i in range(len(data.sets))]
                    t = time_calls(calls, dev, warmup=5, repeat=30, use_graph=True).median_us
                    cells.append(f"{t:.1f}{err}")
                    del plan, calls
            print(f"| {shape.label} | " + " | ".join(cells) + " |", flush=True)
            del data
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
