// Combine of the split schedule's partials (second stage of mla_decoding_split_kv.cuh), plain CUDA.
//
// One CTA of 4 warps = batch row b (blockIdx.y) and rows_per_cta query rows (blockIdx.x); lane l of a
// warp owns columns 128 j + 4 l .. + 3 (j < 4) of the 512, so each load of a warp reads 512 (float32
// partials) or 256 (fp16 partials) contiguous bytes. The host picks rows_per_cta (mla_decoding_split_kv.py, combine_rows_per_cta): as
// few CTAs as fill about one wave, each paying its start, schedule reads and wait once, but at most a
// row per warp where the grid would be larger (a warp's rows run one after another). Row b's segments
// sit in the consecutive work slots row_pieces[0][b] + b .. row_pieces[1][b] + b (tilegym/ops/schedule.py);
// count, the number of segments, is the CTA's. Then:
// - count 1: the split kernel wrote the rows; the CTA returns at once.
// - count 2 with the row cut exactly into pieces 2k and 2k + 1, when the split kernel merges row halves
//   (merge_bounds = its piece_bounds, merge_cum = its cum_blocks; null otherwise): that cluster of two
//   CTAs wrote the rows (mla_decoding_split_kv.cuh, merge_row_halves); the CTA returns at once.
// - count <= kWideRow: warp w takes the CTA's rows w, w + 4, ..., each alone.
// - more (long rows cut into many segments, few rows): the 4 warps fold every fourth slot of one row
//   and merge their sums through shared memory, so a row costs count / 4 slots of latency, not count.
// A fold takes kSlotsAtOnce slots per round (all their loads issued before any is used) into a running
// max and rescaled float32 sums:
//   out[r, d] = scale * sum_s exp(lse[s, r] - max) * partial[s, r, d] / sum_s exp(lse[s, r] - max),
// the same merge as the Tile C++ combine (tilegym/ops/tilecpp/common.cuh, LseMerge). A slot with
// lse -inf (a query row that saw no token there) weighs nothing and its partial is never used;
// NaN in a live slot gives NaN. A row with no segment (length 0) gets zeros and lse -inf.
// TPart: float32 partials (the wgmma kernel), or fp16 ones (the 16-row fp8 kernel; over a per-tensor
// fp8 cache stored before its scale, part_scale, one float on the device; null: 1).
//
// Launched with programmatic stream serialization after the split kernel (which allows it at its
// start): the CTA reads the schedule while the split kernel still runs, then waits for that grid to
// finish before it reads a partial. Every CTA waits, so the combine never completes before the split
// kernel: the next work on the stream sees both kernels' writes. It allows the next kernel's launch at
// its start (the next call's split kernel waits on the device before reading anything).
//
// Memory traffic per query row: count * (512 * sizeof(TPart) + 4) B read, 512 * sizeof(TOut) B written
// (+ 4 B lse).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common.cuh"

namespace tilegym_cute_combine {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;
inline constexpr int kSlotsAtOnce = 2;  // partials whose loads are in flight together, per warp
inline constexpr int kWarps = 4;
inline constexpr int kChunks = 4;    // float4 chunks per lane: 4 chunks x 32 lanes x 4 floats = 512 columns
inline constexpr int kWideRow = 4;  // more segments than this: the CTA's 4 warps share each row
inline constexpr int kCtasPerSm = 6;  // the register cap (80) that the host's one-wave grid assumes

// Four consecutive partial columns as floats (float32 partials, or fp16 ones: 8-byte loads).
__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 load4(const __half* p) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
  const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// A warp's fold of some of a row's partials: running max m (natural log), sum of exp(lse - m), and the
// rescaled sums of this lane's 16 columns.
struct Fold {
  float m = -INFINITY;
  float total = 0.f;
  float4 acc[kChunks];
};

// Folds slots i = begin, begin + step, ... < count of the row whose first slot row is first_row (slot s
// of the row at first_row + s * slot_stride floats of lse, that times 512 of partials).
template <typename TPart>
__device__ __forceinline__ Fold fold_slots(const TPart* __restrict__ part_out, const float* __restrict__ part_lse,
                                           long long first_row, long long slot_stride, int begin, int step,
                                           int count, int lane) {
  Fold f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) f.acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int i0 = begin; i0 < count; i0 += kSlotsAtOnce * step) {
    float lse[kSlotsAtOnce];
    float4 part[kSlotsAtOnce][kChunks];
#pragma unroll
    for (int j = 0; j < kSlotsAtOnce; ++j) {  // a slot past the row: lse -inf, never used
      const int i = i0 + j * step;
      const bool live = i < count;
      const long long slot_row = first_row + (live ? i : begin) * slot_stride;
      lse[j] = live ? part_lse[slot_row] : -INFINITY;
      // Loaded whatever lse is (an empty slot's partial may be garbage, even NaN: selected away below).
      const TPart* src = part_out + slot_row * 512 + lane * 4;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) part[j][c] = load4(src + c * 128);
    }
    float m_new = f.m;
#pragma unroll
    for (int j = 0; j < kSlotsAtOnce; ++j) m_new = fmaxf(m_new, lse[j]);
    const float shift = m_new == -INFINITY ? 0.f : m_new;  // every partial so far empty: no inf - inf
    const float alpha = exp2f((f.m - shift) * kLog2e);
    f.m = m_new;
    f.total *= alpha;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      f.acc[c] = make_float4(f.acc[c].x * alpha, f.acc[c].y * alpha, f.acc[c].z * alpha, f.acc[c].w * alpha);
    }
#pragma unroll
    for (int j = 0; j < kSlotsAtOnce; ++j) {
      if (lse[j] == -INFINITY) continue;
      const float w = exp2f((lse[j] - shift) * kLog2e);
      f.total += w;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        f.acc[c] = make_float4(f.acc[c].x + w * part[j][c].x, f.acc[c].y + w * part[j][c].y,
                               f.acc[c].z + w * part[j][c].z, f.acc[c].w + w * part[j][c].w);
      }
    }
  }
  return f;
}

__device__ __forceinline__ void store4(__nv_bfloat16* p, float4 v) {
  reinterpret_cast<__nv_bfloat162*>(p)[0] = __floats2bfloat162_rn(v.x, v.y);
  reinterpret_cast<__nv_bfloat162*>(p)[1] = __floats2bfloat162_rn(v.z, v.w);
}
__device__ __forceinline__ void store4(__half* p, float4 v) {
  reinterpret_cast<__half2*>(p)[0] = __floats2half2_rn(v.x, v.y);
  reinterpret_cast<__half2*>(p)[1] = __floats2half2_rn(v.z, v.w);
}

// out[4 columns] = acc * scale / total (zeros when no partial had a token).
template <typename TOut>
__device__ __forceinline__ void store_row4(TOut* p, float4 acc, float total, float scale) {
  const float inv = total == 0.f ? 0.f : scale / total;
  store4(p, make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv));
}

__device__ __forceinline__ float row_lse(float m, float total) {
  return total == 0.f ? -INFINITY : m + log2f(total) * kLn2;
}

}  // namespace tilegym_cute_combine

template <typename TPart, typename TOut>
__global__ void __launch_bounds__(128, tilegym_cute_combine::kCtasPerSm) mla_decode_cute_combine_kernel(
    const TPart* __restrict__ part_out, const float* __restrict__ part_lse, const int* __restrict__ row_pieces,
    const int* __restrict__ merge_bounds, const int* __restrict__ merge_cum, int batch, TOut* __restrict__ out,
    float* __restrict__ out_lse, int query_rows, int write_lse, int rows_per_cta,
    const float* __restrict__ part_scale) {
  using namespace tilegym_cute_combine;
  constexpr int D = 512;
  __shared__ float s_acc[kWarps][D];  // the wide-row merge: each warp's sums, its max and its total
  __shared__ float s_m[kWarps], s_total[kWarps];
  const int b = blockIdx.y;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  tilegym_cutlass::allow_dependent_launch();  // the next call's split kernel may be placed as SMs free up
  const int first = row_pieces[b];
  const int count = row_pieces[batch + b] - first + 1;  // 0: an empty row
  const bool merged = count == 2 && merge_bounds != nullptr && (first & 1) == 0 &&
                      merge_bounds[first] == merge_cum[b] && merge_bounds[first + 2] == merge_cum[b + 1];
  tilegym_cutlass::wait_for_previous_grid();  // the partials are the split kernel's output
  if (count == 1 || merged) return;            // the split kernel wrote these rows
  const float scale = part_scale == nullptr ? 1.f : *part_scale;
  const long long first_slot = (long long)first + b;
  const int r_begin = blockIdx.x * rows_per_cta;
  const int r_end = min(query_rows, r_begin + rows_per_cta);

  if (count <= kWideRow) {
    for (int r = r_begin + warp; r < r_end; r += kWarps) {
      const Fold f = fold_slots(part_out, part_lse, first_slot * query_rows + r, query_rows, 0, 1, count, lane);
      const long long out_row = (long long)b * query_rows + r;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) store_row4(out + out_row * D + c * 128 + lane * 4, f.acc[c], f.total, scale);
      if (write_lse && lane == 0) out_lse[out_row] = row_lse(f.m, f.total);
    }
    return;
  }
  for (int r = r_begin; r < r_end; ++r) {
    const Fold f = fold_slots(part_out, part_lse, first_slot * query_rows + r, query_rows, warp, kWarps, count, lane);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) *reinterpret_cast<float4*>(&s_acc[warp][c * 128 + lane * 4]) = f.acc[c];
    if (lane == 0) {
      s_m[warp] = f.m;
      s_total[warp] = f.total;
    }
    __syncthreads();
    // Thread t merges columns 4t .. 4t + 3 over the warps.
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, s_m[w]);
    const float shift = m == -INFINITY ? 0.f : m;
    float total = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      if (s_m[w] == -INFINITY) continue;  // that warp's slots saw no token
      const float weight = exp2f((s_m[w] - shift) * kLog2e);
      const float4 v = *reinterpret_cast<const float4*>(&s_acc[w][threadIdx.x * 4]);
      total += weight * s_total[w];
      acc = make_float4(acc.x + weight * v.x, acc.y + weight * v.y, acc.z + weight * v.z, acc.w + weight * v.w);
    }
    const long long out_row = (long long)b * query_rows + r;
    store_row4(out + out_row * D + threadIdx.x * 4, acc, total, scale);
    if (write_lse && threadIdx.x == 0) out_lse[out_row] = row_lse(m, total);
    __syncthreads();  // s_acc is rewritten for the next row
  }
}
