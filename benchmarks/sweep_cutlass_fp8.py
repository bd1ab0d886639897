"""Sweep the cutlass fp8 kernel's configurations on the GPU (a development tool).

    python benchmarks/sweep_cutlass_fp8.py [--shapes 64x4096x16,128x8192x16,64xU8192x16] [--formats fp8,fp8_ds_mla]
    python benchmarks/sweep_cutlass_fp8.py --precompile   # on the CPU machine: build every variant

For each shape and format it plans the call once per ``Fp8Config`` (stages, warpgroups, CTAs per SM,
k-steps per score accumulator, fewest blocks per schedule piece) that fits in shared memory, checks the
output and lse against float64, times CUDA-graph replays over rotating input sets and prints one
table per shape, fastest first, with the same-run copy bandwidth counting the format's bytes. A shape
``BxUSxH`` gives the rows lengths drawn uniformly from [1, S] (one draw, the same for every input set).
The
chosen defaults go into ``FP8_CONFIGS``. Compare builds only within one device call: this
kernel's times move by up to 12 % between calls.
"""

from __future__ import annotations

import argparse

import torch

from tilegym.bench import measure_ceilings
from tilegym.ops.contract import validate_mla_decoding
from tilegym.ops.cutlass import mla_decoding_split_kv as cutlass_mla
from tilegym.ops.mla_decoding import Shape, kv_bytes_per_token, traffic_bytes
from tilegym.testing import make_mla_inputs, mla_decode_float64, pack_cache, relative_error
from tilegym.timing import time_calls

ROTATING_SETS = 4
Config = cutlass_mla.Fp8Config
# (stages, warpgroups, CTAs per SM, k-steps per score accumulator)
CONFIGS = [Config(2, 1, 2, 4), Config(4, 2, 1, 4), Config(5, 2, 1, 4), Config(4, 3, 1, 4), Config(5, 3, 1, 4)]


def parse_shape(text: str) -> tuple[Shape, list[int] | None]:
    """``BxSxH`` (every row S tokens: no lengths) or ``BxUSxH`` (lengths uniform in [1, S], a fixed draw)."""
    b, s, h = text.split("x")
    batch, heads, seq_len = int(b), int(h), int(s.removeprefix("U"))
    if not s.startswith("U"):
        return Shape(batch, seq_len, heads), None
    lens = torch.randint(1, seq_len + 1, (batch,), generator=torch.Generator().manual_seed(batch * seq_len))
    return Shape(batch, seq_len, heads, lengths="uniform"), lens.tolist()


def parse_config(text: str) -> Config:
    """``stages x groups x CTAs/SM x k-steps [x fewest blocks (0: the rule's) [x snap]]``."""
    fields = text.split("x")
    ints = [int(f) for f in fields[:5]]
    if len(ints) == 5 and ints[4] == 0:
        ints[4] = None
    return Config(*ints, *(float(f) for f in fields[5:6]))


def inputs(shape: Shape, lens: list[int] | None, fmt: str, seed: int) -> tuple[dict, object, object]:
    g = torch.Generator().manual_seed(seed)
    kv_dtype = torch.float8_e4m3fn if fmt == "fp8" else None
    x = make_mla_inputs(
        shape.batch, shape.heads, shape.seq_len, kv_dtype=kv_dtype, kv_lens=lens, device="cuda", generator=g
    )
    if fmt == "fp8":
        return {"q": x.q, "qpe": x.qpe, "kv": x.kv, "kpe": x.kpe, "kv_scale": x.kv_scale, "kv_lens": x.kv_lens}, x, None
    cache = pack_cache(x, fmt)
    return {"q": x.q, "qpe": x.qpe, "kv_lens": x.kv_lens, **cache.op_kwargs()}, x, cache


def expected(x, cache) -> tuple[torch.Tensor, torch.Tensor]:
    if cache is None:
        return mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens, kv_scale=x.kv_scale)
    return mla_decode_float64(x.q, x.qpe, cache.latent, cache.rope, kv_lens=x.kv_lens)


def sweep(shape: Shape, lens: list[int] | None, fmt: str, copy_gbps: float, configs: list[Config]) -> None:
    sets = [inputs(shape, lens, fmt, seed) for seed in range(ROTATING_SETS)]
    calls = [validate_mla_decoding(**s[0]) for s in sets]
    reference, reference_lse = expected(*sets[0][1:])
    tokens = shape.batch * shape.seq_len if lens is None else sum(lens)
    nbytes = traffic_bytes(shape, tokens, kv_bytes_per_token(fmt))
    rows = []
    for config in configs:
        if not cutlass_mla.fp8_config_fits(fmt, config):
            continue
        plan = cutlass_mla.CutlassFp8DecodePlan(calls[0], config)
        runs = []
        for call in calls:
            out = torch.empty_like(call.out)
            runs.append(lambda c=call, o=out, p=plan: p.run(c.q, c.qpe, c.kv, c.kpe, c.kv_scale, o, None) or o)
        check = validate_mla_decoding(**sets[0][0], return_lse=True)
        out, lse = torch.empty_like(check.out), torch.empty(reference_lse.shape, device="cuda")
        check_plan = cutlass_mla.CutlassFp8DecodePlan(check, config)
        check_plan.run(check.q, check.qpe, check.kv, check.kpe, check.kv_scale, out, lse)
        err = relative_error(out.reshape(reference.shape), reference)
        lse_err = (lse.cpu().double() - reference_lse).abs().max().item()
        us = time_calls(runs, torch.device("cuda"), warmup=3, repeat=20, use_graph=True).median_us
        sizes = plan.schedule.piece_bounds[1:] - plan.schedule.piece_bounds[:-1]  # after the runs: the plan's cut
        pieces = f"{int((sizes > 0).sum())} of {sizes.numel()}, longest {int(sizes.max())}"
        rows.append((us, config, err, lse_err, pieces))
    mixed = "" if lens is None else "U"
    title = f"{shape.batch}x{mixed}{shape.seq_len}x{shape.heads} {fmt}, {tokens} tokens"
    print(f"\n## {title} (the library's choice: {cutlass_mla.fp8_config(calls[0])})")
    header = "| us | % copy BW | stages | groups | CTAs/SM | k-steps | min blocks | snap | pieces used (blocks) |"
    print(header + " rel. L2 | lse error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for us, config, err, lse_err, pieces in sorted(rows):
        pct = 100 * nbytes / (us * 1e3) / copy_gbps
        fields = f"{config.stages} | {config.groups} | {config.ctas_per_sm} | {config.chunk} | {config.min_blocks}"
        fields += f" | {config.snap:g} | {pieces}"
        print(f"| {us:.1f} | {pct:.0f} | {fields} | {err:.1e} | {lse_err:.1e} |")


def precompile() -> None:
    for fmt in cutlass_mla.FP8_FORMATS:
        for dtype in cutlass_mla.fp8_query_dtypes(fmt):
            for config in CONFIGS:
                if cutlass_mla.fp8_config_fits(fmt, config, dtype):
                    print(cutlass_mla.fp8_split_kernel(dtype, fmt, config).compile("sm_90a"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # 128 x 4096: pieces of one CTA per SM cut its rows into short segments (what decided FP8_CONFIGS)
    parser.add_argument("--shapes", default="64x4096x16,128x8192x16,128x4096x16")
    parser.add_argument("--formats", default="fp8,fp8_ds_mla")
    parser.add_argument(
        "--configs",
        default=",".join("x".join(map(str, c[:4])) for c in CONFIGS),
        help="stages x warpgroups x CTAs/SM x k-steps per accumulator [x fewest blocks per piece (0: the "
        "library's rule) [x snap]], ...",
    )
    parser.add_argument("--precompile", action="store_true")
    args = parser.parse_args()
    if args.precompile:
        precompile()
        return
    configs = [parse_config(c) for c in args.configs.split(",")]
    ceilings = measure_ceilings(torch.device("cuda"))
    print(f"copy bandwidth in this run: {ceilings.copy_gbps:.0f} GB/s")
    for text in args.shapes.split(","):
        shape, lens = parse_shape(text)
        for fmt in args.formats.split(","):
            sweep(shape, lens, fmt, ceilings.copy_gbps, configs)


if __name__ == "__main__":
    main()
