"""Same-process A/B of the cutlass wgmma split kernel across source trees (a development tool).

    python benchmarks/ab_trees.py --precompile TREE...     # CPU machine: each tree's bf16 and fp8 variants
    python benchmarks/ab_trees.py [--fp8] [--reps N] [--suites many-heads,mtp] [--layout paged
        --page-size 64] [--l2] TREE...                     # GPU: one table, the trees timed per shape in turn

Kernel times move by up to ~10% between device calls, so a kernel change is timed against its baseline
in one process: ``bash benchmarks/ab_build.sh REF`` exports REF's tree to ``.ab/REF`` and builds the
cubins of both trees. Each tree's kernel is built from TREE/tilegym/ops/cutlass/mla_decoding_split_kv.cuh
with this tree's Python (the header is swapped and ``split_kernel``'s cache cleared); the plans take
TREE's own TMA map encoders, thread counts and shared-memory size (loaded from TREE's
mla_decoding_split_kv.py), so trees whose kernels differ in those too compare as built. Every cell is
checked against the float64 oracle first, to the backend's declared tolerance (the error, and any
problem, is printed beside the time). Rounds alternate the trees' order (the first timing of a shape
runs on a cooler GPU under the power limit). ``--l2``: a paged copy of each shape whose page table
points every row at the same 128 pages (the KV stays in L2), a diagnostic of how much of the time
waits on DRAM; its results are wrong by construction and not checked.
Only the wgmma kernel is swapped: an fp8 cache at up to 16 query rows runs this tree's 16-row kernel in
every column (time that kernel with the bench run in each tree). (Sessions 15 and 21 kept their own
copies of this tool under benchmarks/results/.)
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import torch

from tilegym import bench
from tilegym.ops.cutlass import mla_decoding_split_kv as m
from tilegym.ops.mla_decoding import SUITES
from tilegym.timing import time_calls

_TREES: dict[str, dict] = {}


def tree_settings(tree: str) -> dict:
    """What a tree's plans launch with: its header, map encoders, thread counts and shared memory."""
    if tree not in _TREES:
        path = Path(tree).resolve() / "tilegym/ops/cutlass/mla_decoding_split_kv.py"
        spec = importlib.util.spec_from_file_location(f"ab_tree_{len(_TREES)}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        _TREES[tree] = {
            "header": str(path.with_suffix(".cuh")),
            "shared": mod.SHARED_BYTES,
            "plans": {
                name: {
                    "_encode_maps": getattr(mod, name)._encode_maps,
                    "threads": getattr(mod, name).threads,
                    # Trees before session 23 launch the split kernel as an ordinary launch.
                    "early_split": getattr(getattr(mod, name), "early_split", False),
                }
                for name in ("CutlassDecodePlan", "CutlassFp8WideDecodePlan")
            },
        }
    return _TREES[tree]


def use_tree(tree: str) -> None:
    settings = tree_settings(tree)
    m.HEADER = settings["header"]
    m.split_kernel.cache_clear()
    m.SHARED_BYTES = settings["shared"]
    for name, attrs in settings["plans"].items():
        cls = getattr(m, name)
        for attr, value in attrs.items():
            # Set on each class itself: the fp8 plan inherits what it does not override.
            setattr(cls, attr, value)


def precompile(trees: list[str]) -> None:
    for tree in trees:
        use_tree(tree)
        for dtype in (torch.bfloat16, torch.float16):
            for fp8 in (False, True):
                for pair in (False, True):
                    m.split_kernel(dtype, pair, fp8=fp8).compile("sm_90a")
        print("built", tree, flush=True)


def time_cell(data: bench.ShapeData, device: torch.device, tolerance: float | None) -> str:
    """The tree's graph-replay time for ``data``, after its float64 check (skipped when ``tolerance`` is None)."""
    try:
        plan = bench.make_plan("cutlass", data, None)
    except Exception as exc:  # a shape this tree's kernel does not serve
        return type(exc).__name__
    err = ""
    if tolerance is not None:
        e, problem = bench.check_result(bench.planned_call(plan, data, 0), data, tolerance)
        err = f" ({e:.1e}{' ' + problem if problem else ''})"
    calls = [bench.planned_call(plan, data, i) for i in range(len(data.sets))]
    t = time_calls(calls, device, warmup=5, repeat=30, use_graph=True).median_us
    return f"{t:.1f}{err}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--precompile", action="store_true")
    ap.add_argument("--fp8", action="store_true", help="a per-tensor fp8 cache (else bf16)")
    ap.add_argument("--l2", action="store_true")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--suites", default="many-heads,mtp")
    ap.add_argument("--layout", default="dense")
    ap.add_argument("--page-size", type=int, default=64)
    a = ap.parse_args()
    if a.precompile:
        precompile(a.trees)
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
    tolerance = bench.error_tolerance("cutlass", cfg.dtype, cfg.kv_format)  # the backend's declared accuracy
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
            cells = {}
            for rep in range(a.reps):
                # ABBA: the tree timed first in a round runs on a cooler GPU (less power-capped), so the
                # order alternates between rounds (session 22's A/Bs showed a first-position advantage).
                for tree in a.trees if rep % 2 == 0 else reversed(a.trees):
                    use_tree(tree)
                    cells[rep, tree] = time_cell(data, dev, None if a.l2 else tolerance)
            row = [cells[rep, tree] for rep in range(a.reps) for tree in a.trees]
            print(f"| {shape.label} | " + " | ".join(row) + " |", flush=True)
            del data
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
