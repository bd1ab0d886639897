"""Session 24 diagnosis: the tilecpp parity case B8 H128 S8192 with kv_lens (8192, 0, 1, 4095, 4096, 7000, 9000,
-1), whose GPU test did not finish in call 2, at one segment cost (tokens, argv[1]): the schedule, then the
call, its sync and the error against float64."""

import faulthandler
import sys

import torch

from tilegym.ops import mla_decoding_split_kv
from tilegym.ops.contract import validate_mla_decoding
from tilegym.ops.tilecpp import mla_decoding_split_kv as tilecpp_mla
from tilegym.testing import make_mla_inputs, mla_decode_float64

faulthandler.dump_traceback_later(40, exit=True)
tilecpp_mla.SEGMENT_COST_TOKENS = int(sys.argv[1])
g = torch.Generator().manual_seed(0)
lens = (8192, 0, 1, 4095, 4096, 7000, 9000, -1)
x = make_mla_inputs(8, 128, 8192, dtype=torch.bfloat16, kv_lens=lens, device="cuda", generator=g)
call = validate_mla_decoding(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens, return_lse=True)
plan = tilecpp_mla.plan(call)
s = plan.schedule
print("shape", s.shape, "config", plan.config, flush=True)
for name in ("lens", "cum_blocks", "piece_bounds", "piece_rows", "row_pieces"):
    print(name, getattr(s, name).tolist(), flush=True)
out, lse = mla_decoding_split_kv(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens, return_lse=True, backend="tilecpp")
torch.cuda.synchronize()
print("ran", flush=True)
ref, ref_lse = mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens)
err = (out.double().cpu() - ref).abs().max().item()
print(f"max |out - float64| {err:.3e}", flush=True)
