// Split-KV combine: merge per-split partial outputs with their log-sum-exp.
//
// One program = (BLOCK_D columns, head, batch row). It walks the N splits BLOCK_S at a time,
// keeping a running max of the lse and rescaling its float32 sum, so N is a runtime argument:
//   out[d] = sum_n exp(lse[n] - lse_max) * partial[n, d] / sum_n exp(lse[n] - lse_max).
// Splits with lse = -inf weigh nothing; a row whose splits are all empty gives zeros.
// With write_lse, the first column block also writes the merged lse (-inf for an empty row).
//
// Memory traffic per program: reads N * BLOCK_D * sizeof(TIn) B of partials and N * 4 B of lse
// (the lse once per column block: D / BLOCK_D times per head), writes BLOCK_D * sizeof(TOut) B
// (+ 4 B of lse).
// Whole launch: B * H * N * D * sizeof(TIn) read + B * H * D * sizeof(TOut) written.
//
// head_dim must be a multiple of BLOCK_D (no column mask, so loads stay 128-bit vectors).
// partial_out may be any [B, H, N, D] view with unit stride along D whose rows start on 16-byte
// boundaries (the launcher checks; strides in elements), so its loads are 128-bit vectors;
// partial_lse any [B, H, N] view; out is contiguous [B, H, D].
#pragma once

#include "common.cuh"

template <typename TIn, typename TOut, int BLOCK_S, int BLOCK_D>
__tile_global__ void splitk_reduce_kernel(const TIn* __restrict__ partial_out, const float* __restrict__ partial_lse,
                                          TOut* __restrict__ out, float* __restrict__ out_lse, int heads,
                                          int num_splits, int head_dim, int write_lse, long long po_sb, long long po_sh, long long po_sn, long long lse_sb,
                                          long long lse_sh, long long lse_sn) {
  namespace ct = cuda::tiles;
  using i32_S = ct::tile<int, ct::shape<BLOCK_S>>;
  using i32_D = ct::tile<int, ct::shape<BLOCK_D>>;
  using f32_11 = ct::tile<float, ct::shape<1, 1>>;
  using f32_1D = ct::tile<float, ct::shape<1, BLOCK_D>>;
  using i32_11 = ct::tile<int, ct::shape<1, 1>>;

  constexpr int kVec = 16 / sizeof(TIn);  // elements per 16-byte vector
  partial_out = ct::assume_aligned<16>(partial_out);
  po_sb = ct::assume_divisible<kVec>(po_sb);
  po_sh = ct::assume_divisible<kVec>(po_sh);
  po_sn = ct::assume_divisible<kVec>(po_sn);

  const int d0 = ct::bid().x * BLOCK_D;
  const int h = ct::bid().y;
  const int b = ct::bid().z;

  auto d_row = ct::reshape(ct::iota<i32_D>() + d0, ct::shape<1, BLOCK_D>{});
  auto s_col = ct::reshape(ct::iota<i32_S>(), ct::shape<BLOCK_S, 1>{});

  const TIn* po_base = partial_out + b * po_sb + h * po_sh;
  const float* lse_base = partial_lse + b * lse_sb + h * lse_sh;

  auto m = ct::full<f32_11>(-INFINITY);  // running max of lse (natural log)
  auto total = ct::zeros<f32_11>();      // running sum of exp(lse - m)
  auto acc = ct::zeros<f32_1D>();        // running sum of exp(lse - m) * partial
  const int num_chunks = (num_splits + BLOCK_S - 1) / BLOCK_S;
  for (int chunk : ct::irange(0, num_chunks)) {
    const int n0 = chunk * BLOCK_S;
    auto n_ok = (s_col + n0) < num_splits;
    auto lse = ct::load_masked(lse_base + n0 * lse_sn + s_col * (int)lse_sn, n_ok, -INFINITY);
    auto part = ct::element_cast<float>(
        ct::load_masked(po_base + n0 * po_sn + (s_col * (int)po_sn + d_row), n_ok, TIn(0)));
    auto m_new = ct::max(m, ct::reduce_max(lse, ct::integral_constant<0>{}));
    // While every split so far is empty, m_new is -inf: shift by 0 instead (no inf - inf).
    auto shift = ct::select(m_new == -INFINITY, ct::zeros<f32_11>(), m_new);
    auto alpha = ct::exp2((m - shift) * tilegym::kLog2e);
    auto w = ct::exp2((lse - shift) * tilegym::kLog2e);
    total = total * alpha + ct::sum(w, ct::integral_constant<0>{});
    acc = acc * alpha + ct::sum(w * part, ct::integral_constant<0>{});
    m = m_new;
  }
  auto nonempty = total > 0.0f;
  auto merged = ct::select(nonempty, acc / ct::select(nonempty, total, ct::full<f32_11>(1.0f)),
                           ct::zeros<f32_1D>());
  TOut* out_base = out + ((long long)b * heads + h) * head_dim;
  ct::store(out_base + d_row, ct::element_cast<TOut>(merged));
  if (write_lse && d0 == 0) {
    auto lse = ct::select(nonempty, m + ct::log2(total) * tilegym::kLn2, ct::full<f32_11>(-INFINITY));
    ct::store(out_lse + ((long long)b * heads + h) + ct::zeros<i32_11>(), lse);
  }
}
