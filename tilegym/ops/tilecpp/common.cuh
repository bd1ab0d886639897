// Shared helpers of tilegym's CUDA Tile C++ kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_tile.h>

namespace tilegym {

inline constexpr float kLog2e = 1.4426950408889634f;  // exp(x) == exp2(x * kLog2e)
inline constexpr float kLn2 = 0.6931471805599453f;    // log(x) == log2(x) * kLn2

// The running merge every combine kernel does: partial results of BLOCK_R rows x BLOCK_D
// columns, each with its log-sum-exp, folded into a running max and rescaled float32 sums:
//   merged[r, d] = sum_s exp(lse[s, r] - max) * partial[s, r, d] / sum_s exp(lse[s, r] - max).
// A partial with lse -inf (it saw no token) weighs exactly nothing, whatever it holds (NaN
// included); NaN in a live partial, or an lse of NaN or +inf, gives NaN (NaN in, NaN out).
template <int BLOCK_R, int BLOCK_D>
struct LseMerge {
  using f32_R1 = cuda::tiles::tile<float, cuda::tiles::shape<BLOCK_R, 1>>;
  using f32_RD = cuda::tiles::tile<float, cuda::tiles::shape<BLOCK_R, BLOCK_D>>;

  f32_R1 m = cuda::tiles::full<f32_R1>(-INFINITY);  // running max of lse (natural log)
  f32_R1 total = cuda::tiles::zeros<f32_R1>();       // running sum of exp(lse - m)
  f32_RD acc = cuda::tiles::zeros<f32_RD>();         // running sum of exp(lse - m) * partial

  // One partial per row: lse [BLOCK_R, 1], part [BLOCK_R, BLOCK_D].
  __tile__ void add(f32_R1 lse, f32_RD part) {
    namespace ct = cuda::tiles;
    part = ct::select(lse == -INFINITY, ct::zeros<f32_RD>(), part);
    auto shift = raise_max(ct::max(m, lse));
    auto w = ct::exp2((lse - shift) * kLog2e);
    total = total + w;
    acc = acc + w * part;
  }

  // BLOCK_S partials per row: lse [BLOCK_R, BLOCK_S], part [BLOCK_R, BLOCK_S, BLOCK_D].
  template <int BLOCK_S>
  __tile__ void add(cuda::tiles::tile<float, cuda::tiles::shape<BLOCK_R, BLOCK_S>> lse,
                    cuda::tiles::tile<float, cuda::tiles::shape<BLOCK_R, BLOCK_S, BLOCK_D>> part) {
    namespace ct = cuda::tiles;
    using f32_RSD = ct::tile<float, ct::shape<BLOCK_R, BLOCK_S, BLOCK_D>>;
    auto lse3 = ct::reshape(lse, ct::shape<BLOCK_R, BLOCK_S, 1>{});
    part = ct::select(lse3 == -INFINITY, ct::zeros<f32_RSD>(), part);
    auto step_max = ct::reshape(ct::reduce_max(lse, ct::integral_constant<1>{}), ct::shape<BLOCK_R, 1>{});
    auto shift = raise_max(ct::max(m, step_max));
    auto w = ct::exp2((lse - shift) * kLog2e);
    total = total + ct::reshape(ct::sum(w, ct::integral_constant<1>{}), ct::shape<BLOCK_R, 1>{});
    auto weighted = ct::reshape(w, ct::shape<BLOCK_R, BLOCK_S, 1>{}) * part;
    acc = acc + ct::reshape(ct::sum(weighted, ct::integral_constant<1>{}), ct::shape<BLOCK_R, BLOCK_D>{});
  }

  // total == 0: no partial had a token (zeros, lse -inf).
  __tile__ f32_RD merged() const {
    namespace ct = cuda::tiles;
    auto none = total == 0.0f;
    return ct::select(none, ct::zeros<f32_RD>(), acc / ct::select(none, ct::full<f32_R1>(1.0f), total));
  }

  __tile__ f32_R1 lse() const {
    namespace ct = cuda::tiles;
    return ct::select(total == 0.0f, ct::full<f32_R1>(-INFINITY), m + ct::log2(total) * kLn2);
  }

 private:
  // Moves the running max to m_new and rescales the sums to it; returns the shift to subtract
  // from the new lse (m_new, or 0 while every partial so far is empty: no inf - inf).
  __tile__ f32_R1 raise_max(f32_R1 m_new) {
    namespace ct = cuda::tiles;
    auto shift = ct::select(m_new == -INFINITY, ct::zeros<f32_R1>(), m_new);
    auto alpha = ct::exp2((m - shift) * kLog2e);
    total = total * alpha;
    acc = acc * alpha;
    m = m_new;
    return shift;
  }
};

}  // namespace tilegym
