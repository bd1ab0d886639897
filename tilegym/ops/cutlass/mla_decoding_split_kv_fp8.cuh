// MLA decoding over a split schedule from an fp8 KV cache, plain CUDA C++ (mma.sync) for sm_90a,
// for up to 16 query rows per KV read: the memory-bound case (16 heads x 1 new token, or fewer
// heads x several new tokens), where the 64-row wgmma of mla_decoding_split_kv.cuh would waste
// three quarters of its work and the cache bytes decide the time.
//
// Formats (kFormat): kPerTensor = float8_e4m3fn latent and rope, one float32 scale for the whole
// cache; kDsMla = DeepSeek's 656-byte token: e4m3 latent, 4 float32 scales (one per 128 latent
// columns), bf16 rope (bf16 queries only).
//
// One CTA of 128 threads (4 warps) = one piece of the schedule (tilegym/ops/schedule.py), several
// CTAs per SM. It walks the batch rows its piece meets and, for each, the row's KV blocks of kTokens
// (64 or 32) tokens [lo, hi) inside the piece (same segments, work slots and causal rule as the
// wgmma kernel):
//   loads   cp.async, kStages - 1 blocks ahead, per block (N = kTokens):
//             latent fp8 [N, 512] (N / 2 KB); rope [N, 64] fp8 (bf16); scales [N, 4] float32.
//           Each token's byte offsets (page lookup) are computed once, kStages blocks ahead, by one
//           thread into a small table in shared memory.
//   warp w  partial S[16 rows, N tokens] over its quarter of the 576 columns: latent columns
//           128w .. 128w + 127 and one 16-column k-step of the rope (mma m16n8k16, N / 8 n-tiles x 9
//           k-steps, each k-step's query fragment read once by ldmatrix). K's bytes
//           are widened exactly to f16 in registers (cvt e4m3x2 -> f16x2); the query was rescaled
//           per row by a power of two into f16 (exact), its columns permuted so that one 16-byte K
//           load per lane feeds four k-steps. kDsMla: the warp's columns are one scale group, so
//           it scales its partial per token before adding its bf16 rope k-step.
//   CTA     the four partials meet in shared memory; every warp adds them up and runs the same
//           online softmax, so P stays in registers as the next mma's A fragments.
//   warp w  O[16 rows, columns 128w .. 128w + 127] += P . V: mma m16n8k16, N / 16 k-steps x 16 n-tiles.
//           Two tokens' bytes are interleaved (prmt) and widened, so each register holds one column
//           of two tokens (kDsMla: times their f16 scales of group w); the n-tiles are permuted:
//           n-tile j, column n of the mma <-> latent column 128w + 16n + j.
//   O lives in registers (64 floats per thread), the running max and row sums too. Two barriers
//   per block: the stage has landed, and the partials are written.
// Shared-memory tiles are XOR-swizzled by 16-byte chunk so that the K loads (two tokens x 64 B per
// 8 lanes), the V loads (four tokens x 32 B) and ldmatrix of the query hit distinct banks.
//
// Memory traffic per CTA (L = tokens of its piece, R = batch rows it meets):
//   reads  L * 576 B (kPerTensor) or L * 656 B (kDsMla) of KV, + 4 B of page id per token when
//          paged, and R * 16 * 576 * 2 B of queries;
//   writes per row met 16 * 512 * 4 B of float32 partial + 64 B of lse (a whole row: the output in
//          the query dtype, 16 * 512 * 2 B, + lse when asked).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "common.cuh"

namespace tilegym_fp8 {

inline constexpr int kD = 512;        // latent columns (K's first D, all of V)
inline constexpr int kP = 64;         // rope columns
inline constexpr int kRows = 16;      // query rows per CTA (the mma M)
inline constexpr int kThreads = 128;  // 4 warps
inline constexpr int kPerTensor = 0, kDsMla = 1;
inline constexpr float kLn2 = 0.6931471805599453f;

// kTokens: KV tokens per block (64 or 32); kNt = its 8-token n-tiles (QK), kKs = its 16-token k-steps (PV).
template <int kFormat, int kTokens>
struct Tiles {
  static constexpr int kNt = kTokens / 8, kKs = kTokens / 16;
  static constexpr int kRopeBytes = kFormat == kPerTensor ? kP : 2 * kP;  // per token
  static constexpr int kRopeChunks = kRopeBytes / 16;
  static constexpr int kScaleBytes = kFormat == kPerTensor ? 0 : 16;  // per token
  static constexpr int kLat = 0;
  static constexpr int kRope = kTokens * kD;
  static constexpr int kScale = kRope + kTokens * kRopeBytes;
  static constexpr int kStage = kScale + kTokens * kScaleBytes;
  // The query in f16 (scaled): the latent, and with kPerTensor the rope too (one dot of 576).
  static constexpr int kQCols = kFormat == kPerTensor ? kD + kP : kD;
  static constexpr int kQBytes = kRows * kQCols * 2;
  static constexpr int kQpeBytes = kFormat == kPerTensor ? 0 : kRows * kP * 2;  // bf16 rope query
};

// Byte offset of 16-byte chunk c of token row t in a latent tile: XOR swizzle of the chunk's low 3 bits.
// K loads: 8 lanes read tokens t, t + 1 (t even) x chunks 4j .. 4j + 3 -> opposite halves of the banks;
// V loads: 8 lanes read tokens {2q + c} (q = 0..3, c fixed) x chunks 8w + {2p, 2p + 1} -> 4 distinct pairs.
__device__ __forceinline__ int lat_offset(int t, int c) {
  const int h = (t & 6) ^ ((t & 1) << 2);
  return t * kD + ((c ^ h) << 4);
}
template <int kFormat>
__device__ __forceinline__ int rope_offset(int t, int c) {
  if constexpr (kFormat == kPerTensor) {
    return t * kP + ((c ^ ((t >> 1) & 3)) << 4);  // 4-byte reads of 8 tokens x 4 chunks: 32 banks
  } else {
    return t * 2 * kP + ((c ^ ((t & 1) << 2)) << 4);
  }
}
// Query tiles [16 rows, cols] of 2-byte elements, ldmatrix-friendly swizzle.
__device__ __forceinline__ int q_offset(int row, int col, int row_bytes) {
  return row * row_bytes + (((col >> 3) ^ (row & 7)) << 4) + (col & 7) * 2;
}
// Where query column d goes in the staged tile (k-step ks = slot / 16, mma column kk = slot % 16),
// so that one 16-byte K load per lane feeds the mma: lane quad q of k-step ks reads the K bytes
//   fp8 (latent, then the fp8 rope as a ninth 64-column block): 64 (ks / 4) + 16 q + 4 (ks % 4) + [0, 4)
//     -> kk = 2 q + {0, 1} (first two bytes), 8 + 2 q + {0, 1} (last two);
//   bf16 rope: elements 32 (ks / 2) + 8 q + 4 (ks % 2) + [0, 4), in the same kk order.
__device__ __forceinline__ int fp8_k_slot(int d) {
  const int j = d >> 6, r = d & 63;
  return 16 * (4 * j + ((r >> 2) & 3)) + 8 * ((r >> 1) & 1) + 2 * (r >> 4) + (r & 1);
}
__device__ __forceinline__ int bf16_k_slot(int d) {
  const int u = d >> 5, r = d & 31;
  return 16 * (2 * u + ((r >> 2) & 1)) + 8 * ((r >> 1) & 1) + 2 * (r >> 3) + (r & 1);
}

using tilegym_cutlass::commit_async_copies;
using tilegym_cutlass::cp_async16;
using tilegym_cutlass::wait_async_copies;
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&a)[4], const void* smem) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(addr));
}
// Four e4m3 bytes -> two f16x2 (bytes 0, 1 -> lo; bytes 2, 3 -> hi), exact. The 32-bit word is split
// into its halves by a move (no shifts).
__device__ __forceinline__ void fp8x4_to_half2x2(uint32_t word, uint32_t& lo, uint32_t& hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(word));
}
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t mul_half2(uint32_t x, float lo, float hi) {
  __half2 v = *reinterpret_cast<__half2*>(&x);
  v = __hmul2(v, __floats2half2_rn(lo, hi));
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ __nv_bfloat162 pack2(__nv_bfloat16*, float a, float b) { return __floats2bfloat162_rn(a, b); }
__device__ __forceinline__ __half2 pack2(__half*, float a, float b) { return __floats2half2_rn(a, b); }

// Byte offsets of one token's latent, rope and scales (-1: past the row), kStages blocks ahead.
struct TokenOffsets {
  long long lat, rope, scale;
};

// Where a batch row's tokens live: byte strides of kv, kpe and the scales (batch/page, token).
struct TokenRows {
  const int* pages;
  long long b, kv_s0, kv_s1, kpe_s0, kpe_s1, sc_s0, sc_s1;
  int len, paged, page_size, num_pages;
  __device__ __forceinline__ TokenOffsets locate(int pos) const {
    if (pos >= len) return {-1, -1, -1};
    long long outer = b, inner = pos;
    if (paged) {
      outer = tilegym_cutlass::page_of(pages, pos, page_size, num_pages);
      inner = pos % page_size;
    }
    return {outer * kv_s0 + inner * kv_s1, outer * kpe_s0 + inner * kpe_s1, outer * sc_s0 + inner * sc_s1};
  }
};

// cp.async of one block into a stage from its offset table. Latent: thread t takes tokens t / 8 + 16 i
// and chunks t % 8 + 8 j (a warp instruction reads four full 128-byte lines); rope and scale chunks follow.
template <int kFormat, int kTokens>
__device__ __forceinline__ void load_block(unsigned char* stage, const TokenOffsets* table, const unsigned char* kv,
                                           const unsigned char* kpe, const unsigned char* scales) {
  using L = Tiles<kFormat, kTokens>;
  const int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < kTokens / 16; ++i) {
    const int t = (tid >> 3) + 16 * i;
    const long long off = table[t].lat;
    const unsigned char* src = kv + (off < 0 ? 0 : off);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c = (tid & 7) + 8 * j;
      cp_async16(stage + L::kLat + lat_offset(t, c), src + 16 * c, off >= 0);
    }
  }
#pragma unroll
  for (int k = 0; k < kTokens * L::kRopeChunks / kThreads; ++k) {
    const int i = tid + kThreads * k;
    const int t = i / L::kRopeChunks, c = i % L::kRopeChunks;
    const long long off = table[t].rope;
    cp_async16(stage + L::kRope + rope_offset<kFormat>(t, c), kpe + (off < 0 ? 0 : off + 16 * c), off >= 0);
  }
  if constexpr (kFormat == kDsMla) {
    if (tid < kTokens) {
      const long long off = table[tid].scale;
      cp_async16(stage + L::kScale + 16 * tid, scales + (off < 0 ? 0 : off), off >= 0);
    }
  }
}

}  // namespace tilegym_fp8

template <typename T, int kFormat, int kTokens, int kStages, int kCtasPerSm>
__global__ void __launch_bounds__(128, kCtasPerSm) mla_decode_fp8_split_kernel(
    const T* __restrict__ q, const T* __restrict__ qpe, const unsigned char* __restrict__ kv,
    const unsigned char* __restrict__ kpe, const unsigned char* __restrict__ scales,
    const int* __restrict__ table, const int* __restrict__ indptr, const int* __restrict__ lens,
    const int* __restrict__ cum_blocks, const int* __restrict__ blocks_per_program, const int* __restrict__ piece_rows,
    T* __restrict__ out, float* __restrict__ out_lse, float* __restrict__ part_out, float* __restrict__ part_lse,
    int heads, int q_len, int query_rows, int causal, int write_lse, int paged, int page_size, int num_pages,
    int num_indices, int ragged, int num_pieces, long long q_sb, long long q_sq, long long q_sh, long long qpe_sb,
    long long qpe_sq, long long qpe_sh, long long kv_s0, long long kv_s1, long long kpe_s0, long long kpe_s1,
    long long sc_s0, long long sc_s1, long long table_sb, float qk_scale_log2) {
  using namespace tilegym_fp8;
  using L = Tiles<kFormat, kTokens>;
  constexpr int kNt = L::kNt;
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* q16 = smem + kStages * L::kStage;  // [16, kQCols] f16, scaled and permuted
  unsigned char* qpe16 = q16 + L::kQBytes;           // [16, 64] bf16 (kDsMla), permuted
  float4* partials = reinterpret_cast<float4*>(qpe16 + L::kQpeBytes);  // [4 warps, kNt n-tiles, 32 lanes]
  TokenOffsets* offsets = reinterpret_cast<TokenOffsets*>(partials + 4 * kNt * 32);  // [kStages, kTokens]
  float* q_unscale = reinterpret_cast<float*>(offsets + kStages * kTokens);       // [16]: 2^-shift per row

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, quad = lane & 3;  // mma fragment coordinates
  const int piece = blockIdx.x;
  const int per = blocks_per_program[0];
  const int start = piece * per;
  const int first_row = piece_rows[piece];
  const int last_row = piece_rows[num_pieces + piece];
  // kPerTensor: the cache value is kv * kv_scale (one float32 on the device).
  const float kv_scale = kFormat == kPerTensor ? *reinterpret_cast<const float*>(scales) : 1.f;
  // This warp's k-steps of the staged query: latent 64-column blocks 2w, 2w + 1 (four k-steps each),
  // then one rope k-step (the fp8 rope is block 8 of the same tile; the bf16 rope its own tile).
  const int rope_ks = kFormat == kPerTensor ? 32 + warp : warp;

  for (int b = first_row; b <= last_row; ++b) {
    const int row_begin = cum_blocks[b], row_end = cum_blocks[b + 1];
    const int lo = start > row_begin ? start : row_begin;
    const int hi = start + per < row_end ? start + per : row_end;
    if (lo >= hi) continue;
    const bool whole = lo == row_begin && hi == row_end;
    const long long slot = piece + b;
    const int* pages = tilegym_cutlass::page_list(table, indptr, b, paged, ragged, num_indices, table_sb);
    const TokenRows rows{pages, b, kv_s0, kv_s1, kpe_s0, kpe_s1, sc_s0, sc_s1, lens[b], paged, page_size, num_pages};
    const int first_blk = lo - row_begin, end_blk = hi - row_begin;

    __syncthreads();  // the previous segment is done with every buffer
    if (tid < kTokens) {
#pragma unroll
      for (int s = 0; s < kStages; ++s) {
        if (first_blk + s < end_blk) offsets[s * kTokens + tid] = rows.locate((first_blk + s) * kTokens + tid);
      }
    }
    __syncthreads();
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (first_blk + s < end_blk) load_block<kFormat, kTokens>(smem + s * L::kStage, offsets + s * kTokens, kv, kpe, scales);
      commit_async_copies();
    }

    // Stage the query: thread t scales row t / 8 by a power of two that puts its largest magnitude
    // in [2^13, 2^14) (exact in f16; the rope joins the latent's dot with kPerTensor). Every load
    // is issued before the first use (one memory latency per segment, not one per element).
    {
      const int row = tid >> 3, sub = tid & 7;
      const bool live = row < query_rows;
      const int token = live ? row / heads : 0, head = live ? row - token * heads : 0;
      const T* q_row = q + b * q_sb + token * q_sq + head * q_sh;
      const T* qpe_row = qpe + b * qpe_sb + token * qpe_sq + head * qpe_sh;
      constexpr int kPer = L::kQCols / 8;  // columns sub + 8 i of the row
      float x[kPer];
      float amax = 0.f;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int c = sub + 8 * i;
        x[i] = live ? static_cast<float>(c < kD ? q_row[c] : qpe_row[c - kD]) : 0.f;
        amax = fmaxf(amax, fabsf(x[i]));
      }
#pragma unroll
      for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, o));
      const bool finite = amax > 0.f && amax <= 3.0e38f;
      int exponent = 0;
      if (finite) frexpf(amax, &exponent);
      int shift = finite ? 14 - exponent : 0;
      shift = shift > 100 ? 100 : (shift < -100 ? -100 : shift);
      const float up = ldexpf(1.f, shift);
      if (sub == 0) q_unscale[row] = ldexpf(1.f, -shift);
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int c = sub + 8 * i;
        *reinterpret_cast<__half*>(q16 + q_offset(row, fp8_k_slot(c), L::kQCols * 2)) = __float2half_rn(x[i] * up);
      }
      if constexpr (kFormat == kDsMla) {
#pragma unroll
        for (int i = 0; i < kP / 8; ++i) {
          const int c = sub + 8 * i;
          const T v = live ? qpe_row[c] : T(0.f);
          *reinterpret_cast<T*>(qpe16 + q_offset(row, bf16_k_slot(c), kP * 2)) = v;
        }
      }
    }

    float m[2] = {-INFINITY, -INFINITY};  // running max (log2 units) of rows g, g + 8
    float l[2] = {0.f, 0.f};              // this lane's share of their sums
    int limit[2];
    float row_scale[2];  // kPerTensor: score scale of rows g, g + 8 (kDsMla scales per token instead)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = g + 8 * h;
      limit[h] = causal ? rows.len - q_len + 1 + r / heads : rows.len;
    }
    float acc[16][4];
#pragma unroll
    for (int j = 0; j < 16; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    // ldmatrix addresses of this lane (matrix lane / 8: rows +8 for odd, columns +8 for >= 2).
    const int lm_row = (lane & 7) + 8 * ((lane >> 3) & 1), lm_col = 8 * (lane >> 4);
    // Stage offsets of this lane's loads (the swizzle depends on the token's low 3 bits only, so
    // n-tile / k-step steps are constant strides): K of token 8 nt + g, chunk 4 (2w + jj) + quad;
    // rope; V of token 16 ks + 2 quad + (r & 1) + 8 (r >> 1), chunk 8w + g; the scales.
    int k_base[2], v_base[2];
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) k_base[jj] = L::kLat + lat_offset(g, 4 * (2 * warp + jj) + quad);
#pragma unroll
    for (int odd = 0; odd < 2; ++odd) v_base[odd] = L::kLat + lat_offset(2 * quad + odd, 8 * warp + g);
    const int rope_base = kFormat == kPerTensor ? L::kRope + rope_offset<kFormat>(g, quad) + 4 * warp
                                                : L::kRope + rope_offset<kFormat>(g, 4 * (warp >> 1) + quad) + 8 * (warp & 1);
    const int scale_base = L::kScale + 32 * quad + 4 * warp;  // + 16 (token - 2 quad)
    // Blocks entirely below every row's limit need no mask.
    const int unmasked_end = causal ? rows.len - q_len + 1 : rows.len;

    for (int blk = first_blk; blk < end_blk; ++blk) {
      const int i = blk - first_blk;
      const unsigned char* stage = smem + (i % kStages) * L::kStage;
      wait_async_copies<kStages - 2>();
      __syncthreads();  // block i has landed for every thread; block i - 1 is done everywhere
      if (i == 0) {  // the staged query is visible now
#pragma unroll
        for (int h = 0; h < 2; ++h) row_scale[h] = qk_scale_log2 * kv_scale * q_unscale[g + 8 * h];
      }
      if (blk + kStages - 1 < end_blk) {
        const int s = (i + kStages - 1) % kStages;
        load_block<kFormat, kTokens>(smem + s * L::kStage, offsets + s * kTokens, kv, kpe, scales);
      }
      commit_async_copies();
      if (tid < kTokens && blk + kStages < end_blk) {
        offsets[(i % kStages) * kTokens + tid] = rows.locate((blk + kStages) * kTokens + tid);
      }

      // This warp's partial S over its columns, all kTokens tokens (n-tile nt: tokens 8 nt .. 8 nt + 7).
      float sp[kNt][4] = {};
      uint32_t a[4];
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        const int j = 2 * warp + jj;
        uint4 kw[kNt];
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) kw[nt] = *reinterpret_cast<const uint4*>(stage + k_base[jj] + kD * 8 * nt);
#pragma unroll
        for (int t4 = 0; t4 < 4; ++t4) {
          ldmatrix_x4(a, q16 + q_offset(lm_row, 16 * (4 * j + t4) + lm_col, L::kQCols * 2));
#pragma unroll
          for (int nt = 0; nt < kNt; ++nt) {
            uint32_t b0, b1;
            fp8x4_to_half2x2((&kw[nt].x)[t4], b0, b1);
            mma_f16(sp[nt], a, b0, b1);
          }
        }
      }
      if constexpr (kFormat == kPerTensor) {
        ldmatrix_x4(a, q16 + q_offset(lm_row, 16 * rope_ks + lm_col, L::kQCols * 2));
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) {  // rope k-step w: word w of the lane's rope chunk
          uint32_t b0, b1;
          fp8x4_to_half2x2(*reinterpret_cast<const uint32_t*>(stage + rope_base + 8 * kP * nt), b0, b1);
          mma_f16(sp[nt], a, b0, b1);
        }
      } else {
        ldmatrix_x4(a, qpe16 + q_offset(lm_row, 16 * rope_ks + lm_col, kP * 2));
        // Scale group w's partial per token, then add the rope k-step w (bf16, unscaled query).
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const float group_scale = *reinterpret_cast<const float*>(stage + scale_base + 16 * (8 * nt + (k & 1)));
            sp[nt][k] *= group_scale * q_unscale[g + 8 * (k >> 1)];
          }
          const uint2 words = *reinterpret_cast<const uint2*>(stage + rope_base + 16 * kP * nt);
          mma_bf16(sp[nt], a, words.x, words.y);
        }
      }
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
        partials[(warp * kNt + nt) * 32 + lane] = make_float4(sp[nt][0], sp[nt][1], sp[nt][2], sp[nt][3]);
      }
      __syncthreads();  // every warp's partial is written
#pragma unroll
      for (int other = 1; other < 4; ++other) {
        const int w2 = (warp + other) & 3;
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) {
          const float4 v = partials[(w2 * kNt + nt) * 32 + lane];
          sp[nt][0] += v.x;
          sp[nt][1] += v.y;
          sp[nt][2] += v.z;
          sp[nt][3] += v.w;
        }
      }

      // Mask (only a block that reaches a row's limit), the block's row maxima of the raw scores
      // (quad shuffles: every warp has every token); the score scale (> 0) goes into exp2's FMA.
      if ((blk + 1) * kTokens > unmasked_end) {
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const int pos = blk * kTokens + 8 * nt + 2 * quad + (k & 1);
            sp[nt][k] = pos < limit[k >> 1] ? sp[nt][k] : -INFINITY;
          }
        }
      }
      float bmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
        for (int k = 0; k < 4; ++k) bmax[k >> 1] = fmaxf(bmax[k >> 1], sp[nt][k]);
      }
      float m_safe[2], alpha[2], sf[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        sf[h] = kFormat == kPerTensor ? row_scale[h] : qk_scale_log2;
        bmax[h] = fmaxf(bmax[h], __shfl_xor_sync(0xffffffff, bmax[h], 1));
        bmax[h] = fmaxf(bmax[h], __shfl_xor_sync(0xffffffff, bmax[h], 2));
        const float m_new = fmaxf(m[h], bmax[h] * sf[h]);
        m_safe[h] = m_new == -INFINITY ? 0.f : m_new;  // a row with no token yet: no inf - inf
        alpha[h] = exp2f(m[h] - m_safe[h]);
        m[h] = m_new;
        l[h] *= alpha[h];
      }
      // P = exp2(S - m) in f16 as A fragments: k-step ks takes n-tiles 2 ks (a0, a1) and 2 ks + 1 (a2, a3).
      uint32_t pf[L::kKs][4];
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float p0 = exp2f(fmaf(sp[nt][2 * h], sf[h], -m_safe[h]));
          const float p1 = exp2f(fmaf(sp[nt][2 * h + 1], sf[h], -m_safe[h]));
          l[h] += p0 + p1;
          __half2 pair = __floats2half2_rn(p0, p1);
          pf[nt >> 1][2 * (nt & 1) + h] = *reinterpret_cast<uint32_t*>(&pair);
        }
      }
      if (__any_sync(0xffffffff, alpha[0] != 1.f || alpha[1] != 1.f)) {  // the max moved for a row
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          acc[j][0] *= alpha[0];
          acc[j][1] *= alpha[0];
          acc[j][2] *= alpha[1];
          acc[j][3] *= alpha[1];
        }
      }

      // O[:, 128 warp ..] += P . V: the lane reads tokens 16 ks + {2q, 2q + 1, 2q + 8, 2q + 9}.
#pragma unroll
      for (int ks = 0; ks < L::kKs; ++ks) {
        uint4 vw[4];
        float vs[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int token_step = 16 * ks + 8 * (r >> 1);  // + 2 quad + (r & 1), in the bases
          vw[r] = *reinterpret_cast<const uint4*>(stage + v_base[r & 1] + kD * token_step);
          if constexpr (kFormat == kDsMla) {
            vs[r] = *reinterpret_cast<const float*>(stage + scale_base + 16 * (token_step + (r & 1)));
          }
        }
#pragma unroll
        for (int w4 = 0; w4 < 4; ++w4) {
          const uint32_t x0 = (&vw[0].x)[w4], x1 = (&vw[1].x)[w4], x2 = (&vw[2].x)[w4], x3 = (&vw[3].x)[w4];
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            // Bytes (col c, token a), (c, a + 1), (c + 1, a), (c + 1, a + 1) for columns 4 w4 + 2 half + {0, 1}.
            const uint32_t sel = half ? 0x7362u : 0x5140u;
            uint32_t b0_lo, b0_hi, b1_lo, b1_hi;
            fp8x4_to_half2x2(__byte_perm(x0, x1, sel), b0_lo, b0_hi);
            fp8x4_to_half2x2(__byte_perm(x2, x3, sel), b1_lo, b1_hi);
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              uint32_t b0 = e ? b0_hi : b0_lo, b1 = e ? b1_hi : b1_lo;
              if constexpr (kFormat == kDsMla) {
                b0 = mul_half2(b0, vs[0], vs[1]);
                b1 = mul_half2(b1, vs[2], vs[3]);
              }
              mma_f16(acc[4 * w4 + 2 * half + e], pf[ks], b0, b1);
            }
          }
        }
      }
    }

    // Row sums: lane share -> quad (every warp saw every token: no exchange between warps).
    float inv[2], lse[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float total = l[h] + __shfl_xor_sync(0xffffffff, l[h], 1);
      total += __shfl_xor_sync(0xffffffff, total, 2);
      const bool empty = total == 0.f;  // no token seen: zeros, lse -inf; NaN data gives NaN
      inv[h] = empty ? 0.f : (kFormat == kPerTensor ? kv_scale : 1.f) / total;
      lse[h] = empty ? -INFINITY : (m[h] + log2f(total)) * kLn2;
    }
    // acc[j][2 h + e] is row g + 8 h, column 128 warp + 16 (2 quad + e) + j: 16 consecutive columns.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = g + 8 * h;
      if (r >= query_rows) continue;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = 128 * warp + 16 * (2 * quad + e);
        if (whole) {
          T* dst = out + ((long long)b * query_rows + r) * kD + col;
#pragma unroll
          for (int v = 0; v < 2; ++v) {
            uint4 packed;
            uint32_t* words = &packed.x;
#pragma unroll
            for (int w = 0; w < 4; ++w) {
              const int j = 8 * v + 2 * w;
              auto pair = pack2(dst, acc[j][2 * h + e] * inv[h], acc[j + 1][2 * h + e] * inv[h]);
              words[w] = *reinterpret_cast<uint32_t*>(&pair);
            }
            reinterpret_cast<uint4*>(dst)[v] = packed;
          }
        } else {
          float* dst = part_out + (slot * query_rows + r) * kD + col;
#pragma unroll
          for (int v = 0; v < 4; ++v) {
            const int j = 4 * v;
            reinterpret_cast<float4*>(dst)[v] = make_float4(acc[j][2 * h + e] * inv[h], acc[j + 1][2 * h + e] * inv[h],
                                                            acc[j + 2][2 * h + e] * inv[h], acc[j + 3][2 * h + e] * inv[h]);
          }
        }
      }
      if (warp == 0 && quad == 0) {
        if (whole) {
          if (write_lse) out_lse[(long long)b * query_rows + r] = lse[h];
        } else {
          part_lse[slot * query_rows + r] = lse[h];
        }
      }
    }
  }
}
