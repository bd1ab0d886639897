"""Development sweep of the Tile C++ fp8-cache split kernel (benchmarks/NOTES_tilecpp.md, "fp8 cache").

``python dev_fp8.py --compile``: build every candidate variant here (CPU, pip toolchain).
``python dev_fp8.py``: on the GPU, for each shape and candidate (tile config x MMA dtype), check
the first rows against float64 and time both stages and the split stage alone (CUDA-graph
replay, median), next to the bf16 cache through the library's default plan; prints one table
and the same-run copy ceiling (``torch.mul`` 1 GiB read + write).

Runs 1 and 2 (``run1-dev-sweep.txt``, ``run2-dev-sweep.txt``) also listed the 16 x 64 bf16-MMA,
16 x 128, 32 x 64 and 32 x 128 candidates, dropped since (slower; see NOTES_tilecpp.md).
"""

from __future__ import annotations

import argparse
import sys

import torch

from tilegym.ops.contract import validate_mla_decoding
from tilegym.ops.tilecpp import mla_decoding_split_kv as m
from tilegym.ops.tilecpp.mla_decoding_split_kv import TileConfig
from tilegym.testing import mla_decode_float64, relative_error
from tilegym.timing import time_calls

BF16, FP16, FP8 = torch.bfloat16, torch.float16, m.FP8_KV
# (label, config, MMA dtype) per head regime
SMALL = [("16x64 f16-mma", TileConfig(16, 64, 1), FP16)]
MANY = [("16x64 f16-mma", TileConfig(16, 64, 1), FP16)]
SHAPES = [(64, 4096, 16), (128, 8192, 16), (4, 1024, 16), (64, 4096, 128)]
CHECK_ROWS = 2


def candidates(heads: int):
    return SMALL if heads <= 16 else MANY


def compile_all() -> None:
    for q_dtype in (BF16,):
        for group in (SMALL, MANY):
            for label, config, mma in group:
                kernel = m.split_kernel(q_dtype, config, m.DENSE_ROWS, FP8, mma)
                print(label, kernel.compile("sm_90"), flush=True)


def inputs(batch: int, seq: int, heads: int, kv_dtype: torch.dtype, q_dtype: torch.dtype = BF16):
    g = torch.Generator(device="cuda").manual_seed(batch * 7 + seq + heads)
    q = torch.randn(batch, heads, 512, device="cuda", generator=g).to(q_dtype)
    qpe = torch.randn(batch, heads, 64, device="cuda", generator=g).to(q_dtype)
    cache = torch.randn(batch, seq, 576, device="cuda", generator=g)
    scale = None
    if kv_dtype == FP8:
        scale = (cache.abs().amax() / torch.finfo(FP8).max).reshape(1).float()
        cache = (cache / scale).to(FP8)
    else:
        cache = cache.to(kv_dtype)
    return q, qpe, cache, scale


def timed(plan: m.TileCppDecodePlan, q, qpe, kv, kpe, scale, out) -> tuple[float, float]:
    full = time_calls(
        [lambda: plan.run(q, qpe, kv, kpe, scale, out, None)], q.device, warmup=3, repeat=30, use_graph=True
    )
    split_only = m.TileCppDecodePlan(plan.call, plan.config)
    split_only.split = plan.split
    split_only._launch_split = plan._launch_split
    split_only._launch_combine = lambda *args: None
    split = time_calls(
        [lambda: split_only.run(q, qpe, kv, kpe, scale, out, None)], q.device, warmup=3, repeat=30, use_graph=True
    )
    return full.median_us, split.median_us


def error(q, qpe, kv, kpe, scale, out) -> float:
    expected, _ = mla_decode_float64(
        q[:CHECK_ROWS], qpe[:CHECK_ROWS], kv[:CHECK_ROWS], kpe[:CHECK_ROWS], kv_scale=scale
    )
    return relative_error(out[:CHECK_ROWS], expected)


def row(label, batch, seq, heads, kv_dtype, us, split_us, err, copy_gbps) -> str:
    nbytes = batch * seq * 576 * (1 if kv_dtype == FP8 else 2) + batch * heads * 2176
    gbps = nbytes / (us * 1e3)
    name = "fp8" if kv_dtype == FP8 else "bf16"
    return (
        f"| {batch}, {seq}, {heads} | {name} | {label} | {us:.1f} | {split_us:.1f} | {gbps:.0f} | "
        f"{100 * gbps / copy_gbps:.0f}% | {err:.2e} |"
    )


def copy_ceiling_gbps() -> float:
    src = torch.randn(1 << 28, device="cuda")
    dst = torch.empty_like(src)
    copy = time_calls([lambda: torch.mul(src, 1.0, out=dst)], src.device, warmup=3, repeat=10, use_graph=False)
    return 2 * src.nbytes / (copy.median_us * 1e3)


def run(shapes, fp16_too: bool) -> None:
    copy_gbps = copy_ceiling_gbps()
    print(f"copy ceiling (torch.mul, 1 GiB, read + write): {copy_gbps:.0f} GB/s", flush=True)
    print("| (B, S, H) | cache | variant | us | split stage | GB/s | % of copy | rel. err (2 rows) |")
    print("|---|---|---|---|---|---|---|---|")
    for batch, seq, heads in shapes:
        q, qpe, cache, _ = inputs(batch, seq, heads, BF16)
        kv, kpe = cache[..., :512], cache[..., 512:]
        call = validate_mla_decoding(q, qpe, kv, kpe)
        plan = m.TileCppDecodePlan(call)
        out = call.out.squeeze(1)
        us, split_us = timed(plan, q, qpe, kv, kpe, None, out)
        c = plan.config
        print(
            row(
                f"default {c.block_h}x{c.block_n}",
                batch,
                seq,
                heads,
                BF16,
                us,
                split_us,
                error(q, qpe, kv, kpe, None, out),
                copy_gbps,
            ),
            flush=True,
        )
        del cache, kv, kpe
        for q_dtype in (BF16, FP16) if fp16_too else (BF16,):
            q, qpe, cache, scale = inputs(batch, seq, heads, FP8, q_dtype)
            kv, kpe = cache[..., :512], cache[..., 512:]
            call = validate_mla_decoding(q, qpe, kv, kpe, kv_scale=scale)
            out = call.out.squeeze(1)
            groups = candidates(heads) if q_dtype == BF16 else [("default", m.choose_config(call), None)]
            for label, config, mma in groups:
                plan = m.TileCppDecodePlan(call, config)
                if mma is not None:
                    plan.split = m.split_kernel(q_dtype, config, m.DENSE_ROWS, FP8, mma)
                    plan._launch_split = plan.split.bind(plan.device_index, plan.split_grid)
                out.fill_(float("nan"))
                try:
                    us, split_us = timed(plan, q, qpe, kv, kpe, scale, out)
                except Exception as exc:  # a candidate that fails to load or run: say so, go on
                    print(f"| {batch}, {seq}, {heads} | fp8 | {label} | failed: {str(exc)[:100]} |", flush=True)
                    continue
                name = label if q_dtype == BF16 else f"{label} (fp16 query)"
                print(
                    row(name, batch, seq, heads, FP8, us, split_us, error(q, qpe, kv, kpe, scale, out), copy_gbps),
                    flush=True,
                )
            del cache, kv, kpe
        torch.cuda.empty_cache()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args(argv)
    if args.compile:
        compile_all()
        return
    run(SHAPES, fp16_too=True)


if __name__ == "__main__":
    main(sys.argv[1:])
