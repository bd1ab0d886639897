"""The MLA decode ops' specs: ``mla_decoding_split_kv`` and ``splitk_reduce``, one place each.

Names, validation (``tilegym.ops.contract``), the float64 references
(``tilegym.testing``), declared accuracy (``tilegym.ops.accuracy``), the byte and FLOP model
of ``docs/performance.md``, the benchmark suites and the demo shapes. Backends register under
``MLA_DECODING.name`` / ``SPLITK_REDUCE.name``; the bench, the demo and the parity tests read
everything else here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tilegym.ops.accuracy import format_name, output_tolerance
from tilegym.ops.contract import validate_mla_decoding, validate_splitk_reduce
from tilegym.ops.spec import OpSpec, register_spec
from tilegym.quant import cache_format
from tilegym.testing import mla_decode_float64, splitk_reduce_float64

HEAD_DIM, ROPE_DIM = 512, 64  # DeepSeek-V2/V3 latent and rope widths
LENGTH_KINDS = ("full", "uniform", "long-tail")
LENGTH_SEED = 20261130  # lengths of the mixed suites are the same in every run


@dataclass(frozen=True)
class Shape:
    """One decode step: ``batch`` rows, cache length ``seq_len``, ``heads``, ``q_len`` new tokens."""

    batch: int
    seq_len: int
    heads: int
    q_len: int = 1
    lengths: str = "full"

    @property
    def label(self) -> str:
        label = f"B{self.batch} S{self.seq_len} H{self.heads}"
        label += f" Q{self.q_len}" if self.q_len > 1 else ""
        return label + (f" {self.lengths}" if self.lengths != "full" else "")


def _shapes(*specs: tuple) -> tuple[Shape, ...]:
    return tuple(Shape(*spec) for spec in specs)


SUITES: dict[str, tuple[Shape, ...]] = {
    "deepseek": _shapes(
        (64, 4096, 16),
        (128, 8192, 16),
        (32, 8192, 16),
        (1, 32768, 16),
        (64, 4096, 128),
        (128, 8192, 128),
        (64, 4096, 64),
        (4, 1024, 16),
    ),
    "amd-mixed-mla": _shapes(*((b, s, 16) for b in (4, 32, 64, 256) for s in (1024, 8192))),
    "mixed": _shapes(
        (64, 8192, 16, 1, "uniform"),
        (64, 8192, 16, 1, "long-tail"),
        (128, 4096, 16, 1, "uniform"),
        (128, 4096, 128, 1, "uniform"),
        (128, 4096, 128, 1, "full"),
    ),
    "many-heads": _shapes((64, 4096, 64), (64, 4096, 128), (128, 8192, 128), (128, 4096, 128, 1, "uniform")),
    "mtp": _shapes((64, 4096, 16, 1), (64, 4096, 16, 2), (64, 4096, 16, 4), (64, 4096, 128, 2)),
    "quick": _shapes((64, 4096, 16), (64, 4096, 128), (4, 1024, 16)),
    "quantized": _shapes((64, 4096, 16), (128, 8192, 16), (64, 4096, 128)),  # the cache-format targets
    "tiny": _shapes((2, 128, 16), (3, 96, 16, 2, "uniform")),  # CPU smoke run: Triton's interpreter included
}

# Representative DeepSeek-V3 decode step with tensor parallelism 8 (16 heads per GPU); small on a CPU.
DEMO_SHAPES = {
    "cuda": {"batch": 32, "heads": 16, "seq_len": 4096},
    "cpu": {"batch": 2, "heads": 16, "seq_len": 256},
}


def row_lengths(shape: Shape) -> list[int]:
    """Each row's cached tokens, the same in every run (seeded): full, uniform in [1, S], or long-tail.

    Long-tail: one row in eight is S long, the others uniform in [1, S/16].
    """
    if shape.lengths == "full":
        return [shape.seq_len] * shape.batch
    g = torch.Generator().manual_seed(LENGTH_SEED + shape.batch * 7 + shape.seq_len)
    if shape.lengths == "uniform":
        return torch.randint(1, shape.seq_len + 1, (shape.batch,), generator=g).tolist()
    short = torch.randint(1, max(2, shape.seq_len // 16) + 1, (shape.batch,), generator=g).tolist()
    return [shape.seq_len if b % 8 == 7 else n for b, n in enumerate(short)]


def kv_bytes_per_token(kv: torch.dtype | str) -> int:
    """Cache bytes read per token (latent + rope, plus scales for block-scaled formats) of a kv dtype
    or a cache format name."""
    return cache_format(format_name(kv)).bytes_per_token(HEAD_DIM, ROPE_DIM)


def traffic_bytes(shape: Shape, tokens: int, kv_token_bytes: int, q_elsize: int = 2) -> int:
    """Fewest bytes moved: the tokens present read once, queries read once, output written once."""
    rows = shape.batch * shape.q_len * shape.heads
    return tokens * kv_token_bytes + rows * (HEAD_DIM + ROPE_DIM) * q_elsize + rows * HEAD_DIM * 2


def flop_count(shape: Shape, tokens: int) -> int:
    """FLOPs by the FlashMLA convention: QK^T over D+P plus PV over D for every query row, softmax not counted."""
    return 2 * shape.heads * shape.q_len * tokens * (HEAD_DIM + ROPE_DIM + HEAD_DIM)


def _decode_tolerance(backend: str, q_dtype: torch.dtype, kv: torch.dtype | str) -> float:
    return output_tolerance(MLA_DECODING_NAME, backend, q_dtype, kv)


# Partials are exact inputs to the combine: only the output rounding remains.
REDUCE_TOLERANCES = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 5e-3}

MLA_DECODING_NAME = "mla_decoding_split_kv"

MLA_DECODING = register_spec(
    OpSpec(
        name=MLA_DECODING_NAME,
        summary="absorbed MLA attention at decode time, split over KV (dense or paged cache, 1-8 new tokens)",
        validate=validate_mla_decoding,
        oracle=mla_decode_float64,
        tolerance=_decode_tolerance,
        traffic_bytes=traffic_bytes,
        flop_count=flop_count,
        suites=SUITES,
        demo_shapes=DEMO_SHAPES,
    )
)

SPLITK_REDUCE = register_spec(
    OpSpec(
        name="splitk_reduce",
        summary="merge per-split partial outputs by their log-sum-exp",
        validate=validate_splitk_reduce,
        oracle=splitk_reduce_float64,
        tolerance=lambda backend, out_dtype, _: REDUCE_TOLERANCES[out_dtype],
    )
)
