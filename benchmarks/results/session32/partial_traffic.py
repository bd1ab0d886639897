"""Session 32: float32 partial bytes each shape's schedule writes (and the combine reads back), against
the cache's own bytes. CPU only: the schedule of 132 SMs with the plans' pieces per SM, head groups and
segment costs, read back with segments_on_host. A one-off analysis, not a maintained tool.

    PYTHONPATH=. python benchmarks/results/session32/partial_traffic.py
"""

import torch

from tilegym.ops import schedule
from tilegym.ops.contract import validate_mla_decoding
from tilegym.testing import make_mla_inputs

schedule.multiprocessor_count = lambda device: 132  # the H200's SMs


def report(batch, seq, heads, per_sm, groups, cost_tokens, token_bytes, lens=None, min_blocks=1):
    x = make_mla_inputs(1, heads, 64, dtype=torch.bfloat16)
    q, qpe = x.q.expand(batch, *x.q.shape[1:]), x.qpe.expand(batch, *x.qpe.shape[1:])
    kv = torch.empty(1, seq, 512, dtype=torch.bfloat16).expand(batch, seq, 512)
    kpe = torch.empty(1, seq, 64, dtype=torch.bfloat16).expand(batch, seq, 64)
    kv_lens = torch.tensor(lens, dtype=torch.int32) if lens is not None else None
    call = validate_mla_decoding(q, qpe, kv, kpe, kv_lens=kv_lens)
    shape = schedule.schedule_shape(
        call,
        block_n=64,
        programs_per_sm=per_sm,
        head_groups=groups,
        min_blocks=min_blocks,
        segment_cost_tokens=cost_tokens,
    )
    segments = schedule.segments_on_host(schedule.SplitSchedule(call, shape))
    lengths = lens if lens is not None else [seq] * batch
    row_blocks = [-(-n // 64) for n in lengths]
    partial = [s for s in segments if not (s[2] == 0 and s[3] == row_blocks[s[1]])]
    written = len(partial) * heads * 512 * 4  # every query row of a partial segment, float32
    cache = sum(lengths) * token_bytes
    print(
        f"B{batch} S{seq} H{heads}: {shape.programs} pieces, {len(segments)} segments, {len(partial)} partial: "
        f"{written / 1e6:.1f} MB written and read back = {200 * written / cache:.1f}% of the cache's "
        f"{cache / 1e6:.0f} MB"
    )


report(64, 4096, 16, 2, 1, 256, 576)  # the 16-row fp8 kernel: two CTAs per SM
report(128, 8192, 16, 2, 1, 256, 576, min_blocks=2)
report(64, 4096, 16, 1, 1, 256, 1152)  # the bf16 wgmma kernel, one CTA per SM
report(128, 8192, 16, 1, 1, 256, 1152)
uniform = torch.randint(1, 4097, (128,), generator=torch.Generator().manual_seed(0)).tolist()
report(128, 4096, 128, 1, 2, 384, 1152, lens=uniform)  # cluster pairs, mixed lengths (one draw)
