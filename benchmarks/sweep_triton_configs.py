"""Sweep the Triton split kernel's tile configs per cache format on the GPU (a development tool).

    python benchmarks/sweep_triton_configs.py [--shapes 64x4096x16,64x4096x128] [--formats bf16,fp8,...]
        [--configs default,n32w4s3f,...] [--tree LABEL] [--page-size 64] [--q-len 2]

For each shape and format it builds a plan per ``KernelConfig`` of a small grid (the library
default first; ``--configs`` names them instead: ``n<block_n>w<warps>s<stages>``, a trailing
``f`` for fp8 scores in fp16), checks its output against float64 (rel. L2 on the first input
set), times CUDA-graph replays of the planned call over rotating input sets, and prints one
table per shape, fastest first, with the same-run copy bandwidth as the ceiling. The chosen
defaults go into ``default_config``; the numbers into benchmarks/NOTES_triton.md. Run with
``PYTHONPATH=.ab/REF`` it times an older tree's kernel (``--tree`` labels the tables).
"""

from __future__ import annotations

import argparse
import itertools

import torch

from tilegym.bench import fp8_dtype, measure_ceilings
from tilegym.ops.contract import validate_mla_decoding
from tilegym.ops.mla_decoding import Shape, kv_bytes_per_token, traffic_bytes
from tilegym.ops.triton.mla_decoding_split_kv import KernelConfig, TritonDecodePlan, default_config
from tilegym.testing import cache_kwargs, make_mla_inputs, mla_decode_float64, relative_error
from tilegym.timing import time_calls

ROTATING_SETS = 4


def grid(block_h: int, fmt: str) -> list[KernelConfig]:
    """The configs tried: step length, warps, stages, occupancy (and fp8's scores in fp16)."""
    if block_h >= 64:
        choices = itertools.product((16, 32, 64), (8,), (1, 2, 3), (1,))
    else:
        choices = itertools.product((32, 64), (4, 8), (2, 3, 4), (2,))
    configs = [KernelConfig(block_h, n, w, s, programs_per_sm=p) for n, w, s, p in choices]
    if fmt == "fp8" and block_h < 64:
        configs += [
            KernelConfig(c.block_h, c.block_n, c.num_warps, c.num_stages, c.programs_per_sm, fp8_fp16_scores=True)
            for c in configs
            if c.num_warps == 4
        ]
    return configs


def op_tensors(shape: Shape, fmt: str, seed: int, page_size: int = 0) -> tuple[dict, tuple]:
    """The op's keyword tensors for one input set (the cache in pages of ``page_size`` tokens
    behind a block table when > 0), and what float64 needs to check it."""
    g = torch.Generator().manual_seed(seed)
    kv_dtype = fp8_dtype(torch.device("cuda")) if fmt == "fp8" else None
    lens = [shape.seq_len] * shape.batch if page_size else None  # a paged cache needs kv_lens
    x = make_mla_inputs(
        shape.batch,
        shape.heads,
        shape.seq_len,
        q_len=shape.q_len,
        kv_dtype=kv_dtype,
        device="cuda",
        kv_lens=lens,
        generator=g,
    )
    cache, packed = cache_kwargs(x, fmt, "paged" if page_size else "dense", page_size, generator=g)
    reference = (
        (x.q, x.qpe, x.kv, x.kpe, x.kv_scale) if packed is None else (x.q, x.qpe, packed.latent, packed.rope, None)
    )
    return {"q": x.q, "qpe": x.qpe, **cache}, reference


def float64_output(q, qpe, kv, kpe, kv_scale) -> torch.Tensor:
    return mla_decode_float64(q, qpe, kv, kpe, kv_scale=kv_scale)[0]


def output_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    """Rel. L2 error of a plan's output [B, Q, H, D] against float64's ([B, H, D] when Q = 1)."""
    return relative_error(out.reshape(reference.shape), reference)


def named_configs(names: str, default: KernelConfig, fmt: str) -> list[KernelConfig]:
    """The configs ``--configs`` names for ``fmt``: ``default`` or names like ``n32w4s3f``
    (``KernelConfig.parse``; ``h32n32w4s2fp1`` also sets query rows and programs per SM), each for
    every format or, prefixed ``fp8:``, for one."""
    configs = []
    for entry in names.split(","):
        only, _, name = entry.rpartition(":")
        if only and only != fmt:
            continue
        try:
            configs.append(
                default if name == "default" else KernelConfig.parse(name, default.block_h, default.programs_per_sm)
            )
        except ValueError as exc:
            raise SystemExit(f"--configs: {exc}") from None
    return configs


def planned_run(plan: TritonDecodePlan, call) -> object:
    """A call of ``plan`` on one input set, writing (and returning) its own output buffer."""
    out = torch.empty_like(call.out)

    def run() -> torch.Tensor:
        plan.run(call.q, call.qpe, call.kv, call.kpe, call.kv_scale, out, None)
        return out

    return run


def checked_time(plan, sets: list, reference: torch.Tensor) -> tuple[float, float]:
    """(median us of CUDA-graph replays over the rotating input sets, rel. L2 error of the first set's
    output against float64) for any backend's plan."""
    calls = [planned_run(plan, validate_mla_decoding(**tensors)) for tensors, _ in sets]
    got = calls[0]().clone()
    torch.cuda.synchronize()
    err = output_error(got, reference)
    return time_calls(calls, torch.device("cuda"), warmup=3, repeat=15, use_graph=True).median_us, err


def sweep(shape: Shape, fmt: str, copy_gbps: float, names: str | None, tree: str, page_size: int = 0) -> None:
    sets = [op_tensors(shape, fmt, seed, page_size) for seed in range(ROTATING_SETS)]
    call = validate_mla_decoding(**sets[0][0])
    default = default_config(call)
    reference = float64_output(*sets[0][1])
    rows = []
    nbytes = traffic_bytes(shape, shape.batch * shape.seq_len, kv_bytes_per_token(fmt))
    configs = (
        named_configs(names, default, fmt)
        if names
        else [default, *[c for c in grid(default.block_h, fmt) if c != default]]
    )
    for config in configs:
        try:
            us, err = checked_time(TritonDecodePlan(call, config), sets, reference)
            rows.append((us, config, err))
        except Exception as exc:  # noqa: BLE001 - a config that does not fit (shared memory) is skipped
            rows.append((float("inf"), config, f"{type(exc).__name__}: {str(exc).splitlines()[0][:60]}"))
    layout = f", pages of {page_size}" if page_size else ""
    new_tokens = f" Q={shape.q_len}" if shape.q_len > 1 else ""
    print(f"\n## {tree}: {shape.batch}x{shape.seq_len}x{shape.heads}{new_tokens} {fmt}{layout} (default {default})")
    print(
        "| us | % copy BW | block_h | block_n | warps | stages | programs/SM | fp8 scores fp16 | rel. L2 vs float64 |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for us, c, err in sorted(rows, key=lambda r: r[0])[: len(rows) if names else 8]:
        pct = 100 * nbytes / (us * 1e3) / copy_gbps if us != float("inf") else 0
        mark = " (default)" if c == default else ""
        check = err if isinstance(err, str) else f"{err:.1e}"
        fields = (c.block_h, c.block_n, c.num_warps, c.num_stages, c.programs_per_sm, c.fp8_fp16_scores, check)
        print(f"| {us:.1f}{mark} | {pct:.0f} | " + " | ".join(map(str, fields)) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="64x4096x16,64x4096x128")
    parser.add_argument("--formats", default="bf16,fp8,fp8_ds_mla,mxfp4")
    parser.add_argument("--configs", default=None, help="e.g. default,fp8:n32w4s3f,n64w8s2 (the same for every shape)")
    parser.add_argument("--tree", default="this tree", help="a label for the tables")
    parser.add_argument("--page-size", type=int, default=0, help="> 0: the cache in pages behind a block table")
    parser.add_argument("--q-len", type=int, default=1, help="new tokens per row (MTP), causal")
    args = parser.parse_args()
    ceilings = measure_ceilings(torch.device("cuda"))
    print(f"{args.tree}: copy bandwidth in this run: {ceilings.copy_gbps:.0f} GB/s", flush=True)
    for text in args.shapes.split(","):
        b, s, h = map(int, text.split("x"))
        for fmt in args.formats.split(","):
            sweep(Shape(b, s, h, args.q_len), fmt, ceilings.copy_gbps, args.configs, args.tree, args.page_size)


if __name__ == "__main__":
    main()
