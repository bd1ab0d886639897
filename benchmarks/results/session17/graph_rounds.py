"""Graph of one round vs graphs of several rounds: how much of a one-call sample is the replay's launch gap.

python .ab/graph_rounds.py   (GPU)
"""

import torch

from tilegym import bench
from tilegym.ops.mla_decoding import Shape
from tilegym.timing import time_calls

dev = torch.device("cuda")
ceil = bench.measure_ceilings(dev)
print(f"copy {ceil.copy_gbps:.0f} GB/s, matmul {ceil.matmul_tflops:.0f} TFLOP/s", flush=True)

# the gap itself: a graph of one tiny kernel
x = torch.randn(1024, device=dev)
y = torch.empty_like(x)
for us in (0, 2000):
    t = time_calls([lambda: torch.add(x, 1, out=y)], dev, warmup=5, repeat=50, use_graph=True, min_sample_us=us)
    print(
        f"tiny kernel, sample {us} us: {t.median_us:.2f} us per call ({t.calls_per_sample} calls per replay)",
        flush=True,
    )

shapes = {
    "bf16": [
        Shape(64, 4096, 16),
        Shape(128, 8192, 16),
        Shape(4, 1024, 16),
        Shape(64, 4096, 64),
        Shape(64, 4096, 128),
        Shape(128, 8192, 128),
        Shape(64, 4096, 16, 2),
    ],
    "fp8": [Shape(64, 4096, 16), Shape(128, 8192, 16), Shape(64, 4096, 128)],
}
print("| kv | shape | backend | 1 round (sets) | rounds to 2 ms (calls) | diff |", flush=True)
print("|---|---|---|---|---|---|", flush=True)
for kvname, kv in (("bf16", torch.bfloat16), ("fp8", torch.float8_e4m3fn)):
    cfg = bench.BenchConfig(device=dev, dtype=torch.bfloat16, kv_dtype=kv, warmup=5, repeat=30, ceilings=ceil)
    for shape in shapes[kvname]:
        data = bench.make_shape_data(shape, cfg)
        for backend in ("triton", "tilecpp", "cutlass"):
            if bench.unsupported_reasons(backend, data, None):
                continue
            plan = bench.make_plan(backend, data, None)
            e, problem = bench.check_result(bench.planned_call(plan, data, 0), data, 1e-2)
            calls = [bench.planned_call(plan, data, i) for i in range(len(data.sets))]
            cells = []
            for _rep in range(2):
                one = time_calls(calls, dev, warmup=5, repeat=30, use_graph=True, min_sample_us=0)
                many = time_calls(calls, dev, warmup=5, repeat=30, use_graph=True)
                cells.append((one, many))
            txt = " / ".join(f"{o.median_us:.1f}" for o, _ in cells)
            txt2 = " / ".join(f"{m.median_us:.1f}" for _, m in cells)
            d = sum(o.median_us - m.median_us for o, m in cells) / 2
            print(
                f"| {kvname} | {shape.label} | {backend} | {txt} ({len(calls)}) | "
                f"{txt2} ({cells[0][1].calls_per_sample}) | {d:.1f} | {e:.1e}{problem}",
                flush=True,
            )
            del plan, calls
        del data
        torch.cuda.empty_cache()
