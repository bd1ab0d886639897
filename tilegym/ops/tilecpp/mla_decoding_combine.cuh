// Combine of the split schedule's partials (second stage of mla_decoding_split_kv.cuh).
//
// One program = (BLOCK_D columns, BLOCK_R query rows, batch row b). Row b's segments sit in the
// consecutive work slots row_pieces[0][b] + b .. row_pieces[1][b] + b (tilegym/ops/schedule.py).
// A row with one segment was written by the split kernel: the program returns at once. A row with
// none (length 0) gets zeros and lse -inf. Otherwise a runtime loop walks the row's slots BLOCK_S
// at a time with a [BLOCK_R, BLOCK_S, BLOCK_D] tile of partials and a [BLOCK_R, BLOCK_S] tile of
// lse, folding them into a running max and rescaled float32 sums (tilegym::LseMerge):
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

namespace tilegym {

// Where batch row b's segments sit: count work slots from first_slot on (count 0 for a row of
// length 0, 1 for a row the split kernel finished itself).
struct RowSegments {
  long long first_slot;
  int count;
};

__tile__ inline RowSegments row_segments(const int* __restrict__ row_pieces, int batch, int b) {
  const int first = row_pieces[b];
  return {(long long)first + b, row_pieces[batch + b] - first + 1};
}

}  // namespace tilegym

template <typename TOut, int BLOCK_R, int BLOCK_S, int BLOCK_D>
__tile_global__ void mla_decode_combine_kernel(const float* __restrict__ part_out, const float* __restrict__ part_lse,
                                               const int* __restrict__ row_pieces,
                                               int batch, TOut* __restrict__ out,
                                               float* __restrict__ out_lse, int query_rows, int head_dim,
                                               int write_lse) {
  namespace ct = cuda::tiles;
  using i32_R = ct::tile<int, ct::shape<BLOCK_R>>;
  using i32_S = ct::tile<int, ct::shape<BLOCK_S>>;
  using i32_D = ct::tile<int, ct::shape<BLOCK_D>>;

  part_out = ct::assume_aligned<16>(part_out);
  head_dim = ct::assume_divisible<BLOCK_D>(head_dim);

  const int d0 = ct::bid().x * BLOCK_D;
  const int r0 = ct::bid().y * BLOCK_R;
  const int b = ct::bid().z;
  const auto [first_slot, count] = tilegym::row_segments(row_pieces, batch, b);
  if (count == 1) {
    return;  // one segment: the split kernel wrote this row
  }

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

  tilegym::LseMerge<BLOCK_R, BLOCK_D> merge;
  const int steps = (count + BLOCK_S - 1) / BLOCK_S;
  for (int step : ct::irange(0, steps)) {
    const int s0 = step * BLOCK_S;
    const long long slot_row = (first_slot + s0) * query_rows + r0;
    auto lse = ct::load_masked(part_lse + slot_row + lse_offs, r_ok2 & ((s2 + s0) < count), -INFINITY);
    auto part = ct::load_masked(part_out + slot_row * head_dim + d0 + po_offs, r_ok3 & ((s3 + s0) < count), 0.0f);
    merge.template add<BLOCK_S>(lse, part);
  }
  TOut* out_block = out + ((long long)b * query_rows + r0) * head_dim + d0;
  ct::store_masked(out_block + (r2 * head_dim + d2), ct::element_cast<TOut>(merge.merged()), r_ok2);
  if (write_lse && d0 == 0) {
    ct::store_masked(out_lse + ((long long)b * query_rows + r0) + r2, merge.lse(), r_ok2);
  }
}

// The same combine with a 2-D [BLOCK_R, BLOCK_D] tile and one slot per step: the shape for many
// query rows with few segments each (a 3-D tile with a unit slot axis measured several times
// slower on the H200 in round 1, so this one has its own kernel). Same traffic as above.
template <typename TOut, int BLOCK_R, int BLOCK_D>
__tile_global__ void mla_decode_combine_rows_kernel(const float* __restrict__ part_out,
                                                    const float* __restrict__ part_lse,
                                                    const int* __restrict__ row_pieces,
                                                    int batch, TOut* __restrict__ out,
                                                    float* __restrict__ out_lse, int query_rows, int head_dim,
                                                    int write_lse) {
  namespace ct = cuda::tiles;
  using i32_R = ct::tile<int, ct::shape<BLOCK_R>>;
  using i32_D = ct::tile<int, ct::shape<BLOCK_D>>;

  part_out = ct::assume_aligned<16>(part_out);
  head_dim = ct::assume_divisible<BLOCK_D>(head_dim);

  const int d0 = ct::bid().x * BLOCK_D;
  const int r0 = ct::bid().y * BLOCK_R;
  const int b = ct::bid().z;
  const auto [first_slot, count] = tilegym::row_segments(row_pieces, batch, b);
  if (count == 1) {
    return;  // one segment: the split kernel wrote this row
  }

  auto r_col = ct::reshape(ct::iota<i32_R>(), ct::shape<BLOCK_R, 1>{});
  auto d_row = ct::reshape(ct::iota<i32_D>(), ct::shape<1, BLOCK_D>{});
  auto r_ok = (r_col + r0) < query_rows;
  auto po_offs = r_col * head_dim + d_row;

  tilegym::LseMerge<BLOCK_R, BLOCK_D> merge;
  for (int i : ct::irange(0, count)) {
    const long long slot_row = (first_slot + i) * query_rows + r0;
    auto lse = ct::load_masked(part_lse + slot_row + r_col, r_ok, -INFINITY);
    merge.add(lse, ct::load_masked(part_out + slot_row * head_dim + d0 + po_offs, r_ok, 0.0f));
  }
  TOut* out_block = out + ((long long)b * query_rows + r0) * head_dim + d0;
  ct::store_masked(out_block + (r_col * head_dim + d_row), ct::element_cast<TOut>(merge.merged()), r_ok);
  if (write_lse && d0 == 0) {
    ct::store_masked(out_lse + ((long long)b * query_rows + r0) + r_col, merge.lse(), r_ok);
  }
}
