"""Sweep the Triton split kernel's tile configs per cache format on the GPU (a development tool).

    python benchmarks/sweep_triton_configs.py [--shapes 64x4096x16,64x4096x128] [--formats bf16,fp8,...]

For each shape and format it builds a plan per ``KernelConfig`` of a small grid (the library
default first), checks its output against the default config's (rel. L2, a wrong config shows
up as O(1)), times CUDA-graph replays of the planned call over rotating input sets, and prints
one table per shape, fastest first, with the same-run copy bandwidth as the ceiling. The
chosen defaults go into ``default_config``; the numbers into benchmarks/NOTES_triton.md.
"""

from __future__ import annotations

import argparse
import itertools

import torch

from tilegym.bench import fp8_dtype, measure_ceilings
from tilegym.ops.contract import validate_mla_decoding
from tilegym.ops.mla_decoding import Shape, kv_bytes_per_token, traffic_bytes
from tilegym.ops.triton.mla_decoding_split_kv import KernelConfig, TritonDecodePlan, default_config
from tilegym.testing import make_mla_inputs, pack_cache, relative_error
from tilegym.timing import time_calls

ROTATING_SETS = 4


def grid(block_h: int, fmt: str) -> list[KernelConfig]:
    """The configs tried: step length, warps, stages, occupancy (and fp8's one-tile variant)."""
    if block_h >= 64:
        choices = itertools.product((16, 32, 64), (8,), (1, 2, 3), (1,))
    else:
        choices = itertools.product((32, 64), (4, 8), (2, 3, 4), (2,))
    configs = [KernelConfig(block_h, n, w, s, programs_per_sm=p) for n, w, s, p in choices]
    if fmt == "fp8" and block_h < 64:
        configs += [
            KernelConfig(c.block_h, c.block_n, c.num_warps, c.num_stages, c.programs_per_sm, fp8_one_tile=True)
            for c in configs
            if c.num_warps == 4
        ]
    return configs


def op_tensors(shape: Shape, fmt: str, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    kv_dtype = fp8_dtype(torch.device("cuda")) if fmt == "fp8" else None
    x = make_mla_inputs(shape.batch, shape.heads, shape.seq_len, kv_dtype=kv_dtype, device="cuda", generator=g)
    if fmt in ("bf16", "fp8"):
        return {"q": x.q, "qpe": x.qpe, "kv": x.kv, "kpe": x.kpe, "kv_scale": x.kv_scale}
    return {"q": x.q, "qpe": x.qpe, **pack_cache(x, fmt).op_kwargs()}


def planned_run(plan: TritonDecodePlan, call) -> object:
    """A call of ``plan`` on one input set, writing (and returning) its own output buffer."""
    out = torch.empty_like(call.out)

    def run() -> torch.Tensor:
        plan.run(call.q, call.qpe, call.kv, call.kpe, call.kv_scale, out, None)
        return out

    return run


def sweep(shape: Shape, fmt: str, copy_gbps: float) -> None:
    sets = [op_tensors(shape, fmt, seed) for seed in range(ROTATING_SETS)]
    call = validate_mla_decoding(**sets[0])
    default = default_config(call)
    reference = None
    rows = []
    nbytes = traffic_bytes(shape, shape.batch * shape.seq_len, kv_bytes_per_token(fmt))
    for config in [default, *[c for c in grid(default.block_h, fmt) if c != default]]:
        try:
            plan = TritonDecodePlan(call, config)
            calls = [planned_run(plan, validate_mla_decoding(**tensors)) for tensors in sets]
            got = calls[0]().clone()
            torch.cuda.synchronize()
            reference = got if reference is None else reference
            err = relative_error(got, reference)
            us = time_calls(calls, torch.device("cuda"), warmup=3, repeat=15, use_graph=True).median_us
            rows.append((us, config, err))
        except Exception as exc:  # noqa: BLE001 - a config that does not fit (shared memory) is skipped
            rows.append((float("inf"), config, f"{type(exc).__name__}: {str(exc).splitlines()[0][:60]}"))
    print(f"\n## {shape.batch}x{shape.seq_len}x{shape.heads} {fmt} (default {default})")
    print("| us | % copy BW | block_n | warps | stages | programs/SM | one tile | vs default config |")
    print("|---|---|---|---|---|---|---|---|")
    for us, c, err in sorted(rows, key=lambda r: r[0])[:8]:
        pct = 100 * nbytes / (us * 1e3) / copy_gbps if us != float("inf") else 0
        mark = " (default)" if c == default else ""
        check = err if isinstance(err, str) else f"{err:.1e}"
        fields = (c.block_n, c.num_warps, c.num_stages, c.programs_per_sm, c.fp8_one_tile, check)
        print(f"| {us:.1f}{mark} | {pct:.0f} | " + " | ".join(map(str, fields)) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="64x4096x16,64x4096x128")
    parser.add_argument("--formats", default="bf16,fp8,fp8_ds_mla,mxfp4")
    args = parser.parse_args()
    ceilings = measure_ceilings(torch.device("cuda"))
    print(f"copy bandwidth in this run: {ceilings.copy_gbps:.0f} GB/s")
    for text in args.shapes.split(","):
        b, s, h = map(int, text.split("x"))
        for fmt in args.formats.split(","):
            sweep(Shape(b, s, h), fmt, ceilings.copy_gbps)


if __name__ == "__main__":
    main()
