"""The config sweeps on the CPU: the Triton one's (``benchmarks/sweep_triton_configs.py``) inputs,
float64 check and config names, and how the Tile C++ and cutlass fp8 sweeps read their configs. The
Triton sweep's first H200 run printed relative errors of 11-16 for every kernel (a [B, 1, H, D] output
broadcast against a [B, H, D] reference); this runs the same path under the interpreter, so such a
check cannot pass unnoticed again.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from tilegym.ops.contract import validate_mla_decoding  # noqa: E402
from tilegym.ops.mla_decoding import Shape  # noqa: E402
from tilegym.ops.triton.mla_decoding_split_kv import KernelConfig, TritonDecodePlan, default_config  # noqa: E402

TOOL = Path(__file__).resolve().parents[1] / "benchmarks" / "sweep_triton_configs.py"


@pytest.fixture
def sweep(monkeypatch):
    spec = importlib.util.spec_from_file_location("sweep_triton_configs", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    make_inputs = module.make_mla_inputs
    monkeypatch.setattr(module, "make_mla_inputs", lambda *a, **k: make_inputs(*a, **{**k, "device": "cpu"}))
    monkeypatch.setattr(module, "fp8_dtype", lambda device: torch.float8_e4m3fn)
    return module


@pytest.mark.parametrize("page_size", [0, 16], ids=["dense", "pages-of-16"])
@pytest.mark.parametrize("fmt", ["bf16", "fp8", "fp8_ds_mla"])
def test_the_sweeps_float64_check_passes_a_correct_kernel_and_fails_a_wrong_one(sweep, fmt, page_size):
    tensors, reference_inputs = sweep.op_tensors(Shape(2, 48, 16), fmt, seed=3, page_size=page_size)
    call = validate_mla_decoding(**tensors)
    assert call.layout == ("paged" if page_size else "dense")
    out = torch.empty_like(call.out)
    TritonDecodePlan(call, default_config(call)).run(call.q, call.qpe, call.kv, call.kpe, call.kv_scale, out, None)
    reference = sweep.float64_output(*reference_inputs)
    assert out.shape != reference.shape  # the plan's [B, 1, H, D] against float64's [B, H, D]
    assert sweep.output_error(out, reference) < 1e-2
    assert sweep.output_error(out.roll(1, dims=0), reference) > 0.5  # another row's answer must show


def test_configs_are_named_per_format(sweep):
    default = KernelConfig(16, 32, 4, 3, fp8_fp16_scores=True)
    names = "default,fp8:n32w4s3,fp8_ds_mla:n64w8s2,n32w4s2f"
    assert [c.name for c in sweep.named_configs(names, default, "fp8")] == ["n32w4s3f", "n32w4s3", "n32w4s2f"]
    assert [c.name for c in sweep.named_configs(names, default, "fp8_ds_mla")] == ["n32w4s3f", "n64w8s2", "n32w4s2f"]
    with pytest.raises(SystemExit, match="n32w4"):
        sweep.named_configs("n32w4", default, "fp8")
    (wider,) = sweep.named_configs("h32n64w8s2fp1", default, "fp8")
    assert (wider.block_h, wider.block_n, wider.num_warps, wider.num_stages) == (32, 64, 8, 2)
    assert (wider.programs_per_sm, wider.fp8_fp16_scores) == (1, True)


def test_tilecpp_fp8_sweep_times_the_library_config_first_and_once(monkeypatch):
    """``benchmarks/sweep_tilecpp_fp8.py --configs``: rows x tokens x CTAs per SM, the library's first."""
    from tilegym.ops.tilecpp.mla_decoding_split_kv import SMALL_HEADS, TileConfig

    monkeypatch.syspath_prepend(str(TOOL.parent))  # the tool imports its helpers from the Triton sweep
    spec = importlib.util.spec_from_file_location("sweep_tilecpp_fp8", TOOL.parent / "sweep_tilecpp_fp8.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    configs = module.parse_configs("16x32x2,16x64x1,16x16x4")
    assert configs == [SMALL_HEADS, TileConfig(16, 32, 2), TileConfig(16, 16, 4)]
    assert SMALL_HEADS == TileConfig(16, 64, 1)


def test_the_sweeps_float64_check_covers_several_new_tokens(sweep):
    """``--q-len 2``: causal MTP inputs, checked against float64 (which masks the same way)."""
    tensors, reference_inputs = sweep.op_tensors(Shape(2, 48, 16, q_len=2), "fp8", seed=5)
    call = validate_mla_decoding(**tensors)
    assert call.q_len == 2 and call.causal
    out = torch.empty_like(call.out)
    TritonDecodePlan(call, default_config(call)).run(call.q, call.qpe, call.kv, call.kpe, call.kv_scale, out, None)
    reference = sweep.float64_output(*reference_inputs)
    assert sweep.output_error(out, reference) < 1e-2
    assert sweep.output_error(out.flip(1), reference) > 0.05  # the two new tokens see different prefixes


def test_the_cutlass_fp8_sweep_reads_host_only_fields_of_a_config() -> None:
    """``sweep_cutlass_fp8.py --configs``: a fifth field 0 keeps the library's fewest-blocks rule (None),
    a sixth is the snap (a float)."""
    path = TOOL.with_name("sweep_cutlass_fp8.py")
    spec = importlib.util.spec_from_file_location("sweep_cutlass_fp8", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.Config
    assert module.parse_config("4x3x1x4") == config(4, 3, 1, 4)
    assert module.parse_config("2x1x2x4x3") == config(2, 1, 2, 4, 3)
    assert module.parse_config("4x3x1x4x0x0.04") == config(4, 3, 1, 4, None, 0.04)
