"""The cutlass backend (CuTe, sm_90a): what it refuses and why (CPU), and parity with the float64
oracle on an H100/H200 (GPU): 16, 64 and 128 heads, 1, 2 and 4 new tokens per row (causal and
not, rows shorter than the new tokens), dense, paged and ragged caches, mixed lengths, forced
splits through the combine, bf16 and fp16."""

from __future__ import annotations

import pytest
import torch

from tilegym.backend import BackendUnavailableError
from tilegym.ops import mla_decoding_split_kv, plan_mla_decoding
from tilegym.ops.accuracy import lse_rtol, lse_tolerance
from tilegym.ops.contract import validate_mla_decoding
from tilegym.ops.cutlass import mla_decoding_split_kv as cutlass_mla
from tilegym.ops.mla_decoding import MLA_DECODING
from tilegym.testing import fresh_generator, make_mla_inputs, mla_decode_float64, relative_error, to_pages

BACKEND = "cutlass"


def _call(heads: int, q_len: int = 1, *, dtype=torch.bfloat16, kv_dtype=None, head_dim=512, rope_dim=64):
    x = make_mla_inputs(2, heads, 64, head_dim, rope_dim, dtype=dtype, kv_dtype=kv_dtype, q_len=q_len)
    return validate_mla_decoding(x.q, x.qpe, x.kv, x.kpe, kv_scale=x.kv_scale)


# ----------------------------------------------------------------------------- CPU: reasons, not crashes


def test_too_many_query_rows_is_refused_with_a_reason() -> None:
    reasons = cutlass_mla.supports(_call(160, q_len=8))
    assert len(reasons) == 1 and "1..1024 query rows" in reasons[0] and "8 x 160 = 1280" in reasons[0]
    assert cutlass_mla.supports(_call(128, q_len=8)) == ["cutlass runs on NVIDIA GPUs only, got a tensor on cpu"]


@pytest.mark.parametrize(
    ("rows", "groups"), [(1, 1), (64, 1), (65, 2), (128, 2), (129, 4), (192, 4), (256, 4), (257, 6), (1024, 16)]
)
def test_query_rows_run_as_one_cta_or_cluster_pairs_per_piece(rows: int, groups: int) -> None:
    """Above one 64-row group the CTAs of a piece come in cluster pairs (the pair kernel's cluster shape),
    so an odd number of groups gets a spare CTA."""
    assert cutlass_mla.row_groups(rows) == groups
    assert cutlass_mla.row_groups(min(rows, 16), cutlass_mla.FP8_MAX_QUERY_ROWS) == 1  # the 16-row fp8 kernel


def test_fp8_cache_at_many_heads_is_taken_by_the_wgmma_kernel() -> None:
    """(tests/test_cutlass_fp8.py covers the fp8 variant's reasons and parity.)"""
    assert cutlass_mla.supports(_call(64, kv_dtype=torch.float8_e4m3fn)) == [
        "cutlass runs on NVIDIA GPUs only, got a tensor on cpu"
    ]
    kernel = cutlass_mla._split_kernel_of(_call(64, kv_dtype=torch.float8_e4m3fn))
    assert kernel.instance_name == f"{cutlass_mla.KERNEL}<__nv_bfloat16, 1, 1, 0>"  # dtype, kPair, kFp8, kMerge


@pytest.mark.parametrize(
    ("heads", "q_len", "kv_dtype", "merged"),
    [(64, 1, None, True), (16, 4, None, True), (16, 2, None, False), (16, 1, None, False), (128, 1, None, False)]
    + [(64, 1, torch.float8_e4m3fn, False)],
)
def test_row_halves_kernel_serves_64_query_rows_of_a_16_bit_cache(heads, q_len, kv_dtype, merged: bool) -> None:
    """The row-halves kernel (a cluster of two pieces) runs for one group of 64 query rows; 16 heads, where it
    measured slower, and cluster pairs and fp8 caches keep their kernels."""
    call = _call(heads, q_len, kv_dtype=kv_dtype)
    assert cutlass_mla.merges_row_halves(call) is merged
    assert cutlass_mla._split_kernel_of(call).instance_name.endswith(", 1>" if merged else ", 0>")


def test_other_head_dims_are_refused_with_a_reason() -> None:
    reasons = cutlass_mla.supports(_call(16, head_dim=128, rope_dim=32))
    assert reasons == ["cutlass supports D=512, P=64, got D=128, P=32"]


def test_cpu_tensors_are_refused_with_a_reason() -> None:
    reasons = cutlass_mla.supports(_call(16, q_len=2))
    assert reasons == ["cutlass runs on NVIDIA GPUs only, got a tensor on cpu"]


def test_batches_beyond_the_combine_grid_are_refused_with_a_reason() -> None:
    x = make_mla_inputs(1, 16, 8)
    big = cutlass_mla.MAX_GRID_Y + 1
    q, qpe, cache = (t.expand(big, *t.shape[1:]) for t in (x.q, x.qpe, x.cache))
    call = validate_mla_decoding(q, qpe, cache[..., :512], cache[..., 512:])
    assert cutlass_mla.supports(call) == [
        f"cutlass launches its combine with the batch on grid.y: at most 65535 rows, got {big}"
    ]


def test_a_cache_expanded_over_the_batch_is_refused_with_a_reason() -> None:
    x = make_mla_inputs(1, 16, 64)
    q, qpe, cache = (t.expand(3, *t.shape[1:]) for t in (x.q, x.qpe, x.cache))  # batch stride 0
    reasons = cutlass_mla.supports(validate_mla_decoding(q, qpe, cache[..., :512], cache[..., 512:]))
    assert len(reasons) == 2 and all("by TMA" in r and "[0, 1152] bytes" in r for r in reasons), reasons


@pytest.mark.parametrize(("capability", "found"), [((8, 0), "sm_80"), ((10, 0), "sm_100")])
def test_probe_names_hopper_as_the_only_arch(monkeypatch: pytest.MonkeyPatch, capability, found: str) -> None:
    import tilegym.ops.cutlass as backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: capability)
    monkeypatch.setattr(torch.version, "hip", None)
    assert backend.probe() == [f"needs a Hopper GPU (sm_90: its kernels use wgmma), found {found}"]


def test_asking_for_cutlass_on_cpu_raises_backend_unavailable() -> None:
    x = make_mla_inputs(1, 16, 32)
    with pytest.raises(BackendUnavailableError, match="cutlass"):
        mla_decoding_split_kv(x.q, x.qpe, x.kv, x.kpe, backend=BACKEND)


def test_every_variant_is_listed_for_precompile() -> None:
    import tilegym.ops.cutlass as backend

    names = sorted(k.instance_name for k in backend.all_kernels())
    fp8 = []
    for configs in (cutlass_mla.FP8_CONFIGS, cutlass_mla.FP8_FEW_BLOCKS_CONFIGS):
        tiles, ds = (f"{c.stages}, {c.groups}, {c.ctas_per_sm}, {c.chunk}" for c in configs.values())  # kStages ..
        fp8 += [f"{cutlass_mla.FP8_KERNEL}<{c}, 0, {tiles}, 1>" for c in ("__half", "__nv_bfloat16")]  # one row tile
        fp8.append(f"{cutlass_mla.FP8_KERNEL}<__nv_bfloat16, 1, {ds}, 1>")  # fp8_ds_mla: bf16 queries only
    two = cutlass_mla.FP8_TWO_TILE_CONFIG
    two_tiles = f"{two.stages}, {two.groups}, {two.ctas_per_sm}, {two.chunk}, 2"
    fp8 += [f"{cutlass_mla.FP8_KERNEL}<{c}, 0, {two_tiles}>" for c in ("__half", "__nv_bfloat16")]  # per-tensor
    fp8.append(f"{cutlass_mla.FP8_KERNEL}<__nv_bfloat16, 1, {two_tiles}>")  # fp8_ds_mla
    assert names == sorted(
        [
            *(
                f"{cutlass_mla.COMBINE_KERNEL}<{part}, {ctype}>"
                for part in ("float", "__half")  # fp16: the 16-row kernel's per-tensor fp8 partials
                for ctype in ("__half", "__nv_bfloat16")
            ),
            *(
                f"{cutlass_mla.KERNEL}<{c}, {pair}, {fp8_cache}, 0>"
                for c in ("__half", "__nv_bfloat16")
                for pair in (1, 2)
                for fp8_cache in (0, 1)
            ),
            *(f"{cutlass_mla.KERNEL}<__nv_bfloat16, {pair}, 2, 0>" for pair in (1, 2)),  # fp8_ds_mla, bf16 queries
            *(f"{cutlass_mla.KERNEL}<{c}, 1, 0, 1>" for c in ("__half", "__nv_bfloat16")),  # row halves
            *fp8,
        ]
    )


@pytest.mark.parametrize(
    ("layout", "size", "rows"),
    [("dense", 4096, 64), ("dense", 40, 32), ("paged", 1, 1), ("paged", 16, 16), ("paged", 64, 64), ("paged", 256, 64)],
)
def test_tma_boxes_never_cross_a_page_or_a_block(layout: str, size: int, rows: int) -> None:
    # Dense: `size` tokens per row; paged: `size` tokens per page.
    tokens = size if layout == "dense" else 2 * size
    x = make_mla_inputs(2, 16, tokens, kv_lens=[tokens, tokens - 1])
    kv, kpe = x.kv, x.kpe
    kwargs = {}
    if layout == "paged":
        pages = to_pages(x, size)
        kv, kpe, kwargs = pages.kv, pages.kpe, pages.layout_kwargs("paged")
    call = validate_mla_decoding(x.q, x.qpe, kv, kpe, **kwargs)
    assert cutlass_mla.tma_box_rows(call) == rows
    assert cutlass_mla.TOKENS_PER_BLOCK % rows == 0 and (layout == "dense" or size % rows == 0)


def test_tensor_maps_are_passed_by_value_in_the_parameter_buffer() -> None:
    import ctypes

    from tilegym.ops.cubin_loader import _ParamBuffer

    kinds = ("int", "const __grid_constant__ CUtensorMap", "long long")
    buffer = _ParamBuffer(kinds)
    tensor_map = bytes(range(128))
    pointers = ctypes.cast(buffer.fill((7, tensor_map, -3)), ctypes.POINTER(ctypes.c_void_p))
    assert ctypes.c_int.from_address(pointers[0]).value == 7
    assert ctypes.string_at(pointers[1], 128) == tensor_map
    assert ctypes.c_longlong.from_address(pointers[2]).value == -3


def test_shared_memory_request_fits_one_hopper_sm() -> None:
    # 227 KB is the most one CTA may ask for on sm_90.
    assert cutlass_mla.SHARED_BYTES <= 227 * 1024


# ----------------------------------------------------------------------------- GPU: parity


def _on_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


needs_hopper = pytest.mark.skipif(not _on_hopper(), reason="needs an sm_90 GPU (H100/H200)")


def _check(
    x, out, lse, *, causal: bool, sm_scale: float | None = None, dtype=torch.bfloat16, column_blocks: int = 1
) -> None:
    """out and lse against float64; the output's relative error in each of ``column_blocks`` equal
    blocks of columns on its own (blocks of very different magnitudes)."""
    expected, expected_lse = mla_decode_float64(x.q, x.qpe, x.kv, x.kpe, sm_scale, kv_lens=x.kv_lens, causal=causal)
    tolerance = MLA_DECODING.tolerance(BACKEND, dtype, x.kv.dtype)
    for i, (got, want) in enumerate(zip(out.chunk(column_blocks, -1), expected.chunk(column_blocks, -1), strict=True)):
        err = relative_error(got, want)
        assert err <= tolerance, f"column block {i}: rel. L2 error {err:.2e} > {tolerance:.0e}"
    live = expected_lse.isfinite()
    atol = lse_tolerance(MLA_DECODING.name, BACKEND, x.kv.dtype)
    rtol = lse_rtol(MLA_DECODING.name, BACKEND, x.kv.dtype)
    torch.testing.assert_close(lse.cpu().double()[live], expected_lse[live], atol=atol, rtol=rtol)
    assert torch.equal(lse.cpu()[~live], torch.full_like(lse.cpu()[~live], float("-inf")))
    assert torch.all(out.cpu()[~live] == 0)


GPU_CASES = [
    # (heads, q_len, causal, lens) with S = 300 unless the lens say otherwise
    (16, 1, True, None),
    (16, 2, True, (300, 1, 0, 157)),
    (16, 4, True, (300, 3, 2, 77)),
    (16, 4, False, (300, 3, 0, 77)),
    (64, 1, True, (300, 64, 65, 1)),
    (64, 2, True, (129, 1, 300, 64)),
    (64, 2, False, (129, 1, 300, 64)),
    (128, 1, True, (300, 0, 191, 200)),
    (128, 1, True, None),
    (16, 6, True, (300, 5, 0, 100)),  # 96 rows: a cluster pair whose second CTA is half empty
    (128, 2, True, (300, 1, 0, 129)),  # 256 rows: two cluster pairs per piece
    (64, 3, True, (300, 2, 0, 65)),  # 192 rows: two pairs, the last CTA without rows
]


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize(("heads", "q_len", "causal", "lens"), GPU_CASES)
@pytest.mark.parametrize("layout", ["dense", "paged", "ragged"])
def test_parity_with_float64(heads: int, q_len: int, causal: bool, lens, layout: str) -> None:
    g = torch.Generator().manual_seed(hash((heads, q_len, causal, lens, layout)) % 2**31)
    batch = 4 if lens is not None else 3
    x = make_mla_inputs(batch, heads, 300, dtype=torch.bfloat16, device="cuda", kv_lens=lens, generator=g, q_len=q_len)
    kwargs = {"kv_lens": x.kv_lens}
    kv, kpe = x.kv, x.kpe
    if layout != "dense":
        if x.kv_lens is None:
            x.kv_lens = kwargs["kv_lens"] = torch.full((batch,), 300, dtype=torch.int32, device="cuda")
        paged = to_pages(x, 16 if layout == "paged" else 1, generator=g)
        kv, kpe = paged.kv, paged.kpe
        kwargs = paged.layout_kwargs(layout)
    out, lse = mla_decoding_split_kv(x.q, x.qpe, kv, kpe, causal=causal, return_lse=True, backend=BACKEND, **kwargs)
    torch.cuda.synchronize()
    _check(x, out, lse, causal=causal)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("split", [64, 128])
@pytest.mark.parametrize("heads", [32, 64])  # 64 or 128 query rows: one CTA or a cluster pair per piece
def test_forced_splits_go_through_the_combine(dtype: torch.dtype, split: int, heads: int) -> None:
    g = torch.Generator().manual_seed(split + heads)
    lens = (1000, 0, 513, 64, 1)
    x = make_mla_inputs(5, heads, 1000, dtype=dtype, device="cuda", kv_lens=lens, generator=g, q_len=2)
    out, lse = mla_decoding_split_kv(
        x.q, x.qpe, x.kv, x.kpe, 0.05, split, kv_lens=x.kv_lens, return_lse=True, backend=BACKEND
    )
    torch.cuda.synchronize()
    _check(x, out, lse, causal=True, sm_scale=0.05, dtype=dtype)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("split", [64, 256, None])
@pytest.mark.parametrize("most_rows", [4, 32])
def test_combine_ctas_of_many_rows(split: int | None, most_rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Enough (batch row, query row) pairs that a combine CTA takes several query rows: rows of 1-4
    segments (a warp each) and of more (the CTA's warps share each row, one row after another); and,
    with COMBINE_MAX_ROWS_PER_CTA raised, warps that take several rows one after another."""
    monkeypatch.setattr(cutlass_mla, "COMBINE_MAX_ROWS_PER_CTA", most_rows)
    g = torch.Generator().manual_seed(split or 1)
    lens = tuple(int(n) for n in torch.randint(1, 1200, (40,), generator=g))
    x = make_mla_inputs(40, 128, 1200, device="cuda", kv_lens=lens, generator=g)
    kwargs = {"kv_lens": x.kv_lens, "return_lse": True}
    plan = plan_mla_decoding(x.q, x.qpe, x.kv, x.kpe, None, split, backend=BACKEND, **kwargs)
    rows = plan.runner._combine_sizes[-1]
    assert rows == 4 if most_rows == 4 else rows > 4, f"a combine CTA takes {rows} query rows"
    out, lse = mla_decoding_split_kv(x.q, x.qpe, x.kv, x.kpe, None, split, plan=plan, **kwargs)
    torch.cuda.synchronize()
    _check(x, out, lse, causal=True)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("page_size", [32, 64])
def test_large_pages_and_many_heads(page_size: int) -> None:
    g = torch.Generator().manual_seed(page_size)
    x = make_mla_inputs(6, 128, 2000, device="cuda", kv_lens=(2000, 1999, 700, 33, 1500, 1024), generator=g)
    paged = to_pages(x, page_size, generator=g)
    out, lse = mla_decoding_split_kv(
        x.q, x.qpe, paged.kv, paged.kpe, return_lse=True, backend=BACKEND, **paged.layout_kwargs("paged")
    )
    torch.cuda.synchronize()
    _check(x, out, lse, causal=True)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize(("heads", "q_len"), [(16, 1), (16, 2), (128, 1)])
@pytest.mark.parametrize("layout", ["dense", "paged"])
def test_pieces_that_cross_rows(heads: int, q_len: int, layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of several blocks that meet several rows, with odd and even block counts per segment:
    each segment refills both buffers and stages its query again, and rows split between pieces go
    through the combine. (Pieces of equal blocks: with a segment cost, rows this short would rarely
    share a piece.)"""
    for name in ("SEGMENT_COST_TOKENS", "PAIR_SEGMENT_COST_TOKENS"):
        monkeypatch.setattr(cutlass_mla, name, 0)
    g = torch.Generator().manual_seed(heads * 10 + q_len)
    lens = tuple(int(n) for n in torch.randint(1, 700, (48,), generator=g))
    x = make_mla_inputs(48, heads, 700, device="cuda", kv_lens=lens, generator=g, q_len=q_len)
    kv, kpe, kwargs = x.kv, x.kpe, {"kv_lens": x.kv_lens}
    if layout == "paged":
        paged = to_pages(x, 16, generator=g)
        kv, kpe, kwargs = paged.kv, paged.kpe, paged.layout_kwargs("paged")
    call = validate_mla_decoding(x.q, x.qpe, kv, kpe, **kwargs)
    rows = cutlass_mla.plan(call).schedule.piece_rows.cpu()
    assert (rows[1] > rows[0]).sum() >= 8, "the schedule should have pieces that meet several rows"
    out, lse = mla_decoding_split_kv(x.q, x.qpe, kv, kpe, return_lse=True, backend=BACKEND, **kwargs)
    torch.cuda.synchronize()
    _check(x, out, lse, causal=True)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize(("heads", "q_len"), [(128, 1), (128, 2), (128, 4)])  # 1, 2 or 4 pairs per piece
def test_cluster_pairs_stay_one_wave(heads: int, q_len: int) -> None:
    x = make_mla_inputs(64, heads, 256, device="cuda", q_len=q_len)
    plan = cutlass_mla.plan(validate_mla_decoding(x.q, x.qpe, x.kv, x.kpe))
    kernel = plan._split_kernel()
    assert kernel.instance_name.endswith(", 2, 0, 0>"), "64-row groups should run as cluster pairs"
    pairs = heads * q_len // 128
    programs = plan.schedule.shape.programs
    grid = (programs, 2 * pairs, 1)
    fit = kernel.max_active_clusters(plan.device_index, grid, (plan.threads, 1, 1), plan._shared_bytes())
    sms = torch.cuda.get_device_properties(plan.device_index).multi_processor_count
    print(f"{fit} clusters of two fit at once on {sms} SMs; the plan cuts {programs} pieces of {pairs} pairs")
    assert programs == min(sms // (2 * pairs), fit // pairs)


@pytest.mark.gpu
@needs_hopper
def test_equal_rows_are_not_cut_by_a_cluster_pairs_pieces() -> None:
    """64 rows of 64 blocks at 128 heads: balanced pieces would be 63 blocks on the H200's 66 pairs;
    the plan snaps them to one whole row each (schedule.py, snap), so no row goes through the combine."""
    g = torch.Generator().manual_seed(64)
    x = make_mla_inputs(64, 128, 4096, device="cuda", generator=g)
    call = validate_mla_decoding(x.q, x.qpe, x.kv, x.kpe, return_lse=True)
    plan = cutlass_mla.plan(call)
    programs = plan.schedule.shape.programs
    if not 64 <= programs <= 66:
        pytest.skip(f"written for 64-66 cluster pairs in one wave (the H200 fits 66); this GPU fits {programs}")
    assert plan.schedule.piece_bounds[:65].tolist() == list(range(0, 65 * 64, 64))
    first, last = plan.schedule.piece_rows.cpu()
    assert torch.equal(first[:64], torch.arange(64, dtype=torch.int32)), "piece p starts at row p"
    assert torch.equal(last[:64], first[:64]), "and ends there"
    assert bool((last[64:] < first[64:]).all()), "the pieces past the rows are empty"
    out, lse = mla_decoding_split_kv(x.q, x.qpe, x.kv, x.kpe, return_lse=True, backend=BACKEND)
    torch.cuda.synchronize()
    _check(x, out, lse, causal=True)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("heads", "q_len"), [(16, 1), (64, 1), (16, 4)])
def test_equal_rows_halved_are_merged_in_shared_memory(
    dtype: torch.dtype, heads: int, q_len: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """64 equal rows of 16 blocks on about 132 SMs: pieces of 8 blocks, so pieces 2k and 2k + 1 hold row k's
    halves, and each cluster of two merges its row without the combine (forced from one query row)."""
    monkeypatch.setattr(cutlass_mla, "MERGE_MIN_QUERY_ROWS", 1)
    g = torch.Generator().manual_seed(heads + q_len)
    x = make_mla_inputs(64, heads, 1024, dtype=dtype, device="cuda", generator=g, q_len=q_len)
    call = validate_mla_decoding(x.q, x.qpe, x.kv, x.kpe, return_lse=True)
    plan = cutlass_mla.plan(call)
    assert plan.merge and plan._split_kernel().instance_name.endswith(", 1, 0, 1>")
    programs = plan.schedule.shape.programs
    if not 128 <= programs <= 136:
        pytest.skip(f"written for 128-136 pieces (pieces of 8 blocks); this GPU's plan cuts {programs}")
    assert all(cutlass_mla.rows_merged_in_pairs(plan.schedule)), "each row should be the two pieces of one cluster"
    out, lse = mla_decoding_split_kv(x.q, x.qpe, x.kv, x.kpe, return_lse=True, backend=BACKEND)
    torch.cuda.synchronize()
    _check(x, out, lse, causal=True, dtype=dtype)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("heads", [16, 64])
def test_rows_merged_in_pairs_beside_rows_for_the_combine(heads: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of one block: rows of two blocks that start on an even piece are merged by their cluster,
    the others (one block, three, or two starting on an odd piece) are written whole or go through the
    combine, which must leave the merged rows alone; an empty row gets zeros."""
    monkeypatch.setattr(cutlass_mla, "MERGE_MIN_QUERY_ROWS", 1)
    lens = (128, 64, 128, 192, 128, 0, 100, 65, 64, 128)
    g = torch.Generator().manual_seed(heads)
    x = make_mla_inputs(len(lens), heads, 192, device="cuda", kv_lens=lens, generator=g)
    kwargs = {"kv_lens": x.kv_lens, "return_lse": True}
    plan = plan_mla_decoding(x.q, x.qpe, x.kv, x.kpe, None, 64, backend=BACKEND, **kwargs)
    merged = cutlass_mla.rows_merged_in_pairs(plan.runner.schedule)
    # blocks 2 1 2 3 2 0 2 2 1 2: rows 0, 4, 6 and 7 are two blocks from an even piece, row 9 from an odd one
    assert merged == [True, False, False, False, True, False, True, True, False, False]
    out, lse = mla_decoding_split_kv(x.q, x.qpe, x.kv, x.kpe, None, 64, plan=plan, **kwargs)
    torch.cuda.synchronize()
    _check(x, out, lse, causal=True)


@pytest.mark.gpu
@needs_hopper
def test_graph_replay_is_bitwise_stable() -> None:
    g = torch.Generator().manual_seed(7)
    x = make_mla_inputs(8, 64, 1024, device="cuda", kv_lens=tuple(range(100, 1024, 120)), generator=g)
    first = mla_decoding_split_kv(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens, backend=BACKEND).clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = mla_decoding_split_kv(x.q, x.qpe, x.kv, x.kpe, kv_lens=x.kv_lens, backend=BACKEND)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, first)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize(("left", "right"), [(20, -24), (-40, 12)], ids=str)
@pytest.mark.parametrize("split", [128, 512])  # rows of 8 segments (the combine's wide rows) and of 2
@pytest.mark.parametrize("heads", [16, 128])
def test_split_rows_keep_their_precision_at_any_cache_magnitude(heads: int, split: int, left: int, right: int) -> None:
    """Latent columns 0..255 scaled by 2^left and 256..511 by 2^right (beyond fp16's range both
    ways) and the query's columns by the inverse, so the scores stay as drawn: each half of the
    output must match float64 on its own, through the partials of split rows (whatever their
    format: a partial rounded to fp16 unscaled would lose one half or overflow in the other)."""
    g, seed = fresh_generator()
    lens = (1000, 999, 130, 1)
    x = make_mla_inputs(4, heads, 1000, device="cuda", kv_lens=lens, generator=g)
    factor = torch.full((512,), 2.0**left, device="cuda")
    factor[256:] = 2.0**right
    x.cache[..., :512] = (x.cache[..., :512].float() * factor).to(x.cache.dtype)
    x.q = (x.q.float() / factor).to(x.q.dtype)
    out, lse = mla_decoding_split_kv(
        x.q, x.qpe, x.kv, x.kpe, None, split, kv_lens=x.kv_lens, return_lse=True, backend=BACKEND
    )
    torch.cuda.synchronize()
    assert out.isfinite().all(), f"seed {seed}: a non-finite output"
    _check(x, out, lse, causal=True, column_blocks=2)


@pytest.mark.gpu
@needs_hopper
@pytest.mark.parametrize("split", [None, 128])
@pytest.mark.parametrize("heads", [16, 64, 128])
def test_scores_that_grow_along_the_row(heads: int, split: int | None) -> None:
    """Keys scaled up along the row, with a large softmax scale: the running max rises on most
    blocks (by about 3 log2 units on average, by more than 8 on about one block in six) and a
    block's scores spread over about 10 log2 units; short rows and forced splits included."""
    g = torch.Generator().manual_seed(heads + (split or 0))
    lens = (1000, 999, 130, 1)
    x = make_mla_inputs(4, heads, 1000, device="cuda", kv_lens=lens, generator=g)
    ramp = torch.linspace(0.2, 3.0, 1000, device="cuda").view(1, -1, 1)
    x.cache = (x.cache.float() * ramp).to(x.cache.dtype)
    out, lse = mla_decoding_split_kv(
        x.q, x.qpe, x.kv, x.kpe, 0.2, split, kv_lens=x.kv_lens, return_lse=True, backend=BACKEND
    )
    torch.cuda.synchronize()
    _check(x, out, lse, causal=True, sm_scale=0.2)
