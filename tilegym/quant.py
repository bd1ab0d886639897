"""Quantised KV cache formats for MLA decode: quantisers, byte layouts and error budgets.

Pure PyTorch, device-agnostic and free of host syncs (no ``.item()``, no data-dependent
Python branches, no host-built tensors), so every quantiser can run on CUDA tensors inside
a CUDA graph. Shape checks raise ``ValueError``; they read shapes only, never values.

Formats:

* ``fp8`` per tensor: ``x ~= x_fp8 * scale`` with one float32 scale (the aiter/triton contract).
* ``fp8_ds_mla`` (DeepSeek V3.2 / FlashMLA): 656 bytes per token, see :func:`pack_fp8_ds_mla`.
* ``mxfp4`` (OCP Microscaling v1.0): e2m1 codes with one e8m0 scale per 32 values along the
  last dim, packed as ``tl.dot_scaled`` reads ``"e2m1"`` operands, see :func:`quantize_mxfp4`.

All byte views assume a little-endian host and device (x86, ARM, NVIDIA and AMD GPUs are).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tilegym.testing import REL_L2_TOLERANCE

# ---------------------------------------------------------------------------------------------
# fp8 per tensor
# ---------------------------------------------------------------------------------------------

_MIN_AMAX = 1e-12


def quantize_fp8_per_tensor(
    x: torch.Tensor, fp8_dtype: torch.dtype = torch.float8_e4m3fn
) -> tuple[torch.Tensor, torch.Tensor]:
    """(x in ``fp8_dtype``, float32 scale [1]) with ``x ~= x_fp8 * scale`` and ``scale = amax / finfo.max``.

    amax is clamped to >= 1e-12 so an all-zero tensor gets a finite, nonzero scale; values are
    clamped to +-finfo.max before the (round-to-nearest-even) cast, so rounding of ``x / scale``
    just above the max never reaches the cast. A NaN anywhere makes the scale, hence all of x, NaN.
    """
    fp8_max = torch.finfo(fp8_dtype).max
    x = x.float()
    scale = (x.abs().amax().clamp(min=_MIN_AMAX) / fp8_max).reshape(1)
    return (x / scale).clamp(-fp8_max, fp8_max).to(fp8_dtype), scale


def dequantize_fp8_per_tensor(x_fp8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 ``x_fp8 * scale``."""
    return x_fp8.float() * scale.float()


# ---------------------------------------------------------------------------------------------
# fp8_ds_mla: DeepSeek V3.2 / FlashMLA per-token layout
# ---------------------------------------------------------------------------------------------

FP8_DS_MLA_LATENT_DIM = 512
FP8_DS_MLA_ROPE_DIM = 64
FP8_DS_MLA_GROUP = 128
FP8_DS_MLA_GROUPS = FP8_DS_MLA_LATENT_DIM // FP8_DS_MLA_GROUP
FP8_DS_MLA_SCALES_OFFSET = FP8_DS_MLA_LATENT_DIM
FP8_DS_MLA_ROPE_OFFSET = FP8_DS_MLA_SCALES_OFFSET + 4 * FP8_DS_MLA_GROUPS
FP8_DS_MLA_BYTES_PER_TOKEN = FP8_DS_MLA_ROPE_OFFSET + 2 * FP8_DS_MLA_ROPE_DIM
assert FP8_DS_MLA_BYTES_PER_TOKEN == 656

_E4M3_MAX = 448.0
_MIN_NORMAL_F32 = torch.finfo(torch.float32).tiny  # 2**-126


def _check_last_dim(name: str, t: torch.Tensor, size: int) -> None:
    if t.shape[-1] != size:
        raise ValueError(f"{name} must have last dim {size}, got shape {tuple(t.shape)}")


def fp8_ds_mla_group_scales(latent: torch.Tensor) -> torch.Tensor:
    """float32 [..., 4]: amax / 448 of each 128-group, clamped to >= 2**-126.

    The clamp is the zero-group guard: an all-zero group (or one so small that amax/448
    underflows) gets scale 2**-126, the smallest normal float32, so every stored scale is
    a normal number (flush-to-zero kernels cannot turn it into 0, ``1/scale`` stays finite)
    and the group still decodes to exactly 0. Plain amax/448 scales are used, not the
    power-of-two (UE8M0, ``2**ceil(log2(amax/448))``) scales some FlashMLA/vLLM versions
    write: readers only multiply by the stored float32, so both decode with the same kernel;
    plain scales use e4m3's top binade fully (on N(0,1) data power-of-two scales measured
    ~3% larger rel. L2, 0.0265 vs 0.0258), while power-of-two scales would only buy exact
    division/multiplication by the scale. A NaN makes its group's scale, hence group, NaN.
    """
    groups = latent.float().unflatten(-1, (FP8_DS_MLA_GROUPS, FP8_DS_MLA_GROUP))
    return (groups.abs().amax(dim=-1) / _E4M3_MAX).clamp(min=_MIN_NORMAL_F32)


def pack_fp8_ds_mla(latent: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """uint8 [..., 656] in FlashMLA's ``fp8_ds_mla`` layout from latent [..., 512] and rope [..., 64].

    Bytes 0..511: float8_e4m3fn of ``latent / scale[g]`` (g = column // 128, round to nearest
    even, clamped to +-448); bytes 512..527: the 4 float32 scales (little endian, group g at
    512+4g); bytes 528..655: rope in bf16 (rounded to nearest even from fp32/fp16 input).
    Decoding is ``fp8 * scale[g]``. Every region starts at a multiple of 16 bytes and
    656 = 16 * 41, so in a contiguous buffer each region of each token is 16-byte aligned.
    """
    _check_last_dim("latent", latent, FP8_DS_MLA_LATENT_DIM)
    _check_last_dim("rope", rope, FP8_DS_MLA_ROPE_DIM)
    scales = fp8_ds_mla_group_scales(latent)
    groups = latent.float().unflatten(-1, (FP8_DS_MLA_GROUPS, FP8_DS_MLA_GROUP))
    values = (groups / scales[..., None]).clamp(-_E4M3_MAX, _E4M3_MAX).to(torch.float8_e4m3fn).flatten(-2)
    rope_bf16 = rope.to(torch.bfloat16).contiguous()
    return torch.cat(
        (values.view(torch.uint8), scales.contiguous().view(torch.uint8), rope_bf16.view(torch.uint8)), dim=-1
    )


def fp8_ds_mla_views(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Zero-copy (values fp8 [..., 512], scales float32 [..., 4], rope bf16 [..., 64]) of packed bytes.

    ``Tensor.view(dtype)`` on a byte slice needs the last dim contiguous and the slice's
    storage offset and every other stride divisible by the new element size. The scales sit at
    byte 512 (= 4 * 128) and the rope at 528 (= 2 * 264), and the row stride 656 = 4 * 164, so
    any contiguous buffer (or whole-row slice of one) views cleanly; a buffer whose rows start
    at an offset that is not a multiple of 4 bytes makes torch raise instead of misreading.
    """
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed must be uint8, got {packed.dtype}")
    _check_last_dim("packed", packed, FP8_DS_MLA_BYTES_PER_TOKEN)
    values = packed[..., :FP8_DS_MLA_SCALES_OFFSET].view(torch.float8_e4m3fn)
    scales = packed[..., FP8_DS_MLA_SCALES_OFFSET:FP8_DS_MLA_ROPE_OFFSET].view(torch.float32)
    rope = packed[..., FP8_DS_MLA_ROPE_OFFSET:].view(torch.bfloat16)
    return values, scales, rope


def unpack_fp8_ds_mla(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantised (latent float32 [..., 512], rope float32 [..., 64]) of a packed fp8_ds_mla cache."""
    values, scales, rope = fp8_ds_mla_views(packed)
    groups = values.float().unflatten(-1, (FP8_DS_MLA_GROUPS, FP8_DS_MLA_GROUP))
    return (groups * scales[..., None]).flatten(-2), rope.float()


# ---------------------------------------------------------------------------------------------
# MXFP4 (OCP Microscaling v1.0: e2m1 elements, e8m0 scale per 32)
# ---------------------------------------------------------------------------------------------

MXFP4_BLOCK = 32
E8M0_NAN = 255
_E2M1_EMAX = 2  # largest e2m1 magnitude 6 = 1.5 * 2**2
_E2M1_SIGN = 8
# Rounding e2m1 magnitudes with round-to-nearest-even: crossing the midpoint between codes k and k+1
# moves to k+1; on the midpoint itself the even code wins (>= when k+1 is even, > when k is even).
_E2M1_MIDPOINTS: tuple[tuple[float, bool], ...] = (
    (0.25, False),  # 0 | 0.5
    (0.75, True),  # 0.5 | 1
    (1.25, False),  # 1 | 1.5
    (1.75, True),  # 1.5 | 2
    (2.5, False),  # 2 | 3
    (3.5, True),  # 3 | 4
    (5.0, False),  # 4 | 6
)


def _check_mxfp4_k(k: int) -> None:
    if k % MXFP4_BLOCK:
        raise ValueError(f"MXFP4 needs the last dim to be a multiple of {MXFP4_BLOCK}, got {k}")


def _float32_exponent_field(x: torch.Tensor) -> torch.Tensor:
    """int32 biased exponent of float32 ``x >= 0``: floor(log2 x) + 127 exactly; 0 for 0/subnormals, 255 NaN/inf."""
    return (x.view(torch.int32) >> 23) & 0xFF


def _power_of_two(exponent: torch.Tensor) -> torch.Tensor:
    """float32 2**exponent, built from bits, exact for int32 exponents in [-126, 127]."""
    return ((exponent + 127) << 23).view(torch.float32)


def e8m0_scale_codes(amax: torch.Tensor) -> torch.Tensor:
    """OCP shared scale (int32 e8m0 codes) of blocks with float32 abs-max ``amax``.

    shared_exp = floor(log2 amax) - 2, clamped to e8m0's [-127, 127]; code = shared_exp + 127.
    floor(log2) is read from the float32 exponent bits, so it is exact (no log rounding near
    powers of two). A zero (or < 2**-124) amax clamps to code 0, i.e. scale 2**-127: a valid
    scale whose block decodes to exactly 0. Non-finite amax (a NaN or inf in the block) gives
    code 255, e8m0's NaN: e2m1 has no NaN/inf, so the whole block decodes to NaN (its
    element codes are stored as 0).
    """
    biased = _float32_exponent_field(amax)
    codes = (biased - _E2M1_EMAX).clamp(0, 254)
    return torch.where(biased == 255, E8M0_NAN, codes)


def e8m0_to_float32(codes: torch.Tensor) -> torch.Tensor:
    """float32 2**(code - 127) of e8m0 codes (any integer dtype); 255 -> NaN, 0 -> 2**-127 (subnormal)."""
    codes = codes.to(torch.int32)
    bits = torch.where(codes == 0, 1 << 22, codes << 23)
    return torch.where(codes == E8M0_NAN, 0x7FC00000, bits).view(torch.float32)


def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """uint8 e2m1 codes (sign bit 3, magnitude bits 0..2) of float32 ``x``: nearest even, saturating at +-6.

    The sign comes from the sign bit, so -0 and small negatives that round to 0 give code 8
    (-0), as IEEE rounding keeps the sign of a zero. NaN gets magnitude 0 (callers mark NaN through the scale).
    """
    magnitude = x.abs()
    code = torch.zeros_like(x, dtype=torch.uint8)
    for midpoint, tie_goes_up in _E2M1_MIDPOINTS:
        code += (magnitude >= midpoint if tie_goes_up else magnitude > midpoint).to(torch.uint8)
    return code | (torch.signbit(x).to(torch.uint8) << 3)


def e2m1_to_float32(codes: torch.Tensor) -> torch.Tensor:
    """float32 values of e2m1 codes: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign."""
    codes = codes.to(torch.int32)
    exponent, mantissa = (codes >> 1) & 3, (codes & 1).float()
    normal = (1 << exponent).float() * 0.5 * (1.0 + 0.5 * mantissa)
    magnitude = torch.where(exponent == 0, 0.5 * mantissa, normal)
    return torch.where((codes & _E2M1_SIGN) != 0, -magnitude, magnitude)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] from 4-bit codes [..., K]: element 2i in the low nibble, 2i+1 in the high one."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., 2*N] from packed bytes [..., N] (inverse of :func:`pack_nibbles`)."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def quantize_mxfp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed uint8 [..., K/2], e8m0 scales uint8 [..., K/32]) of x [..., K], K % 32 == 0.

    OCP MX v1.0: per 32 consecutive values along the last dim, shared_exp =
    floor(log2 amax) - 2 (see :func:`e8m0_scale_codes`) and each element is
    round-to-nearest-even(x / 2**shared_exp) on the e2m1 grid, saturating at +-6 (the
    spec's scale maps amax into [4, 8), so the top of a block can clip to 6). Input is
    cast to float32 first. Packing is Triton's ``tl.dot_scaled`` ``"e2m1"`` operand with
    ``k_pack=True``: two codes per byte along K, the first (even) element in the low nibble;
    the scales are the ``[rows, K // 32]`` uint8 e8m0 tensor ``dot_scaled`` takes.

    Error budget (N(0,1) data, measured in tests/test_quant.py, 8 seeds of 64 x 512): rel. L2
    of the dequantised tensor 0.114..0.116 (bound :data:`MXFP4_REL_L2_BOUND` = 0.15); one
    512-long dot product with an exact query 0.09..0.14 relative; an MLA decode output over an
    MXFP4 latent (exact query) ~0.15 rel. L2 vs the unquantised cache. Element-wise relative
    error is unbounded: elements far below their block's amax round to 0.
    """
    _check_mxfp4_k(x.shape[-1])
    blocks = x.float().unflatten(-1, (-1, MXFP4_BLOCK))
    scale_codes = e8m0_scale_codes(blocks.abs().amax(dim=-1))
    nan_blocks = (scale_codes == E8M0_NAN)[..., None]
    finite_codes = torch.where(scale_codes == E8M0_NAN, 127, scale_codes)
    scaled = blocks * _power_of_two(127 - finite_codes)[..., None]
    codes = torch.where(nan_blocks, 0, e2m1_codes(scaled)).flatten(-2)
    return pack_nibbles(codes), scale_codes.to(torch.uint8)


def dequantize_mxfp4(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """float32 [..., K] from packed e2m1 [..., K/2] and e8m0 scales [..., K/32]."""
    values = e2m1_to_float32(unpack_nibbles(packed)).unflatten(-1, (-1, MXFP4_BLOCK))
    if values.shape[:-1] != scales.shape:
        raise ValueError(f"scales shape {tuple(scales.shape)} does not match packed {tuple(packed.shape)}")
    return (values * e8m0_to_float32(scales)[..., None]).flatten(-2)


def round_query_mxfp8(x: torch.Tensor) -> torch.Tensor:
    """float32 x [..., K] (K % 32 == 0) as the ``mxfp4`` decode path rounds its query: MXFP8.

    Per 32 values along the last dim, e = floor(log2 amax) - 7 (clamped to [-126, 126]), then each
    value becomes 2^e * e4m3(x / 2^e) with round-to-nearest-even: the block's largest entry lands in
    [128, 256), below e4m3's 448, so nothing saturates (OCP's -8 would clip by up to 12.5%). The
    e8m0 code of the block is e + 127. Used as the tests' oracle of the kernel's declared rounding.
    """
    _check_mxfp4_k(x.shape[-1])
    blocks = x.float().unflatten(-1, (-1, MXFP4_BLOCK))
    exponent = (_float32_exponent_field(blocks.abs().amax(dim=-1)) - 127 - 7).clamp(-126, 126)
    scaled = blocks * _power_of_two(-exponent)[..., None]
    return (scaled.to(torch.float8_e4m3fn).float() * _power_of_two(exponent)[..., None]).flatten(-2)


# ---------------------------------------------------------------------------------------------
# Registry for the op's tolerance model
# ---------------------------------------------------------------------------------------------

# Rel. L2 of quantise->dequantise on N(0,1) data; worst of 8 seeds of 64 x 512 measured in
# tests/test_quant.py: bf16 1.67e-3, fp16 2.1e-4, fp8 per tensor 2.66e-2, fp8_ds_mla 2.59e-2, mxfp4 0.116.
# Bounds are ~1.3-1.5x those (the statistic is stable to ~1% between seeds at this size).
MXFP4_REL_L2_BOUND = 0.15

# Rel. L2 vs float64 of the MLA decode output when the kernel also quantises the query to fp8 e4m3
# per tensor (aiter's fp8 path: all 576 columns; an MXFP4 K path: at least the 512 latent ones),
# oracle fed the unquantised query and the dequantised cache. Measured in tests/test_quant.py with
# the float64 decode math, B=4 H=16 S=256 D=512 P=64, N(0,1), seeds 0..7: quantising all 576 columns
# 2.56e-2..2.70e-2, the 512 latent ones 2.40e-2..2.54e-2. That is the query alone; a bf16 output adds
# ~1.7e-3. Tolerance ~2.2x the worst (matches aiter's fp8 test tolerance, which also covers fp8 softmax weights).
QUERY_FP8_TOLERANCE = 6e-2


@dataclass(frozen=True)
class CacheFormat:
    """A KV cache format: storage cost and the error a correct MLA decode kernel stays under.

    ``output_tolerance[out_dtype]``: rel. L2 vs the float64 oracle fed the *dequantised* cache
    (so only the kernel's own rounding counts: the output-dtype tolerance).
    ``query_quantized_tolerance``: the same, for kernels that also quantise the query to fp8
    (None where no kernel path does). ``quantization_rel_l2``: rel. L2 of dequant(quant(x)) vs x
    for N(0,1) data, i.e. what the format itself costs, as opposed to what a kernel may add.
    """

    name: str
    latent_bits: int
    rope_bits: int
    quantization_rel_l2: float
    scale_group: int | None = None
    scale_bytes: int = 0
    output_tolerance: dict[torch.dtype, float] = field(default_factory=lambda: dict(REL_L2_TOLERANCE))
    query_quantized_tolerance: float | None = None

    def bytes_per_token(self, head_dim: int = 512, rope_dim: int = 64) -> int:
        """Bytes one token's cache row takes (a per-tensor scale is amortised to 0)."""
        scales = head_dim // self.scale_group * self.scale_bytes if self.scale_group else 0
        return (head_dim * self.latent_bits + rope_dim * self.rope_bits) // 8 + scales


_FP8_QUERY = {"query_quantized_tolerance": QUERY_FP8_TOLERANCE}
CACHE_FORMATS: dict[str, CacheFormat] = {
    f.name: f
    for f in (
        CacheFormat("bf16", latent_bits=16, rope_bits=16, quantization_rel_l2=2.5e-3),
        CacheFormat("fp16", latent_bits=16, rope_bits=16, quantization_rel_l2=3.2e-4),
        CacheFormat("fp8", latent_bits=8, rope_bits=8, quantization_rel_l2=4e-2, **_FP8_QUERY),
        CacheFormat("fp8_ds_mla", 8, 16, 4e-2, scale_group=FP8_DS_MLA_GROUP, scale_bytes=4, **_FP8_QUERY),
        # The MLA latent is both K and V, so the MXFP4 latent serves both; the rope stays bf16.
        CacheFormat("mxfp4", 4, 16, MXFP4_REL_L2_BOUND, scale_group=MXFP4_BLOCK, scale_bytes=1, **_FP8_QUERY),
    )
}


def cache_format(name: str) -> CacheFormat:
    """The registered :class:`CacheFormat` called ``name``."""
    try:
        return CACHE_FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown cache format {name!r}; known: {', '.join(CACHE_FORMATS)}") from None
