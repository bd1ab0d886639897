"""tilegym.quant against independent float64 references of each format, written here.

The references decode bit patterns from their definitions (e4m3fn, e2m1, e8m0, bf16), pick
round-to-nearest-even codes by brute force over every code point, read fp8_ds_mla bytes with
``struct`` and compute e8m0 exponents with ``math.frexp``: none of them calls the module's code
paths, so a wrong nibble order, byte offset, scale exponent or tie rule shows up as a mismatch.
"""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
import torch

from tilegym.quant import (
    CACHE_FORMATS,
    FP8_DS_MLA_BYTES_PER_TOKEN,
    MXFP4_REL_L2_BOUND,
    QUERY_FP8_TOLERANCE,
    cache_format,
    dequantize_fp8_per_tensor,
    dequantize_mxfp4,
    fp8_ds_mla_views,
    pack_fp8_ds_mla,
    quantize_fp8_per_tensor,
    quantize_mxfp4,
    unpack_fp8_ds_mla,
)
from tilegym.testing import REL_L2_TOLERANCE, mla_decode_float64, relative_error

SEEDS = range(8)

# ---------------------------------------------------------------------------------------------
# Independent references
# ---------------------------------------------------------------------------------------------


def e4m3fn_decode(code: int) -> float:
    """float64 value of an OCP e4m3fn byte: bias 7, no inf, S.1111.111 = NaN."""
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = (code >> 3) & 0xF, code & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return math.nan
    if exponent == 0:
        return sign * mantissa / 8 * 2.0**-6
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


E4M3_POSITIVE = np.array([e4m3fn_decode(c) for c in range(0x7F)])  # codes 0..126 (0x7F is NaN)
E2M1_POSITIVE = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # codes 0..7


def nearest_even_codes(values: np.ndarray, positive_grid: np.ndarray, sign_bit: int) -> np.ndarray:
    """Brute-force round-to-nearest-even onto a sign-magnitude grid; ties pick the even code."""
    magnitude = np.abs(values)[..., None]
    distance = np.abs(magnitude - positive_grid)
    nearest = distance == distance.min(axis=-1, keepdims=True)
    codes = np.arange(len(positive_grid))
    tie_break = np.where(nearest, np.where(codes % 2 == 0, 0, 1), 2)
    magnitude_codes = tie_break.argmin(axis=-1)
    return magnitude_codes | np.where(np.signbit(values), sign_bit, 0)


def e4m3fn_codes(values: np.ndarray) -> np.ndarray:
    return nearest_even_codes(values, E4M3_POSITIVE, 0x80)


def bf16_bytes(values: np.ndarray) -> np.ndarray:
    """Little-endian bf16 bytes of float32 values by integer round-to-nearest-even (finite inputs)."""
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return rounded.astype("<u2").view(np.uint8).reshape(*values.shape[:-1], -1)


def e8m0_shared_exponent(amax: float) -> int:
    """OCP: floor(log2 amax) - 2 clamped to [-127, 127] (zero -> -127); 128 marks NaN (code 255)."""
    if not math.isfinite(amax):
        return 128
    if amax == 0:
        return -127
    _, exponent = math.frexp(amax)  # amax = m * 2**exponent, m in [0.5, 1)
    return min(max(exponent - 1 - 2, -127), 127)


def mxfp4_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(packed bytes, e8m0 codes) of float32 x [..., K] from the OCP definition, in float64."""
    x = x.astype(np.float64)
    blocks = x.reshape(*x.shape[:-1], -1, 32)
    shared = np.vectorize(e8m0_shared_exponent)(np.abs(blocks).max(axis=-1))
    shared = np.where(np.isnan(blocks).any(axis=-1), 128, shared)
    scaled = blocks / np.exp2(np.minimum(shared, 127).astype(np.float64))[..., None]
    codes = np.where(shared[..., None] == 128, 0, nearest_even_codes(scaled, E2M1_POSITIVE, 0x8)).reshape(x.shape)
    packed = np.array(
        [lo | (hi << 4) for lo, hi in zip(codes[..., 0::2].ravel(), codes[..., 1::2].ravel(), strict=True)]
    )
    return packed.reshape(*x.shape[:-1], -1).astype(np.uint8), (shared + 127).astype(np.uint8)


def mxfp4_decode_reference(packed: np.ndarray, scale_codes: np.ndarray) -> np.ndarray:
    """float64 values from packed bytes (low nibble first) and e8m0 codes."""
    codes = np.stack((packed & 0xF, packed >> 4), axis=-1).reshape(*packed.shape[:-1], -1)
    values = E2M1_POSITIVE[codes & 7] * np.where(codes & 8, -1.0, 1.0)
    scale = np.where(scale_codes == 255, np.nan, np.exp2(scale_codes.astype(np.float64) - 127))
    return (values.reshape(*values.shape[:-1], -1, 32) * scale[..., None]).reshape(values.shape)


def rel_l2(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return relative_error(actual, expected)


# ---------------------------------------------------------------------------------------------
# fp8 per tensor
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS[:3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fp8_per_tensor_matches_reference(seed, dtype):
    x = (torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(seed)) * 10.0 ** (seed - 1)).to(dtype)
    x_fp8, scale = quantize_fp8_per_tensor(x)
    x32 = x.float().numpy()
    expected_scale = np.float32(np.abs(x32).max()) / np.float32(448.0)
    assert scale.dtype == torch.float32 and scale.shape == (1,)
    assert scale.numpy()[0] == expected_scale
    quotient = np.clip(x32 / expected_scale, -448, 448)
    np.testing.assert_array_equal(x_fp8.view(torch.uint8).numpy(), e4m3fn_codes(quotient))
    decoded = np.vectorize(e4m3fn_decode)(x_fp8.view(torch.uint8).numpy()).astype(np.float32) * expected_scale
    np.testing.assert_array_equal(dequantize_fp8_per_tensor(x_fp8, scale).numpy(), decoded)


def test_fp8_per_tensor_edges():
    zeros, scale = quantize_fp8_per_tensor(torch.zeros(4, 8))
    assert (zeros.float() == 0).all() and torch.isfinite(scale).all() and scale.item() > 0
    x = torch.tensor([1e30, -3e38, 1e-30, -0.0])
    x8, scale = quantize_fp8_per_tensor(x)
    assert x8.view(torch.uint8).tolist() == [0x00, 0xFE, 0x00, 0x80]  # below e4m3's range -> +-0; amax -> -448
    nan8, nan_scale = quantize_fp8_per_tensor(torch.tensor([1.0, float("nan")]))
    assert nan_scale.isnan().all() and dequantize_fp8_per_tensor(nan8, nan_scale).isnan().all()


def test_fp8_per_tensor_fnuz_uses_its_own_max():
    x = torch.randn(256, generator=torch.Generator().manual_seed(1))
    x8, scale = quantize_fp8_per_tensor(x, torch.float8_e4m3fnuz)
    assert x8.dtype == torch.float8_e4m3fnuz and x8.float().abs().max() == 240.0
    assert rel_l2(dequantize_fp8_per_tensor(x8, scale), x) < CACHE_FORMATS["fp8"].quantization_rel_l2


def test_fp8_per_tensor_is_the_aiter_contract():
    from tilegym.ops.aiter.mla_decoding_split_kv import quantize_per_tensor

    x = torch.randn(2, 16, 576, generator=torch.Generator().manual_seed(2)).bfloat16()
    ours, theirs = quantize_fp8_per_tensor(x), quantize_per_tensor(x, torch.float8_e4m3fn)
    assert torch.equal(ours[0].view(torch.uint8), theirs[0].view(torch.uint8)) and torch.equal(ours[1], theirs[1])


# ---------------------------------------------------------------------------------------------
# fp8_ds_mla
# ---------------------------------------------------------------------------------------------


def ds_mla_reference_bytes(latent: np.ndarray, rope: np.ndarray) -> np.ndarray:
    """656 bytes per token written from the layout description with numpy and struct."""
    rows = []
    for lat, rp in zip(latent.reshape(-1, 512), rope.reshape(-1, 64), strict=True):
        groups = lat.reshape(4, 128)
        scales = np.maximum(np.abs(groups).max(axis=-1) / np.float32(448), np.float32(2.0**-126)).astype(np.float32)
        values = e4m3fn_codes(np.clip(groups / scales[:, None], -448, 448)).ravel().astype(np.uint8)
        scale_bytes = np.frombuffer(struct.pack("<4f", *scales.tolist()), dtype=np.uint8)
        rows.append(np.concatenate((values, scale_bytes, bf16_bytes(rp[None])[0])))
    return np.stack(rows).reshape(*latent.shape[:-1], 656)


@pytest.mark.parametrize("seed", SEEDS[:3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fp8_ds_mla_bytes_match_reference(seed, dtype):
    g = torch.Generator().manual_seed(seed)
    magnitudes = torch.tensor([1e-3, 1.0, 30.0, 1e4])  # each group a different range
    latent = (torch.randn(2, 3, 4, 128, generator=g) * magnitudes[:, None]).flatten(-2).to(dtype)
    rope = torch.randn(2, 3, 64, generator=g).to(dtype)
    packed = pack_fp8_ds_mla(latent, rope)
    assert packed.dtype == torch.uint8 and packed.shape == (2, 3, FP8_DS_MLA_BYTES_PER_TOKEN)
    expected = ds_mla_reference_bytes(latent.float().numpy(), rope.float().numpy())
    np.testing.assert_array_equal(packed.numpy(), expected)


def test_fp8_ds_mla_byte_offsets_by_hand():
    latent = torch.cat([torch.full((128,), 448.0 * (g + 1)) for g in range(4)])
    latent[0], latent[129] = 0.5, -0.5
    rope = torch.zeros(64)
    rope[0], rope[63] = 1.0, -2.0
    row = pack_fp8_ds_mla(latent, rope).numpy()
    assert row[0] == 0x30 and row[1] == 0x7E  # 0.5 = e4m3 0.0110.000; 448 = 0.1111.110
    assert row[129] == 0xA8  # group 1's scale is 2.0: -0.5 / 2 = -0.25 -> 1.0101.000
    for g in range(4):
        assert bytes(row[512 + 4 * g : 516 + 4 * g]) == struct.pack("<f", float(g + 1))
    assert bytes(row[528:530]) == bytes([0x80, 0x3F])  # bf16 1.0 = 0x3F80, little endian
    assert bytes(row[654:656]) == bytes([0x00, 0xC0])  # bf16 -2.0 = 0xC000


def test_fp8_ds_mla_views_are_zero_copy_and_decode():
    g = torch.Generator().manual_seed(5)
    cache = torch.randn(3, 7, 576, generator=g).bfloat16()
    packed = pack_fp8_ds_mla(cache[..., :512], cache[..., 512:])  # non-contiguous column slices
    values, scales, rope = fp8_ds_mla_views(packed)
    assert (values.dtype, scales.dtype, rope.dtype) == (torch.float8_e4m3fn, torch.float32, torch.bfloat16)
    assert (values.shape, scales.shape, rope.shape) == ((3, 7, 512), (3, 7, 4), (3, 7, 64))
    base = packed.data_ptr()
    assert (values.data_ptr(), scales.data_ptr(), rope.data_ptr()) == (base, base + 512, base + 528)
    assert torch.equal(rope, cache[..., 512:])
    scales[1, 2, 3] = 8.0
    assert bytes(packed[1, 2, 524:528].numpy()) == struct.pack("<f", 8.0)
    latent, rope32 = unpack_fp8_ds_mla(packed)
    reference = np.vectorize(e4m3fn_decode)(values.view(torch.uint8).numpy()).astype(np.float32)
    reference = (reference.reshape(3, 7, 4, 128) * scales.numpy()[..., None]).reshape(3, 7, 512)
    np.testing.assert_array_equal(latent.numpy(), reference)
    assert latent.dtype == rope32.dtype == torch.float32


def test_fp8_ds_mla_views_need_4_byte_aligned_rows():
    buffer = torch.zeros(2 * 656 + 2, dtype=torch.uint8)
    fp8_ds_mla_views(buffer[:-2].view(2, 656))
    with pytest.raises(RuntimeError, match="divisible"):
        fp8_ds_mla_views(buffer[2:].view(2, 656))


def test_fp8_ds_mla_edges():
    latent = torch.randn(3, 512, generator=torch.Generator().manual_seed(3))
    latent[0, 128:256] = 0.0
    latent[1, 0:128] = 1e-40  # float32 subnormal: amax / 448 underflows
    latent[2, 384] = float("nan")
    latent[2, 0] = 3e38
    packed = pack_fp8_ds_mla(latent, torch.zeros(3, 64))
    _, scales, _ = fp8_ds_mla_views(packed)
    assert scales[0, 1] == 2.0**-126 and scales[1, 0] == 2.0**-126
    decoded, _ = unpack_fp8_ds_mla(packed)
    assert (decoded[0, 128:256] == 0).all() and ((decoded[1, :128] - 1e-40).abs() < 1e-41).all()
    assert decoded[2, 384:].isnan().all() and torch.isfinite(decoded[2, :384]).all()
    assert decoded[2, 0] == pytest.approx(3e38, rel=1e-6)
    clean = torch.ones(3, dtype=torch.bool)
    clean[2] = False
    assert rel_l2(decoded[clean][:, 256:], latent[clean][:, 256:]) < CACHE_FORMATS["fp8_ds_mla"].quantization_rel_l2


def test_fp8_ds_mla_rejects_wrong_widths():
    with pytest.raises(ValueError, match="512"):
        pack_fp8_ds_mla(torch.zeros(576), torch.zeros(64))
    with pytest.raises(ValueError, match="656"):
        fp8_ds_mla_views(torch.zeros(576, dtype=torch.uint8))


# ---------------------------------------------------------------------------------------------
# MXFP4
# ---------------------------------------------------------------------------------------------


def assert_mxfp4_matches_reference(x: torch.Tensor) -> None:
    packed, scales = quantize_mxfp4(x)
    k = x.shape[-1]
    assert packed.dtype == scales.dtype == torch.uint8
    assert packed.shape == (*x.shape[:-1], k // 2) and scales.shape == (*x.shape[:-1], k // 32)
    expected_packed, expected_scales = mxfp4_reference(x.float().numpy())
    np.testing.assert_array_equal(scales.numpy(), expected_scales)
    np.testing.assert_array_equal(packed.numpy(), expected_packed)
    np.testing.assert_array_equal(
        dequantize_mxfp4(packed, scales).double().numpy(), mxfp4_decode_reference(expected_packed, expected_scales)
    )


@pytest.mark.parametrize("seed", SEEDS[:3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_mxfp4_matches_reference(seed, dtype):
    g = torch.Generator().manual_seed(seed)
    magnitudes = 10.0 ** torch.arange(-3.0, 3.0).repeat_interleave(32)  # one range per block
    assert_mxfp4_matches_reference((torch.randn(2, 3, 192, generator=g) * magnitudes).to(dtype))


def test_mxfp4_edges_match_reference():
    def block(*values: float) -> torch.Tensor:
        return torch.tensor(values + (0.0,) * (32 - len(values)))

    midpoints = (4.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -5.0, -1e-3, -0.0)
    rows = [
        block(),  # all zero: code 0 (2**-127)
        block(*midpoints),  # amax 4 -> scale 1: every tie goes to the even code
        block(7.9, 6.5, -7.0, 5.5),  # amax in [4, 8): saturates at 6
        block(3 * 2.0**-127, 2.0**-127, 1e-45),  # around float32's smallest normal: scale clamps to 2**-127
        block(2.0**-120, 3 * 2.0**-122),  # small but normal: shared exponent -122
        block(3e38, -1e38, 1.0),  # largest binade: code 252
        block(1.0, float("nan"), 2.0),  # NaN -> e8m0 NaN
        block(1.0, float("inf")),  # inf -> e8m0 NaN too (e2m1 has no inf)
    ]
    x = torch.stack(rows)
    assert_mxfp4_matches_reference(x)
    packed, scales = quantize_mxfp4(x)
    assert scales[:, 0].tolist() == [0, 127, 127, 0, 5, 252, 255, 255]
    codes = torch.stack((packed[1] & 0xF, packed[1] >> 4), -1).flatten()[:13].tolist()
    assert codes == [6, 0, 2, 2, 4, 4, 6, 6, 8, 10, 14, 8, 8]  # -0 and negatives rounding to 0 keep the sign
    decoded = dequantize_mxfp4(packed, scales)
    assert (decoded[0] == 0).all() and decoded[2, :4].tolist() == [6.0, 6.0, -6.0, 6.0]
    assert decoded[6:].isnan().all() and decoded[3, :2].tolist() == [3 * 2.0**-127, 2.0**-127]


def test_mxfp4_nibble_order_is_low_first():
    x = torch.zeros(64)
    x[0], x[1], x[32] = 6.0, 0.5, -1.0
    packed, scales = quantize_mxfp4(x)
    assert packed[0] == 0x17 and packed[16] == 0x0E  # element 0 (6 -> 7) low, element 1 (0.5 -> 1) high; -4 -> 14
    assert scales.tolist() == [127, 125]  # amax 6 -> 2**0; amax 1 -> 2**-2


def test_mxfp4_non_contiguous_and_round_trip():
    x = torch.randn(128, 5, generator=torch.Generator().manual_seed(7)).t()
    packed, scales = quantize_mxfp4(x)
    contiguous = quantize_mxfp4(x.contiguous())
    assert torch.equal(packed, contiguous[0]) and torch.equal(scales, contiguous[1])
    decoded = dequantize_mxfp4(packed, scales)
    assert torch.equal(dequantize_mxfp4(*quantize_mxfp4(decoded)), decoded)


def test_mxfp4_rejects_bad_shapes():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_mxfp4(torch.zeros(48))
    with pytest.raises(ValueError, match="does not match"):
        dequantize_mxfp4(torch.zeros(2, 32, dtype=torch.uint8), torch.zeros(2, 3, dtype=torch.uint8))


# ---------------------------------------------------------------------------------------------
# Error budgets and the format registry
# ---------------------------------------------------------------------------------------------


def quantization_round_trip(name: str, x: torch.Tensor) -> torch.Tensor:
    if name in ("bf16", "fp16"):
        return x.to(torch.bfloat16 if name == "bf16" else torch.float16).float()
    if name == "fp8":
        return dequantize_fp8_per_tensor(*quantize_fp8_per_tensor(x))
    if name == "fp8_ds_mla":
        return unpack_fp8_ds_mla(pack_fp8_ds_mla(x, x[..., :64]))[0]
    return dequantize_mxfp4(*quantize_mxfp4(x))


@pytest.mark.parametrize("name", list(CACHE_FORMATS))
def test_quantization_error_budget(name):
    """Measured worst over seeds 0..7 of 64 x 512 N(0,1): see the numbers in tilegym/quant.py."""
    errors = [
        rel_l2(quantization_round_trip(name, x), x)
        for x in (torch.randn(64, 512, generator=torch.Generator().manual_seed(s)) for s in SEEDS)
    ]
    bound = CACHE_FORMATS[name].quantization_rel_l2
    assert max(errors) < bound
    assert max(errors) > bound / 2  # the budget is tight enough to notice a format twice as good


def test_mxfp4_dot_products_error():
    g = torch.Generator().manual_seed(0)
    keys, query = torch.randn(256, 512, generator=g), torch.randn(512, generator=g)
    approx = dequantize_mxfp4(*quantize_mxfp4(keys)) @ query
    assert rel_l2(approx, keys @ query) < MXFP4_REL_L2_BOUND


def random_decode_inputs(seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    shapes = ((4, 16, 512), (4, 16, 64), (4, 256, 512), (4, 256, 64))
    return tuple(torch.randn(*shape, generator=g, dtype=torch.float64) for shape in shapes)


def query_quantization_error(seed: int, columns: int) -> float:
    """Rel. L2 of the float64 decode output caused by quantising q's first ``columns`` to fp8 per tensor."""
    q, qpe, kv, kpe = random_decode_inputs(seed)
    exact, _ = mla_decode_float64(q, qpe, kv, kpe)
    full = torch.cat((q, qpe), dim=-1)
    head = dequantize_fp8_per_tensor(*quantize_fp8_per_tensor(full[..., :columns])).double()
    quantised = torch.cat((head, full[..., columns:]), dim=-1)
    out, _ = mla_decode_float64(quantised[..., :512], quantised[..., 512:], kv, kpe)
    return rel_l2(out, exact)


@pytest.mark.parametrize("columns", [576, 512])
def test_query_quantized_tolerance_covers_measured_error(columns):
    worst = max(query_quantization_error(seed, columns) for seed in SEEDS)
    assert 2e-2 < worst < QUERY_FP8_TOLERANCE / 2
    assert worst > REL_L2_TOLERANCE[torch.bfloat16]  # why fp8-query kernels need their own tolerance


@pytest.mark.parametrize("name", ["fp8_ds_mla", "mxfp4"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_dequantised_cache_kernel_meets_output_tolerance(name, out_dtype):
    """A float32 kernel on the dequantised cache, rounded to out_dtype, vs float64 on the same values."""
    q, qpe, cache, cache_pe = random_decode_inputs(11)
    cache = torch.cat((cache, cache_pe), dim=-1).float()
    if name == "fp8_ds_mla":
        kv, kpe = unpack_fp8_ds_mla(pack_fp8_ds_mla(cache[..., :512], cache[..., 512:]))
    else:
        kv, kpe = dequantize_mxfp4(*quantize_mxfp4(cache[..., :512])), cache[..., 512:].bfloat16().float()
    expected, _ = mla_decode_float64(q, qpe, kv, kpe)
    scores = (q.float() @ kv.transpose(1, 2) + qpe.float() @ kpe.transpose(1, 2)) * 576**-0.5
    out = (torch.softmax(scores, dim=-1) @ kv).to(out_dtype)
    assert rel_l2(out, expected) < cache_format(name).output_tolerance[out_dtype]


def test_cache_format_registry():
    expected_bytes = {"bf16": 1152, "fp16": 1152, "fp8": 576, "fp8_ds_mla": 656, "mxfp4": 400}
    assert {name: f.bytes_per_token() for name, f in CACHE_FORMATS.items()} == expected_bytes
    assert cache_format("fp8_ds_mla").bytes_per_token() == FP8_DS_MLA_BYTES_PER_TOKEN
    assert cache_format("bf16").bytes_per_token(128, 32) == 320
    assert cache_format("bf16").output_tolerance == REL_L2_TOLERANCE
    assert cache_format("bf16").query_quantized_tolerance is None
    with pytest.raises(ValueError, match="unknown cache format"):
        cache_format("int4")


# ---------------------------------------------------------------------------------------------
# CUDA graphs (no host sync)
# ---------------------------------------------------------------------------------------------


def quantise_everything(x: torch.Tensor) -> list[torch.Tensor]:
    (x_fp8, scale), packed = quantize_fp8_per_tensor(x), pack_fp8_ds_mla(x[:, :512], x[:, 512:])
    mx_packed, mx_scales = quantize_mxfp4(x[:, :512])
    latent, rope = unpack_fp8_ds_mla(packed)
    return [
        x_fp8.view(torch.uint8),
        scale,
        packed,
        latent,
        rope,
        mx_packed,
        mx_scales,
        dequantize_mxfp4(mx_packed, mx_scales),
    ]


@pytest.mark.gpu
def test_quantisers_run_without_syncs_and_replay_in_a_cuda_graph():
    """No host sync, bit-exact graph replay, and the CPU's values up to one rounding step.

    CUDA may round ``amax / 448`` differently from the CPU by one ulp (division vs a
    reciprocal product), which can move an fp8 code by one step: CPU and GPU agree on the
    decoded values within one e4m3 step (2**-3 relative), not bit for bit. NaN rows are
    checked by value (NaN payload and sign bits are unspecified).
    """
    nan_row = torch.randn(1, 576, device="cuda")
    nan_row[0, 0] = float("nan")
    latent, _ = unpack_fp8_ds_mla(pack_fp8_ds_mla(nan_row[:, :512], nan_row[:, 512:]))
    assert bool(latent[0, :128].isnan().all()) and not bool(latent[0, 128:].isnan().any())
    x = torch.randn(8, 576, device="cuda")
    x[0, :32] = 0.0
    torch.cuda.set_sync_debug_mode("error")
    try:
        eager = quantise_everything(x)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = quantise_everything(x)
    graph.replay()
    for a, b in zip(eager, captured, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    on_cpu = quantise_everything(x.cpu())
    (fp8, scale), (fp8_cpu, scale_cpu) = (eager[0], eager[1]), (on_cpu[0], on_cpu[1])
    decoded = [
        fp8.view(torch.float8_e4m3fn).float().cpu() * scale.cpu(),
        *(t.cpu() for t in (eager[3], eager[4], eager[7])),
    ]
    expected = [fp8_cpu.view(torch.float8_e4m3fn).float() * scale_cpu, on_cpu[3], on_cpu[4], on_cpu[7]]
    for a, c in zip(decoded, expected, strict=True):
        torch.testing.assert_close(a, c, rtol=2**-3, atol=1e-6)
