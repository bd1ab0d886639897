"""Public ops: validate once, pick a backend, run it; or plan once and run the plan per layer.

For ``mla_decoding_split_kv`` every backend registers a *planner*: ``planner(call)``
returns a runner (``tilegym.ops.plan``) holding the configuration, schedule and workspace
for that call. A call without a plan makes a plan internally and runs it (same results);
recent ones are kept (``PLAN_CACHE``) so a repeated unplanned call skips most of the work.
Under ``torch.compile`` the calls go through the custom ops of ``tilegym.ops.torch_library``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch

from tilegym.backend import select
from tilegym.ops import torch_library
from tilegym.ops.contract import MLADecodeCall, validate_mla_decoding, validate_splitk_reduce
from tilegym.ops.mla_decoding import MLA_DECODING
from tilegym.ops.mla_decoding import SPLITK_REDUCE as SPLITK_REDUCE_SPEC
from tilegym.ops.plan import MLADecodePlan
from tilegym.utils import capturing

__all__ = ["MLADecodePlan", "mla_decoding_split_kv", "plan_mla_decoding", "splitk_reduce"]

MLA_DECODE = MLA_DECODING.name
SPLITK_REDUCE = SPLITK_REDUCE_SPEC.name

Result = torch.Tensor | tuple[torch.Tensor, torch.Tensor]


def plan_for_call(call: MLADecodeCall, backend: str | None = None) -> MLADecodePlan:
    """Select the backend for a validated call and build its plan."""
    impl = select(MLA_DECODE, call, backend)
    return MLADecodePlan(call, impl.backend, impl.run(call))


class _PlanCache:
    """The plans of recent unplanned calls, so a repeated call does not rebuild its workspace.

    Keyed by the backend and everything a plan fixes: shapes, strides, dtypes and device of the
    four tensors, the options, and the identity of the index tensors (``kv_lens`` and the page
    tables; the cached plan keeps them alive, so an identity is never reused while cached). A
    hit recomputes the schedule from the index tensors' current values. Small (memory of
    workspaces), never used while a CUDA graph is being captured (a captured workspace belongs
    to the graph).
    """

    def __init__(self, capacity: int = 8) -> None:
        self.capacity = capacity
        self._plans: OrderedDict[tuple, MLADecodePlan] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(backend: str, call: MLADecodeCall) -> tuple:
        tensors = (call.q, call.qpe, call.kv, call.kpe)
        index = (call.kv_lens, call.block_table, call.kv_indptr, call.kv_indices)
        return (
            backend,
            *((t.shape, t.stride(), t.dtype, t.device) for t in tensors),
            *(None if t is None else id(t) for t in index),
            call.sm_scale,
            call.kv_len_per_split,
            call.causal,
            call.return_lse,
            call.squeeze_q,
        )

    def plan(self, call: MLADecodeCall, backend: str | None) -> MLADecodePlan:
        """A cached plan for ``call`` (schedule refreshed), or a new one."""
        if capturing(call.device):
            return plan_for_call(call, backend)
        impl = select(MLA_DECODE, call, backend)
        key = self.key(impl.backend, call)
        with self._lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
        if plan is None:
            plan = MLADecodePlan(call, impl.backend, impl.run(call))
            with self._lock:
                self._plans[key] = plan
                while len(self._plans) > self.capacity:
                    self._plans.popitem(last=False)
        elif call.kv_lens is not None:
            plan.refresh()
        return plan

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()


PLAN_CACHE = _PlanCache()


def plan_mla_decoding(
    q: torch.Tensor,
    qpe: torch.Tensor,
    kv: torch.Tensor,
    kpe: torch.Tensor | None,
    sm_scale: float | None = None,
    kv_len_per_split: int | None = None,
    *,
    kv_lens: torch.Tensor | None = None,
    kv_scale: torch.Tensor | float | None = None,
    block_table: torch.Tensor | None = None,
    kv_indptr: torch.Tensor | None = None,
    kv_indices: torch.Tensor | None = None,
    causal: bool = True,
    return_lse: bool = False,
    kv_cache_format: str | None = None,
    backend: str | None = None,
) -> MLADecodePlan:
    """Plan ``mla_decoding_split_kv`` once per decode step; pass the plan to every layer's call.

    Takes the arguments of ``mla_decoding_split_kv`` (any layer's tensors: only their
    shapes, strides, dtypes and device matter, plus the values of ``kv_lens`` and the page
    tables, read on the device). The plan fixes the backend, the kernel configuration, a
    split schedule balanced over the GPU by the rows' real lengths, and the workspace.
    """
    call = validate_mla_decoding(
        q,
        qpe,
        kv,
        kpe,
        sm_scale,
        kv_len_per_split,
        kv_lens=kv_lens,
        kv_scale=kv_scale,
        block_table=block_table,
        kv_indptr=kv_indptr,
        kv_indices=kv_indices,
        causal=causal,
        return_lse=return_lse,
        kv_cache_format=kv_cache_format,
    )
    return plan_for_call(call, backend)


def mla_decoding_split_kv(
    q: torch.Tensor,
    qpe: torch.Tensor,
    kv: torch.Tensor,
    kpe: torch.Tensor | None,
    sm_scale: float | None = None,
    kv_len_per_split: int | None = None,
    *,
    kv_lens: torch.Tensor | None = None,
    kv_scale: torch.Tensor | float | None = None,
    block_table: torch.Tensor | None = None,
    kv_indptr: torch.Tensor | None = None,
    kv_indices: torch.Tensor | None = None,
    causal: bool | None = None,
    return_lse: bool | None = None,
    out: torch.Tensor | None = None,
    kv_cache_format: str | None = None,
    plan: MLADecodePlan | None = None,
    backend: str | None = None,
) -> Result:
    """Absorbed MLA attention at decode time, split over KV.

    Shapes: q [B, H, D] or [B, Q, H, D] (Q new tokens per row, up to 8), qpe [B, (Q,) H, P];
    the cache is dense (kv [B, S, D], kpe [B, S, P]) or paged (kv [num_pages, page_size, D],
    kpe [num_pages, page_size, P] with ``block_table`` [B, max_pages] or with ``kv_indptr``
    [B + 1] + ``kv_indices``; ``kv_lens`` required). Per row b, new token i and head h:
    ``score[s] = (q.kv[s] + qpe.kpe[s]) * sm_scale`` over ``s < kv_lens[b]`` (all S when
    ``kv_lens`` is None), restricted with ``causal`` (default) to ``s < kv_lens[b] - Q + 1 + i``;
    returns ``softmax(score) @ kv`` in q's shape and dtype, and with ``return_lse`` also lse
    [B, (Q,) H] float32 (natural log; -inf for a row that sees no token).

    ``sm_scale`` defaults to 1/sqrt(D + P). ``kv_len_per_split`` (tokens per split) is chosen
    by the backend when None. fp8 kv/kpe need ``kv_scale`` (cache value = kv * kv_scale).
    ``kv_cache_format`` names a packed cache (uint8 ``kv``): "fp8_ds_mla" (656 bytes per token:
    512 e4m3 values, 4 float32 scales, 64 bf16 rope; ``kpe`` and ``kv_scale`` None) or "mxfp4"
    (``kv`` [.., D/2] e2m1 pairs, ``kv_scale`` uint8 e8m0 [.., D/32], ``kpe`` plain); see
    ``tilegym.quant`` for the packers.
    ``plan`` (from ``plan_mla_decoding``) skips validation, selection and planning; options
    given with a plan must match it. ``backend`` overrides the selection rules of
    ``tilegym.backend`` (it must be None or the plan's backend when a plan is given).
    """
    if plan is not None:
        if backend is not None and backend != plan.backend:
            raise ValueError(f"backend={backend!r} differs from the plan's backend {plan.backend!r}")
        if not (
            sm_scale is None
            and kv_len_per_split is None
            and kv_lens is None
            and block_table is None
            and kv_indptr is None
            and kv_indices is None
            and causal is None
            and return_lse is None
            and kv_cache_format is None
        ):
            plan.check_options(
                sm_scale=sm_scale,
                kv_len_per_split=kv_len_per_split,
                kv_lens=kv_lens,
                block_table=block_table,
                kv_indptr=kv_indptr,
                kv_indices=kv_indices,
                causal=causal,
                return_lse=return_lse,
                kv_cache_format=kv_cache_format,
            )
        if torch.compiler.is_compiling():
            return _compiled_call(plan.call_arguments(q, qpe, kv, kpe, kv_scale, out, plan.backend))
        out, lse = plan.run(q, qpe, kv, kpe, kv_scale, out)
        return (out, lse) if plan.call.return_lse else out
    arguments = {
        "sm_scale": sm_scale,
        "kv_len_per_split": kv_len_per_split,
        "kv_lens": kv_lens,
        "kv_scale": kv_scale,
        "block_table": block_table,
        "kv_indptr": kv_indptr,
        "kv_indices": kv_indices,
        "causal": True if causal is None else causal,
        "return_lse": False if return_lse is None else return_lse,
        "out": out,
        "kv_cache_format": kv_cache_format,
    }
    if torch.compiler.is_compiling():
        return _compiled_call({"q": q, "qpe": qpe, "kv": kv, "kpe": kpe, **arguments, "backend": backend})
    call = validate_mla_decoding(q, qpe, kv, kpe, **arguments)
    planned = PLAN_CACHE.plan(call, backend)
    out, lse = planned.run(q, qpe, kv, kpe, call.caller_kv_scale, out)
    return (out, lse) if call.return_lse else out


def _compiled_call(arguments: dict) -> Result:
    """The op under ``torch.compile``: traceable checks here, the rest inside the custom op."""
    call = validate_mla_decoding(**{k: v for k, v in arguments.items() if k != "backend"}, host_checks=False)
    # Packed caches travel as the caller's tensors (the op re-derives its views of the bytes).
    cache = ("kv", "kpe", "kv_scale")
    kv, kpe, kv_scale = (arguments[k] for k in cache) if call.is_packed else (getattr(call, k) for k in cache)
    out, lse = torch_library.mla_decoding_split_kv_op(
        call.q,
        call.qpe,
        kv,
        kpe,
        call.kv_lens,
        kv_scale,
        call.block_table,
        call.kv_indptr,
        call.kv_indices,
        call.sm_scale,
        call.kv_len_per_split,
        call.causal,
        call.return_lse,
        call.kv_format if call.is_packed else None,
        arguments["backend"],
    )
    user_out = arguments.get("out")
    if call.squeeze_q:
        out = out[:, 0]
        lse = lse[:, 0] if call.return_lse else lse
    if user_out is not None:
        user_out.copy_(out)
        out = user_out
    return (out, lse) if call.return_lse else out


def splitk_reduce(
    partial_out: torch.Tensor,
    partial_lse: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Merge per-split partial outputs [B, H, N, D] with their lse [B, H, N] into [B, H, D].

    ``partial_lse`` is float32, natural log; -inf marks an empty split. A row whose splits
    are all empty gives zeros; NaN in a live split gives NaN. The output dtype is ``out``'s
    when given, else partial_out's.
    """
    if torch.compiler.is_compiling():
        if out is None:
            out = partial_out.new_empty(partial_out.shape[:2] + partial_out.shape[3:])
        torch_library.splitk_reduce_op(partial_out, partial_lse, out, backend)
        return out
    call = validate_splitk_reduce(partial_out, partial_lse, out=out)
    select(SPLITK_REDUCE, call, backend).run(call)
    return call.out
