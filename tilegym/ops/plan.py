"""Plans: what a decode step fixes once and every layer of the step reuses.

``plan_mla_decoding(...)`` validates a call, picks the backend, and asks that backend for
its *runner*: the kernel configuration, the split schedule (built on the device from
``kv_lens``; no host sync, capturable), the workspace and the pre-packed launches. Each
layer then calls ``mla_decoding_split_kv(q, qpe, kv, kpe, plan=plan)``: the plan checks
that the tensors have the shapes, strides, dtypes and device it was made for (a handful
of attribute reads instead of a full validation and selection) and runs the launches.

A backend's runner has ``run(q, qpe, kv, kpe, kv_scale, out, lse)``, writing ``out`` (and
``lse`` when not None) and reading only the data pointers and dtypes of the tensors it is
given (their sizes and strides are the plan's), and ``refresh()``, which recomputes the
schedule in place from the current values of the plan's ``kv_lens`` and page tables.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from tilegym.ops.contract import (
    FP8_DS_MLA,
    MLADecodeCall,
    check_out_does_not_overlap,
    fp8_ds_mla_cache,
    overlaps,
    validate_kv_scale,
    validate_mxfp4_scales,
)


class Runner(Protocol):
    def run(
        self,
        q: torch.Tensor,
        qpe: torch.Tensor,
        kv: torch.Tensor,
        kpe: torch.Tensor,
        kv_scale: torch.Tensor | None,
        out: torch.Tensor,
        lse: torch.Tensor | None,
    ) -> None: ...

    def refresh(self) -> None: ...


def _key(t: torch.Tensor) -> tuple[Any, ...]:
    return (t.shape, t.stride(), t.dtype, t.device)


def _byte_extent(t: torch.Tensor) -> int:
    """Bytes from a tensor's first element to one past its last (its strides are the plan's)."""
    return (sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride(), strict=True)) + 1) * t.element_size()


class MLADecodePlan:
    """A planned ``mla_decoding_split_kv``: backend, configuration, schedule and workspace.

    Reuse it for every call with tensors shaped like the ones it was made from (typically
    every layer of one decode step); ``refresh()`` after changing ``kv_lens`` (or the page
    tables) in place lets one plan serve later steps with the same shapes.
    """

    def __init__(self, call: MLADecodeCall, backend: str, runner: Runner) -> None:
        self.call = call
        self.backend = backend
        self.runner = runner
        q, qpe = (call.q[:, 0], call.qpe[:, 0]) if call.squeeze_q else (call.q, call.qpe)
        self._keys = (_key(q), _key(qpe), _key(call.kv), _key(call.kpe))
        self._flat_key = sum(self._keys, ())
        self._extents = tuple(_byte_extent(t) for t in (q, qpe, call.kv, call.kpe))
        self._out_shape = tuple(q.shape)
        self._out_bytes = q.numel() * q.element_size()  # out has q's shape and dtype
        self._lse_shape = tuple(q.shape[:-1])
        self._dtype, self._device = call.q.dtype, call.q.device
        self._packed = call.kv_format if call.is_packed else None
        self._scale_key = _key(call.kv_scale) if call.is_packed else None
        self._device_index = call.device.index if call.device.type == "cuda" else None
        self._fixed = {
            "kv_lens": call.kv_lens,
            "block_table": call.block_table,
            "kv_indptr": call.kv_indptr,
            "kv_indices": call.kv_indices,
        }

    def __repr__(self) -> str:
        c = self.call
        return (
            f"MLADecodePlan(backend={self.backend!r}, B={c.batch}, Q={c.q_len}, H={c.heads}, D={c.head_dim}, "
            f"P={c.rope_dim}, layout={c.layout!r}, kv={c.kv.dtype}, runner={type(self.runner).__name__})"
        )

    def refresh(self) -> None:
        """Recompute the schedule from the current values of ``kv_lens`` (and page tables), in place."""
        self.runner.refresh()

    def check_options(self, **options: Any) -> None:
        """Raise when a call passes an option (other than None) that differs from the plan's."""
        call = self.call
        for name, given in options.items():
            if given is None:
                continue
            if name in self._fixed:
                if given is not self._fixed[name]:
                    raise ValueError(
                        f"{name} is not the tensor this plan was made with; pass the same tensor "
                        "(update its values in place and call plan.refresh()) or make a new plan"
                    )
                continue
            planned = {
                "sm_scale": call.sm_scale,
                "kv_len_per_split": call.kv_len_per_split,
                "causal": call.causal,
                "return_lse": call.return_lse,
                "kv_cache_format": call.kv_format,
            }[name]
            if given != planned:
                raise ValueError(f"{name}={given!r} differs from the plan's {name}={planned!r}; make a new plan")

    def check_tensors(self, q: torch.Tensor, qpe: torch.Tensor, kv: torch.Tensor, kpe: torch.Tensor) -> None:
        """Raise unless the four tensors match the plan's shapes, strides, dtypes and device."""
        tensors = (q, qpe, kv, kpe)
        for name, t, key in zip(("q", "qpe", "kv", "kpe"), tensors, self._keys, strict=True):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if _key(t) != key:
                shape, stride, dtype, device = key
                raise ValueError(
                    f"{name} does not match the plan: it was made for shape {tuple(shape)}, strides {stride}, "
                    f"{dtype} on {device}; got shape {tuple(t.shape)}, strides {t.stride()}, {t.dtype} on {t.device}"
                )
        if torch.is_grad_enabled() and (q.requires_grad or qpe.requires_grad or kv.requires_grad or kpe.requires_grad):
            raise ValueError(
                "an input requires grad, but tilegym's MLA ops are inference-only (no backward): "
                "call them under torch.no_grad() or torch.inference_mode()"
            )

    def check_out(self, out: object, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Raise unless ``out`` fits the plan (the detailed checks behind ``_fast_output``)."""
        c = self.call
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
        if tuple(out.shape) != self._out_shape or out.dtype != c.q.dtype or out.device != c.q.device:
            raise ValueError(
                f"out must be a {c.q.dtype} tensor of shape {self._out_shape} on {c.q.device}, "
                f"got {out.dtype} {tuple(out.shape)} on {out.device}"
            )
        if not out.is_contiguous():
            raise ValueError(f"out must be contiguous, got strides {out.stride()}")
        if out.requires_grad and torch.is_grad_enabled():
            raise ValueError("out requires grad, but tilegym's MLA ops are inference-only (no backward)")
        if any(overlaps(out, t) for t in inputs):
            check_out_does_not_overlap(out, dict(zip(("q", "qpe", "kv", "kpe"), inputs, strict=True)))
        return out

    def unpack_cache(
        self, kv: torch.Tensor, kpe: torch.Tensor | None, kv_scale: object
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(kv, kpe, scales) of a packed cache as the runner reads them: the byte views of an
        ``fp8_ds_mla`` buffer, or an ``mxfp4`` cache with its block scales checked against the plan."""
        if not isinstance(kv, torch.Tensor):
            raise TypeError(f"kv must be a torch.Tensor, got {type(kv).__name__}")
        if self._packed == FP8_DS_MLA:
            return fp8_ds_mla_cache(kv, kpe, kv_scale)
        scales = validate_mxfp4_scales(kv_scale, kv, self.call.head_dim)
        if _key(scales) != self._scale_key:
            shape, stride, dtype, device = self._scale_key
            raise ValueError(
                f"kv_scale does not match the plan: it was made for shape {tuple(shape)}, strides {stride}, {dtype} "
                f"on {device}; got shape {tuple(scales.shape)}, strides {scales.stride()} on {scales.device}"
            )
        return kv, kpe, scales

    def kv_scale_tensor(self, kv_scale: torch.Tensor | float | None) -> torch.Tensor | None:
        """The call's fp8 scale as a float32 [1] device tensor (each layer may have its own; None: the plan's)."""
        if kv_scale is None and self.call.is_fp8:
            return self.call.kv_scale
        return validate_kv_scale(kv_scale, self.call.kv, host_checks=False)

    def call_arguments(
        self,
        q: torch.Tensor,
        qpe: torch.Tensor,
        kv: torch.Tensor,
        kpe: torch.Tensor,
        kv_scale: torch.Tensor | float | None,
        out: torch.Tensor | None,
        backend: str,
    ) -> dict[str, Any]:
        """The arguments of an unplanned call equivalent to running this plan on these tensors."""
        c = self.call
        return {
            "q": q,
            "qpe": qpe,
            "kv": kv,
            "kpe": kpe,
            "sm_scale": c.sm_scale,
            "kv_len_per_split": c.kv_len_per_split,
            "kv_scale": kv_scale if c.is_packed or kv_scale is not None else c.kv_scale,
            "kv_cache_format": c.kv_format if c.is_packed else None,
            "causal": c.causal,
            "return_lse": c.return_lse,
            "out": out,
            "backend": backend,
            **self._fixed,
        }

    def run(
        self,
        q: torch.Tensor,
        qpe: torch.Tensor,
        kv: torch.Tensor,
        kpe: torch.Tensor,
        kv_scale: torch.Tensor | float | None,
        out: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the planned launches on these tensors: (out, lse or None) in the caller's shapes.

        The per-call checks are a handful of attribute reads: shapes, strides, dtypes and device
        against the plan, gradients, and ``out`` (shape, dtype, contiguity, no overlap with an input).
        A packed cache is given as the caller's bytes (and block scales); its views are taken here.
        """
        if self._packed is not None:
            kv, kpe, kv_scale = self.unpack_cache(kv, kpe, kv_scale)
        try:
            key = (
                q.shape, q.stride(), q.dtype, q.device,
                qpe.shape, qpe.stride(), qpe.dtype, qpe.device,
                kv.shape, kv.stride(), kv.dtype, kv.device,
                kpe.shape, kpe.stride(), kpe.dtype, kpe.device,
            )  # fmt: skip
        except AttributeError:
            key = None
        if key != self._flat_key:
            self.check_tensors(q, qpe, kv, kpe)  # raises, naming the tensor
        if torch.is_grad_enabled() and (q.requires_grad or qpe.requires_grad or kv.requires_grad or kpe.requires_grad):
            self.check_tensors(q, qpe, kv, kpe)
        out = self._fast_output(out, (q, qpe, kv, kpe))
        if self._packed is not None:
            scale = kv_scale
        else:
            scale = None if kv_scale is None and not self.call.is_fp8 else self.kv_scale_tensor(kv_scale)
        lse = torch.empty(self._lse_shape, dtype=torch.float32, device=self._device) if self.call.return_lse else None
        index = self._device_index
        if index is not None and torch._C._cuda_getDevice() != index:
            with torch.cuda.device(index):
                self.runner.run(q, qpe, kv, kpe, scale, out, lse)
        else:
            self.runner.run(q, qpe, kv, kpe, scale, out, lse)
        return out, lse

    def _fast_output(self, out: torch.Tensor | None, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        if out is None:
            return torch.empty(self._out_shape, dtype=self._dtype, device=self._device)
        if not (
            isinstance(out, torch.Tensor)
            and out.shape == self._out_shape
            and out.dtype == self._dtype
            and out.is_contiguous()
            and not (out.requires_grad and torch.is_grad_enabled())
        ):
            return self.check_out(out, inputs)  # raises with the reason
        begin, end = out.data_ptr(), out.data_ptr() + self._out_bytes
        for t, extent in zip(inputs, self._extents, strict=True):
            start = t.data_ptr()
            if start < end and begin < start + extent:
                return self.check_out(out, inputs)  # same bytes: the full check names the input
        return out
