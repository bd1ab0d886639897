"""Backend ``aiter``: AMD's aiter kernels on ROCm (gfx942 / gfx950), registered lazily.

Registers ``mla_decoding_split_kv`` (AMD devices only) and the environment probe. Nothing
here imports aiter: the probe imports it once, guarded, and the adapter module loads on
the first call. ``splitk_reduce`` is not registered (see ``mla_decoding_split_kv.py``).
"""

from __future__ import annotations

from tilegym.backend import register_impl, register_probe
from tilegym.ops.aiter import support
from tilegym.ops.contract import MLADecodeCall
from tilegym.ops.mla_decoding import MLA_DECODING

register_probe("aiter", support.probe)


# aiter's fp8 kernels take an fp8 query: the adapter quantises it (per tensor), which widens the error.
@register_impl(
    MLA_DECODING.name, "aiter", vendors=("amd",), supports=support.mla_decode_reasons, quantizes_query=("fp8",)
)
def plan_mla_decoding_split_kv(call: MLADecodeCall) -> object:
    from tilegym.ops.aiter.mla_decoding_split_kv import plan

    return plan(call)
