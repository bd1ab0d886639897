"""Session 14's timing script for the A/B calls 4 and 7 (kept with their logs): cutlass on the fp8
`many-heads` and `mtp` shapes with the bench's inputs, CUDA-graph replay, the error printed but never a
failure (call 4's no-widening build is a timing diagnostic). Run from the root of the tree to time,
e.g. `PYTHONPATH=. python3 <path to this file> LABEL`; it prints one markdown row."""

import sys

import torch

from tilegym import bench
from tilegym.ops.mla_decoding import SUITES
from tilegym.timing import time_calls

tree = sys.argv[1]
ceilings = bench.measure_ceilings(torch.device("cuda"))
cfg = bench.BenchConfig(
    device=torch.device("cuda"),
    dtype=torch.bfloat16,
    kv_dtype=torch.float8_e4m3fn,
    warmup=5,
    repeat=30,
    ceilings=ceilings,
    kv_cache_format=None,
)
cells = []
for suite in ("many-heads", "mtp"):
    for shape in SUITES[suite]:
        data = bench.make_shape_data(shape, cfg)
        if bench.unsupported_reasons("cutlass", data, None):
            continue
        plan = bench.make_plan("cutlass", data, None)
        run = bench.planned_call(plan, data, 0)
        out = run()
        torch.cuda.synchronize()
        err, problem = bench.check_result(run, data, 1.0)
        calls = [bench.planned_call(plan, data, i) for i in range(len(data.sets))]
        t = time_calls(calls, cfg.device, warmup=5, repeat=30, use_graph=True).median_us
        cells.append(f"{shape.label}: {t:.1f} us (err {err:.1e})")
        del data, plan
        torch.cuda.empty_cache()
print(f"| {tree} (copy {ceilings.copy_gbps:.0f} GB/s) | " + " | ".join(cells) + " |", flush=True)
