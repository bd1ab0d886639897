"""Session 24 diagnosis of a tilecpp split kernel that did not finish (call 2's GPU tests): one case at one
segment cost, under a 30 s watchdog. Cases: `parity`, the parity test B8 H128 S8192 with kv_lens (8192, 0,
1, 4095, 4096, 7000, 9000, -1), whose pieces at 256 tokens of segment cost span row 1 (empty); `gap16` /
`gap128`, rows (700, 0, 700) at 16 / 128 heads in one fixed piece (kv_len_per_split 4096), which spans the
empty row at any cost. Prints the schedule, then the call's error against float64.

    python tilecpp_case.py CASE COST_TOKENS
"""

import faulthandler
import sys

import torch

from tilegym.ops import mla_decoding_split_kv
from tilegym.ops.contract import validate_mla_decoding
from tilegym.ops.tilecpp import mla_decoding_split_kv as tilecpp_mla
from tilegym.testing import make_mla_inputs, mla_decode_float64

CASES = {
    "parity": (128, 8192, (8192, 0, 1, 4095, 4096, 7000, 9000, -1), None),
    "gap16": (16, 700, (700, 0, 700), 4096),
    "gap128": (128, 700, (700, 0, 700), 4096),
}

faulthandler.dump_traceback_later(30, exit=True)
heads, seq_len, lens, split = CASES[sys.argv[1]]
tilecpp_mla.SEGMENT_COST_TOKENS = int(sys.argv[2])
g = torch.Generator().manual_seed(0)
x = make_mla_inputs(len(lens), heads, seq_len, dtype=torch.bfloat16, kv_lens=lens, device="cuda", generator=g)
call = validate_mla_decoding(x.q, x.qpe, x.kv, x.kpe, kv_len_per_split=split, kv_lens=x.kv_lens, return_lse=True)
plan = tilecpp_mla.plan(call)
s = plan.schedule
print("shape", s.shape, "config", plan.config, flush=True)
for name in ("cum_blocks", "piece_bounds", "piece_rows", "row_pieces"):
    print(name, getattr(s, name).tolist()[:40], flush=True)
out, lse = mla_decoding_split_kv(
    x.q, x.qpe, x.kv, x.kpe, kv_len_per_split=split, kv_lens=x.kv_lens, return_lse=True, backend="tilecpp"
)
torch.cuda.synchronize()
ref, _ = mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens)
print(f"ran: max |out - float64| {(out.double().cpu() - ref).abs().max().item():.3e}", flush=True)
