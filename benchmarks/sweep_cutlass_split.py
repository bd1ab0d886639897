"""Time the cutlass bf16 split kernel with and without the cluster pair in one device call (a development tool).

    python benchmarks/sweep_cutlass_split.py [--suites many-heads,mtp] [--precompile]

For every shape of the suites it plans the call with the kernel the plan picks and, with two 64-row
groups, also with the groups as separate CTAs (``kPair`` = 1 instead of a cluster of two), checks
output and lse against a float64 computation on the GPU, times CUDA-graph replays over rotating
input sets (combine included) and prints one markdown table with the same-run ceilings. Kernel
times move by several percent between device calls, so compare variants within one call only.
``--precompile`` builds both variants here (the GPU machine has no CUTLASS headers).
"""

from __future__ import annotations

import argparse

import torch

from tilegym.bench import measure_ceilings
from tilegym.ops.contract import validate_mla_decoding
from tilegym.ops.cutlass import mla_decoding_split_kv as cutlass_mla
from tilegym.ops.mla_decoding import SUITES, Shape, flop_count, row_lengths
from tilegym.testing import make_mla_inputs, relative_error
from tilegym.timing import time_calls
from tilegym.utils import cdiv

ROTATING_SETS = 3
VARIANTS = {False: "separate CTAs", True: "cluster pair"}  # kPair = 2, the plan's choice at two groups


def reference(x, lens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 on the GPU, dense cache, the op's causal rule; [B, Q, H, D] and [B, Q, H]."""
    q = torch.cat([x.q, x.qpe], dim=-1).double()
    q = q if q.dim() == 4 else q.unsqueeze(1)
    k = torch.cat([x.kv, x.kpe], dim=-1).double()
    batch, q_len, heads, width = q.shape
    out = torch.empty(batch, q_len, heads, x.kv.shape[-1], dtype=torch.float64, device=q.device)
    lse = torch.empty(batch, q_len, heads, dtype=torch.float64, device=q.device)
    for b, n in enumerate(lens):
        s = torch.einsum("qhd,td->qht", q[b], k[b, :n]) * width**-0.5
        pos = torch.arange(n, device=q.device)
        for i in range(q_len):
            s[i, :, pos >= n - q_len + 1 + i] = -torch.inf
        lse[b] = torch.logsumexp(s, dim=-1)
        out[b] = torch.einsum("qht,td->qhd", torch.softmax(s, dim=-1), k[b, :n, : x.kv.shape[-1]])
    return out, lse


def plan_with(pair: bool) -> type:
    """The plan class with ``kPair`` fixed (one wave of pieces either way)."""

    def split(self: cutlass_mla.CutlassDecodePlan) -> cutlass_mla.CudaKernel:
        return cutlass_mla.split_kernel(self.call.q.dtype, pair)

    return type(f"Pair{int(pair)}", (cutlass_mla.CutlassDecodePlan,), {"_split_kernel": split})


def run_shape(shape: Shape) -> list[str]:
    lens = row_lengths(shape)
    kv_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    sets = []
    for seed in range(ROTATING_SETS):
        g = torch.Generator().manual_seed(seed)
        x = make_mla_inputs(shape.batch, shape.heads, shape.seq_len, device="cuda", generator=g, q_len=shape.q_len)
        sets.append((x, validate_mla_decoding(x.q, x.qpe, x.kv, x.kpe, kv_lens=kv_lens, return_lse=True)))
    ref_out, ref_lse = reference(sets[0][0], lens)
    flops = flop_count(shape, sum(lens))
    cells = []
    groups = cdiv(shape.heads * shape.q_len, cutlass_mla.ROWS_PER_CTA)
    for pair in VARIANTS:
        if pair and groups != cutlass_mla.PAIR_GROUPS:
            cells.append("-")
            continue
        plans = [plan_with(pair)(call) for _, call in sets]
        outs = [torch.empty_like(call.out) for _, call in sets]
        lses = [torch.empty(call.out.shape[:-1], device="cuda") for _, call in sets]
        runs = [
            lambda p=p, c=c, o=o, s=s: p.run(c.q, c.qpe, c.kv, c.kpe, None, o, s)
            for p, (_, c), o, s in zip(plans, sets, outs, lses, strict=True)
        ]
        runs[0]()
        torch.cuda.synchronize()
        err = relative_error(outs[0].reshape(ref_out.shape), ref_out)
        lse_err = (lses[0].reshape(ref_lse.shape).double() - ref_lse).abs().max().item()
        us = time_calls(runs, torch.device("cuda"), warmup=3, repeat=20, use_graph=True).median_us
        cells.append(f"{us:.1f} us ({flops / us / 1e6:.0f} TF/s, err {err:.1e}, lse {lse_err:.1e})")
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", default="many-heads,mtp")
    parser.add_argument("--precompile", action="store_true", help="build every variant's cubin (CPU) and exit")
    args = parser.parse_args()
    if args.precompile:
        for variant in VARIANTS:
            cutlass_mla.split_kernel(torch.bfloat16, variant).compile("sm_90a")
        return
    ceilings = measure_ceilings(torch.device("cuda"))
    print(f"same-run ceilings: copy {ceilings.copy_gbps:.0f} GB/s, bf16 matmul {ceilings.matmul_tflops:.1f} TFLOP/s")
    print("| shape | " + " | ".join(VARIANTS.values()) + " |")
    print("|---" * (len(VARIANTS) + 1) + "|")
    for suite in args.suites.split(","):
        for shape in SUITES[suite]:
            if shape.heads * shape.q_len <= cutlass_mla.MAX_QUERY_ROWS:
                print(f"| {shape.label} | " + " | ".join(run_shape(shape)) + " |", flush=True)


if __name__ == "__main__":
    main()
