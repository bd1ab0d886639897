"""Session 20: does a shorter fp8 accumulation chunk fix the 16-row fp8 kernel's lse at large scores?

    python benchmarks/results/session20/fp8_chunks.py --precompile   # CPU machine: the chunk variants
    python benchmarks/results/session20/fp8_chunks.py                # GPU: errors, then timings

The 16-row fp8 kernel sums every `chunk` k-steps (32 columns each) of fp8 wgmma into a fresh
accumulator in float32 (default 4). With keys growing along the row (the growing-scores test of
tests/test_cutlass_fp8.py, at 16 heads) its lse was 6e-3 off float64 in session 19. This prints, per
chunk, the errors of that case over three seeds (with the largest score, natural units), then the
sweep's timings at the two issue-13 shapes.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/ for the sweep

from sweep_cutlass_fp8 import sweep  # noqa: E402

from tilegym.bench import measure_ceilings  # noqa: E402
from tilegym.ops import PLAN_CACHE, mla_decoding_split_kv  # noqa: E402
from tilegym.ops.cutlass import mla_decoding_split_kv as cutlass_mla  # noqa: E402
from tilegym.ops.mla_decoding import Shape  # noqa: E402
from tilegym.testing import make_mla_inputs, mla_decode_float64, relative_error  # noqa: E402

FP8 = torch.float8_e4m3fn
CHUNKS = (4, 2, 1)


def config(chunk: int) -> cutlass_mla.Fp8Config:
    return cutlass_mla.Fp8Config(2, 1, 2, chunk)


def growing_case(seed: int, chunk: int) -> tuple[float, float, float]:
    g = torch.Generator().manual_seed(seed)
    x = make_mla_inputs(4, 16, 1000, device="cuda", kv_lens=[1000, 999, 130, 1], generator=g)
    grown = x.cache.float() * torch.linspace(0.2, 3.0, 1000, device="cuda").view(1, -1, 1)
    scale = grown.abs().amax() / torch.finfo(FP8).max
    x.cache, x.kv_scale = (grown / scale).to(FP8), scale.reshape(1)
    cutlass_mla.FP8_CONFIGS = {fmt: config(chunk) for fmt in cutlass_mla.FP8_FORMATS}
    PLAN_CACHE.clear()
    out, lse = mla_decoding_split_kv(
        x.q, x.qpe, x.kv, x.kpe, 0.2, kv_lens=x.kv_lens, kv_scale=x.kv_scale, return_lse=True, backend="cutlass"
    )
    torch.cuda.synchronize()
    ref, ref_lse = mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, 0.2, kv_lens=x.kv_lens, kv_scale=x.kv_scale)
    lse_err = (lse.cpu().double() - ref_lse).abs().max().item()
    return relative_error(out, ref), lse_err, ref_lse.abs().max().item()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--precompile", action="store_true")
    a = ap.parse_args()
    if a.precompile:
        for chunk in CHUNKS:
            for dtype in cutlass_mla.fp8_query_dtypes("fp8"):
                print(cutlass_mla.fp8_split_kernel(dtype, "fp8", config(chunk)).compile("sm_90a"), flush=True)
        return
    default = dict(cutlass_mla.FP8_CONFIGS)
    print("| chunk | seed | rel. L2 out | lse max abs error | max lse (natural) |")
    print("|---|---|---|---|---|")
    for chunk in CHUNKS:
        for seed in range(3):
            err, lse_err, top = growing_case(seed, chunk)
            print(f"| {chunk} | {seed} | {err:.2e} | {lse_err:.2e} | {top:.1f} |", flush=True)
    cutlass_mla.FP8_CONFIGS = default
    ceil = measure_ceilings(torch.device("cuda"))
    print(f"copy bandwidth in this run: {ceil.copy_gbps:.0f} GB/s", flush=True)
    for b, s in ((64, 4096), (128, 8192)):
        sweep(Shape(b, s, 16), "fp8", ceil.copy_gbps, [config(c) for c in CHUNKS])


if __name__ == "__main__":
    main()
