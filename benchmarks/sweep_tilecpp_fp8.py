"""Time the Tile C++ split kernel's fp8 path under other tile configs on the GPU (a development tool).

    python benchmarks/sweep_tilecpp_fp8.py --compile [--configs 16x64x2,16x32x2]    # CPU machine
    python benchmarks/sweep_tilecpp_fp8.py [--shapes 64x4096x16] [--configs ...]     # GPU machine

A config is ``<query rows>x<tokens per step>x<CTAs per SM>`` (``TileConfig``); the library's fp8
config comes first. ``--compile`` builds the dense bf16-query fp8 variants into the cubin cache
(Tile C++ compiles only where the Tile toolchain is; carry the cache to the GPU). On the GPU each
config plans the call, is checked against float64 (rel. L2 on the first input set) and timed by
CUDA-graph replay over rotating input sets; one table per shape with the same-run copy ceiling.
"""

from __future__ import annotations

import argparse

import torch
from sweep_triton_configs import ROTATING_SETS, checked_time, float64_output, op_tensors  # same folder

from tilegym.ops.contract import validate_mla_decoding
from tilegym.ops.mla_decoding import Shape, kv_bytes_per_token, traffic_bytes
from tilegym.ops.tilecpp.mla_decoding_split_kv import (
    DENSE_ROWS,
    FP8_KV,
    SMALL_HEADS,
    TileConfig,
    TileCppDecodePlan,
    split_kernel,
)

DEFAULT_CONFIGS = "16x64x1,16x64x2,16x32x2,16x32x1"


def parse_configs(text: str) -> list[TileConfig]:
    configs = [TileConfig(*map(int, name.split("x"))) for name in text.split(",")]
    return [SMALL_HEADS, *[c for c in configs if c != SMALL_HEADS]]


def compile_variants(configs: list[TileConfig], arch: str) -> None:
    for config in configs:
        kernel = split_kernel(torch.bfloat16, config, DENSE_ROWS, FP8_KV)
        print(f"{config}: {kernel.compile(arch)}", flush=True)


def sweep(shape: Shape, configs: list[TileConfig], copy_gbps: float) -> None:
    sets = [op_tensors(shape, "fp8", seed) for seed in range(ROTATING_SETS)]
    call = validate_mla_decoding(**sets[0][0])
    reference = float64_output(*sets[0][1])
    nbytes = traffic_bytes(shape, shape.batch * shape.seq_len, kv_bytes_per_token("fp8"))
    print(f"\n## tilecpp: {shape.batch}x{shape.seq_len}x{shape.heads} fp8 (library config {SMALL_HEADS})")
    print("| us | % copy BW | query rows | tokens per step | CTAs per SM | rel. L2 vs float64 |")
    print("|---|---|---|---|---|---|")
    for config in configs:
        try:
            us, err = checked_time(TileCppDecodePlan(call, config), sets, reference)
            check = f"{err:.1e}"
        except Exception as exc:  # noqa: BLE001 - a variant that does not fit or was not compiled is reported
            us, check = float("inf"), f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
        pct = 100 * nbytes / (us * 1e3) / copy_gbps if us != float("inf") else 0
        print(
            f"| {us:.1f} | {pct:.0f} | {config.block_h} | {config.block_n} | {config.occupancy} | {check} |", flush=True
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="64x4096x16,128x8192x16")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help="rows x tokens x CTAs per SM, comma-separated")
    parser.add_argument("--compile", action="store_true", help="build the variants' cubins (no GPU needed)")
    parser.add_argument("--arch", default="sm_90")
    args = parser.parse_args()
    configs = parse_configs(args.configs)
    if args.compile:
        compile_variants(configs, args.arch)
        return
    from tilegym.bench import measure_ceilings

    ceilings = measure_ceilings(torch.device("cuda"))
    print(f"copy bandwidth in this run: {ceilings.copy_gbps:.0f} GB/s", flush=True)
    for text in args.shapes.split(","):
        sweep(Shape(*map(int, text.split("x"))), configs, ceilings.copy_gbps)


if __name__ == "__main__":
    main()
