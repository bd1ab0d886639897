// Split-KV combine: merge per-split partial outputs with their log-sum-exp.
//
// One program = (BLOCK_D columns, BLOCK_R consecutive (batch, head) rows). It walks the N splits
// BLOCK_S at a time with a [BLOCK_R, BLOCK_S, BLOCK_D] tile, folding them into a running max
// of the lse and rescaled float32 sums (tilegym::LseMerge), so N is a runtime argument:
//   out[r, d] = sum_n exp(lse[r, n] - max_n lse[r, n]) * partial[r, n, d] / sum_n exp(...).
// Splits with lse = -inf weigh nothing (their partials may hold anything, NaN included); a row whose
// splits are all empty gives zeros; NaN in a live split (or an lse of NaN or +inf) gives NaN.
// With write_lse, the first column block also writes the merged lse (-inf for an empty row).
// Two shapes are built: many rows x few splits (large batch) and one row x many splits (long
// sequences, few rows); both keep BLOCK_R * BLOCK_S * BLOCK_D elements in flight per step.
//
// Memory traffic per program: reads BLOCK_R * N * BLOCK_D * sizeof(TIn) B of partials and
// BLOCK_R * N * 4 B of lse (the lse once per column block), writes BLOCK_R * BLOCK_D *
// sizeof(TOut) B (+ BLOCK_R * 4 B of lse). Whole launch: B * H * N * D * sizeof(TIn) read
// + B * H * D * sizeof(TOut) written.
//
// head_dim must be a multiple of BLOCK_D (no column mask, so loads stay 128-bit vectors).
// partial_out may be any [B, H, N, D] view with unit stride along D whose rows start on 16-byte
// boundaries (the launcher checks; strides in elements, offsets must fit in int32);
// partial_lse any [B, H, N] view; out is contiguous [B, H, D].
#pragma once

#include "common.cuh"

template <typename TIn, typename TOut, int BLOCK_R, int BLOCK_S, int BLOCK_D>
__tile_global__ void splitk_reduce_kernel(const TIn* __restrict__ partial_out, const float* __restrict__ partial_lse,
                                          TOut* __restrict__ out, float* __restrict__ out_lse, int rows, int heads,
                                          int num_splits, int head_dim, int write_lse, long long po_sb,
                                          long long po_sh, long long po_sn, long long lse_sb, long long lse_sh,
                                          long long lse_sn) {
  namespace ct = cuda::tiles;
  using i32_R = ct::tile<int, ct::shape<BLOCK_R>>;
  using i32_S = ct::tile<int, ct::shape<BLOCK_S>>;
  using i32_D = ct::tile<int, ct::shape<BLOCK_D>>;

  constexpr int kVec = 16 / sizeof(TIn);  // elements per 16-byte vector
  partial_out = ct::assume_aligned<16>(partial_out);
  po_sb = ct::assume_divisible<kVec>(po_sb);
  po_sh = ct::assume_divisible<kVec>(po_sh);
  po_sn = ct::assume_divisible<kVec>(po_sn);

  const int d0 = ct::bid().x * BLOCK_D;
  const int r0 = ct::bid().y * BLOCK_R;

  auto r = ct::iota<i32_R>() + r0;
  auto b = r / ct::full<i32_R>(heads);
  auto h = r - b * heads;
  auto r_ok2 = ct::reshape(r < rows, ct::shape<BLOCK_R, 1>{});
  auto r_ok3 = ct::reshape(r < rows, ct::shape<BLOCK_R, 1, 1>{});
  auto po_row = ct::reshape(b * (int)po_sb + h * (int)po_sh, ct::shape<BLOCK_R, 1, 1>{});
  auto lse_row = ct::reshape(b * (int)lse_sb + h * (int)lse_sh, ct::shape<BLOCK_R, 1>{});
  auto s2 = ct::reshape(ct::iota<i32_S>(), ct::shape<1, BLOCK_S>{});
  auto s3 = ct::reshape(ct::iota<i32_S>(), ct::shape<1, BLOCK_S, 1>{});
  auto d3 = ct::reshape(ct::iota<i32_D>() + d0, ct::shape<1, 1, BLOCK_D>{});

  tilegym::LseMerge<BLOCK_R, BLOCK_D> merge;
  const int num_chunks = (num_splits + BLOCK_S - 1) / BLOCK_S;
  for (int chunk : ct::irange(0, num_chunks)) {
    const int n0 = chunk * BLOCK_S;
    auto lse = ct::load_masked(partial_lse + n0 * lse_sn + (lse_row + s2 * (int)lse_sn),
                               r_ok2 & ((s2 + n0) < num_splits), -INFINITY);
    auto part = ct::element_cast<float>(ct::load_masked(partial_out + n0 * po_sn + (po_row + s3 * (int)po_sn + d3),
                                                        r_ok3 & ((s3 + n0) < num_splits), TIn(0)));
    merge.template add<BLOCK_S>(lse, part);
  }
  auto r_col = ct::reshape(r, ct::shape<BLOCK_R, 1>{});
  auto d_row = ct::reshape(ct::iota<i32_D>() + d0, ct::shape<1, BLOCK_D>{});
  ct::store_masked(out + (r_col * head_dim + d_row), ct::element_cast<TOut>(merge.merged()), r_ok2);
  if (write_lse && d0 == 0) {
    ct::store_masked(out_lse + r_col, merge.lse(), r_ok2);
  }
}

// 2-D combine over a [rows, N, D] view (round 3): no split axis in the tile.
//
// One program = (BLOCK_D columns, BLOCK_R consecutive rows). A runtime loop walks the N splits
// one at a time: per split it loads the lse column [BLOCK_R, 1] and the partial tile
// [BLOCK_R, BLOCK_D] (each row's columns contiguous, rows po_sr apart) and folds them into a
// running max / rescaled float32 sum, as above. Rows are addressed as r * po_sr (no division by
// heads): the launcher uses it when the [B, H] axes flatten to one row axis (always for the
// split-KV launcher's own contiguous [B, H, N, D] partials, where po_sr = N * D, po_sn = D).
//
// Memory traffic per program: reads BLOCK_R * N * (BLOCK_D * sizeof(TIn) + 4) B, writes
// BLOCK_R * BLOCK_D * sizeof(TOut) B (+ BLOCK_R * 4 B of lse from the first column block).
// Whole launch: rows * N * D * sizeof(TIn) read + rows * D * sizeof(TOut) written (+ the lse
// once per column block). Same requirements as above (head_dim % BLOCK_D == 0, 16-byte rows,
// int32 offsets; out contiguous [rows, D]).
template <typename TIn, typename TOut, int BLOCK_R, int BLOCK_D>
__tile_global__ void splitk_reduce_rows_kernel(const TIn* __restrict__ partial_out,
                                               const float* __restrict__ partial_lse, TOut* __restrict__ out,
                                               float* __restrict__ out_lse, int rows, int num_splits, int head_dim,
                                               int write_lse, long long po_sr, long long po_sn, long long lse_sr,
                                               long long lse_sn) {
  namespace ct = cuda::tiles;
  using i32_R = ct::tile<int, ct::shape<BLOCK_R>>;
  using i32_D = ct::tile<int, ct::shape<BLOCK_D>>;

  constexpr int kVec = 16 / sizeof(TIn);  // elements per 16-byte vector
  partial_out = ct::assume_aligned<16>(partial_out);
  po_sr = ct::assume_divisible<kVec>(po_sr);
  po_sn = ct::assume_divisible<kVec>(po_sn);

  const int d0 = ct::bid().x * BLOCK_D;
  const int r0 = ct::bid().y * BLOCK_R;
  auto r_col = ct::reshape(ct::iota<i32_R>(), ct::shape<BLOCK_R, 1>{});
  auto d_row = ct::reshape(ct::iota<i32_D>(), ct::shape<1, BLOCK_D>{});
  auto r_ok = (r_col + r0) < rows;
  // The block's base pointers carry the 64-bit offsets; offsets inside a tile are small int32.
  const TIn* po_block = partial_out + r0 * po_sr + d0;
  const float* lse_block = partial_lse + r0 * lse_sr;
  auto po_offs = r_col * (int)po_sr + d_row;
  auto lse_offs = r_col * (int)lse_sr;

  tilegym::LseMerge<BLOCK_R, BLOCK_D> merge;
  for (int n : ct::irange(0, num_splits)) {
    auto lse = ct::load_masked(lse_block + n * lse_sn + lse_offs, r_ok, -INFINITY);
    merge.add(lse, ct::element_cast<float>(ct::load_masked(po_block + n * po_sn + po_offs, r_ok, TIn(0))));
  }
  TOut* out_block = out + ((long long)r0 * head_dim + d0);
  ct::store_masked(out_block + (r_col * head_dim + d_row), ct::element_cast<TOut>(merge.merged()), r_ok);
  if (write_lse && d0 == 0) {
    ct::store_masked(out_lse + r0 + r_col, merge.lse(), r_ok);
  }
}
