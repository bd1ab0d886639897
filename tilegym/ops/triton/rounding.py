"""Rounding float32 to a kernel's 16-bit types the way the GPU does, also under the interpreter.

Triton's CPU interpreter (3.9, measured here) converts float32 to bfloat16 by dropping the low 16
bits, i.e. rounding toward zero: values come out ~0.3% small on average, and a bf16 decode run
through it was 3x less accurate (rel. L2 ~5e-3 against float64) than the same kernel on a GPU,
which rounds to nearest even (~1.7e-3). Its float16 conversion already rounds to nearest. So the
kernels convert through ``to_nearest``: under the interpreter it rounds a bfloat16 target to
nearest even by integer arithmetic first (the conversion is then exact), on a GPU it is ``.to``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def to_nearest(x, dtype: tl.constexpr, INTERPRETED: tl.constexpr):
    """``x.to(dtype)`` rounded to nearest even (ties to even; NaN and inf stay what they are)."""
    if INTERPRETED and dtype == tl.bfloat16:
        wide = x.to(tl.float32)
        bits = wide.to(tl.uint32, bitcast=True)
        rounded = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
        x = tl.where(wide != wide, wide, rounded.to(tl.float32, bitcast=True))
    return x.to(dtype)
