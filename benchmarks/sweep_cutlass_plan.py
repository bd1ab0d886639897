"""Time variants of the cutlass backend's plan side by side in one device call (a development tool).

    python benchmarks/sweep_cutlass_plan.py [--specs mtp,many-heads,quantized+fp8] [--variants early,ordinary]
    python benchmarks/sweep_cutlass_plan.py --precompile   # on the CPU machine: every variant's cubins

For every shape of each spec (a suite name, ``+fp8`` / ``+fp8_ds_mla`` for a quantized cache) it plans
the call with the cutlass backend as ``python -m tilegym bench`` does (the same inputs, rotating sets
and float64 check) once per variant, and prints a markdown table with the same-run ceilings. Variants
(``VARIANTS``): ``early`` / ``ordinary``, the combine as a programmatic dependent launch or not;
``box64`` ... ``box8``, tokens per TMA box (a 64-token block as one box per 64-column tile, or as 2-8
boxes, which changes the order in which the block's bytes are asked of memory). Run
from an older tree (``PYTHONPATH=.ab/REF``, see ``ab_build.sh``) it times that tree's plan as built.
``--timed-if-wrong`` times a build whose float64 check fails too (a diagnostic build, e.g. one
that skips the fp8 widening), marking it WRONG. Kernel times move by several percent between device
calls: compare variants within one call only.
"""

from __future__ import annotations

import argparse

import torch

from tilegym import bench
from tilegym.ops.cutlass import mla_decoding_split_kv as cutlass_mla
from tilegym.ops.mla_decoding import SUITES
from tilegym.timing import time_calls

KV_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_ds_mla": torch.uint8}


def config(kv: str | None, ceilings: bench.Ceilings) -> bench.BenchConfig:
    return bench.BenchConfig(
        device=torch.device("cuda"),
        dtype=torch.bfloat16,
        kv_dtype=KV_DTYPES.get(kv, torch.bfloat16),
        warmup=5,
        repeat=30,
        ceilings=ceilings,
        kv_cache_format="fp8_ds_mla" if kv == "fp8_ds_mla" else None,
    )


def _box_rows(rows: int):
    return lambda self: min(rows, cutlass_mla.tma_box_rows(self.call))


# Variant name -> attributes set on the plan class for its plans (the fp8 plan inherits them).
VARIANTS = {
    "early": {"early_combine": True},
    "ordinary": {"early_combine": False},
    **{f"box{n}": {"_box_rows": _box_rows(n)} for n in (64, 32, 16, 8)},
}


def time_variant(data: bench.ShapeData, cfg: bench.BenchConfig, variant: str, timed_if_wrong: bool = False) -> str:
    """The cutlass plan's graph-replay time with ``variant``'s attributes ("as built": none); a wrong
    result is reported instead of timed unless ``timed_if_wrong`` (diagnostic builds)."""
    cls = cutlass_mla.CutlassDecodePlan
    saved = {name: cls.__dict__[name] for name in VARIANTS.get(variant, {})}
    for name, value in VARIANTS.get(variant, {}).items():
        setattr(cls, name, value)
    try:
        plan = bench.make_plan("cutlass", data, None)
    finally:
        for name, value in saved.items():
            setattr(cls, name, value)
    tolerance = bench.error_tolerance("cutlass", cfg.dtype, cfg.kv_format)
    err, problem = bench.check_result(bench.planned_call(plan, data, 0), data, tolerance)
    if problem and not timed_if_wrong:
        return f"FAILED: {problem}"
    calls = [bench.planned_call(plan, data, i) for i in range(len(data.sets))]
    timing = time_calls(calls, cfg.device, warmup=cfg.warmup, repeat=cfg.repeat, use_graph=True)
    mode = "" if timing.mode == "cuda-graph" else f" [{timing.mode}]"
    wrong = " WRONG" if problem else ""
    return f"{timing.median_us:.1f} us (err {err:.1e}{wrong}){mode}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", default="mtp,many-heads,quantized+fp8,quantized+fp8_ds_mla")
    parser.add_argument("--variants", default="early,ordinary")
    parser.add_argument("--tree", default="this tree", help="a label for the table")
    parser.add_argument(
        "--timed-if-wrong", action="store_true", help="time variants whose check fails (diagnostic builds)"
    )
    args = parser.parse_args()
    variants = args.variants.split(",") if hasattr(cutlass_mla.CutlassDecodePlan, "_box_rows") else ["as built"]
    ceilings = bench.measure_ceilings(torch.device("cuda"))
    copy, matmul = ceilings.copy_gbps, ceilings.matmul_tflops
    print(f"{args.tree}; same-run ceilings: copy {copy:.0f} GB/s, matmul {matmul:.1f} TFLOP/s")
    print("| spec | shape | " + " | ".join(variants) + " |")
    print("|---" * (len(variants) + 2) + "|")
    for spec in args.specs.split(","):
        suite, _, kv = spec.partition("+")
        cfg = config(kv or None, ceilings)
        for shape in SUITES[suite]:
            data = bench.make_shape_data(shape, cfg)
            if bench.unsupported_reasons("cutlass", data, None):
                continue
            cells = [time_variant(data, cfg, variant, args.timed_if_wrong) for variant in variants]
            print(f"| {spec} | {shape.label} | " + " | ".join(cells) + " |", flush=True)
            del data
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
