// Combine of the split schedule's partials (second stage of mla_decoding_split_kv.cuh).
//
// One program = (BLOCK_D columns, BLOCK_R query rows, batch row b). Row b's segments sit in the
// consecutive work slots [cum[b] / per + b, (cum[b + 1] - 1) / per + b] (tilegym/ops/schedule.py).
// A row with one segment was written by the split kernel: the program returns at once. A row with
// none (length 0) gets zeros and lse -inf. Otherwise a runtime loop walks the row's slots BLOCK_S
// at a time with a [BLOCK_R, BLOCK_S, BLOCK_D] tile of partials and a [BLOCK_R, BLOCK_S] tile of
// lse, folding them into a running max and rescaled float32 sums:
//   out[r, d] = sum_s exp(lse[s, r] - max) * partial[s, r, d] / sum_s exp(lse[s, r] - max).
// This kernel is built for one query row, 16 slots per step (long rows cut into many segments);
// mla_decode_combine_rows_kernel below serves many query rows with few segments each.
// A slot with lse -inf (a query row that saw no token there) weighs nothing and its partial is
// never used; NaN in a live slot gives NaN.
//
// Memory traffic per program: for split rows, count * BLOCK_R * (BLOCK_D + 1) * 4 B read and
// BLOCK_R * BLOCK_D * sizeof(TOut) B written (+ BLOCK_R * 4 B of lse from the first column block).
// Whole launch: every partial once.
#pragma once

#include "common.cuh"

template <typename TOut, int BLOCK_R, int BLOCK_S, int BLOCK_D>
__tile_global__ void mla_decode_combine_kernel(const float* __restrict__ part_out, const float* __restrict__ part_lse,
                                               const int* __restrict__ cum_blocks,
                                               const int* __restrict__ blocks_per_program, TOut* __restrict__ out,
                                               float* __restrict__ out_lse, int query_rows, int head_dim,
                                               int write_lse) {
  namespace ct = cuda::tiles;
  using i32_R = ct::tile<int, ct::shape<BLOCK_R>>;
  using i32_S = ct::tile<int, ct::shape<BLOCK_S>>;
  using i32_D = ct::tile<int, ct::shape<BLOCK_D>>;
  using f32_R1 = ct::tile<float, ct::shape<BLOCK_R, 1>>;
  using f32_RD = ct::tile<float, ct::shape<BLOCK_R, BLOCK_D>>;
  using f32_RSD = ct::tile<float, ct::shape<BLOCK_R, BLOCK_S, BLOCK_D>>;

  part_out = ct::assume_aligned<16>(part_out);
  head_dim = ct::assume_divisible<BLOCK_D>(head_dim);

  const int d0 = ct::bid().x * BLOCK_D;
  const int r0 = ct::bid().y * BLOCK_R;
  const int b = ct::bid().z;
  const int per = blocks_per_program[0];
  const int row_begin = cum_blocks[b];
  const int row_end = cum_blocks[b + 1];
  const bool empty = row_end == row_begin;
  const int first = row_begin / per;
  const int last = empty ? first : (row_end - 1) / per;
  if (!empty && first == last) {
    return;  // one segment: the split kernel wrote this row
  }
  const int count = empty ? 0 : last - first + 1;
  const long long first_slot = (long long)first + b;

  auto r2 = ct::reshape(ct::iota<i32_R>(), ct::shape<BLOCK_R, 1>{});
  auto r3 = ct::reshape(ct::iota<i32_R>(), ct::shape<BLOCK_R, 1, 1>{});
  auto s2 = ct::reshape(ct::iota<i32_S>(), ct::shape<1, BLOCK_S>{});
  auto s3 = ct::reshape(ct::iota<i32_S>(), ct::shape<1, BLOCK_S, 1>{});
  auto d2 = ct::reshape(ct::iota<i32_D>(), ct::shape<1, BLOCK_D>{});
  auto d3 = ct::reshape(ct::iota<i32_D>(), ct::shape<1, 1, BLOCK_D>{});
  auto r_ok2 = (r2 + r0) < query_rows;
  auto r_ok3 = (r3 + r0) < query_rows;
  // Offsets inside one step stay small (int32); the step's base pointer carries the slot offset.
  auto lse_offs = s2 * query_rows + r2;
  auto po_offs = (s3 * query_rows + r3) * head_dim + d3;

  auto m = ct::full<f32_R1>(-INFINITY);  // running max of lse (natural log)
  auto total = ct::zeros<f32_R1>();      // running sum of exp(lse - m)
  auto acc = ct::zeros<f32_RD>();        // running sum of exp(lse - m) * partial
  const int steps = (count + BLOCK_S - 1) / BLOCK_S;
  for (int step : ct::irange(0, steps)) {
    const int s0 = step * BLOCK_S;
    const long long slot_row = (first_slot + s0) * query_rows + r0;
    auto lse = ct::load_masked(part_lse + slot_row + lse_offs, r_ok2 & ((s2 + s0) < count), -INFINITY);
    auto part = ct::load_masked(part_out + slot_row * head_dim + d0 + po_offs, r_ok3 & ((s3 + s0) < count), 0.0f);
    auto lse3 = ct::reshape(lse, ct::shape<BLOCK_R, BLOCK_S, 1>{});
    part = ct::select(lse3 == -INFINITY, ct::zeros<f32_RSD>(), part);  // an empty slot weighs nothing
    auto m_new = ct::max(m, ct::reshape(ct::reduce_max(lse, ct::integral_constant<1>{}), ct::shape<BLOCK_R, 1>{}));
    // While every slot so far is empty, m_new is -inf: shift by 0 instead (no inf - inf).
    auto shift = ct::select(m_new == -INFINITY, ct::zeros<f32_R1>(), m_new);
    auto alpha = ct::exp2((m - shift) * tilegym::kLog2e);
    auto w = ct::exp2((lse - shift) * tilegym::kLog2e);
    total = total * alpha + ct::reshape(ct::sum(w, ct::integral_constant<1>{}), ct::shape<BLOCK_R, 1>{});
    auto weighted = ct::reshape(w, ct::shape<BLOCK_R, BLOCK_S, 1>{}) * part;
    acc = acc * alpha + ct::reshape(ct::sum(weighted, ct::integral_constant<1>{}), ct::shape<BLOCK_R, BLOCK_D>{});
    m = m_new;
  }
  // total == 0: no token anywhere (zeros, lse -inf); NaN total: NaN out (NaN in, NaN out).
  auto none = total == 0.0f;
  auto merged = ct::select(none, ct::zeros<f32_RD>(), acc / ct::select(none, ct::full<f32_R1>(1.0f), total));
  TOut* out_block = out + ((long long)b * query_rows + r0) * head_dim + d0;
  ct::store_masked(out_block + (r2 * head_dim + d2), ct::element_cast<TOut>(merged), r_ok2);
  if (write_lse && d0 == 0) {
    auto lse = ct::select(none, ct::full<f32_R1>(-INFINITY), m + ct::log2(total) * tilegym::kLn2);
    ct::store_masked(out_lse + ((long long)b * query_rows + r0) + r2, lse, r_ok2);
  }
}

// The same combine with a 2-D [BLOCK_R, BLOCK_D] tile and one slot per step: the shape for many
// query rows with few segments each (a 3-D tile with a unit slot axis measured several times
// slower on the H200 in round 1, so this one has its own kernel). Same traffic as above.
template <typename TOut, int BLOCK_R, int BLOCK_D>
__tile_global__ void mla_decode_combine_rows_kernel(const float* __restrict__ part_out,
                                                    const float* __restrict__ part_lse,
                                                    const int* __restrict__ cum_blocks,
                                                    const int* __restrict__ blocks_per_program, TOut* __restrict__ out,
                                                    float* __restrict__ out_lse, int query_rows, int head_dim,
                                                    int write_lse) {
  namespace ct = cuda::tiles;
  using i32_R = ct::tile<int, ct::shape<BLOCK_R>>;
  using i32_D = ct::tile<int, ct::shape<BLOCK_D>>;
  using f32_R1 = ct::tile<float, ct::shape<BLOCK_R, 1>>;
  using f32_RD = ct::tile<float, ct::shape<BLOCK_R, BLOCK_D>>;

  part_out = ct::assume_aligned<16>(part_out);
  head_dim = ct::assume_divisible<BLOCK_D>(head_dim);

  const int d0 = ct::bid().x * BLOCK_D;
  const int r0 = ct::bid().y * BLOCK_R;
  const int b = ct::bid().z;
  const int per = blocks_per_program[0];
  const int row_begin = cum_blocks[b];
  const int row_end = cum_blocks[b + 1];
  const bool empty = row_end == row_begin;
  const int first = row_begin / per;
  const int last = empty ? first : (row_end - 1) / per;
  if (!empty && first == last) {
    return;  // one segment: the split kernel wrote this row
  }
  const int count = empty ? 0 : last - first + 1;
  const long long first_slot = (long long)first + b;

  auto r_col = ct::reshape(ct::iota<i32_R>(), ct::shape<BLOCK_R, 1>{});
  auto d_row = ct::reshape(ct::iota<i32_D>(), ct::shape<1, BLOCK_D>{});
  auto r_ok = (r_col + r0) < query_rows;
  auto po_offs = r_col * head_dim + d_row;

  auto m = ct::full<f32_R1>(-INFINITY);
  auto total = ct::zeros<f32_R1>();
  auto acc = ct::zeros<f32_RD>();
  for (int i : ct::irange(0, count)) {
    const long long slot_row = (first_slot + i) * query_rows + r0;
    auto lse = ct::load_masked(part_lse + slot_row + r_col, r_ok, -INFINITY);
    auto part = ct::load_masked(part_out + slot_row * head_dim + d0 + po_offs, r_ok, 0.0f);
    part = ct::select(lse == -INFINITY, ct::zeros<f32_RD>(), part);
    auto m_new = ct::max(m, lse);
    auto shift = ct::select(m_new == -INFINITY, ct::zeros<f32_R1>(), m_new);
    auto alpha = ct::exp2((m - shift) * tilegym::kLog2e);
    auto w = ct::exp2((lse - shift) * tilegym::kLog2e);
    total = total * alpha + w;
    acc = acc * alpha + w * part;
    m = m_new;
  }
  auto none = total == 0.0f;
  auto merged = ct::select(none, ct::zeros<f32_RD>(), acc / ct::select(none, ct::full<f32_R1>(1.0f), total));
  TOut* out_block = out + ((long long)b * query_rows + r0) * head_dim + d0;
  ct::store_masked(out_block + (r_col * head_dim + d_row), ct::element_cast<TOut>(merged), r_ok);
  if (write_lse && d0 == 0) {
    auto lse = ct::select(none, ct::full<f32_R1>(-INFINITY), m + ct::log2(total) * tilegym::kLn2);
    ct::store_masked(out_lse + ((long long)b * query_rows + r0) + r_col, lse, r_ok);
  }
}
