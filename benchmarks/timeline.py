"""Where a planned call's GPU time goes: each kernel's duration and the gaps between kernels, read from a
profiler trace of CUDA-graph replays (a development tool, GPU only).

    python benchmarks/timeline.py [--backend cutlass] [--suites many-heads] [--kv bf16|fp8]
        [--layout paged --page-size 64] [--tree DIR]...

For each shape of the suites: the bench's inputs and plan, one graph of ``--calls`` calls (rotating input
sets, as the bench times them), replayed under ``torch.profiler``. Kernel start and end times come from
CUPTI, so they hold at the clocks the GPU really ran, unlike ncu's one serialised launch at locked clocks.
Printed per shape: the period per call (first kernel start to last kernel end, over the calls), each
kernel's mean duration, and the mean gap between each pair of consecutive kernels (negative: they
overlapped, as programmatic dependent launches may). ``--tree DIR`` (cutlass): time the wgmma kernel of
another source tree too, swapped as ``ab_trees.py`` does (its cubins built with ``ab_build.sh``).
``--split`` (repeatable): the plan's ``kv_len_per_split`` in tokens, or ``Nrow`` for N times the shape's
sequence length (pieces that never cut a row of a full-length batch); default: the backend's choice.
``--segment-cost`` (repeatable): the schedule's cost of a segment start in tokens (the backend module's
``SEGMENT_COST_TOKENS`` and its variants), each value timed in turn. ``--merge`` (repeatable, cutlass):
``MERGE_MIN_QUERY_ROWS`` (0: never) for the plans made after, each value timed in turn.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import statistics
import tempfile
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from tilegym import bench
from tilegym.ops.mla_decoding import SUITES
from tilegym.timing import capture_graph

Kernel = tuple[str, float, float]  # name, start us, end us


def short_name(name: str) -> str:
    """A kernel's name without template arguments and parameters, cut to 40 characters."""
    return name.removeprefix("void ").split("(")[0].split("<")[0][-40:]


def trace_kernels(replay: Callable[[], None], rounds: int) -> list[Kernel]:
    """GPU kernels of ``rounds`` replays, in start order, from a profiler trace."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(rounds):
            replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    kernels = [
        (short_name(e["name"]), float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        for e in events
        if e.get("cat") == "kernel" and e.get("ph") == "X"
    ]
    return sorted(kernels, key=lambda k: k[1])


def summarise(kernels: Sequence[Kernel], calls: int) -> str:
    """Period per call, mean duration per kernel name, mean gap per consecutive pair of kernel names."""
    if len(kernels) < 2:
        return f"{len(kernels)} kernels traced (CUPTI saw no graph kernels?)"
    durations: dict[str, list[float]] = defaultdict(list)
    gaps: dict[str, list[float]] = defaultdict(list)
    for name, start, end in kernels:
        durations[name].append(end - start)
    for (a, _, a_end), (b, b_start, _) in zip(kernels, kernels[1:], strict=False):
        gaps[f"{a} -> {b}"].append(b_start - a_end)
    period = (kernels[-1][2] - kernels[0][1]) / calls
    parts = [f"period {period:.1f} us/call"]
    parts += [f"{n} {statistics.median(d):.1f} (x{len(d)})" for n, d in durations.items()]
    parts += [f"gap {n} {statistics.median(g):+.1f}" for n, g in gaps.items()]
    return "; ".join(parts)


def timeline(calls: Sequence[Callable[[], object]], rounds: int) -> str:
    graph = capture_graph(calls)
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    return summarise(trace_kernels(graph.replay, rounds), len(calls) * rounds)


def split_tokens(split: str | None, seq_len: int) -> int | None:
    """``--split``'s value in tokens: an int, or ``Nrow`` for N rows of ``seq_len``."""
    if split is None:
        return None
    return int(split[:-3]) * seq_len if split.endswith("row") else int(split)


def set_segment_cost(backend: str, tokens: int) -> None:
    """The schedule's segment cost of ``backend``'s plans made from now on (its module constants)."""
    module = importlib.import_module(f"tilegym.ops.{backend}.mla_decoding_split_kv")
    for name in (
        "SEGMENT_COST_TOKENS",
        "PAIR_SEGMENT_COST_TOKENS",
        "FP8_SEGMENT_COST_TOKENS",
        "GROUPED_SEGMENT_COST_TOKENS",
    ):
        if hasattr(module, name):
            setattr(module, name, tokens)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cutlass")
    ap.add_argument("--suites", default="many-heads")
    ap.add_argument("--kv", default="bf16", choices=("bf16", "fp8"))
    ap.add_argument("--layout", default="dense")
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--calls", type=int, default=16, help="calls per graph (input sets rotate)")
    ap.add_argument("--rounds", type=int, default=3, help="graph replays traced")
    ap.add_argument("--tree", action="append", default=[], help="cutlass: another source tree's kernel")
    ap.add_argument("--split", action="append", default=[], help="kv_len_per_split: tokens, or Nrow")
    ap.add_argument("--combine-rows", type=int, help="cutlass: most query rows per combine CTA")
    ap.add_argument("--segment-cost", type=int, action="append", default=[], help="segment start, tokens")
    ap.add_argument("--merge", type=int, action="append", default=[], help="cutlass: MERGE_MIN_QUERY_ROWS (0: never)")
    ap.add_argument("--early-merge-split", action="store_true", help="cutlass: the row-halves kernel as a PDL")
    ap.add_argument("--fp8-one-tile", action="store_true", help="cutlass: FP8_TWO_TILES off (17-32 fp8 rows)")
    a = ap.parse_args()
    if a.fp8_one_tile:
        from tilegym.ops.cutlass import mla_decoding_split_kv as cutlass_mla

        cutlass_mla.FP8_TWO_TILES = False
    if a.early_merge_split:
        from tilegym.ops.cutlass import mla_decoding_split_kv as cutlass_mla

        cutlass_mla.CutlassDecodePlan.early_merge_split = True
    dev = torch.device("cuda")
    kv = torch.float8_e4m3fn if a.kv == "fp8" else torch.bfloat16
    cfg = bench.BenchConfig(
        device=dev,
        dtype=torch.bfloat16,
        kv_dtype=kv,
        warmup=5,
        repeat=30,
        ceilings=None,
        layout=a.layout,
        page_size=a.page_size,
    )
    if a.combine_rows is not None:
        from tilegym.ops.cutlass import mla_decoding_split_kv as cutlass_mla

        cutlass_mla.COMBINE_MAX_ROWS_PER_CTA = a.combine_rows
    trees = a.tree or [None]
    if a.tree:
        import ab_trees  # beside this file
    for suite in a.suites.split(","):
        for shape in SUITES[suite]:
            data = bench.make_shape_data(shape, cfg)
            for tree in trees:
                if tree is not None:
                    ab_trees.use_tree(tree)
                for split in a.split or [None]:
                    for cost, merge in itertools.product(a.segment_cost or [None], a.merge or [None]):
                        tokens = split_tokens(split, shape.seq_len)
                        label = f"{shape.label} [{tree or a.backend}{'' if split is None else f', split {tokens}'}"
                        label += "" if cost is None else f", segment cost {cost}"
                        label += "]" if merge is None else f", merge {merge}]"
                        if cost is not None:
                            set_segment_cost(a.backend, cost)
                        if merge is not None:
                            cutlass = importlib.import_module("tilegym.ops.cutlass.mla_decoding_split_kv")
                            cutlass.MERGE_MIN_QUERY_ROWS = merge or None
                        try:
                            plan = bench.make_plan(a.backend, data, tokens)
                        except Exception as exc:  # a shape this backend does not serve
                            print(f"{label}: {type(exc).__name__}: {exc}", flush=True)
                            continue
                        sets = [bench.planned_call(plan, data, i) for i in range(len(data.sets))]
                        calls = [sets[i % len(sets)] for i in range(a.calls)]
                        print(f"{label}: {timeline(calls, a.rounds)}", flush=True)
            del data
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
