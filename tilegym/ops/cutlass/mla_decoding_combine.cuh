// Combine of the split schedule's partials (second stage of mla_decoding_split_kv.cuh), plain CUDA.
//
// One CTA of 128 threads = (query row r, batch row b); thread t owns columns 4t .. 4t + 3 of the
// 512. Row b's segments sit in the consecutive work slots [cum[b] / per + b, (cum[b + 1] - 1) / per + b]
// (tilegym/ops/schedule.py). A row with one segment was written by the split kernel: the CTA
// returns at once. A row with none (length 0) gets zeros and lse -inf. Otherwise the CTA folds the
// row's partials, kSlotsAtOnce slots per round (all their loads issued before any is used, so a
// round costs one memory latency, not two per slot), into a running max and rescaled float32 sums:
//   out[r, d] = sum_s exp(lse[s, r] - max) * partial[s, r, d] / sum_s exp(lse[s, r] - max),
// the same merge as the Tile C++ combine (tilegym/ops/tilecpp/common.cuh, LseMerge). A slot with
// lse -inf (a query row that saw no token there) weighs nothing and its partial is never used;
// NaN in a live slot gives NaN.
//
// Launched with programmatic stream serialization after the split kernel (which allows it at its
// start): the CTA reads the schedule while the split kernel still runs, then waits for that grid to
// finish before it reads a partial. Every CTA waits, so the combine never completes before the split
// kernel: the next work on the stream sees both kernels' writes.
//
// Memory traffic per CTA: count * (512 + 1) * 4 B read, 512 * sizeof(TOut) B written (+ 4 B lse).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common.cuh"

namespace tilegym_cute_combine {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;
inline constexpr int kSlotsAtOnce = 4;  // partials whose loads are in flight together

__device__ __forceinline__ void store4(__nv_bfloat16* p, float4 v) {
  reinterpret_cast<__nv_bfloat162*>(p)[0] = __floats2bfloat162_rn(v.x, v.y);
  reinterpret_cast<__nv_bfloat162*>(p)[1] = __floats2bfloat162_rn(v.z, v.w);
}
__device__ __forceinline__ void store4(__half* p, float4 v) {
  reinterpret_cast<__half2*>(p)[0] = __floats2half2_rn(v.x, v.y);
  reinterpret_cast<__half2*>(p)[1] = __floats2half2_rn(v.z, v.w);
}

}  // namespace tilegym_cute_combine

template <typename TOut>
__global__ void __launch_bounds__(128) mla_decode_cute_combine_kernel(
    const float* __restrict__ part_out, const float* __restrict__ part_lse, const int* __restrict__ cum_blocks,
    const int* __restrict__ blocks_per_program, TOut* __restrict__ out, float* __restrict__ out_lse, int query_rows,
    int write_lse) {
  using namespace tilegym_cute_combine;
  constexpr int D = 512;
  const int r = blockIdx.x;
  const int b = blockIdx.y;
  const int per = blocks_per_program[0];
  const int row_begin = cum_blocks[b];
  const int row_end = cum_blocks[b + 1];
  const int first = row_begin / per;
  const int count = row_end == row_begin ? 0 : (row_end - 1) / per - first + 1;
  tilegym_cutlass::wait_for_previous_grid();  // the partials are the split kernel's output
  if (count == 1) return;                      // one segment: the split kernel wrote this row
  const long long first_slot = (long long)first + b;
  const int d = threadIdx.x * 4;

  float m = -INFINITY;  // running max of lse (natural log)
  float total = 0.f;    // running sum of exp(lse - m)
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int i0 = 0; i0 < count; i0 += kSlotsAtOnce) {
    float lse[kSlotsAtOnce];
    float4 part[kSlotsAtOnce];
#pragma unroll
    for (int j = 0; j < kSlotsAtOnce; ++j) {  // a slot past the row: lse -inf, never used
      const bool live = i0 + j < count;
      const long long slot_row = (first_slot + (live ? i0 + j : 0)) * query_rows + r;
      lse[j] = live ? part_lse[slot_row] : -INFINITY;
      // Loaded whatever lse is (an empty slot's partial may be garbage, even NaN: selected away below).
      part[j] = *reinterpret_cast<const float4*>(part_out + slot_row * D + d);
    }
    float m_new = m;
#pragma unroll
    for (int j = 0; j < kSlotsAtOnce; ++j) m_new = fmaxf(m_new, lse[j]);
    const float shift = m_new == -INFINITY ? 0.f : m_new;  // every partial so far empty: no inf - inf
    const float alpha = exp2f((m - shift) * kLog2e);
    m = m_new;
    total *= alpha;
    acc = make_float4(acc.x * alpha, acc.y * alpha, acc.z * alpha, acc.w * alpha);
#pragma unroll
    for (int j = 0; j < kSlotsAtOnce; ++j) {
      if (lse[j] == -INFINITY) continue;
      const float w = exp2f((lse[j] - shift) * kLog2e);
      total += w;
      acc = make_float4(acc.x + w * part[j].x, acc.y + w * part[j].y, acc.z + w * part[j].z, acc.w + w * part[j].w);
    }
  }
  const bool none = total == 0.f;  // no partial had a token (or the row is empty)
  const float inv = none ? 0.f : 1.f / total;
  const long long out_row = (long long)b * query_rows + r;
  store4(out + out_row * D + d, make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv));
  if (write_lse && threadIdx.x == 0) {
    out_lse[out_row] = none ? -INFINITY : m + log2f(total) * kLn2;
  }
}
