"""The op contract: validate a call's arguments once and describe it for the backends.

Public ops call ``validate_*`` before dispatch; every backend receives the resulting
frozen call object, so no backend re-checks shapes, dtypes or devices. Errors are
``TypeError`` (wrong kind of argument) or ``ValueError`` (wrong value), and name the
argument and what was expected.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from tilegym.backend import device_vendor
from tilegym.utils import FP8_DTYPES, HALF_DTYPES


@dataclass(frozen=True)
class MLADecodeCall:
    """A validated ``mla_decoding_split_kv`` call; ``out`` is always allocated."""

    q: torch.Tensor  # [B, H, D]
    qpe: torch.Tensor  # [B, H, P]
    kv: torch.Tensor  # [B, S, D]
    kpe: torch.Tensor  # [B, S, P]
    sm_scale: float
    kv_len_per_split: int | None
    kv_lens: torch.Tensor | None  # int32 [B]
    kv_scale: torch.Tensor | None  # float32 [1], only with fp8 kv
    return_lse: bool
    out: torch.Tensor  # [B, H, D], dtype of q

    @property
    def batch(self) -> int:
        return self.q.shape[0]

    @property
    def heads(self) -> int:
        return self.q.shape[1]

    @property
    def head_dim(self) -> int:
        return self.q.shape[2]

    @property
    def rope_dim(self) -> int:
        return self.qpe.shape[2]

    @property
    def seq_len(self) -> int:
        return self.kv.shape[1]

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def vendor(self) -> str:
        return device_vendor(self.q.device)

    @property
    def is_fp8(self) -> bool:
        return self.kv.dtype in FP8_DTYPES

    def kv_shares_buffer_with_kpe(self) -> bool:
        """True when kv and kpe are column views of one [B, S, D+P] buffer (serving layout)."""
        kv, kpe = self.kv, self.kpe
        elem = kv.element_size()
        return (
            kv.stride() == kpe.stride()
            and kv.untyped_storage().data_ptr() == kpe.untyped_storage().data_ptr()
            and kpe.data_ptr() - kv.data_ptr() == self.head_dim * elem
            and kv.stride(1) == self.head_dim + self.rope_dim
        )


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


def _validate_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return int(value)


def _validate_scale(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {value}")
    return float(value)


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


def _validate_dtypes(q: torch.Tensor, qpe: torch.Tensor, kv: torch.Tensor, kpe: torch.Tensor) -> None:
    if q.dtype not in HALF_DTYPES:
        raise TypeError(f"q must be bfloat16 or float16, got {q.dtype}")
    if qpe.dtype != q.dtype:
        raise TypeError(f"qpe must have the dtype of q ({q.dtype}), got {qpe.dtype}")
    if kv.dtype != kpe.dtype:
        raise TypeError(f"kpe must have the dtype of kv ({kv.dtype}), got {kpe.dtype}")
    if kv.dtype != q.dtype and kv.dtype not in FP8_DTYPES:
        allowed = ", ".join(str(d) for d in (q.dtype, *FP8_DTYPES))
        raise TypeError(f"kv must have the dtype of q or an fp8 dtype ({allowed}), got {kv.dtype}")


def _validate_kv_scale(kv_scale: object, kv: torch.Tensor) -> torch.Tensor | None:
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
        return kv_scale.reshape(1)
    value = _validate_scale("kv_scale", kv_scale)
    return torch.full((1,), value, dtype=torch.float32, device=kv.device)


def _validate_kv_lens(kv_lens: object, batch: int, device: torch.device) -> torch.Tensor | None:
    if kv_lens is None:
        return None
    kv_lens = _expect_tensor("kv_lens", kv_lens)
    if kv_lens.dtype != torch.int32:
        raise TypeError(f"kv_lens must be int32, got {kv_lens.dtype}")
    if tuple(kv_lens.shape) != (batch,):
        raise ValueError(f"kv_lens must have shape ({batch},) (one length per batch row), got {tuple(kv_lens.shape)}")
    if kv_lens.device != device:
        raise ValueError(f"kv_lens must be on {device} (the device of q), got {kv_lens.device}")
    return kv_lens if kv_lens.is_contiguous() else kv_lens.contiguous()


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
    return_lse: object = False,
    out: object = None,
) -> MLADecodeCall:
    """Check every argument of ``mla_decoding_split_kv`` and return the call description."""
    names = ("q", "qpe", "kv", "kpe")
    q, qpe, kv, kpe = (_expect_tensor(n, t) for n, t in zip(names, (q, qpe, kv, kpe), strict=True))
    _expect_rank("q", q, 3, "[B, H, D]")
    _expect_rank("qpe", qpe, 3, "[B, H, P]")
    _expect_rank("kv", kv, 3, "[B, S, D]")
    _expect_rank("kpe", kpe, 3, "[B, S, P]")
    batch, heads, head_dim = q.shape
    seq_len = kv.shape[1]
    for name, size in (("batch B", batch), ("heads H", heads), ("head dim D", head_dim)):
        if size < 1:
            raise ValueError(f"q must have a non-empty {name}, got shape {tuple(q.shape)}")
    if seq_len < 1:
        raise ValueError(f"kv must have a non-empty sequence dim S, got shape {tuple(kv.shape)}")
    _expect_dim("qpe", qpe, 0, batch, "q.shape[0] (B)")
    _expect_dim("qpe", qpe, 1, heads, "q.shape[1] (H)")
    if qpe.shape[2] < 1:
        raise ValueError(f"qpe must have a non-empty rope dim P, got shape {tuple(qpe.shape)}")
    _expect_dim("kv", kv, 0, batch, "q.shape[0] (B)")
    _expect_dim("kv", kv, 2, head_dim, "q.shape[2] (D)")
    _expect_dim("kpe", kpe, 0, batch, "q.shape[0] (B)")
    _expect_dim("kpe", kpe, 1, seq_len, "kv.shape[1] (S)")
    _expect_dim("kpe", kpe, 2, qpe.shape[2], "qpe.shape[2] (P)")
    _expect_same_device(names, (q, qpe, kv, kpe))
    _validate_dtypes(q, qpe, kv, kpe)
    for name, t in zip(names, (q, qpe, kv, kpe), strict=True):
        _expect_unit_inner_stride(name, t)
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    scale = 1.0 / math.sqrt(head_dim + qpe.shape[2]) if sm_scale is None else _validate_scale("sm_scale", sm_scale)
    split = None if kv_len_per_split is None else _validate_positive_int("kv_len_per_split", kv_len_per_split)
    shape = (batch, heads, head_dim)
    out = (
        torch.empty(shape, dtype=q.dtype, device=q.device)
        if out is None
        else _validate_out(out, shape, q.dtype, q.device)
    )
    return MLADecodeCall(
        q=q,
        qpe=qpe,
        kv=kv,
        kpe=kpe,
        sm_scale=scale,
        kv_len_per_split=split,
        kv_lens=_validate_kv_lens(kv_lens, batch, q.device),
        kv_scale=_validate_kv_scale(kv_scale, kv),
        return_lse=return_lse,
        out=out,
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
    batch, heads, _, head_dim = partial_out.shape
    shape = (batch, heads, head_dim)
    if out is None:
        out = torch.empty(shape, dtype=partial_out.dtype, device=partial_out.device)
    else:
        out = _expect_tensor("out", out)
        if out.dtype not in (torch.float32, *HALF_DTYPES):
            raise TypeError(f"out must be float32, bfloat16 or float16, got {out.dtype}")
        out = _validate_out(out, shape, out.dtype, partial_out.device)
    return SplitKReduceCall(partial_out=partial_out, partial_lse=partial_lse, out=out)
