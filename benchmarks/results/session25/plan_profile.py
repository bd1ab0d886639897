"""Session 25: where the host time of ``plan_mla_decoding`` goes (cProfile of 20 plans per case, GPU).

PYTHONPATH=. python benchmarks/results/session25/plan_profile.py
"""

from __future__ import annotations

import cProfile
import functools
import pstats
import time

import torch

import tilegym
from tilegym.testing import make_mla_inputs

CASES = (("cutlass", 128, 4096, 128), ("cutlass", 64, 8192, 16), ("triton", 64, 8192, 16), ("tilecpp", 64, 8192, 16))


def main() -> None:
    for backend, batch, seq_len, heads in CASES:
        g = torch.Generator().manual_seed(1)
        lens = torch.randint(1, seq_len + 1, (batch,), generator=g).tolist()
        x = make_mla_inputs(batch, heads, seq_len, device="cuda", kv_lens=lens, generator=g)
        plan = functools.partial(tilegym.plan_mla_decoding, x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens, backend=backend)

        for _ in range(3):
            plan()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(20):
            plan()
        per = (time.perf_counter() - start) / 20 * 1e6
        torch.cuda.synchronize()
        print(f"=== {backend} B{batch} S{seq_len} H{heads}: {per:.0f} us per plan (host)")
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(20):
            plan()
        profile.disable()
        torch.cuda.synchronize()
        pstats.Stats(profile).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
