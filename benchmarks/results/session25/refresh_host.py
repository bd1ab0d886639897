"""Session 25: host time of a schedule refresh, one Triton launch against the torch ops, for each GPU
backend's plan; and of an eager call without a plan (which refreshes its cached plan every call).

    PYTHONPATH=. python benchmarks/results/session25/refresh_host.py   # GPU only

Each refresh variant is also checked against the other (same tensors) on the plan's real lengths.
"""

from __future__ import annotations

import functools

import torch

import tilegym
from tilegym.bench import host_us_per_call
from tilegym.ops import PLAN_CACHE, schedule
from tilegym.testing import make_mla_inputs

NAMES = ("lens", "cum_blocks", "piece_bounds", "piece_rows", "row_pieces")
SHAPES = (  # (label, batch, seq_len, heads, lengths)
    ("128 rows U[1, 4096] x 128", 128, 4096, 128, "uniform"),
    ("64 rows U[1, 8192] x 16", 64, 8192, 16, "uniform"),
    ("64 x 4096 x 16 (equal)", 64, 4096, 16, None),
)


def inputs(batch: int, seq_len: int, heads: int, lengths: str | None):
    g = torch.Generator().manual_seed(batch * 7 + heads)
    lens = torch.randint(1, seq_len + 1, (batch,), generator=g).tolist() if lengths else [seq_len] * batch
    return make_mla_inputs(batch, heads, seq_len, device="cuda", kv_lens=lens, generator=g)


def main() -> None:
    usable = schedule.schedule_kernel_usable
    head = ("refresh kernel", "refresh ops", "eager kernel", "eager ops")
    print(f"{'shape':28} {'backend':8} " + " ".join(f"{h:>14}" for h in head))
    for label, batch, seq_len, heads, lengths in SHAPES:
        x = inputs(batch, seq_len, heads, lengths)
        args = (x.q, x.qpe, x.kv, x.kpe)
        for backend in ("cutlass", "triton", "tilecpp"):
            plan = tilegym.plan_mla_decoding(*args, kv_lens=x.kv_lens, backend=backend)
            sched = plan.runner.schedule
            assert sched._launch is not None, "the GPU schedule should be the kernel"
            sched.refresh()
            got = {n: getattr(sched, n).clone() for n in NAMES}
            sched.refresh_by_ops()
            same = all(torch.equal(got[n], getattr(sched, n)) for n in NAMES)
            kernel_us = host_us_per_call(sched.refresh, x.q.device, 200)
            ops_us = host_us_per_call(sched.refresh_by_ops, x.q.device, 200)
            eager = {}
            for name, flag in (("kernel", True), ("ops", False)):
                schedule.schedule_kernel_usable = (lambda d: d.type == "cuda") if flag else (lambda d: False)
                PLAN_CACHE.clear()
                call = functools.partial(tilegym.mla_decoding_split_kv, *args, kv_lens=x.kv_lens, backend=backend)
                eager[name] = host_us_per_call(call, x.q.device, 50)
            schedule.schedule_kernel_usable = usable
            print(
                f"{label:28} {backend:8} "
                + " ".join(f"{v:14.1f}" for v in (kernel_us, ops_us, eager["kernel"], eager["ops"]))
                + ("" if same else "   MISMATCH")
            )


if __name__ == "__main__":
    main()
