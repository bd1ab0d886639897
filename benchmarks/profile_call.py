"""Run one planned call a few times, for a profiler on the GPU machine (a development tool).

    ncu --section SpeedOfLight --section WarpStateStats -k regex:mla_decode --launch-skip 2 \\
        --launch-count 1 python benchmarks/profile_call.py --shape 64x4096x16 --kv fp8 --backend cutlass

Builds the inputs of a ``BxSxH`` shape (dense cache, full lengths, bf16 queries; ``--kv`` fp8,
fp8_ds_mla or bf16), plans the call for ``--backend`` once and runs it ``--calls`` times, then
synchronises. Nothing is timed here: the profiler measures the launches it selects.
``--separate-groups`` (cutlass, 65-128 query rows): run the two 64-row groups of a piece as
separate CTAs instead of a cluster pair, to profile what the pair changes.
"""

from __future__ import annotations

import argparse

import torch

import tilegym
from tilegym.testing import make_mla_inputs, pack_cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="64x4096x16", help="B x S x H")
    parser.add_argument("--kv", default="fp8", choices=("bf16", "fp8", "fp8_ds_mla"))
    parser.add_argument("--backend", default="cutlass")
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--separate-groups", action="store_true", help="cutlass: no cluster pair")
    args = parser.parse_args()
    if args.separate_groups:
        from tilegym.ops.cutlass import mla_decoding_split_kv as cutlass_mla

        cutlass_mla.PAIR_GROUPS = 0  # no plan has zero groups: every group is its own CTA
    batch, seq_len, heads = map(int, args.shape.split("x"))
    kv_dtype = torch.float8_e4m3fn if args.kv == "fp8" else None
    x = make_mla_inputs(batch, heads, seq_len, kv_dtype=kv_dtype, device=args.device)
    if args.kv == "fp8_ds_mla":
        cache = pack_cache(x, args.kv).op_kwargs()
    else:
        cache = {"kv": x.kv, "kpe": x.kpe, "kv_scale": x.kv_scale}
    plan = tilegym.plan_mla_decoding(x.q, x.qpe, backend=args.backend, **cache)
    for _ in range(args.calls):
        tilegym.mla_decoding_split_kv(x.q, x.qpe, plan=plan, **cache)
    if x.q.is_cuda:
        torch.cuda.synchronize()
    print(f"{args.calls} calls of {args.shape} {args.kv} on {plan.backend}")


if __name__ == "__main__":
    main()
