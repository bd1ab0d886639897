"""The op contract: validate a call's arguments once and describe it for the backends.

Public ops call ``validate_*`` before dispatch; every backend receives the resulting
frozen call object, so no backend re-checks shapes, dtypes or devices. Errors are
``TypeError`` (wrong kind of argument) or ``ValueError`` (wrong value), and name the
argument and what was expected.

Cache layouts of ``mla_decoding_split_kv`` (``MLADecodeCall.layout``):

- ``dense``: ``kv`` [B, S, D], ``kpe`` [B, S, P]; row b's token t is ``kv[b, t]``.
- ``paged`` (vLLM, FlashMLA): ``kv`` [num_pages, page_size, D] with ``block_table`` int32
  [B, max_pages]; row b's token t is ``kv[block_table[b, t // page_size], t % page_size]``.
- ``ragged`` (FlashInfer, SGLang, aiter): the same pages with ``kv_indptr`` int32 [B + 1]
  and ``kv_indices`` int32; row b's pages are ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]``.

Pages need ``kv_lens``. Values that only the device holds (page ids, lengths against the
row's pages, a tensor ``kv_scale``) are checked on the host when those tensors live on the
CPU, or anywhere under ``TILEGYM_CHECK_INDICES=1`` (a debug mode: it synchronises). On a
GPU they are the caller's contract; the kernels clamp lengths to the row's pages and page
ids to the cache, so a violation gives a wrong row, never an out-of-bounds read.
"""

from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass

import torch

from tilegym.backend import device_vendor
from tilegym.quant import (
    FP8_DS_MLA_BYTES_PER_TOKEN,
    FP8_DS_MLA_LATENT_DIM,
    FP8_DS_MLA_ROPE_DIM,
    MXFP4_BLOCK,
    fp8_ds_mla_views,
)
from tilegym.utils import DTYPE_SHORT_NAMES, FP8_DTYPES, HALF_DTYPES, cdiv

DENSE, PAGED, RAGGED = "dense", "paged", "ragged"
LAYOUTS = (DENSE, PAGED, RAGGED)
# Cache formats: the first three follow from kv's dtype; the packed ones are named by
# ``kv_cache_format`` (their bytes are uint8, see tilegym.quant for the layouts).
FP8_DS_MLA, MXFP4 = "fp8_ds_mla", "mxfp4"
PACKED_KV_FORMATS = (FP8_DS_MLA, MXFP4)
PLAIN_KV_FORMATS = ("bf16", "fp16", "fp8")
KV_FORMATS = (*PLAIN_KV_FORMATS, *PACKED_KV_FORMATS)
MAX_Q_LEN = 8  # new tokens per row (MTP / speculative decoding)
MAX_PAGE_SIZE = 4096
CHECK_INDICES_ENV = "TILEGYM_CHECK_INDICES"
LOG2_E = math.log2(math.e)
FLOAT32_MAX = 3.4028234663852886e38


def plain_format(kv_dtype: torch.dtype) -> str:
    """The cache format a kv dtype stands for on its own: "bf16", "fp16" or "fp8"."""
    return "fp8" if kv_dtype in FP8_DTYPES else DTYPE_SHORT_NAMES.get(kv_dtype, str(kv_dtype))


def check_indices_on_device() -> bool:
    """True under ``TILEGYM_CHECK_INDICES=1``: check device-held values on the host (syncs)."""
    return os.environ.get(CHECK_INDICES_ENV) == "1"


@dataclass(frozen=True)
class MLADecodeCall:
    """A validated ``mla_decoding_split_kv`` call; ``out`` is always allocated.

    ``q``/``qpe``/``out`` are always 4-D views [B, Q, H, *] (a 3-D query means Q = 1);
    ``kv``/``kpe`` are [B, S, *] (dense) or pages [num_pages, page_size, *].

    ``kv_format`` says how to read the cache (``KV_FORMATS``): "bf16"/"fp16" plain values,
    "fp8" per-tensor scaled (``kv_scale`` float32 [1]); "fp8_ds_mla": ``kv`` is the fp8 e4m3
    view [.., 512] of the 656-byte tokens, ``kpe`` their bf16 rope view [.., 64] and
    ``kv_scale`` their float32 group scales [.., 4] (one per 128 columns), all strided views of
    the caller's uint8 buffer; "mxfp4": ``kv`` uint8 [.., D/2] (two e2m1 codes per byte, the
    even column in the low nibble), ``kv_scale`` uint8 e8m0 [.., D/32], ``kpe`` plain rope.
    """

    q: torch.Tensor  # [B, Q, H, D]
    qpe: torch.Tensor  # [B, Q, H, P]
    kv: torch.Tensor
    kpe: torch.Tensor
    sm_scale: float
    kv_len_per_split: int | None
    kv_lens: torch.Tensor | None  # int32 [B]; required with pages
    kv_scale: torch.Tensor | None  # float32 [1], only with fp8 kv
    return_lse: bool
    out: torch.Tensor  # [B, Q, H, D], dtype of q
    layout: str = DENSE
    block_table: torch.Tensor | None = None  # int32 [B, max_pages]
    kv_indptr: torch.Tensor | None = None  # int32 [B + 1]
    kv_indices: torch.Tensor | None = None  # int32 [nnz]
    causal: bool = True
    squeeze_q: bool = True  # the caller gave 3-D q: return [B, H, D] and lse [B, H]
    kv_format: str = ""  # "" means: the plain format of kv's dtype

    def __post_init__(self) -> None:
        if not self.kv_format:
            object.__setattr__(self, "kv_format", plain_format(self.kv.dtype))

    @property
    def batch(self) -> int:
        return self.q.shape[0]

    @property
    def q_len(self) -> int:
        return self.q.shape[1]

    @property
    def heads(self) -> int:
        return self.q.shape[2]

    @property
    def query_rows(self) -> int:
        """Query rows that share each KV read: new tokens x heads."""
        return self.q.shape[1] * self.q.shape[2]

    @property
    def head_dim(self) -> int:
        return self.q.shape[3]

    @property
    def rope_dim(self) -> int:
        return self.qpe.shape[3]

    @property
    def is_paged(self) -> bool:
        return self.layout != DENSE

    @property
    def page_size(self) -> int:
        """Tokens per page (dense: the whole row)."""
        return self.kv.shape[1]

    @property
    def num_pages(self) -> int:
        """Pages in the cache (dense: batch rows)."""
        return self.kv.shape[0]

    @property
    def seq_len(self) -> int:
        """Dense: S. Pages: the most tokens a row can hold (ragged: every page of the cache)."""
        if self.layout == DENSE:
            return self.kv.shape[1]
        if self.layout == PAGED:
            return self.block_table.shape[1] * self.page_size
        return max(1, self.kv_indices.numel()) * self.page_size

    @property
    def length_hint(self) -> int:
        """A host-side guess of the longest row (no device read): for regimes and plans."""
        if self.layout == RAGGED:
            return max(1, cdiv(self.kv_indices.numel() * self.page_size, self.batch))
        return self.seq_len

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def vendor(self) -> str:
        return device_vendor(self.q.device)

    @property
    def is_fp8(self) -> bool:
        """True for the per-tensor fp8 cache (not for the block-scaled formats)."""
        return self.kv_format == "fp8"

    @property
    def is_packed(self) -> bool:
        """True for the block-scaled formats named by ``kv_cache_format``."""
        return self.kv_format in PACKED_KV_FORMATS

    @property
    def caller_kv_scale(self) -> torch.Tensor | None:
        """``kv_scale`` as a plan's ``run`` takes it with the caller's tensors: None for ``fp8_ds_mla``
        (its scales are views of kv's bytes, taken again per call), else the validated one."""
        return None if self.kv_format == FP8_DS_MLA else self.kv_scale

    def selection_features(self) -> dict[str, object]:
        """What the measured-speed selection table keys on (see ``tilegym.selection``)."""
        return {
            "rows_per_kv": self.query_rows,
            "batch": self.batch,
            "length_hint": self.length_hint,
            "layout": self.layout,
            "kv_dtype": self.kv_format,
        }

    def kv_shares_buffer_with_kpe(self) -> bool:
        """True when kv and kpe are column views of one [.., .., D+P] buffer (serving layout)."""
        kv, kpe = self.kv, self.kpe
        elem = kv.element_size()
        return (
            kv.stride() == kpe.stride()
            and kv.untyped_storage().data_ptr() == kpe.untyped_storage().data_ptr()
            and kpe.data_ptr() - kv.data_ptr() == self.head_dim * elem
            and kv.stride(1) == self.head_dim + self.rope_dim
        )

    def user_out(self) -> torch.Tensor:
        """``out`` in the caller's shape: [B, H, D] for a 3-D query, else [B, Q, H, D]."""
        return self.out[:, 0] if self.squeeze_q else self.out

    def user_lse(self, lse: torch.Tensor | None) -> torch.Tensor | None:
        """lse [B, Q, H] in the caller's shape ([B, H] for a 3-D query)."""
        return lse[:, 0] if lse is not None and self.squeeze_q else lse


@dataclass(frozen=True)
class SplitKReduceCall:
    """A validated ``splitk_reduce`` call; ``out`` is always allocated."""

    partial_out: torch.Tensor  # [B, H, N, D]
    partial_lse: torch.Tensor  # [B, H, N] float32
    out: torch.Tensor  # [B, H, D]

    @property
    def num_splits(self) -> int:
        return self.partial_out.shape[2]

    @property
    def device(self) -> torch.device:
        return self.partial_out.device

    @property
    def vendor(self) -> str:
        return device_vendor(self.partial_out.device)


# ---------------------------------------------------------------------------------------
# Small checks, each naming the argument.


def _expect_tensor(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def _expect_rank(name: str, t: torch.Tensor, rank: int, layout: str) -> None:
    if t.dim() != rank:
        raise ValueError(f"{name} must have {rank} dimensions {layout}, got shape {tuple(t.shape)}")


def _expect_dim(name: str, t: torch.Tensor, dim: int, size: int, what: str) -> None:
    if t.shape[dim] != size:
        raise ValueError(f"{name}.shape[{dim}] must equal {what} = {size}, got shape {tuple(t.shape)}")


def _expect_unit_inner_stride(name: str, t: torch.Tensor) -> None:
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dimension (stride 1), got strides {t.stride()}")


def _expect_same_device(names: tuple[str, ...], tensors: tuple[torch.Tensor, ...]) -> None:
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        listed = ", ".join(f"{n} on {t.device}" for n, t in zip(names, tensors, strict=True))
        raise ValueError(f"all tensors must be on one device, got {listed}")


def _expect_on(name: str, t: torch.Tensor, device: torch.device) -> None:
    if t.device != device:
        raise ValueError(f"{name} must be on {device} (the device of q), got {t.device}")


def _expect_int32_index(name: str, value: object, rank: int, layout: str, device: torch.device) -> torch.Tensor:
    t = _expect_tensor(name, value)
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {t.dtype}")
    _expect_rank(name, t, rank, layout)
    _expect_on(name, t, device)
    return t


def _validate_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


def validate_scale(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {value}")
    if value * LOG2_E >= FLOAT32_MAX:
        raise ValueError(
            f"{name} = {value} overflows the float32 softmax (it must be below {FLOAT32_MAX / LOG2_E:.3g})"
        )
    return float(value)


def _validate_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    """[first, last) bytes of memory a strided tensor can touch."""
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    extent = sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride(), strict=True)) + 1
    return t.data_ptr(), t.data_ptr() + extent * t.element_size()


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when two tensors may share memory (same storage, intersecting byte spans)."""
    if a.device != b.device or a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    (a0, a1), (b0, b1) = _byte_span(a), _byte_span(b)
    return a0 < b1 and b0 < a1


def _validate_out(out: object, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    out = _expect_tensor("out", out)
    if tuple(out.shape) != shape:
        raise ValueError(f"out must have shape {shape}, got {tuple(out.shape)}")
    if out.dtype != dtype:
        raise TypeError(f"out must have dtype {dtype}, got {out.dtype}")
    if out.device != device:
        raise ValueError(f"out must be on {device}, got {out.device}")
    if not out.is_contiguous():
        raise ValueError(f"out must be contiguous, got strides {out.stride()}")
    return out


def check_inference_only(tensors: dict[str, torch.Tensor | None]) -> None:
    """The ops have no backward: refuse inputs that would silently drop a gradient."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if t is not None and t.requires_grad:
            raise ValueError(
                f"{name} requires grad, but tilegym's MLA ops are inference-only (no backward): "
                "call them under torch.no_grad() or torch.inference_mode(), or pass detached tensors"
            )


def check_out_does_not_overlap(out: torch.Tensor, inputs: dict[str, torch.Tensor]) -> None:
    for name, t in inputs.items():
        if overlaps(out, t):
            raise ValueError(f"out overlaps {name} in memory; the op would overwrite its own input")


# ---------------------------------------------------------------------------------------
# Queries, dtypes, scales.


def _validate_queries(q: torch.Tensor, qpe: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Both [B, H, *] (Q = 1) or both [B, Q, H, *]; returns 4-D views and whether q was 3-D."""
    if q.dim() not in (3, 4):
        raise ValueError(f"q must have 3 dimensions [B, H, D] or 4 dimensions [B, Q, H, D], got shape {tuple(q.shape)}")
    squeeze = q.dim() == 3
    layout = "[B, H, P] (like q)" if squeeze else "[B, Q, H, P] (like q)"
    _expect_rank("qpe", qpe, q.dim(), layout)
    q4, qpe4 = (q.unsqueeze(1), qpe.unsqueeze(1)) if squeeze else (q, qpe)
    batch, q_len, heads, head_dim = q4.shape
    for name, size in (("batch B", batch), ("heads H", heads), ("head dim D", head_dim)):
        if size < 1:
            raise ValueError(f"q must have a non-empty {name}, got shape {tuple(q.shape)}")
    if not 1 <= q_len <= MAX_Q_LEN:
        raise ValueError(f"q must hold 1 to {MAX_Q_LEN} new tokens per row (q.shape[1] = Q), got Q = {q_len}")
    hdim = 1 if squeeze else 2
    _expect_dim("qpe", qpe, 0, batch, "q.shape[0] (B)")
    if not squeeze:
        _expect_dim("qpe", qpe, 1, q_len, "q.shape[1] (Q)")
    _expect_dim("qpe", qpe, hdim, heads, f"q.shape[{hdim}] (H)")
    if qpe.shape[-1] < 1:
        raise ValueError(f"qpe must have a non-empty rope dim P, got shape {tuple(qpe.shape)}")
    return q4, qpe4, squeeze


def _validate_query_dtypes(q: torch.Tensor, qpe: torch.Tensor) -> None:
    if q.dtype not in HALF_DTYPES:
        raise TypeError(f"q must be bfloat16 or float16, got {q.dtype}")
    if qpe.dtype != q.dtype:
        raise TypeError(f"qpe must have the dtype of q ({q.dtype}), got {qpe.dtype}")


def _validate_dtypes(q: torch.Tensor, qpe: torch.Tensor, kv: torch.Tensor, kpe: torch.Tensor) -> None:
    _validate_query_dtypes(q, qpe)
    if kv.dtype != kpe.dtype:
        raise TypeError(f"kpe must have the dtype of kv ({kv.dtype}), got {kpe.dtype}")
    if kv.dtype != q.dtype and kv.dtype not in FP8_DTYPES:
        allowed = ", ".join(str(d) for d in (q.dtype, *FP8_DTYPES))
        raise TypeError(f"kv must have the dtype of q or an fp8 dtype ({allowed}), got {kv.dtype}")


def _check_kv_scale_values(kv_scale: torch.Tensor) -> None:
    value = float(kv_scale.reshape(()).item())
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"kv_scale must be finite and > 0, got {value}")


def validate_kv_scale(kv_scale: object, kv: torch.Tensor, *, host_checks: bool) -> torch.Tensor | None:
    if kv.dtype not in FP8_DTYPES:
        if kv_scale is not None:
            raise ValueError(f"kv_scale is only for fp8 kv/kpe; kv has dtype {kv.dtype}")
        return None
    if kv_scale is None:
        raise ValueError(f"kv_scale is required when kv is {kv.dtype} (the cache value is kv * kv_scale)")
    if isinstance(kv_scale, torch.Tensor):
        if kv_scale.numel() != 1 or kv_scale.dtype != torch.float32:
            raise ValueError(
                f"kv_scale must be a float32 tensor of one element, got {kv_scale.dtype} shape {tuple(kv_scale.shape)}"
            )
        if kv_scale.device != kv.device:
            raise ValueError(f"kv_scale must be on {kv.device}, got {kv_scale.device}")
        if host_checks and (kv_scale.device.type == "cpu" or check_indices_on_device()):
            _check_kv_scale_values(kv_scale)
        return kv_scale.reshape(1)
    value = validate_scale("kv_scale", kv_scale)
    return torch.full((1,), value, dtype=torch.float32, device=kv.device)


# ---------------------------------------------------------------------------------------
# Packed cache formats.


def validate_kv_cache_format(kv_cache_format: object, kv: torch.Tensor) -> str:
    """The call's cache format: named by ``kv_cache_format``, or the plain format of kv's dtype."""
    if kv_cache_format is None:
        if kv.dtype == torch.uint8:
            raise TypeError(
                "kv is uint8 (packed bytes): name its format with kv_cache_format="
                + " or ".join(repr(f) for f in PACKED_KV_FORMATS)
            )
        return plain_format(kv.dtype)
    if not isinstance(kv_cache_format, str) or kv_cache_format not in KV_FORMATS:
        raise ValueError(f"kv_cache_format must be None or one of {', '.join(KV_FORMATS)}, got {kv_cache_format!r}")
    if kv_cache_format in PLAIN_KV_FORMATS and plain_format(kv.dtype) != kv_cache_format:
        raise ValueError(f"kv_cache_format={kv_cache_format!r} does not match kv's dtype {kv.dtype}")
    return kv_cache_format


def fp8_ds_mla_cache(kv: torch.Tensor, kpe: object, kv_scale: object) -> tuple[torch.Tensor, ...]:
    """(fp8 values [.., 512], bf16 rope [.., 64], float32 scales [.., 4]): zero-copy views of a packed
    ``fp8_ds_mla`` cache (656 bytes per token, see ``tilegym.quant.pack_fp8_ds_mla``)."""
    if kpe is not None:
        raise ValueError(f"kpe must be None with kv_cache_format={FP8_DS_MLA!r}: each token of kv holds its rope")
    if kv_scale is not None:
        raise ValueError(f"kv_scale must be None with kv_cache_format={FP8_DS_MLA!r}: kv's tokens hold their scales")
    if kv.dtype != torch.uint8:
        raise TypeError(f"kv must be uint8 with kv_cache_format={FP8_DS_MLA!r} (656 bytes per token), got {kv.dtype}")
    if kv.shape[-1] != FP8_DS_MLA_BYTES_PER_TOKEN:
        raise ValueError(
            f"kv must have last dim {FP8_DS_MLA_BYTES_PER_TOKEN} (bytes per token) with kv_cache_format="
            f"{FP8_DS_MLA!r}, got shape {tuple(kv.shape)}"
        )
    if kv.stride(-1) != 1 or kv.storage_offset() % 4 or any(s % 4 for s in kv.stride()[:-1]):
        raise ValueError(
            f"kv must hold whole 656-byte tokens starting on 4-byte boundaries (last dim contiguous, strides and "
            f"offset multiples of 4), got strides {kv.stride()} and offset {kv.storage_offset()}"
        )
    values, scales, rope = fp8_ds_mla_views(kv)
    return values, rope, scales


def _validate_fp8_ds_mla_queries(q4: torch.Tensor, qpe4: torch.Tensor) -> None:
    _validate_query_dtypes(q4, qpe4)
    if q4.dtype != torch.bfloat16:
        raise TypeError(f"q must be bfloat16 with kv_cache_format={FP8_DS_MLA!r} (its rope is bf16), got {q4.dtype}")
    if (q4.shape[3], qpe4.shape[3]) != (FP8_DS_MLA_LATENT_DIM, FP8_DS_MLA_ROPE_DIM):
        raise ValueError(
            f"kv_cache_format={FP8_DS_MLA!r} stores D={FP8_DS_MLA_LATENT_DIM} and P={FP8_DS_MLA_ROPE_DIM}, got "
            f"q.shape[-1]={q4.shape[3]} and qpe.shape[-1]={qpe4.shape[3]}"
        )


def _validate_mxfp4_dtypes(q4: torch.Tensor, qpe4: torch.Tensor, kv: torch.Tensor, kpe: torch.Tensor) -> None:
    _validate_query_dtypes(q4, qpe4)
    if kv.dtype != torch.uint8:
        raise TypeError(f"kv must be uint8 with kv_cache_format={MXFP4!r} (two e2m1 codes per byte), got {kv.dtype}")
    if kpe.dtype != q4.dtype:
        raise TypeError(f"kpe must have the dtype of q ({q4.dtype}) with kv_cache_format={MXFP4!r}, got {kpe.dtype}")
    if q4.shape[3] % MXFP4_BLOCK:
        raise ValueError(
            f"kv_cache_format={MXFP4!r} needs D (q.shape[-1]) to be a multiple of {MXFP4_BLOCK}, got {q4.shape[3]}"
        )


def validate_mxfp4_scales(kv_scale: object, kv: torch.Tensor, head_dim: int) -> torch.Tensor:
    """The e8m0 block scales of an ``mxfp4`` cache: uint8 [.., D/32] beside kv's [.., D/2] codes."""
    if kv_scale is None:
        raise ValueError(f"kv_scale (the uint8 e8m0 scales, one per {MXFP4_BLOCK} values) is required with {MXFP4!r}")
    kv_scale = _expect_tensor("kv_scale", kv_scale)
    if kv_scale.dtype != torch.uint8:
        raise TypeError(f"kv_scale must be uint8 (e8m0 codes) with kv_cache_format={MXFP4!r}, got {kv_scale.dtype}")
    expected = (*kv.shape[:-1], head_dim // MXFP4_BLOCK)
    if tuple(kv_scale.shape) != expected:
        raise ValueError(
            f"kv_scale must have shape {expected} (kv's leading dims, D/{MXFP4_BLOCK} scales), "
            f"got {tuple(kv_scale.shape)}"
        )
    _expect_on("kv_scale", kv_scale, kv.device)
    _expect_unit_inner_stride("kv_scale", kv_scale)
    return kv_scale


def _validate_kv_lens(kv_lens: object, batch: int, device: torch.device) -> torch.Tensor | None:
    if kv_lens is None:
        return None
    kv_lens = _expect_tensor("kv_lens", kv_lens)
    if kv_lens.dtype != torch.int32:
        raise TypeError(f"kv_lens must be int32, got {kv_lens.dtype}")
    if tuple(kv_lens.shape) != (batch,):
        raise ValueError(f"kv_lens must have shape ({batch},) (one length per batch row), got {tuple(kv_lens.shape)}")
    _expect_on("kv_lens", kv_lens, device)
    return kv_lens if kv_lens.is_contiguous() else kv_lens.contiguous()


# ---------------------------------------------------------------------------------------
# Cache layouts.


def _which_layout(block_table: object, kv_indptr: object, kv_indices: object) -> str:
    ragged = kv_indptr is not None or kv_indices is not None
    if block_table is not None and ragged:
        raise ValueError("give one page layout: block_table= (paged) or kv_indptr= with kv_indices= (ragged), not both")
    if ragged and (kv_indptr is None or kv_indices is None):
        missing = "kv_indices" if kv_indices is None else "kv_indptr"
        raise ValueError(f"the ragged page layout needs both kv_indptr= and kv_indices= ({missing} is missing)")
    if block_table is not None:
        return PAGED
    return RAGGED if ragged else DENSE


@dataclass(frozen=True)
class _KvWidth:
    """kv's last dim and how to say where it comes from (packed formats store D in fewer columns)."""

    size: int
    what: str = "q.shape[-1] (D)"


def _validate_dense_cache(kv: torch.Tensor, kpe: torch.Tensor, batch: int, width: _KvWidth, rope_dim: int) -> None:
    _expect_rank("kv", kv, 3, "[B, S, D] (dense) or [num_pages, page_size, D] (with pages)")
    _expect_rank("kpe", kpe, 3, "[B, S, P] (dense) or [num_pages, page_size, P] (with pages)")
    if kv.shape[1] < 1:
        raise ValueError(f"kv must have a non-empty sequence dim S, got shape {tuple(kv.shape)}")
    _expect_dim("kv", kv, 0, batch, "q.shape[0] (B)")
    _expect_dim("kv", kv, 2, width.size, width.what)
    _expect_dim("kpe", kpe, 0, batch, "q.shape[0] (B)")
    _expect_dim("kpe", kpe, 1, kv.shape[1], "kv.shape[1] (S)")
    _expect_dim("kpe", kpe, 2, rope_dim, "qpe.shape[-1] (P)")


def _validate_pages(kv: torch.Tensor, kpe: torch.Tensor, width: _KvWidth, rope_dim: int) -> None:
    _expect_rank("kv", kv, 3, "[num_pages, page_size, D] (with block_table= or kv_indptr=)")
    _expect_rank("kpe", kpe, 3, "[num_pages, page_size, P] (with block_table= or kv_indptr=)")
    num_pages, page_size = kv.shape[:2]
    if num_pages < 1:
        raise ValueError(f"kv must hold at least one page, got shape {tuple(kv.shape)}")
    if not 1 <= page_size <= MAX_PAGE_SIZE or page_size & (page_size - 1):
        raise ValueError(f"kv.shape[1] (page_size) must be a power of two from 1 to {MAX_PAGE_SIZE}, got {page_size}")
    _expect_dim("kv", kv, 2, width.size, width.what)
    _expect_dim("kpe", kpe, 0, num_pages, "kv.shape[0] (num_pages)")
    _expect_dim("kpe", kpe, 1, page_size, "kv.shape[1] (page_size)")
    _expect_dim("kpe", kpe, 2, rope_dim, "qpe.shape[-1] (P)")


def _check_paged_values(block_table: torch.Tensor, kv_lens: torch.Tensor, page_size: int, num_pages: int) -> None:
    """Host check: lengths fit the table, and the pages they use exist."""
    lens = kv_lens.cpu().long()
    capacity = block_table.shape[1] * page_size
    _check_lengths(lens, torch.full_like(lens, capacity), "block_table.shape[1] * page_size")
    table = block_table.cpu().long()
    used = torch.arange(table.shape[1])[None, :] < ((lens + page_size - 1) // page_size)[:, None]
    _check_page_ids(table[used], num_pages, "block_table")


def _check_ragged_values(
    kv_indptr: torch.Tensor, kv_indices: torch.Tensor, kv_lens: torch.Tensor, page_size: int, num_pages: int
) -> None:
    """Host check: kv_indptr is a valid range list into kv_indices, lengths fit, page ids exist."""
    indptr = kv_indptr.cpu().long()
    if indptr[0] < 0 or bool((indptr[1:] < indptr[:-1]).any()) or indptr[-1] > kv_indices.numel():
        raise ValueError(
            f"kv_indptr must be non-decreasing, start >= 0 and end <= kv_indices.numel() = {kv_indices.numel()}, "
            f"got {indptr.tolist()[:16]}"
        )
    lens = kv_lens.cpu().long()
    _check_lengths(lens, (indptr[1:] - indptr[:-1]) * page_size, "the row's pages x page_size")
    indices = kv_indices.cpu().long()
    starts = indptr[:-1].tolist()
    used = [indices[s : s + (n + page_size - 1) // page_size] for s, n in zip(starts, lens.tolist(), strict=True)]
    _check_page_ids(torch.cat(used) if used else indices[:0], num_pages, "kv_indices")


def _check_lengths(lens: torch.Tensor, capacity: torch.Tensor, what: str) -> None:
    bad = (lens < 0) | (lens > capacity)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"kv_lens[{row}] = {int(lens[row])} must be in [0, {int(capacity[row])}] ({what}): "
            "a row cannot be longer than its pages"
        )


def _check_page_ids(ids: torch.Tensor, num_pages: int, name: str) -> None:
    bad = (ids < 0) | (ids >= num_pages)
    if bool(bad.any()):
        raise ValueError(f"{name} holds page id {int(ids[bad][0])} outside [0, {num_pages}) (kv.shape[0] pages)")


@dataclass(frozen=True)
class _Layout:
    name: str
    block_table: torch.Tensor | None = None
    kv_indptr: torch.Tensor | None = None
    kv_indices: torch.Tensor | None = None


def _validate_layout(
    kv: torch.Tensor,
    kpe: torch.Tensor,
    q4: torch.Tensor,
    rope_dim: int,
    kv_lens: torch.Tensor | None,
    block_table: object,
    kv_indptr: object,
    kv_indices: object,
    *,
    width: _KvWidth,
    host_checks: bool,
) -> _Layout:
    batch, device = q4.shape[0], q4.device
    name = _which_layout(block_table, kv_indptr, kv_indices)
    if name == DENSE:
        _validate_dense_cache(kv, kpe, batch, width, rope_dim)
        return _Layout(DENSE)
    _validate_pages(kv, kpe, width, rope_dim)
    if kv_lens is None:
        raise ValueError("kv_lens is required with a paged cache (block_table= or kv_indptr=/kv_indices=)")
    check = host_checks and (kv_lens.device.type == "cpu" or check_indices_on_device())
    page_size, num_pages = kv.shape[1], kv.shape[0]
    if name == PAGED:
        table = _expect_int32_index("block_table", block_table, 2, "[B, max_pages_per_row]", device)
        _expect_dim("block_table", table, 0, batch, "q.shape[0] (B)")
        if table.shape[1] < 1:
            raise ValueError(f"block_table must have at least one page column, got shape {tuple(table.shape)}")
        _expect_unit_inner_stride("block_table", table)
        if check:
            _check_paged_values(table, kv_lens, page_size, num_pages)
        return _Layout(PAGED, block_table=table)
    indptr = _expect_int32_index("kv_indptr", kv_indptr, 1, "[B + 1]", device)
    indices = _expect_int32_index("kv_indices", kv_indices, 1, "[total pages]", device)
    _expect_dim("kv_indptr", indptr, 0, batch + 1, "q.shape[0] + 1 (B + 1)")
    indptr = indptr.contiguous()
    indices = indices.contiguous()
    if check:
        _check_ragged_values(indptr, indices, kv_lens, page_size, num_pages)
    return _Layout(RAGGED, kv_indptr=indptr, kv_indices=indices)


# ---------------------------------------------------------------------------------------
# The validators.


def validate_mla_decoding(
    q: object,
    qpe: object,
    kv: object,
    kpe: object,
    sm_scale: object = None,
    kv_len_per_split: object = None,
    *,
    kv_lens: object = None,
    kv_scale: object = None,
    block_table: object = None,
    kv_indptr: object = None,
    kv_indices: object = None,
    causal: object = True,
    return_lse: object = False,
    out: object = None,
    kv_cache_format: object = None,
    host_checks: bool = True,
) -> MLADecodeCall:
    """Check every argument of ``mla_decoding_split_kv`` and return the call description.

    ``host_checks=False`` skips what reads tensor values or data pointers (used while
    ``torch.compile`` traces; the compiled op checks them when it runs).
    """
    names = ("q", "qpe", "kv", "kpe")
    q, qpe, kv = _expect_tensor("q", q), _expect_tensor("qpe", qpe), _expect_tensor("kv", kv)
    q4, qpe4, squeeze = _validate_queries(q, qpe)
    batch, q_len, heads, head_dim = q4.shape
    rope_dim = qpe4.shape[3]
    kv_format = validate_kv_cache_format(kv_cache_format, kv)
    width = _KvWidth(head_dim)
    if kv_format == FP8_DS_MLA:
        _validate_fp8_ds_mla_queries(q4, qpe4)
        kv, kpe, scales = fp8_ds_mla_cache(kv, kpe, kv_scale)
    else:
        kpe = _expect_tensor("kpe", kpe)
    _expect_same_device(names, (q, qpe, kv, kpe))
    if kv_format == MXFP4:
        _validate_mxfp4_dtypes(q4, qpe4, kv, kpe)
        width = _KvWidth(head_dim // 2, "q.shape[-1] // 2 (D/2 bytes: two e2m1 codes per byte)")
    elif kv_format != FP8_DS_MLA:
        _validate_dtypes(q, qpe, kv, kpe)
    for name, t in zip(names, (q, qpe, kv, kpe), strict=True):
        _expect_unit_inner_stride(name, t)
    lens = _validate_kv_lens(kv_lens, batch, q.device)
    layout = _validate_layout(
        kv, kpe, q4, rope_dim, lens, block_table, kv_indptr, kv_indices, width=width, host_checks=host_checks
    )
    if kv_format == FP8_DS_MLA:
        scale_tensor = scales
    elif kv_format == MXFP4:
        scale_tensor = validate_mxfp4_scales(kv_scale, kv, head_dim)
    else:
        scale_tensor = validate_kv_scale(kv_scale, kv, host_checks=host_checks)
    return_lse = _validate_bool("return_lse", return_lse)
    causal = _validate_bool("causal", causal)
    scale = 1.0 / math.sqrt(head_dim + rope_dim) if sm_scale is None else validate_scale("sm_scale", sm_scale)
    split = None if kv_len_per_split is None else _validate_positive_int("kv_len_per_split", kv_len_per_split)
    check_inference_only(
        {"q": q, "qpe": qpe, "kv": kv, "kpe": kpe, "out": out if isinstance(out, torch.Tensor) else None}
    )
    user_shape = tuple(q.shape)
    if out is None:
        out4 = torch.empty((batch, q_len, heads, head_dim), dtype=q.dtype, device=q.device)
    else:
        out = _validate_out(out, user_shape, q.dtype, q.device)
        if host_checks:
            check_out_does_not_overlap(out, {"q": q, "qpe": qpe, "kv": kv, "kpe": kpe})
        out4 = out.unsqueeze(1) if squeeze else out
    return MLADecodeCall(
        q=q4,
        qpe=qpe4,
        kv=kv,
        kpe=kpe,
        sm_scale=scale,
        kv_len_per_split=split,
        kv_lens=lens,
        kv_scale=scale_tensor,
        return_lse=return_lse,
        out=out4,
        layout=layout.name,
        block_table=layout.block_table,
        kv_indptr=layout.kv_indptr,
        kv_indices=layout.kv_indices,
        causal=causal,
        squeeze_q=squeeze,
        kv_format=kv_format,
    )


def validate_splitk_reduce(partial_out: object, partial_lse: object, *, out: object = None) -> SplitKReduceCall:
    """Check every argument of ``splitk_reduce`` and return the call description."""
    partial_out = _expect_tensor("partial_out", partial_out)
    partial_lse = _expect_tensor("partial_lse", partial_lse)
    _expect_rank("partial_out", partial_out, 4, "[B, H, N, D]")
    _expect_rank("partial_lse", partial_lse, 3, "[B, H, N]")
    if min(partial_out.shape) < 1:
        raise ValueError(f"partial_out must have no empty dimension, got shape {tuple(partial_out.shape)}")
    if tuple(partial_lse.shape) != tuple(partial_out.shape[:3]):
        raise ValueError(
            f"partial_lse must have shape {tuple(partial_out.shape[:3])} (partial_out's [B, H, N]), "
            f"got {tuple(partial_lse.shape)}"
        )
    if partial_out.dtype not in (torch.float32, *HALF_DTYPES):
        raise TypeError(f"partial_out must be float32, bfloat16 or float16, got {partial_out.dtype}")
    if partial_lse.dtype != torch.float32:
        raise TypeError(f"partial_lse must be float32, got {partial_lse.dtype}")
    _expect_same_device(("partial_out", "partial_lse"), (partial_out, partial_lse))
    _expect_unit_inner_stride("partial_out", partial_out)
    check_inference_only({"partial_out": partial_out, "partial_lse": partial_lse})
    batch, heads, _, head_dim = partial_out.shape
    shape = (batch, heads, head_dim)
    if out is None:
        out = torch.empty(shape, dtype=partial_out.dtype, device=partial_out.device)
    else:
        out = _expect_tensor("out", out)
        if out.dtype not in (torch.float32, *HALF_DTYPES):
            raise TypeError(f"out must be float32, bfloat16 or float16, got {out.dtype}")
        out = _validate_out(out, shape, out.dtype, partial_out.device)
        check_inference_only({"out": out})
        check_out_does_not_overlap(out, {"partial_out": partial_out, "partial_lse": partial_lse})
    return SplitKReduceCall(partial_out=partial_out, partial_lse=partial_lse, out=out)
