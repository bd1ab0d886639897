"""Bad input to the public ops: each case raises TypeError/ValueError naming the argument."""

from __future__ import annotations

import pytest
import torch

import tilegym
from tilegym.testing import make_mla_inputs

B, H, S, D, P = 2, 4, 16, 32, 8
FP8 = torch.float8_e4m3fn


def good_args() -> dict:
    x = make_mla_inputs(B, H, S, D, P, dtype=torch.float16)
    return {"q": x.q, "qpe": x.qpe, "kv": x.kv, "kpe": x.kpe}


def fp8_args() -> dict:
    x = make_mla_inputs(B, H, S, D, P, dtype=torch.float16, kv_dtype=FP8)
    return {"q": x.q, "qpe": x.qpe, "kv": x.kv, "kpe": x.kpe, "kv_scale": x.kv_scale}


def f16(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).half()


BAD_CASES = {
    "q not a tensor": ({"q": [[1.0]]}, TypeError, r"q must be a torch.Tensor, got list"),
    "q rank": ({"q": f16(B, D)}, ValueError, r"q must have 3 dimensions \[B, H, D\] or 4 dimensions"),
    "q rank 4, qpe rank 3": ({"q": f16(B, 2, H, D)}, ValueError, r"qpe must have 4 dimensions \[B, Q, H, P\]"),
    "too many new tokens": (
        {"q": f16(B, 9, H, D), "qpe": f16(B, 9, H, P)},
        ValueError,
        r"q must hold 1 to 8 new tokens per row \(q.shape\[1\] = Q\), got Q = 9",
    ),
    "qpe new tokens": ({"q": f16(B, 2, H, D), "qpe": f16(B, 3, H, P)}, ValueError, r"qpe.shape\[1\] must equal"),
    "causal type": ({"causal": 1}, TypeError, r"causal must be a bool, got int"),
    "sm_scale overflows float32": ({"sm_scale": 1e39}, ValueError, r"sm_scale = 1e\+39 overflows the float32"),
    "qpe rank": ({"qpe": f16(B, H, P, 1)}, ValueError, r"qpe must have 3 dimensions"),
    "kv rank": ({"kv": f16(B * S, D)}, ValueError, r"kv must have 3 dimensions \[B, S, D\]"),
    "kpe rank": ({"kpe": f16(S, P)}, ValueError, r"kpe must have 3 dimensions"),
    "qpe batch": ({"qpe": f16(B + 1, H, P)}, ValueError, r"qpe.shape\[0\] must equal q.shape\[0\] \(B\)"),
    "qpe heads": ({"qpe": f16(B, H + 1, P)}, ValueError, r"qpe.shape\[1\] must equal q.shape\[1\] \(H\)"),
    "kv batch": ({"kv": f16(B + 1, S, D)}, ValueError, r"kv.shape\[0\] must equal q.shape\[0\]"),
    "kv head dim": ({"kv": f16(B, S, D + 1)}, ValueError, r"kv.shape\[2\] must equal q.shape\[-1\] \(D\)"),
    "kpe seq": ({"kpe": f16(B, S + 1, P)}, ValueError, r"kpe.shape\[1\] must equal kv.shape\[1\] \(S\)"),
    "kpe rope dim": ({"kpe": f16(B, S, P + 1)}, ValueError, r"kpe.shape\[2\] must equal qpe.shape\[-1\] \(P\)"),
    "empty batch": (
        {"q": f16(0, H, D), "qpe": f16(0, H, P), "kv": f16(0, S, D), "kpe": f16(0, S, P)},
        ValueError,
        r"q must have a non-empty batch B",
    ),
    "empty seq": ({"kv": f16(B, 0, D), "kpe": f16(B, 0, P)}, ValueError, r"kv must have a non-empty sequence dim S"),
    "float32 q": (
        {"q": torch.randn(B, H, D), "qpe": torch.randn(B, H, P)},
        TypeError,
        r"q must be bfloat16 or float16, got torch.float32",
    ),
    "qpe dtype": ({"qpe": f16(B, H, P).bfloat16()}, TypeError, r"qpe must have the dtype of q"),
    "kv dtype": ({"kv": f16(B, S, D).bfloat16()}, TypeError, r"kpe must have the dtype of kv"),
    "kv and kpe bf16 vs fp16 q": (
        {"kv": f16(B, S, D).bfloat16(), "kpe": f16(B, S, P).bfloat16()},
        TypeError,
        r"kv must have the dtype of q or an fp8 dtype",
    ),
    "q inner stride": ({"q": f16(B, D, H).transpose(1, 2)}, ValueError, r"q must have a contiguous last dimension"),
    "kv inner stride": (
        {"kv": f16(B, D, S).transpose(1, 2)},
        ValueError,
        r"kv must have a contiguous last dimension",
    ),
    "sm_scale type": ({"sm_scale": "0.1"}, TypeError, r"sm_scale must be a real number, got str"),
    "sm_scale zero": ({"sm_scale": 0.0}, ValueError, r"sm_scale must be finite and > 0"),
    "sm_scale nan": ({"sm_scale": float("nan")}, ValueError, r"sm_scale must be finite and > 0"),
    "split type": ({"kv_len_per_split": 16.0}, TypeError, r"kv_len_per_split must be an int, got float"),
    "split bool": ({"kv_len_per_split": True}, TypeError, r"kv_len_per_split must be an int, got bool"),
    "split zero": ({"kv_len_per_split": 0}, ValueError, r"kv_len_per_split must be >= 1, got 0"),
    "split negative": ({"kv_len_per_split": -64}, ValueError, r"kv_len_per_split must be >= 1, got -64"),
    "kv_lens list": ({"kv_lens": [1, 2]}, TypeError, r"kv_lens must be a torch.Tensor"),
    "kv_lens int64": ({"kv_lens": torch.tensor([1, 2])}, TypeError, r"kv_lens must be int32, got torch.int64"),
    "kv_lens shape": (
        {"kv_lens": torch.tensor([1, 2, 3], dtype=torch.int32)},
        ValueError,
        r"kv_lens must have shape \(2,\)",
    ),
    "kv_lens 2d": (
        {"kv_lens": torch.tensor([[1, 2]], dtype=torch.int32)},
        ValueError,
        r"kv_lens must have shape \(2,\)",
    ),
    "kv_scale without fp8": ({"kv_scale": 1.0}, ValueError, r"kv_scale is only for fp8 kv/kpe"),
    "return_lse type": ({"return_lse": 1}, TypeError, r"return_lse must be a bool, got int"),
    "out shape": ({"out": f16(B, H, D + 1)}, ValueError, r"out must have shape \(2, 4, 32\)"),
    "out dtype": ({"out": torch.randn(B, H, D)}, TypeError, r"out must have dtype torch.float16"),
    "out strided": ({"out": f16(B, D, H).transpose(1, 2)}, ValueError, r"out must be contiguous"),
    "out not a tensor": ({"out": 3}, TypeError, r"out must be a torch.Tensor"),
    "backend unknown": ({"backend": "cuda"}, ValueError, r"unknown backend 'cuda'; valid names are"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_input_is_rejected_with_named_argument(case):
    changes, error, message = BAD_CASES[case]
    args = good_args() | changes
    q, qpe, kv, kpe = (args.pop(k) for k in ("q", "qpe", "kv", "kpe"))
    with pytest.raises(error, match=message):
        tilegym.mla_decoding_split_kv(q, qpe, kv, kpe, **args)


FP8_CASES = {
    "fp8 without kv_scale": ({"kv_scale": None}, ValueError, r"kv_scale is required when kv is torch.float8_e4m3fn"),
    "kv_scale float64 tensor": (
        {"kv_scale": torch.ones(1, dtype=torch.float64)},
        ValueError,
        r"kv_scale must be a float32 tensor of one element",
    ),
    "kv_scale two elements": (
        {"kv_scale": torch.ones(2)},
        ValueError,
        r"kv_scale must be a float32 tensor of one element",
    ),
    "kv_scale negative": ({"kv_scale": -1.0}, ValueError, r"kv_scale must be finite and > 0"),
    "kv_scale string": ({"kv_scale": "1"}, TypeError, r"kv_scale must be a real number"),
    "fp8 q": (
        {"q": f16(B, H, D).to(FP8), "qpe": f16(B, H, P).to(FP8)},
        TypeError,
        r"q must be bfloat16 or float16",
    ),
    "fp8 kv with fp16 kpe": ({"kpe": f16(B, S, P)}, TypeError, r"kpe must have the dtype of kv"),
}


@pytest.mark.parametrize("case", sorted(FP8_CASES))
def test_bad_fp8_input_is_rejected(case):
    changes, error, message = FP8_CASES[case]
    args = fp8_args() | changes
    q, qpe, kv, kpe = (args.pop(k) for k in ("q", "qpe", "kv", "kpe"))
    with pytest.raises(error, match=message):
        tilegym.mla_decoding_split_kv(q, qpe, kv, kpe, **args)


def test_kv_scale_as_python_float_and_tensor_agree():
    args = fp8_args()
    scale = args.pop("kv_scale")
    q, qpe, kv, kpe = args.values()
    by_tensor = tilegym.mla_decoding_split_kv(q, qpe, kv, kpe, kv_scale=scale)
    by_float = tilegym.mla_decoding_split_kv(q, qpe, kv, kpe, kv_scale=float(scale))
    torch.testing.assert_close(by_tensor, by_float, rtol=0, atol=0)


def test_fused_buffer_views_are_accepted():
    x = make_mla_inputs(B, H, S, D, P, dtype=torch.float16)
    assert x.kv.data_ptr() + D * x.kv.element_size() == x.kpe.data_ptr()
    out = tilegym.mla_decoding_split_kv(x.q, x.qpe, x.kv, x.kpe)
    assert out.shape == (B, H, D) and out.dtype == torch.float16


def test_out_is_written_and_returned():
    args = good_args()
    out = torch.full((B, H, D), float("nan"), dtype=torch.float16)
    result = tilegym.mla_decoding_split_kv(**args, out=out)
    assert result is out and not out.isnan().any()


SPLITK_BAD = {
    "partial_out rank": ({"partial_out": torch.randn(B, H, D)}, ValueError, r"partial_out must have 4 dimensions"),
    "partial_lse rank": ({"partial_lse": torch.randn(B, H)}, ValueError, r"partial_lse must have 3 dimensions"),
    "partial_lse shape": (
        {"partial_lse": torch.randn(B, H, 5)},
        ValueError,
        r"partial_lse must have shape \(2, 4, 3\)",
    ),
    "partial_lse dtype": (
        {"partial_lse": torch.randn(B, H, 3).half()},
        TypeError,
        r"partial_lse must be float32",
    ),
    "partial_out dtype": (
        {"partial_out": torch.ones(B, H, 3, D, dtype=torch.int32)},
        TypeError,
        r"partial_out must be float32, bfloat16 or float16",
    ),
    "partial_out not a tensor": ({"partial_out": None}, TypeError, r"partial_out must be a torch.Tensor"),
    "empty splits dim": (
        {"partial_out": torch.randn(B, H, 0, D), "partial_lse": torch.randn(B, H, 0)},
        ValueError,
        r"partial_out must have no empty dimension",
    ),
    "out shape": ({"out": torch.randn(B, H, D + 1)}, ValueError, r"out must have shape \(2, 4, 32\)"),
    "out dtype": ({"out": torch.ones(B, H, D, dtype=torch.int64)}, TypeError, r"out must be float32, bfloat16"),
}


@pytest.mark.parametrize("case", sorted(SPLITK_BAD))
def test_splitk_reduce_bad_input(case):
    changes, error, message = SPLITK_BAD[case]
    args = {"partial_out": torch.randn(B, H, 3, D), "partial_lse": torch.randn(B, H, 3)} | changes
    with pytest.raises(error, match=message):
        tilegym.splitk_reduce(args.pop("partial_out"), args.pop("partial_lse"), **args)


def meta_like(t: torch.Tensor) -> torch.Tensor:
    """The same tensor on the 'meta' device: a second device that exists on every machine."""
    return torch.empty_like(t, device="meta")


@pytest.mark.parametrize("name", ["q", "qpe", "kv", "kpe"])
def test_inputs_on_different_devices_are_rejected(name):
    args = good_args()
    args[name] = meta_like(args[name])
    with pytest.raises(ValueError, match=rf"all tensors must be on one device, got .*{name} on meta"):
        tilegym.mla_decoding_split_kv(**args)


def test_kv_lens_out_and_kv_scale_on_another_device_are_rejected():
    args = good_args()
    with pytest.raises(ValueError, match=r"kv_lens must be on cpu"):
        tilegym.mla_decoding_split_kv(**args, kv_lens=torch.empty(B, dtype=torch.int32, device="meta"))
    with pytest.raises(ValueError, match=r"out must be on cpu"):
        tilegym.mla_decoding_split_kv(**args, out=torch.empty(B, H, D, dtype=torch.float16, device="meta"))
    fp8 = fp8_args()
    fp8["kv_scale"] = torch.ones(1, device="meta")
    with pytest.raises(ValueError, match=r"kv_scale must be on cpu"):
        tilegym.mla_decoding_split_kv(**fp8)


# --- cache layouts -------------------------------------------------------------------------

PS, PAGES = 4, 9


def paged_args(**changes) -> dict:
    """Valid paged arguments: [PAGES, PS, D+P] pages, a block table of S / PS columns, kv_lens."""
    x = make_mla_inputs(B, H, S, D, P, dtype=torch.float16)
    pages = torch.randn(PAGES, PS, D + P).half()
    table = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7]], dtype=torch.int32)
    args = {
        "q": x.q,
        "qpe": x.qpe,
        "kv": pages[..., :D],
        "kpe": pages[..., D:],
        "block_table": table,
        "kv_lens": torch.tensor([16, 5], dtype=torch.int32),
    }
    return args | changes


def ragged_args(**changes) -> dict:
    args = paged_args()
    del args["block_table"]
    args |= {
        "kv_indptr": torch.tensor([0, 4, 6], dtype=torch.int32),
        "kv_indices": torch.tensor([8, 0, 1, 2, 3, 4], dtype=torch.int32),
    }
    return args | changes


LAYOUT_CASES = {
    "block_table int64": (
        paged_args(block_table=torch.zeros(B, 4, dtype=torch.int64)),
        TypeError,
        "block_table must be int32, got torch.int64",
    ),
    "block_table not a tensor": (paged_args(block_table=[[0]]), TypeError, "block_table must be a torch.Tensor"),
    "block_table rank": (
        paged_args(block_table=torch.zeros(8, dtype=torch.int32)),
        ValueError,
        r"block_table must have 2 dimensions \[B, max_pages_per_row\]",
    ),
    "block_table rows": (
        paged_args(block_table=torch.zeros(B + 1, 4, dtype=torch.int32)),
        ValueError,
        r"block_table.shape\[0\] must equal q.shape\[0\] \(B\)",
    ),
    "missing kv_lens": (paged_args(kv_lens=None), ValueError, "kv_lens is required with a paged cache"),
    "both layouts": (
        paged_args(kv_indptr=torch.zeros(B + 1, dtype=torch.int32), kv_indices=torch.zeros(4, dtype=torch.int32)),
        ValueError,
        "give one page layout",
    ),
    "indptr without indices": (
        ragged_args(kv_indices=None),
        ValueError,
        r"needs both kv_indptr= and kv_indices= \(kv_indices is missing\)",
    ),
    "indptr int64": (
        ragged_args(kv_indptr=torch.zeros(B + 1, dtype=torch.int64)),
        TypeError,
        "kv_indptr must be int32",
    ),
    "indptr length": (
        ragged_args(kv_indptr=torch.zeros(B, dtype=torch.int32)),
        ValueError,
        r"kv_indptr.shape\[0\] must equal q.shape\[0\] \+ 1",
    ),
    "page size not a power of two": (
        paged_args(kv=torch.randn(3, 6, D).half(), kpe=torch.randn(3, 6, P).half()),
        ValueError,
        r"kv.shape\[1\] \(page_size\) must be a power of two",
    ),
    "kpe pages": (
        paged_args(kpe=torch.randn(PAGES + 1, PS, P).half()),
        ValueError,
        r"kpe.shape\[0\] must equal kv.shape\[0\] \(num_pages\)",
    ),
    "length longer than the row's pages": (
        paged_args(kv_lens=torch.tensor([17, 5], dtype=torch.int32)),
        ValueError,
        r"kv_lens\[0\] = 17 must be in \[0, 16\].*longer than its pages",
    ),
    "negative length with pages": (
        paged_args(kv_lens=torch.tensor([3, -1], dtype=torch.int32)),
        ValueError,
        r"kv_lens\[1\] = -1",
    ),
    "page id out of range": (
        paged_args(block_table=torch.tensor([[0, 1, 2, 9], [4, 5, 6, 7]], dtype=torch.int32)),
        ValueError,
        r"block_table holds page id 9 outside \[0, 9\)",
    ),
    "negative page id": (
        paged_args(block_table=torch.tensor([[0, 1, 2, 3], [-4, 5, 6, 7]], dtype=torch.int32)),
        ValueError,
        r"block_table holds page id -4",
    ),
    "ragged row longer than its pages": (
        ragged_args(kv_lens=torch.tensor([16, 9], dtype=torch.int32)),
        ValueError,
        r"kv_lens\[1\] = 9 must be in \[0, 8\]",
    ),
    "ragged page id out of range": (
        ragged_args(kv_indices=torch.tensor([8, 0, 1, 2, 3, 99], dtype=torch.int32)),
        ValueError,
        r"kv_indices holds page id 99",
    ),
    "ragged indptr decreasing": (
        ragged_args(
            kv_indptr=torch.tensor([0, 4, 2], dtype=torch.int32), kv_lens=torch.tensor([16, 0], dtype=torch.int32)
        ),
        ValueError,
        "kv_indptr must be non-decreasing",
    ),
    "ragged indptr past the indices": (
        ragged_args(kv_indptr=torch.tensor([0, 4, 7], dtype=torch.int32)),
        ValueError,
        r"end <= kv_indices.numel\(\) = 6",
    ),
}


@pytest.mark.parametrize("case", sorted(LAYOUT_CASES))
def test_bad_page_layout_is_rejected(case):
    args, error, message = LAYOUT_CASES[case]
    args = {k: v for k, v in args.items() if v is not None}
    with pytest.raises(error, match=message):
        tilegym.mla_decoding_split_kv(**args)


def test_page_values_on_the_gpu_are_checked_only_in_debug_mode(monkeypatch):
    """Device-held values need a sync to check: only under TILEGYM_CHECK_INDICES=1 (meta stands in)."""
    from tilegym.ops.contract import validate_mla_decoding

    args = paged_args(block_table=torch.tensor([[0, 1, 2, 99], [4, 5, 6, 7]], dtype=torch.int32))
    meta = {k: v.to("meta") for k, v in args.items()}
    validate_mla_decoding(**meta)  # no sync, no check: the caller's contract on a device
    monkeypatch.setenv("TILEGYM_CHECK_INDICES", "1")
    with pytest.raises((ValueError, NotImplementedError, RuntimeError)):
        validate_mla_decoding(**meta)  # meta tensors cannot be read: proves the check now runs
    with pytest.raises(ValueError, match="page id 99"):
        validate_mla_decoding(**args)


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf")])
def test_kv_scale_tensor_values_are_checked_on_the_host(value):
    args = fp8_args()
    args["kv_scale"] = torch.tensor([value])
    with pytest.raises(ValueError, match="kv_scale must be finite and > 0"):
        tilegym.mla_decoding_split_kv(**args)


def test_out_overlapping_an_input_is_rejected():
    x = make_mla_inputs(B, H, S, D, P, dtype=torch.float16)
    alias = x.cache.view(-1)[: B * H * D].view(B, H, D)  # a contiguous out living inside the cache
    with pytest.raises(ValueError, match="out overlaps kv"):
        tilegym.mla_decoding_split_kv(x.q, x.qpe, x.kv, x.kpe, out=alias)


@pytest.mark.parametrize("name", ["q", "qpe", "kv", "kpe", "out"])
def test_inputs_that_require_grad_are_rejected_in_grad_mode(name):
    args = good_args()
    if name == "out":
        args["out"] = torch.empty(B, H, D, dtype=torch.float16, requires_grad=True)
    else:
        args[name] = args[name].detach().requires_grad_(True)
    with pytest.raises(ValueError, match=f"{name} requires grad.*inference-only"):
        tilegym.mla_decoding_split_kv(**args)
    with torch.no_grad():
        result = tilegym.mla_decoding_split_kv(**args)
    assert name == "out" or not result.requires_grad
