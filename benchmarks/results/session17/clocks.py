"""Is the slower sustained cutlass time at 128 heads the clock? Timings stamped to align with nvidia-smi."""

import time

import torch

from tilegym import bench
from tilegym.ops.mla_decoding import Shape
from tilegym.timing import time_calls

dev = torch.device("cuda")
ceil = bench.measure_ceilings(dev)
t0 = time.time()
print(f"t0 {t0:.3f}; copy {ceil.copy_gbps:.0f} GB/s, matmul {ceil.matmul_tflops:.0f} TFLOP/s", flush=True)
cfg = bench.BenchConfig(device=dev, dtype=torch.bfloat16, kv_dtype=torch.bfloat16, warmup=5, repeat=30, ceilings=ceil)
for shape in (Shape(128, 8192, 128), Shape(128, 8192, 16)):
    data = bench.make_shape_data(shape, cfg)
    for backend in ("cutlass", "triton", "cutlass"):
        plan = bench.make_plan(backend, data, None)
        calls = [bench.planned_call(plan, data, i) for i in range(len(data.sets))]
        for rep in range(3):
            for us in (0, 2000):
                a = time.time() - t0
                t = time_calls(calls, dev, warmup=5, repeat=30, use_graph=True, min_sample_us=us)
                b = time.time() - t0
                print(
                    f"{a:7.2f}-{b:7.2f} s {shape.label} {backend} rep {rep} min_sample {us}: {t.median_us:.1f} us "
                    f"(spread {t.spread_us:.1f}, {t.calls_per_sample} calls)",
                    flush=True,
                )
            time.sleep(1.0)  # idle: let clocks recover
        del plan, calls
    del data
    torch.cuda.empty_cache()
