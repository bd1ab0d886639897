"""The cutlass backend's fp8 kernel (``mla_decoding_split_kv_fp8.cuh``, mma.sync): the per-tensor
``fp8`` cache and DeepSeek's 656-byte ``fp8_ds_mla`` tokens at up to 16 query rows (32 with two row
tiles); and (last section) the wgmma kernel's fp8 variants, which take both formats at 33-1024 query rows
(17-1024 with two row tiles off).

CPU: what ``supports()`` says about what the kernel does not take. GPU (H100/H200): parity with
float64 on fresh random inputs (the seed is in the message): 16 and 8 heads, 1 and 2 new tokens
(causal, and not), dense, paged (pages of 64 tokens, and of 1, 2, 4 and 8, around the TMA box
sizes) and ragged caches, each with the default configuration and two others, mixed lengths with
empty and one-token rows, forced splits through the combine, bf16 and fp16 queries, fp8_ds_mla
pages holding 0xFF (NaN) bytes wherever a row must not read, and a per-tensor ``kv_scale`` that is
not 16-byte aligned (graph replay with a changed ``kv_scale``: ``tests/test_plan.py``). The oracle
gets the dequantised cache, so only the kernel's own rounding counts.
"""

from __future__ import annotations

import pytest
import torch

from tilegym.ops import mla_decoding_split_kv
from tilegym.ops.accuracy import lse_rtol, lse_tolerance, output_tolerance
from tilegym.ops.contract import validate_mla_decoding
from tilegym.ops.cutlass import mla_decoding_split_kv as cutlass_mla
from tilegym.testing import (
    assert_matches_float64,
    cache_kwargs,
    fresh_generator,
    make_mla_inputs,
    mla_decode_float64,
    pack_cache,
)

FP8 = torch.float8_e4m3fn
BACKEND = "cutlass"
OP = "mla_decoding_split_kv"


# ----------------------------------------------------------------------------- CPU: reasons, not crashes


def fp8_call(heads: int, q_len: int = 1, *, kv_dtype=FP8, dtype=torch.bfloat16):
    x = make_mla_inputs(2, heads, 64, dtype=dtype, kv_dtype=kv_dtype, q_len=q_len)
    return validate_mla_decoding(x.q, x.qpe, x.kv, x.kpe, kv_scale=x.kv_scale)


def ds_mla_call(heads: int, q_len: int = 1, **kwargs):
    x = make_mla_inputs(2, heads, 64, q_len=q_len)
    return validate_mla_decoding(x.q, x.qpe, **pack_cache(x, "fp8_ds_mla").op_kwargs(), **kwargs)


def ds_mla_on_the_wgmma_kernel(monkeypatch, two_tiles: bool = True) -> None:
    """fp8_ds_mla's routes above 16 rows switched on (the library's default), whatever the defaults become."""
    monkeypatch.setattr(cutlass_mla, "FP8_DS_MLA_WIDE", True)
    monkeypatch.setattr(cutlass_mla, "FP8_DS_MLA_TWO_TILES", two_tiles)


def test_more_than_32_query_rows_of_either_fp8_format_go_to_the_wgmma_kernel(monkeypatch) -> None:
    on_gpu_only = ["cutlass runs on NVIDIA GPUs only, got a tensor on cpu"]
    ds_mla_on_the_wgmma_kernel(monkeypatch)
    for make in (fp8_call, ds_mla_call):
        assert cutlass_mla.supports(make(16, q_len=2)) == on_gpu_only
        assert cutlass_mla.supports(make(128, q_len=2)) == on_gpu_only
        reasons = cutlass_mla.supports(make(160, q_len=8))
        assert len(reasons) == 1 and "at most 1024 query rows" in reasons[0] and "8 x 160 = 1280" in reasons[0], reasons
    for fmt, make in (("fp8", fp8_call), ("fp8_ds_mla", ds_mla_call)):
        name = cutlass_mla._split_kernel_of(make(64)).instance_name
        assert name == f"{cutlass_mla.KERNEL}<__nv_bfloat16, 1, {1 + cutlass_mla.FP8_FORMATS[fmt]}, 0>"
        assert name in [k.instance_name for k in cutlass_mla.all_kernels()]
    for two_tiles, heads in ((False, 32), (True, 32), (True, 48)):  # 17-32 rows: two tiles, else the variant
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(cutlass_mla, "FP8_DS_MLA_TWO_TILES", two_tiles)
            call = ds_mla_call(heads)
            assert cutlass_mla.supports(call) == on_gpu_only
            assert cutlass_mla.fp8_row_tiles(call) == (2 if two_tiles and heads <= 32 else None)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cutlass_mla, "FP8_DS_MLA_WIDE", False)
        reasons = cutlass_mla.supports(ds_mla_call(64))
        assert len(reasons) == 1 and "fp8_ds_mla kernel serves at most 32 query rows" in reasons[0], reasons
    with pytest.raises(ValueError, match="fp8_ds_mla variant takes"):
        cutlass_mla.split_kernel(torch.float16, fp8=True, kv_format="fp8_ds_mla")


def test_more_than_16_query_rows_need_16_byte_query_rows() -> None:
    """The wgmma kernel's fp8 variant stages the query with 16-byte copies (the fp8 kernel at up to
    16 rows reads unaligned queries element by element)."""
    x = make_mla_inputs(2, 64, 64, kv_dtype=FP8)
    q = torch.zeros(*x.q.shape[:-1], x.q.shape[-1] + 1, dtype=x.q.dtype)[..., 1:]  # 2 bytes off
    q.copy_(x.q)
    reasons = cutlass_mla.supports(validate_mla_decoding(q, x.qpe, x.kv, x.kpe, kv_scale=x.kv_scale))
    assert len(reasons) == 1 and reasons[0].startswith("cutlass needs q rows on 16-byte boundaries"), reasons


@pytest.mark.parametrize(
    ("fmt", "heads", "page_size", "refused"),
    [
        ("fp8", 64, 1, True),
        ("fp8", 64, 2, False),
        ("fp8", 32, 1, False),
        ("fp8", 33, 1, True),
        ("fp8_ds_mla", 64, 4, True),
        ("fp8_ds_mla", 64, 8, False),
        ("fp8_ds_mla", 32, 1, False),
        ("fp8_ds_mla", 33, 2, True),
    ],
)
def test_more_than_32_query_rows_refuse_pages_under_a_tma_box(fmt, heads, page_size, refused, monkeypatch) -> None:
    """The wgmma kernel's fp8 variants (above the fp8 kernel's 32 rows) TMA-load boxes that must start on
    128-byte boundaries in shared memory: of 64-byte tokens (fp8: pages of 1 token are refused, of 2
    taken) and of fp8_ds_mla's 16 bytes of scales a token (pages under 8 tokens refused); the fp8
    kernel's two row tiles (17-32 rows) take pages of 1."""
    ds_mla_on_the_wgmma_kernel(monkeypatch)
    x = make_mla_inputs(2, heads, 64, kv_dtype=FP8 if fmt == "fp8" else None, kv_lens=[64, 50])
    kwargs, _ = cache_kwargs(x, fmt, "paged", page_size)
    reasons = cutlass_mla.supports(validate_mla_decoding(x.q, x.qpe, **kwargs))
    if refused:
        assert len(reasons) == 1, reasons
        assert "more than 32 query rows" in reasons[0] and f"got pages of {page_size} tokens" in reasons[0], reasons
        assert f"boxes of {cutlass_mla.FP8_WIDE_MIN_BOX_ROWS[fmt]} or more tokens" in reasons[0], reasons
    else:
        assert reasons == ["cutlass runs on NVIDIA GPUs only, got a tensor on cpu"], reasons


@pytest.mark.skipif(not hasattr(torch, "float8_e4m3fnuz"), reason="this torch has no float8_e4m3fnuz")
def test_the_amd_fp8_encoding_is_refused_with_its_name() -> None:
    reasons = cutlass_mla.supports(fp8_call(16, kv_dtype=torch.float8_e4m3fnuz))
    assert len(reasons) == 1 and "float8_e4m3fn " in reasons[0] and "e4m3fnuz" in reasons[0], reasons


def test_an_fp8_call_on_the_cpu_is_refused_for_the_arch_only() -> None:
    assert cutlass_mla.supports(fp8_call(8, q_len=2)) == ["cutlass runs on NVIDIA GPUs only, got a tensor on cpu"]


def test_fp8_ds_mla_is_a_format_the_backend_declares() -> None:
    x = make_mla_inputs(2, 16, 64)
    call = validate_mla_decoding(x.q, x.qpe, **pack_cache(x, "fp8_ds_mla").op_kwargs())
    assert cutlass_mla.supports(call) == ["cutlass runs on NVIDIA GPUs only, got a tensor on cpu"]
    mxfp4 = validate_mla_decoding(x.q, x.qpe, **pack_cache(x, "mxfp4").op_kwargs())
    assert cutlass_mla.supports(mxfp4) == ["cutlass does not implement the mxfp4 KV cache"]


def test_cache_rows_off_16_byte_boundaries_are_refused_with_a_reason() -> None:
    x = make_mla_inputs(2, 16, 64, kv_dtype=FP8)
    wide = torch.zeros(2, 64, 520, dtype=torch.uint8).view(FP8)  # rows of 520 bytes: not a multiple of 16
    wide[..., :512] = x.kv
    call = validate_mla_decoding(x.q, x.qpe, wide[..., :512], x.kpe, kv_scale=x.kv_scale)
    reasons = cutlass_mla.supports(call)
    assert len(reasons) == 1 and "kv rows on 16-byte boundaries" in reasons[0] and "(33280, 520, 1)" in reasons[0]
    packed = pack_cache(make_mla_inputs(2, 16, 64), "fp8_ds_mla").kv
    shifted = torch.zeros(packed.numel() + 4, dtype=torch.uint8)[4:].view(packed.shape)  # 4 bytes off
    shifted.copy_(packed)
    call = validate_mla_decoding(x.q, x.qpe, shifted, None, kv_cache_format="fp8_ds_mla")
    reasons = cutlass_mla.supports(call)
    assert [r.split(" rows")[0] for r in reasons] == [f"cutlass needs kv's {p}" for p in ("values", "rope", "scales")]


@pytest.mark.parametrize("fmt", ["fp8", "fp8_ds_mla"])
def test_calls_with_few_blocks_per_sm_take_the_few_blocks_config(fmt, monkeypatch) -> None:
    """fp8_config: up to FP8_FEW_BLOCKS_PER_SM blocks of 64 tokens per SM (two SMs here) the shared-ring
    config, from one block more the format's default."""
    monkeypatch.setattr(cutlass_mla, "multiprocessor_count", lambda device: 2)
    row_limit = cutlass_mla.FP8_FEW_BLOCKS_PER_SM * 64  # tokens per row of a batch of 2 at the limit
    chosen = []
    for seq_len in (1, row_limit, row_limit + 1):
        x = make_mla_inputs(2, 16, seq_len, kv_dtype=FP8 if fmt == "fp8" else None)
        kwargs, _ = cache_kwargs(x, fmt, "dense", generator=None)
        chosen.append(cutlass_mla.fp8_config(validate_mla_decoding(x.q, x.qpe, **kwargs)))
    few, default = cutlass_mla.FP8_FEW_BLOCKS_CONFIGS[fmt], cutlass_mla.FP8_CONFIGS[fmt]
    assert few != default and chosen == [few, few, default]


def test_the_shared_memory_size_matches_the_kernel_tiles() -> None:
    """1 KB alignment pad + stages of (64 tokens x 576 B) + the query as e4m3 parts (2 x 16 rows for
    bf16, 3 x 16 for fp16) + S [16, 72] float32 per warpgroup + the row scales + an mbarrier and a
    count of issued uses per stage; fp8_ds_mla: stages of 64 x 656 B, e4m3 latent parts + the bf16
    rope query [16, 64]."""
    config = cutlass_mla.Fp8Config(stages=2, groups=1, ctas_per_sm=2)
    rest = 1024 + 16 * 72 * 4 + 16 * 4 + 2 * 12
    bf16, fp16 = torch.bfloat16, torch.float16
    assert cutlass_mla.fp8_shared_bytes("fp8", config, bf16) == 2 * 64 * 576 + 32 * 576 + rest
    assert cutlass_mla.fp8_shared_bytes("fp8", config, fp16) == 2 * 64 * 576 + 48 * 576 + rest
    assert cutlass_mla.fp8_shared_bytes("fp8_ds_mla", config, bf16) == 2 * 64 * 656 + 32 * 512 + 16 * 128 + rest
    fitting = [("fp8", bf16), ("fp8", fp16), ("fp8_ds_mla", bf16)]
    assert all(cutlass_mla.fp8_config_fits(fmt, config, dtype) for fmt, dtype in fitting)
    three = cutlass_mla.Fp8Config(stages=5, groups=3, ctas_per_sm=1)
    assert cutlass_mla.fp8_shared_bytes("fp8", three, bf16) == 5 * 64 * 576 + 32 * 576 + rest + 2 * 16 * 72 * 4 + 3 * 12
    assert cutlass_mla.fp8_config_fits("fp8", three, bf16)
    assert not cutlass_mla.fp8_config_fits("fp8", cutlass_mla.Fp8Config(stages=3, groups=1, ctas_per_sm=2))
    # Warpgroups 1.. merge through the ring: 3 x 34 KB do not fit in two 36 KB stages.
    assert not cutlass_mla.fp8_config_fits("fp8", cutlass_mla.Fp8Config(stages=2, groups=4, ctas_per_sm=1))


def test_a_config_without_warpgroups_or_stages_is_refused_with_a_reason() -> None:
    call = fp8_call(16)
    for bad in (cutlass_mla.Fp8Config(2, 0, 2), cutlass_mla.Fp8Config(0, 1, 2), cutlass_mla.Fp8Config(2, 9, 1)):
        with pytest.raises(ValueError, match="1 <= groups <= 8"):
            cutlass_mla.CutlassFp8DecodePlan(call, bad)
    for snap in (-0.1, float("nan")):
        with pytest.raises(ValueError, match="snap must be >= 0"):
            cutlass_mla.CutlassFp8DecodePlan(call, cutlass_mla.Fp8Config(2, 1, 2, snap=snap))


# ----------------------------------------------------------------------------------------- GPU parity


def test_two_row_tiles_take_17_to_32_query_rows(monkeypatch) -> None:
    """FP8_TWO_TILES routes 17-32 query rows of an fp8 cache (fp8_ds_mla: with FP8_DS_MLA_TWO_TILES) to
    the fp8 kernel with two row tiles (its own config); off, a per-tensor cache's go to the wgmma
    kernel's fp8 variant, and fp8_ds_mla stops at 16."""
    monkeypatch.setattr(cutlass_mla, "FP8_TWO_TILES", False)
    assert cutlass_mla.fp8_row_tiles(fp8_call(16, q_len=2)) is None
    assert cutlass_mla._split_kernel_of(fp8_call(16, q_len=2)).instance_name.endswith(", 1, 1, 0>")  # kFp8 variant
    monkeypatch.setattr(cutlass_mla, "FP8_TWO_TILES", True)
    shapes = [(16, 1), (8, 2), (16, 2), (24, 1), (32, 1)]
    assert [cutlass_mla.fp8_row_tiles(fp8_call(h, q_len=q)) for h, q in shapes] == [1, 1, 2, 2, 2]
    assert cutlass_mla.fp8_row_tiles(fp8_call(16, q_len=3)) is None
    assert cutlass_mla.fp8_config(fp8_call(32)) == cutlass_mla.FP8_TWO_TILE_CONFIG
    kernel = cutlass_mla._split_kernel_of(fp8_call(32))
    assert kernel.instance_name.startswith(f"{cutlass_mla.FP8_KERNEL}<") and kernel.instance_name.endswith(", 2>")
    assert kernel in cutlass_mla.all_kernels()
    x = make_mla_inputs(2, 32, 64)
    ds_mla = validate_mla_decoding(x.q, x.qpe, **pack_cache(x, "fp8_ds_mla").op_kwargs())
    monkeypatch.setattr(cutlass_mla, "FP8_DS_MLA_TWO_TILES", False)
    assert cutlass_mla.fp8_row_tiles(ds_mla) is None
    monkeypatch.setattr(cutlass_mla, "FP8_DS_MLA_TWO_TILES", True)
    assert cutlass_mla.fp8_row_tiles(ds_mla) == 2
    assert cutlass_mla._split_kernel_of(ds_mla) in cutlass_mla.all_kernels()
    monkeypatch.setattr(cutlass_mla, "FP8_TWO_TILES", False)
    assert cutlass_mla.fp8_row_tiles(ds_mla) is None


def test_two_row_tiles_double_the_staged_query_and_scores() -> None:
    """Two tiles of 16 rows: the query's e4m3 parts and S [32, 72] per warpgroup double; two CTAs of two
    stages no longer fit an SM, one CTA of four stages and two warpgroups does (fp16 queries too)."""
    config, bf16, fp16 = cutlass_mla.FP8_TWO_TILE_CONFIG, torch.bfloat16, torch.float16
    rest = 1024 + 2 * 32 * 72 * 4 + 32 * 4 + 4 * 12
    assert cutlass_mla.fp8_shared_bytes("fp8", config, bf16, 2) == 4 * 64 * 576 + 64 * 576 + rest
    assert cutlass_mla.fp8_shared_bytes("fp8", config, fp16, 2) == 4 * 64 * 576 + 96 * 576 + rest
    assert cutlass_mla.fp8_config_fits("fp8", config, bf16, 2) and cutlass_mla.fp8_config_fits("fp8", config, fp16, 2)
    assert not cutlass_mla.fp8_config_fits("fp8", cutlass_mla.FP8_CONFIGS["fp8"], bf16, 2)


def require_cutlass() -> None:
    from tilegym.ops.cutlass import probe

    reasons = probe()
    if reasons:
        pytest.skip(f"cutlass cannot run here: {reasons}")


def check(out, lse, expected, fmt: str, dtype: torch.dtype, seed) -> None:
    rel_tol, lse_atol = output_tolerance(OP, BACKEND, dtype, fmt), lse_tolerance(OP, BACKEND, fmt)
    lse_rel = lse_rtol(OP, BACKEND, fmt)
    assert_matches_float64(out, lse, *expected, rel_tol=rel_tol, lse_atol=lse_atol, lse_rtol=lse_rel, seed=seed)


def run_case_against_float64(
    fmt, layout, page_size, batch, heads, q_len, seq_len, dtype, causal, split, plan_is=None
) -> None:
    """One GPU case: fresh random inputs with an empty, a one-token and a full row, the cutlass call against
    float64, zeros for the empty row; ``plan_is(plan)`` first checks which kernel the call takes."""
    generator, seed = fresh_generator()
    lens = torch.randint(0, seq_len + 1, (batch,), generator=generator).tolist()
    lens[:3] = [0, 1, seq_len]  # an empty row, a one-token row, a full row; the rest mixed
    kv_dtype = FP8 if fmt == "fp8" else None
    x = make_mla_inputs(
        batch, heads, seq_len, dtype=dtype, kv_dtype=kv_dtype, kv_lens=lens, q_len=q_len, device="cuda",
        generator=generator,
    )  # fmt: skip
    kwargs, cache = cache_kwargs(x, fmt, layout, page_size, generator=generator)
    if plan_is is not None:
        plan = cutlass_mla.plan(validate_mla_decoding(x.q, x.qpe, **kwargs))
        assert plan_is(plan), f"{layout} {batch} x {seq_len} x {heads} x {q_len}: {type(plan).__name__}"
    out, lse = mla_decoding_split_kv(
        x.q, x.qpe, causal=causal, return_lse=True, kv_len_per_split=split, backend=BACKEND, **kwargs
    )
    torch.cuda.synchronize()
    latent, rope = (x.kv, x.kpe) if cache is None else (cache.latent, cache.rope)
    scale = x.kv_scale if fmt == "fp8" else None
    expected = mla_decode_float64(x.q, x.qpe, latent, rope, kv_lens=x.kv_lens, kv_scale=scale, causal=causal)
    check(out, lse, expected, fmt, dtype, seed)
    empty = (x.kv_lens <= 0).cpu()
    assert bool((out.cpu()[empty] == 0).all()), f"a row with no tokens must give zeros, seed {seed}"


# The columns of every GPU case list below (dtype: the query's; split: kv_len_per_split).
CASE_COLUMNS = ("fmt", "layout", "page_size", "batch", "heads", "q_len", "seq_len", "dtype", "causal", "split")
GPU_CASES = [
    ("fp8", "dense", 0, 12, 16, 1, 3000, torch.bfloat16, True, None),
    ("fp8", "dense", 0, 6, 8, 2, 1000, torch.float16, True, None),
    ("fp8", "dense", 0, 5, 8, 2, 700, torch.bfloat16, False, 256),
    ("fp8", "paged", 64, 12, 16, 1, 4096, torch.bfloat16, True, None),
    ("fp8", "paged", 1, 6, 16, 1, 900, torch.float16, True, None),
    ("fp8", "paged", 2, 6, 16, 1, 700, torch.bfloat16, True, None),  # the smallest rope box TMA takes
    ("fp8", "ragged", 32, 8, 4, 3, 1200, torch.bfloat16, True, 320),
    ("fp8_ds_mla", "dense", 0, 12, 16, 1, 3000, torch.bfloat16, True, None),
    ("fp8_ds_mla", "dense", 0, 6, 8, 2, 1000, torch.bfloat16, False, 192),
    ("fp8_ds_mla", "paged", 64, 12, 16, 1, 4096, torch.bfloat16, True, None),
    ("fp8_ds_mla", "paged", 1, 6, 16, 1, 900, torch.bfloat16, True, None),
    ("fp8_ds_mla", "paged", 4, 6, 16, 1, 700, torch.bfloat16, True, None),  # scales by bulk copies, 4 a box
    ("fp8_ds_mla", "paged", 8, 6, 16, 1, 700, torch.bfloat16, True, None),  # the smallest scale box TMA takes
    ("fp8_ds_mla", "ragged", 16, 8, 5, 3, 1200, torch.bfloat16, True, 448),
    # few long rows: pieces of at least 7 blocks (FP8_PIECES_PER_ROW)
    ("fp8", "dense", 0, 3, 16, 1, 30000, torch.bfloat16, True, None),
    ("fp8_ds_mla", "paged", 64, 3, 16, 1, 30000, torch.bfloat16, True, None),
]


# Besides the library's choice per call (fp8_config): each config it chooses from (the default's tiles
# without its snapped pieces), and three warpgroups sharing one ring (a config the sweep compares).
OTHER_CONFIGS = [cutlass_mla.Fp8Config(2, 1, 2), cutlass_mla.Fp8Config(4, 2, 1), cutlass_mla.Fp8Config(4, 3, 1)]


@pytest.fixture(params=[None, *OTHER_CONFIGS], ids=lambda c: "default" if c is None else "x".join(map(str, c[:3])))
def fp8_config(request, monkeypatch):
    """Each GPU case runs with the library's choice and with each of OTHER_CONFIGS (plans rebuilt).
    The library builds the configs fp8_config chooses from; others come from the sweep's precompile,
    and a case whose variant has no cubin here is skipped saying so (not failed as unsupported)."""
    from tilegym.ops import PLAN_CACHE

    if request.param is not None:
        missing = [
            f"{fmt} with {dtype} queries"
            for fmt in cutlass_mla.FP8_FORMATS
            for dtype in cutlass_mla.fp8_query_dtypes(fmt)
            if not cutlass_mla.fp8_split_kernel(dtype, fmt, request.param).available("sm_90a")
        ]
        if missing:
            pytest.skip(
                f"no cubin for {request.param} ({', '.join(missing)}): run "
                "`python benchmarks/sweep_cutlass_fp8.py --precompile` where the CUTLASS headers are"
            )
        configs = {fmt: request.param for fmt in cutlass_mla.FP8_CONFIGS}
        monkeypatch.setattr(cutlass_mla, "FP8_CONFIGS", configs)
        monkeypatch.setattr(cutlass_mla, "FP8_FEW_BLOCKS_CONFIGS", configs)
    PLAN_CACHE.clear()
    yield request.param
    PLAN_CACHE.clear()


@pytest.mark.gpu
@pytest.mark.parametrize(
    CASE_COLUMNS,
    GPU_CASES,
    ids=str,
)
def test_fp8_caches_match_float64(
    fmt, layout, page_size, batch, heads, q_len, seq_len, dtype, causal, split, fp8_config
) -> None:
    require_cutlass()
    run_case_against_float64(fmt, layout, page_size, batch, heads, q_len, seq_len, dtype, causal, split)


# Two row tiles (FP8_TWO_TILES), CASE_COLUMNS
TWO_TILE_CASES = [
    ("fp8", "dense", 0, 12, 16, 2, 3000, torch.bfloat16, True, None),  # MTP: 32 rows
    ("fp8", "dense", 0, 6, 24, 1, 1000, torch.float16, True, 256),  # 24 rows: a half-empty second tile, splits
    ("fp8", "paged", 64, 8, 32, 1, 2500, torch.bfloat16, True, None),
    ("fp8", "paged", 1, 5, 16, 2, 700, torch.bfloat16, False, None),
    ("fp8", "ragged", 16, 6, 8, 4, 900, torch.bfloat16, True, 320),
    ("fp8_ds_mla", "dense", 0, 12, 16, 2, 3000, torch.bfloat16, True, None),
    ("fp8_ds_mla", "dense", 0, 6, 24, 1, 1000, torch.bfloat16, True, 256),
    ("fp8_ds_mla", "paged", 64, 8, 32, 1, 2500, torch.bfloat16, True, None),
    ("fp8_ds_mla", "paged", 1, 5, 16, 2, 700, torch.bfloat16, False, None),
    ("fp8_ds_mla", "ragged", 16, 6, 8, 4, 900, torch.bfloat16, True, 320),
]


def has_two_tiles(plan) -> bool:
    return isinstance(plan, cutlass_mla.CutlassFp8DecodePlan) and plan.row_tiles == 2


@pytest.mark.gpu
@pytest.mark.parametrize(
    CASE_COLUMNS,
    TWO_TILE_CASES,
    ids=str,
)
def test_two_row_tiles_match_float64(
    fmt, layout, page_size, batch, heads, q_len, seq_len, dtype, causal, split, monkeypatch
) -> None:
    require_cutlass()
    monkeypatch.setattr(cutlass_mla, "FP8_TWO_TILES", True)
    monkeypatch.setattr(cutlass_mla, "FP8_DS_MLA_TWO_TILES", True)
    run_case_against_float64(fmt, layout, page_size, batch, heads, q_len, seq_len, dtype, causal, split, has_two_tiles)


@pytest.mark.gpu
def test_a_per_tensor_scale_needs_no_alignment() -> None:
    """kv_scale is one float read on the device: a view 4 bytes into a buffer works (only the cache
    rows are copied in 16-byte chunks)."""
    require_cutlass()
    generator, seed = fresh_generator()
    x = make_mla_inputs(4, 16, 300, kv_dtype=FP8, device="cuda", generator=generator)
    scale = torch.zeros(4, dtype=torch.float32, device="cuda")[1:2]
    scale.copy_(x.kv_scale)
    assert scale.data_ptr() % 16
    out, lse = mla_decoding_split_kv(x.q, x.qpe, x.kv, x.kpe, kv_scale=scale, return_lse=True, backend=BACKEND)
    expected = mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, kv_scale=x.kv_scale)
    check(out, lse, expected, "fp8", torch.bfloat16, seed)


@pytest.mark.parametrize("offset", [1, 4], ids=["2-byte", "8-byte"])
@pytest.mark.parametrize("fmt", ["fp8", "fp8_ds_mla"])
@pytest.mark.gpu
def test_queries_off_16_byte_boundaries(fmt, offset) -> None:
    """q and qpe as views ``offset`` elements into their buffers: the query is read in 2-byte
    elements, not in the 16-byte chunks the kernel loads for aligned rows."""
    require_cutlass()
    generator, seed = fresh_generator()
    x = make_mla_inputs(3, 16, 500, kv_dtype=FP8 if fmt == "fp8" else None, device="cuda", generator=generator)
    q = torch.empty(*x.q.shape[:-1], x.q.shape[-1] + offset, dtype=x.q.dtype, device="cuda")[..., offset:]
    qpe = torch.empty(*x.qpe.shape[:-1], x.qpe.shape[-1] + offset, dtype=x.qpe.dtype, device="cuda")[..., offset:]
    q.copy_(x.q)
    qpe.copy_(x.qpe)
    assert q.data_ptr() % 16 and qpe.data_ptr() % 16
    if fmt == "fp8":
        cache_kwargs, latent, rope = {"kv": x.kv, "kpe": x.kpe, "kv_scale": x.kv_scale}, x.kv, x.kpe
    else:
        cache = pack_cache(x, fmt)
        cache_kwargs, latent, rope = cache.op_kwargs(), cache.latent, cache.rope
    out, lse = mla_decoding_split_kv(q, qpe, return_lse=True, backend=BACKEND, **cache_kwargs)
    scale = x.kv_scale if fmt == "fp8" else None
    expected = mla_decode_float64(x.q, x.qpe, latent, rope, kv_scale=scale)
    check(out, lse, expected, fmt, torch.bfloat16, seed)


# Equal rows: SMs - 12 rows of 17 blocks (one CTA per SM) or of 34 (two): balanced pieces of 16 blocks
# cut every row; a snap of 1/16 lets each piece hold a whole row or half of one (17 blocks), so no row
# is cut unevenly (tests/test_schedule.py covers the rule on the CPU; here the kernel runs it).
SNAPPED_CONFIGS = [cutlass_mla.Fp8Config(2, 1, 2, snap=1 / 16), cutlass_mla.Fp8Config(4, 3, 1, snap=1 / 16)]


@pytest.mark.parametrize("config", SNAPPED_CONFIGS, ids=lambda c: "x".join(map(str, c[:3])))
@pytest.mark.parametrize("fmt", ["fp8", "fp8_ds_mla"])
@pytest.mark.gpu
def test_snapped_pieces_match_float64(fmt, config) -> None:
    """Fp8Config.snap (host only): pieces of equal-length rows that hold whole segments."""
    require_cutlass()
    generator, seed = fresh_generator()
    rows = torch.cuda.get_device_properties(0).multi_processor_count - 12
    piece_blocks = 17
    row_tokens = piece_blocks * config.ctas_per_sm * cutlass_mla.FP8_BLOCK_N
    x = make_mla_inputs(
        rows, 16, row_tokens, kv_dtype=FP8 if fmt == "fp8" else None, device="cuda", generator=generator
    )
    kwargs, cache = cache_kwargs(x, fmt, "dense", 0, generator=generator)
    call = validate_mla_decoding(x.q, x.qpe, return_lse=True, **kwargs)
    if not cutlass_mla.fp8_split_kernel(call.q.dtype, fmt, config).available("sm_90a"):
        pytest.skip(f"no cubin for {config}: run `python benchmarks/sweep_cutlass_fp8.py --precompile`")
    plan = cutlass_mla.CutlassFp8DecodePlan(call, config)
    out, lse = torch.empty_like(call.out), torch.empty(call.out.shape[:-1], device="cuda")  # [B, 1, H, *]
    plan.run(call.q, call.qpe, call.kv, call.kpe, call.kv_scale, out, lse)
    torch.cuda.synchronize()
    sizes = (plan.schedule.piece_bounds[1:] - plan.schedule.piece_bounds[:-1]).cpu()
    assert set(sizes[sizes > 0].tolist()) == {piece_blocks}, f"pieces not snapped: {sizes.tolist()}"
    latent, rope = (x.kv, x.kpe) if cache is None else (cache.latent, cache.rope)
    scale = x.kv_scale if fmt == "fp8" else None
    expected = mla_decode_float64(x.q, x.qpe, latent, rope, kv_scale=scale)  # [B, H, *]: the 3-D query's
    check(out.reshape(expected[0].shape), lse.reshape(expected[1].shape), expected, fmt, torch.bfloat16, seed)


FAR_SCALES = [(torch.bfloat16, -20), (torch.bfloat16, 20), (torch.float16, -8), (torch.float16, 8)]


@pytest.mark.parametrize(("dtype", "exponent"), FAR_SCALES, ids=str)
@pytest.mark.gpu
def test_queries_far_from_unit_scale(dtype, exponent) -> None:
    """The query is staged per row as e4m3 parts (largest value 448) after a power-of-two scale: a
    query 2^exponent times larger, with sm_scale 2^-exponent times smaller (the same scores), must
    match float64 like unit queries do (fp16: +-8 stays finite)."""
    require_cutlass()
    generator, seed = fresh_generator()
    x = make_mla_inputs(3, 16, 700, dtype=dtype, kv_dtype=FP8, device="cuda", generator=generator)
    factor = 2.0**exponent
    q, qpe = (x.q.float() * factor).to(dtype), (x.qpe.float() * factor).to(dtype)
    sm_scale = 576**-0.5 / factor
    out, lse = mla_decoding_split_kv(
        q, qpe, x.kv, x.kpe, kv_scale=x.kv_scale, sm_scale=sm_scale, return_lse=True, backend=BACKEND
    )
    expected = mla_decode_float64(q, qpe, x.kv, x.kpe, sm_scale, kv_scale=x.kv_scale)
    check(out, lse, expected, "fp8", dtype, seed)


# ------------------------------------------- fp8 at 17-1024 query rows: the wgmma kernel's fp8 variant
# (from 33 rows by default; 17-32 with FP8_TWO_TILES off)

BF16, FP16 = torch.bfloat16, torch.float16
# The wgmma kernel's fp8 variants, CASE_COLUMNS
WIDE_CASES = [
    ("fp8", "dense", 0, 6, 64, 1, 3000, BF16, True, None),
    ("fp8", "dense", 0, 4, 128, 1, 2000, BF16, True, None),  # two 64-row groups: the cluster pair
    ("fp8", "dense", 0, 5, 16, 2, 1500, FP16, True, 256),  # MTP, 32 rows, forced splits through the combine
    ("fp8", "dense", 0, 3, 24, 3, 800, BF16, True, None),  # 72 rows: a partial second group
    ("fp8", "paged", 64, 6, 128, 1, 2500, BF16, True, None),
    ("fp8", "paged", 2, 4, 64, 1, 700, BF16, True, None),  # the smallest box the variant takes
    ("fp8", "ragged", 16, 5, 32, 2, 900, BF16, False, 320),
    ("fp8", "dense", 0, 3, 128, 2, 1200, BF16, True, None),  # 256 rows: two cluster pairs per piece
    ("fp8", "paged", 64, 4, 64, 3, 900, FP16, True, 256),  # 192 rows: the second pair's last CTA without rows
    # fp8_ds_mla (its pages hold NaN bytes wherever a row must not read)
    ("fp8_ds_mla", "dense", 0, 6, 64, 1, 3000, BF16, True, None),
    ("fp8_ds_mla", "dense", 0, 4, 128, 1, 2000, BF16, True, None),
    ("fp8_ds_mla", "dense", 0, 5, 16, 4, 1500, BF16, True, 256),  # MTP, 64 rows, forced splits
    ("fp8_ds_mla", "dense", 0, 3, 24, 3, 800, BF16, False, None),  # 72 rows
    ("fp8_ds_mla", "paged", 64, 6, 128, 1, 2500, BF16, True, None),
    ("fp8_ds_mla", "paged", 8, 4, 64, 1, 700, BF16, True, None),  # the smallest scale box TMA takes
    ("fp8_ds_mla", "ragged", 16, 5, 32, 2, 900, BF16, True, 320),
    ("fp8_ds_mla", "dense", 0, 3, 128, 2, 1200, BF16, True, None),  # 256 rows
    ("fp8_ds_mla", "paged", 64, 4, 64, 3, 900, BF16, True, 256),  # 192 rows
]


def is_wide(plan) -> bool:
    return isinstance(plan, cutlass_mla.CutlassFp8WideDecodePlan)


@pytest.mark.gpu
@pytest.mark.parametrize(
    CASE_COLUMNS,
    WIDE_CASES,
    ids=str,
)
def test_fp8_at_many_query_rows_matches_float64(
    fmt, layout, page_size, batch, heads, q_len, seq_len, dtype, causal, split, monkeypatch
) -> None:
    require_cutlass()
    monkeypatch.setattr(cutlass_mla, "FP8_TWO_TILES", False)  # 17-32 rows too: the variant is their fallback
    ds_mla_on_the_wgmma_kernel(monkeypatch, two_tiles=False)
    run_case_against_float64(fmt, layout, page_size, batch, heads, q_len, seq_len, dtype, causal, split, is_wide)


@pytest.mark.parametrize("exponent", [-20, 20, -60], ids=str)
@pytest.mark.gpu
def test_fp8_at_many_query_rows_with_queries_far_from_unit_scale(exponent) -> None:
    """The variant stages a bf16 query as fp16 after a power-of-two scale per row: queries 2^exponent
    times larger (beyond fp16's range both ways), with sm_scale 2^-exponent times smaller, must match
    float64 like unit queries do."""
    require_cutlass()
    generator, seed = fresh_generator()
    x = make_mla_inputs(3, 64, 700, kv_dtype=FP8, device="cuda", generator=generator)
    factor = 2.0**exponent
    q, qpe = (x.q.float() * factor).to(BF16), (x.qpe.float() * factor).to(BF16)
    out, lse = mla_decoding_split_kv(
        q, qpe, x.kv, x.kpe, kv_scale=x.kv_scale, sm_scale=576**-0.5 / factor, return_lse=True, backend=BACKEND
    )
    expected = mla_decode_float64(q, qpe, x.kv, x.kpe, 576**-0.5 / factor, kv_scale=x.kv_scale)
    check(out, lse, expected, "fp8", BF16, seed)


@pytest.mark.parametrize("exponent", [-40, 24], ids=str)
@pytest.mark.gpu
def test_fp8_at_many_query_rows_with_a_cache_scale_far_from_unit(exponent) -> None:
    """A cache scale 2^exponent times larger (outputs beyond fp16's range both ways), with sm_scale
    2^-exponent times smaller (the scores as drawn), must match float64 through forced splits: the
    variant's split rows' partials hold the scaled outputs."""
    require_cutlass()
    generator, seed = fresh_generator()
    x = make_mla_inputs(3, 64, 700, kv_dtype=FP8, device="cuda", kv_lens=(700, 300, 1), generator=generator)
    factor = 2.0**exponent
    kv_scale, sm_scale = x.kv_scale * factor, 576**-0.5 / factor
    out, lse = mla_decoding_split_kv(
        x.q, x.qpe, x.kv, x.kpe, sm_scale, 128, kv_lens=x.kv_lens, kv_scale=kv_scale, return_lse=True, backend=BACKEND
    )
    expected = mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, sm_scale, kv_lens=x.kv_lens, kv_scale=kv_scale)
    assert out.isfinite().all(), f"seed {seed}: a non-finite output"
    check(out, lse, expected, "fp8", BF16, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("split", [None, 128])
@pytest.mark.parametrize("heads", [16, 64, 128])
def test_fp8_scores_that_grow_along_the_row(heads: int, split: int | None) -> None:
    """Keys scaled up along the row before quantisation and a large softmax scale: the running max
    rises on most blocks, now and then by more than 8 log2 units (the wgmma kernel's fp8 variant,
    64/128 heads), and the scores reach tens (the 16-row fp8 kernel at 16 heads, whose fp8 MMA
    scores miss lse's absolute bound there, 4.8-7.3e-3 against 1e-3: its declared lse tolerance
    adds a part of |lse|, tilegym/ops/accuracy.py)."""
    require_cutlass()
    generator, seed = fresh_generator()
    x = make_mla_inputs(4, heads, 1000, device="cuda", kv_lens=(1000, 999, 130, 1), generator=generator)
    grown = x.cache.float() * torch.linspace(0.2, 3.0, 1000, device="cuda").view(1, -1, 1)
    scale = grown.abs().amax() / torch.finfo(FP8).max
    x.cache, x.kv_scale = (grown / scale).to(FP8), scale.reshape(1)
    out, lse = mla_decoding_split_kv(
        x.q, x.qpe, x.kv, x.kpe, 0.2, split, kv_lens=x.kv_lens, kv_scale=x.kv_scale, return_lse=True, backend=BACKEND
    )
    torch.cuda.synchronize()
    expected = mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, 0.2, kv_lens=x.kv_lens, kv_scale=x.kv_scale, causal=True)
    check(out, lse, expected, "fp8", torch.bfloat16, seed)
