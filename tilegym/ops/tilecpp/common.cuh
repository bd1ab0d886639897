// Shared helpers of tilegym's CUDA Tile C++ kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_tile.h>

namespace tilegym {

inline constexpr float kLog2e = 1.4426950408889634f;  // exp(x) == exp2(x * kLog2e)
inline constexpr float kLn2 = 0.6931471805599453f;    // log(x) == log2(x) * kLn2

}  // namespace tilegym
