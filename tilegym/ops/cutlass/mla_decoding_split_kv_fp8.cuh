// MLA decoding over a split schedule from an fp8 KV cache, CUDA C++ for sm_90a, for up to 16 query
// rows per KV read (kM = 1 row tile) or 32 (kM = 2: 16 heads x 2 new tokens, 32 heads): the
// memory-bound case, where the 64-row wgmma kernel of mla_decoding_split_kv.cuh would
// waste most of its work and the cache bytes decide the time. With two row tiles each widened V
// fragment feeds both tiles' mma, and the staged query, S and O double.
//
// Formats (kFormat): kPerTensor = float8_e4m3fn latent and rope, one float32 scale for the whole
// cache; kDsMla = DeepSeek's 656-byte token: e4m3 latent, 4 float32 scales (one per 128 latent
// columns), bf16 rope (bf16 queries only).
//
// One CTA = one piece of the schedule (tilegym/ops/schedule.py); kGroups warpgroups of 128 threads,
// kCtasPerSm CTAs per SM. The CTA walks the batch rows its piece meets and, for each, the row's KV
// blocks of kTokens = 64 tokens [lo, hi) inside the piece (same segments, work slots and causal rule
// as the wgmma kernel). Block i of a segment goes to stage (n + i) % kStages of a ring shared by the
// CTA (n: blocks the CTA consumed before) and to warpgroup i % kGroups; each warpgroup keeps its own
// softmax state and O, merged through shared memory at the segment's end. Per block:
//   loads   TMA boxes of [box_rows tokens, 128 B] (latent: 4 per box row range), [.., 64 B] (fp8
//           rope; kDsMla bf16 rope 128 B) and kDsMla's [.., 16 B] scales into wgmma's swizzled
//           K-major tiles, completing on the stage's mbarrier; a dense row's block is one box
//           range, a paged one one range per page part (box_rows = gcd(page_size, 64)); a TMA
//           destination is 128-byte aligned, so rope or scale boxes narrower than that (pages of
//           one fp8 token, of fewer than 8 fp8_ds_mla tokens) go as 16-byte bulk copies; all with an
//           L2 evict-first hint (the cache is read once; the partials stay in L2 for the combine). The
//           warpgroup done with block i refills its stage with block i + kStages (one warp issues,
//           lanes split the boxes). With one warpgroup the ring is filled once, at the piece's first
//           segment, right after warp 0 has issued that segment's query loads (so the query does not
//           queue behind the first blocks), and runs across segment boundaries (the refill after a
//           segment's last blocks is the next row's first ones); several warpgroups merge through
//           it, so it is filled at each segment's start (after the query loads too) and drained at
//           its end. V rows past the row's length are zeroed in shared memory (kDsMla: their scales
//           too); the cache may hold NaN.
//   scores  S^T [64 tokens, 16 kM rows] = K . Q^T by fp8 wgmma straight from shared memory (m64nNk32,
//           e4m3 x e4m3 -> f32, 18 k-steps; N = 16 kM x kParts): the query is staged per row, scaled by
//           a power of two, as kParts e4m3 parts whose sum is the query exactly (2 parts hold any
//           bf16 value, 3 any fp16 value, within e4m3's exponent range: elements more than 2^9 below
//           the row's largest lose low bits). The fp8 MMA accumulates with fewer bits than float32,
//           so every kChunk k-steps go to a fresh accumulator summed in float32 (two in flight).
//           What remains grows with the scores: ~1e-4 of |lse| at kChunk = 4, halving with kChunk
//           (the backend declares fp8_mma_scores; kChunk = 1 still misses 1e-3 at lse ~50 and runs 4-9%
//           slower, benchmarks/NOTES_cutlass.md, "Session 20").
//           kDsMla: one accumulator per 128-column scale group, scaled per token, plus the bf16
//           rope by bf16 wgmma (m64n16k16; kM = 2: m64n32k16, and the groups two in flight, folded
//           as they finish, since four [64, 64] accumulators would not fit beside O).
//   group   S^T goes through shared memory [16 kM, 64] (one per warpgroup); every warp of the group
//           reads all of it as S [16 kM, 64] and runs the same online softmax, so P stays in registers
//           as the next mma's A fragments.
//   warp w  O[16 kM rows, columns 128w .. 128w + 127] += P . V (w: warp of the group): mma.sync
//           m16n8k16, 4 k-steps x 16 n-tiles x kM row tiles. Two tokens' bytes are interleaved (prmt) and widened
//           exactly to f16 (cvt e4m3x2 -> f16x2), so each register holds one column of two tokens
//           (kDsMla: times their f16 scales of group w = warp w's columns); the n-tiles are permuted:
//           n-tile j, column n of the mma <-> latent column 128w + 16n + j.
//   O lives in registers (64 kM floats per thread), the running max and row sums too. Two group
//   barriers per block (S^T is written; the stage is free), none across groups.
//
// Memory traffic per CTA (L = tokens of its piece, R = batch rows it meets):
//   reads  L * 576 B (kPerTensor) or L * 656 B (kDsMla) of KV, + 4 B of page id per box when
//          paged, and R * 16 kM * 576 * 2 B of queries;
//   writes per row met 16 kM * 512 * 2 B of fp16 partial + 64 B of lse (a whole row: the output in the
//          query dtype, 16 kM * 512 * 2 B, + lse when asked).
//
// Partials are fp16: each is a convex combination of the V values the mma read as fp16, so it
// stays within their range (|x| <= 448 for kPerTensor, stored before the cache scale, which the
// combine applies; kDsMla's scaled values are fp16 products already) and keeps 11 significant bits.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "common.cuh"

namespace tilegym_fp8 {

inline constexpr int kD = 512;        // latent columns (K's first D, all of V)
inline constexpr int kP = 64;         // rope columns
inline constexpr int kTileRows = 16;  // query rows per row tile (the mma.sync M); a CTA holds kM of them
inline constexpr int kTokens = 64;    // KV tokens per block (the wgmma M)
inline constexpr int kThreads = 128;  // one warpgroup
inline constexpr int kPerTensor = 0, kDsMla = 1;
inline constexpr float kLn2 = 0.6931471805599453f;
inline constexpr int kSRow = kTokens + 8;  // floats per row of the S exchange (padding: fewer bank conflicts)

// e4m3 parts of the staged query: enough significant bits (4 each) for the query dtype's.
template <typename T>
inline constexpr int kParts = 2;  // bf16: 8 significant bits
template <>
inline constexpr int kParts<__half> = 3;  // fp16: 11

// Byte offsets of a block's stage and of the staged query. Swizzled K-major tiles as wgmma reads
// them: 128-byte rows in 8-row atoms of 1 KB (128-byte swizzle), or 64-byte rows in atoms of 512 B
// (64-byte swizzle, the fp8 rope).
template <int kFormat, typename T, int kM = 1>
struct Tiles {
  static constexpr int kRows = kTileRows * kM;                            // query rows per CTA
  static constexpr int kRopeBytes = kFormat == kPerTensor ? kP : 2 * kP;  // per token
  static constexpr int kLat = 0;                                          // 4 atoms [64 tokens, 128 B]
  static constexpr int kRope = kTokens * kD;
  static constexpr int kScale = kRope + kTokens * kRopeBytes;             // [64 tokens, 16 B], kDsMla
  static constexpr int kStage = kScale + (kFormat == kPerTensor ? 0 : kTokens * 16);
  static constexpr int kTokenBytes = kStage / kTokens;                   // bytes loaded per token
  // Fewest tokens per TMA box of the rope / scales (their destination must be 128-byte aligned);
  // smaller boxes (pages of fewer tokens) copy each token's rows in 16-byte pieces instead.
  static constexpr int kRopeBoxMin = 128 / kRopeBytes, kScaleBoxMin = 128 / 16;
  static constexpr int kN = kRows * kParts<T>;                            // rows of the staged query
  static constexpr int kQLat = 0;                                         // 4 atoms [kN rows, 128 B]
  static constexpr int kQRope = kN * kD;  // kPerTensor: [kN, 64 B] e4m3; kDsMla: bf16 [16, 128 B]
  static constexpr int kQBytes = kQRope + (kFormat == kPerTensor ? kN * kP : kRows * 2 * kP);
};

// Row r, 16-byte chunk c of a 128-byte-swizzled tile (rows of 128 B) / a 64-byte-swizzled tile.
__device__ __forceinline__ int swizzle128(int r, int c) { return ((r >> 3) << 10) + ((r & 7) << 7) + ((c ^ (r & 7)) << 4); }
__device__ __forceinline__ int swizzle64(int r, int c) { return ((r >> 3) << 9) + ((r & 7) << 6) + ((c ^ ((r & 7) >> 1)) << 4); }
// Chunk c (0..31) of row r of a latent tile with `rows` rows: 128-column atom c / 8.
__device__ __forceinline__ int lat_offset(int r, int c, int rows) { return (c >> 3) * rows * 128 + swizzle128(r, c & 7); }
template <int kFormat>
__device__ __forceinline__ int rope_offset(int r, int c) {
  return kFormat == kPerTensor ? swizzle64(r, c) : swizzle128(r, c);
}

using tilegym_cutlass::allow_dependent_launch;
using tilegym_cutlass::bulk_load;
using tilegym_cutlass::fence_async_shared;
using tilegym_cutlass::mbar_expect_bytes;
using tilegym_cutlass::mbar_init;
using tilegym_cutlass::mbar_wait;
using tilegym_cutlass::tma_load_3d;
// A counter in shared memory published to the CTA (release) and read (acquire).
__device__ __forceinline__ void store_release(int* p, int v) {
  asm volatile("st.release.cta.shared::cta.u32 [%0], %1;\n" ::"r"(tilegym_cutlass::shared_address(p)), "r"(v) : "memory");
}
__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.cta.shared::cta.u32 %0, [%1];\n" : "=r"(v) : "r"(tilegym_cutlass::shared_address(p)) : "memory");
  return v;
}
// The 128 threads of warpgroup wg wait for each other (named barrier 1 + wg; 0 is __syncthreads).
__device__ __forceinline__ void group_sync(int wg) { asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory"); }

// ---- wgmma (sm_90a) -----------------------------------------------------------------------------
// Shared-memory matrix descriptor of a K-major swizzled tile: start address, 8-row-group stride
// (1 KB for 128-byte rows, 512 B for 64-byte rows), swizzle mode (1 = 128 B, 2 = 64 B). at(offset)
// moves the start by a byte offset (a multiple of 16 inside shared memory: the 14-bit address field
// never carries), one integer add per wgmma.
struct TileDesc {
  uint32_t lo, hi;
  __device__ __forceinline__ uint64_t at(int offset) const {
    return (static_cast<uint64_t>(hi) << 32) | (lo + static_cast<uint32_t>(offset >> 4));
  }
};
__device__ __forceinline__ TileDesc tile_desc(uint32_t smem_addr, int group_stride, int mode) {
  return {((smem_addr & 0x3FFFF) >> 4) | (1u << 16), static_cast<uint32_t>(group_stride >> 4) | (static_cast<uint32_t>(mode) << 30)};
}
__device__ __forceinline__ TileDesc desc128(uint32_t smem_addr) { return tile_desc(smem_addr, 1024, 1); }
__device__ __forceinline__ TileDesc desc64(uint32_t smem_addr) { return tile_desc(smem_addr, 512, 2); }
using tilegym_cutlass::fast_exp2;  // flushes weights below 2^-126 of the row's largest to zero
using tilegym_cutlass::shared_address;
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>  // until at most kPending committed groups are still running
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Keeps the compiler from moving accumulator reads/writes across the asynchronous wgmma.
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

#define TG_R8(o) "+f"(d[o]), "+f"(d[o + 1]), "+f"(d[o + 2]), "+f"(d[o + 3]), "+f"(d[o + 4]), "+f"(d[o + 5]), "+f"(d[o + 6]), "+f"(d[o + 7])
// d [64, N] (+)= A [64, 32] . B [N, 32]^T, e4m3 x e4m3 -> f32; accumulate = false overwrites d.
template <int N>
__device__ __forceinline__ void wgmma_e4m3(float (&d)[N / 2], uint64_t a, uint64_t b, bool accumulate);
template <>
__device__ __forceinline__ void wgmma_e4m3<32>(float (&d)[16], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15}, %16, %17, p, 1, 1;\n}\n"
      : TG_R8(0), TG_R8(8)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}
template <>
__device__ __forceinline__ void wgmma_e4m3<48>(float (&d)[24], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %26, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n48k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23}, %24, %25, p, 1, 1;\n}\n"
      : TG_R8(0), TG_R8(8), TG_R8(16)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}
// N = 64, 96: the staged query of a CTA of two row tiles (32 rows x 2 or 3 parts).
template <>
__device__ __forceinline__ void wgmma_e4m3<64>(float (&d)[32], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
      : TG_R8(0), TG_R8(8), TG_R8(16), TG_R8(24)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}
template <>
__device__ __forceinline__ void wgmma_e4m3<96>(float (&d)[48], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %50, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, "
      "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, %48, %49, p, 1, 1;\n}\n"
      : TG_R8(0), TG_R8(8), TG_R8(16), TG_R8(24), TG_R8(32), TG_R8(40)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}
// d [64, 16] (+)= A [64, 16] . B [16, 16]^T, bf16 x bf16 -> f32, both K-major.
__device__ __forceinline__ void wgmma_bf16_n16(float (&d)[8], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
      : TG_R8(0)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}
// d [64, 32] (+)= A [64, 16] . B [32, 16]^T, bf16 x bf16 -> f32, both K-major (two row tiles' rope).
__device__ __forceinline__ void wgmma_bf16_n32(float (&d)[16], uint64_t a, uint64_t b, bool accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : TG_R8(0), TG_R8(8)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}
#undef TG_R8

// ---- mma.sync and conversions -------------------------------------------------------------------
// Four e4m3 bytes -> two f16x2 (bytes 0, 1 -> lo; bytes 2, 3 -> hi), exact. The 32-bit word is split
// into its halves by a move (no shifts).
__device__ __forceinline__ void fp8x4_to_half2x2(uint32_t word, uint32_t& lo, uint32_t& hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(word));
}
// Two floats -> e4m3 bytes (a in the low byte), round to nearest, saturating.
__device__ __forceinline__ uint32_t float2_to_e4m3x2(float a, float b) {
  uint16_t packed;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(packed) : "f"(b), "f"(a));
  return packed;
}
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t packed) {
  uint32_t h2;
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, l;\n}\n" : "=r"(h2) : "r"(packed));
  return __half22float2(*reinterpret_cast<__half2*>(&h2));
}
__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t mul_half2(uint32_t x, float lo, float hi) {
  __half2 v = *reinterpret_cast<__half2*>(&x);
  v = __hmul2(v, __floats2half2_rn(lo, hi));
  return *reinterpret_cast<uint32_t*>(&v);
}

using tilegym_cutlass::pack_pair;

// 16 consecutive columns j = 0..15 of acc[j][k] * f, as two 16-byte stores of 16-bit values.
template <typename T16>
__device__ __forceinline__ void store16_columns(T16* dst, const float (&acc)[16][4], int k, float f) {
#pragma unroll
  for (int v = 0; v < 2; ++v) {
    uint4 packed;
    uint32_t* words = &packed.x;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const int j = 8 * v + 2 * w;
      words[w] = pack_pair(dst, acc[j][k] * f, acc[j + 1][k] * f);
    }
    reinterpret_cast<uint4*>(dst)[v] = packed;
  }
}

// Stage query row `row` of one batch row (threads t of warpgroup 0 with t / 8 = row % 16 share it, each
// taking 16-byte chunks (8 columns) 8 i + t % 8; kM row tiles take kM calls). The row is scaled by a
// power of two that puts its largest magnitude in [2^7, 2^8) and split into kParts e4m3 parts (part p
// = row kRows p + row of the staged tile); kDsMla's rope stays bf16. Returns
// nothing; writes q_unscale[r] = 2^-shift. Every load goes to its own registers before the first use
// (one 16-byte load per chunk when the rows are 16-byte aligned, else 2-byte ones): a loop reusing a
// register serialises the loads, 36 global latencies a segment (13-20 us on the H200). Called by
// warpgroup 0 (threads 0..127). `after_loads()` runs once the loads are issued, before their values
// are used: the caller issues the segment's first KV copies there, behind the query in the memory queues.
template <int kFormat, typename T, int kM, typename AfterLoads>
__device__ __forceinline__ void stage_query(unsigned char* qs, float* q_unscale, int row, const T* q_row,
                                            const T* qpe_row, bool live, AfterLoads&& after_loads) {
  using L = Tiles<kFormat, T, kM>;
  constexpr int kCols = kFormat == kPerTensor ? kD + kP : kD;  // columns in e4m3 parts
  constexpr int kChunks = kCols / 64;                           // 8-column chunks per thread
  const int sub = threadIdx.x & 7;
  auto source = [&](int i) { const int c = 8 * (8 * i + sub); return c < kD ? q_row + c : qpe_row + (c - kD); };
  const bool aligned = ((reinterpret_cast<uintptr_t>(q_row) | reinterpret_cast<uintptr_t>(qpe_row)) & 15) == 0;
  uint4 raw[kChunks];
  if (!live) {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) raw[i] = make_uint4(0, 0, 0, 0);
  } else if (aligned) {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) raw[i] = *reinterpret_cast<const uint4*>(source(i));
  } else {
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
#pragma unroll
      for (int e = 0; e < 8; ++e) reinterpret_cast<uint16_t*>(&raw[i])[e] = reinterpret_cast<const uint16_t*>(source(i))[e];
    }
  }
  after_loads();
  auto value = [&](int i, int e) { return static_cast<float>(reinterpret_cast<const T*>(&raw[i])[e]); };
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
#pragma unroll
    for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(value(i, e)));
  }
#pragma unroll
  for (int o = 1; o < 8; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, o));
  const bool finite = amax > 0.f && amax <= 3.0e38f;
  int exponent = 0;
  if (finite) frexpf(amax, &exponent);
  int shift = finite ? 8 - exponent : 0;
  shift = shift > 100 ? 100 : (shift < -100 ? -100 : shift);
  const float up = ldexpf(1.f, shift);
  if (sub == 0) q_unscale[row] = ldexpf(1.f, -shift);
#pragma unroll
  for (int i = 0; i < kChunks; ++i) {
    const int c = 8 * (8 * i + sub);  // byte c of the row: 16-byte chunk c / 16, bytes c % 16 ..
    float x[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] = value(i, e) * up;
#pragma unroll
    for (int p = 0; p < kParts<T>; ++p) {
      uint32_t words[2];
#pragma unroll
      for (int w = 0; w < 2; ++w) {
        uint32_t word = 0;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int e = 4 * w + 2 * h;
          const uint32_t packed = float2_to_e4m3x2(x[e], x[e + 1]);
          word |= packed << (16 * h);
          const float2 part = e4m3x2_to_float2(packed);
          x[e] -= part.x;
          x[e + 1] -= part.y;
        }
        words[w] = word;
      }
      const int r = row + L::kRows * p;
      const int off = c < kD ? L::kQLat + lat_offset(r, c >> 4, L::kN) : L::kQRope + swizzle64(r, (c - kD) >> 4);
      *reinterpret_cast<uint2*>(qs + off + (c & 15)) = make_uint2(words[0], words[1]);
    }
  }
  if constexpr (kFormat == kDsMla) {  // bf16 rope [16, 64]: thread takes columns 8 sub .. 8 sub + 7
    uint4 v = make_uint4(0, 0, 0, 0);
    const T* src = qpe_row + 8 * sub;
    if (live && (reinterpret_cast<uintptr_t>(src) & 15) == 0) {
      v = *reinterpret_cast<const uint4*>(src);
    } else if (live) {  // a row off 16-byte boundaries: element by element
#pragma unroll
      for (int k = 0; k < 8; ++k) reinterpret_cast<uint16_t*>(&v)[k] = reinterpret_cast<const uint16_t*>(src)[k];
    }
    *reinterpret_cast<uint4*>(qs + L::kQRope + swizzle128(row, sub)) = v;
  }
}

}  // namespace tilegym_fp8

template <typename T, int kFormat, int kStages, int kGroups, int kCtasPerSm, int kChunk, int kM>
__global__ void __launch_bounds__(128 * kGroups, kCtasPerSm) mla_decode_fp8_split_kernel(
    const T* __restrict__ q, const T* __restrict__ qpe, const float* __restrict__ tensor_scale,
    const unsigned char* __restrict__ rope_bytes, const unsigned char* __restrict__ scale_bytes,
    const int* __restrict__ table, const int* __restrict__ indptr, const int* __restrict__ lens,
    const int* __restrict__ cum_blocks, const int* __restrict__ piece_bounds, const int* __restrict__ piece_rows,
    T* __restrict__ out, float* __restrict__ out_lse, __half* __restrict__ part_out, float* __restrict__ part_lse,
    int heads, int q_len, int query_rows, int causal, int write_lse, int paged, int page_size, int num_pages,
    int num_indices, int ragged, int num_pieces, long long q_sb, long long q_sq, long long q_sh, long long qpe_sb,
    long long qpe_sq, long long qpe_sh, long long table_sb, long long rope_s0, long long rope_s1, long long scale_s0,
    long long scale_s1, float qk_scale_log2,
    const __grid_constant__ CUtensorMap lat_map, const __grid_constant__ CUtensorMap rope_map,
    const __grid_constant__ CUtensorMap scale_map, int box_rows) {
  using namespace tilegym_fp8;
  using L = Tiles<kFormat, T, kM>;
  constexpr int kRows = L::kRows;  // query rows per CTA: kM row tiles of 16
  static_assert(kM == 1 || kM == 2, "one or two row tiles of 16 query rows");
  constexpr int kNt = kTokens / 8, kKs = kTokens / 16;
  constexpr int kMergeFloats = kThreads * 68 * kM;  // per extra warpgroup and row tile: O (64 floats) + m, sums
  static_assert(kGroups == 1 || (kGroups - 1) * kMergeFloats * 4 <= kStages * L::kStage, "merge fits in the ring");
  extern __shared__ unsigned char smem_raw[];
  // wgmma's swizzle atoms need 1 KB alignment (the launch asks for 1 KB more than the tiles); the
  // offset keeps the pointer in the shared space (shared loads, not generic ones).
  unsigned char* smem = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
  unsigned char* qs = smem + kStages * L::kStage;                        // staged query
  float* s_all = reinterpret_cast<float*>(qs + L::kQBytes);              // S [kRows, kSRow] per warpgroup
  float* q_unscale = s_all + kGroups * kRows * kSRow;                    // [kRows]: 2^-shift per row
  uint64_t* full = reinterpret_cast<uint64_t*>(q_unscale + kRows);       // [kStages]: the stage landed
  int* issued = reinterpret_cast<int*>(full + kStages);                  // [kStages]: uses issued so far

  const int tid = threadIdx.x, wg = tid >> 7, wt = tid & (kThreads - 1), warp = wt >> 5, lane = tid & 31;
  const int g = lane >> 2, quad = lane & 3;  // mma fragment coordinates
  float* s_x = s_all + wg * kRows * kSRow;
  const int piece = blockIdx.x;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      issued[s] = 0;
    }
  }
  allow_dependent_launch();  // the combine's CTAs may take the SM room this kernel leaves
  __syncthreads();
  // A programmatic dependent launch: nothing a previous kernel wrote is read before this wait.
  tilegym_cutlass::wait_for_previous_grid();
  const int start = piece_bounds[piece];
  const int end = piece_bounds[piece + 1];
  const int first_row = piece_rows[piece];
  const int last_row = piece_rows[num_pieces + piece];
  // kPerTensor: the cache value is kv * kv_scale (one float32 on the device).
  const float kv_scale = kFormat == kPerTensor ? *tensor_scale : 1.f;
  // Blocks of the piece in order, n = 0, 1, ...: block start + n of the flattened schedule, whatever its
  // row. A cursor over the rows that only moves forward finds the row of the block to issue (each
  // issuing warp keeps its own).
  const int piece_blocks = max(min(end, cum_blocks[last_row + 1]) - start, 0);
  struct RowCursor {
    int row, begin, end, len;
    const int* pages;
  };
  auto cursor_at = [&](int r) {
    return RowCursor{r, cum_blocks[r], cum_blocks[r + 1], lens[r],
                     tilegym_cutlass::page_list(table, indptr, r, paged, ragged, num_indices, table_sb)};
  };
  RowCursor cursor = cursor_at(first_row);
  // Block blk of row at.row (the CTA's block number seq) into its stage, issued by one warp (every
  // lane calls): boxes of box_rows tokens, lane l taking boxes l, l + 32, ...; boxes wholly past the
  // row's length are skipped (bytes not expected). With several warpgroups, the stage's count of
  // issued uses is published after the expected bytes (see the wait below).
  auto issue_block = [&](const RowCursor& at, int blk, int seq) {
    const int si = seq % kStages;
    unsigned char* stage = smem + si * L::kStage;
    const int boxes = tilegym_cutlass::boxes_in_block(blk, kTokens, at.len, box_rows);
    const uint64_t policy = tilegym_cutlass::l2_policy(true);  // the cache is read once
    if (lane == 0) {
      mbar_expect_bytes(&full[si], boxes * box_rows * L::kTokenBytes);
      if constexpr (kGroups > 1) store_release(&issued[si], seq / kStages + 1);
    }
    __syncwarp();
    for (int box = lane; box < boxes; box += 32) {
      const auto [unit, row] =
          tilegym_cutlass::box_origin(at.pages, at.row, blk * kTokens + box * box_rows, paged, page_size, num_pages);
      const int r0 = box * box_rows;
#pragma unroll
      for (int atom = 0; atom < 4; ++atom) {
        tma_load_3d(stage + L::kLat + atom * kTokens * 128 + r0 * 128, &lat_map, 128 * atom, row, unit, &full[si], policy);
      }
      if (box_rows >= L::kRopeBoxMin) {
        tma_load_3d(stage + L::kRope + r0 * L::kRopeBytes, &rope_map, 0, row, unit, &full[si], policy);
      } else {  // swizzled 16-byte pieces, token by token
        for (int k = 0; k < box_rows; ++k) {
          const unsigned char* src = rope_bytes + unit * rope_s0 + (row + k) * rope_s1;
          for (int c = 0; c < L::kRopeBytes / 16; ++c)
            bulk_load(stage + L::kRope + rope_offset<kFormat>(r0 + k, c), src + 16 * c, 16, &full[si], policy);
        }
      }
      if constexpr (kFormat == kDsMla) {
        if (box_rows >= L::kScaleBoxMin) {
          tma_load_3d(stage + L::kScale + r0 * 16, &scale_map, 0, row, unit, &full[si], policy);
        } else {
          for (int k = 0; k < box_rows; ++k)
            bulk_load(stage + L::kScale + (r0 + k) * 16, scale_bytes + unit * scale_s0 + (row + k) * scale_s1, 16, &full[si], policy);
        }
      }
    }
  };
  // Block n of the piece (its number seq is n: segments tile the piece in order).
  auto issue_piece_block = [&](int n) {
    while (start + n >= cursor.end) cursor = cursor_at(cursor.row + 1);
    issue_block(cursor, start + n - cursor.begin, n);
  };
  // With one warpgroup the ring runs across segment boundaries: a refill may be the next row's first
  // blocks, which then land while this segment ends and the next one stages its query. Several
  // warpgroups merge through the ring at a segment's end, so for them it drains there.
  constexpr bool kAcross = kGroups == 1;
  int consumed = 0;  // blocks of earlier segments: each went once through its stage's barrier

  for (int b = first_row; b <= last_row; ++b) {
    const int row_begin = cum_blocks[b], row_end = cum_blocks[b + 1];
    const int lo = start > row_begin ? start : row_begin;
    const int hi = end < row_end ? end : row_end;
    if (lo >= hi) continue;
    const bool whole = lo == row_begin && hi == row_end;
    const long long slot = piece + b;
    const int len = lens[b];
    const int first_blk = lo - row_begin, blocks = hi - lo;

    // Latent rows (V) at or past the row's length -> zero, and kDsMla's scales of those rows: whatever
    // the cache holds there (NaN) must not reach P . V, where P is 0.
    auto clear_tail = [&](unsigned char* stage, int valid) {
      const int chunks = (kTokens - valid) * 8;  // 16-byte chunks per latent atom
      for (int i = wt; i < 4 * chunks; i += kThreads) {
        const int atom = i / chunks, c = i - atom * chunks;
        *reinterpret_cast<uint4*>(stage + L::kLat + atom * kTokens * 128 + valid * 128 + 16 * c) = make_uint4(0, 0, 0, 0);
      }
      if constexpr (kFormat == kDsMla) {
        for (int t = valid + wt; t < kTokens; t += kThreads) *reinterpret_cast<uint4*>(stage + L::kScale + 16 * t) = make_uint4(0, 0, 0, 0);
      }
    };

    fence_async_shared();  // the last segment's shared reads and writes come before the new copies
    __syncthreads();       // the previous segment is done with every stage and with the query
    // The ring's first copies (kAcross: the piece's, at its first segment; else the segment's) go out
    // once warp 0 has issued its first query loads, so that the query is ahead of them in the memory
    // queues: issued first, it lands in about one latency instead of behind every CTA's first blocks.
    auto fill_ring = [&] {  // a ring across segments (kAcross) is filled once, at the piece's start
      if (tid >= 32 || (kAcross && consumed > 0)) return;
      const int first_blocks = kAcross ? piece_blocks : blocks;
      for (int i = 0; i < kStages && i < first_blocks; ++i) issue_piece_block(consumed + i);
    };
    if (wg == 0) {
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        const int row = kTileRows * mt + (tid >> 3);
        const bool live = row < query_rows;
        const int token = live ? row / heads : 0, head = live ? row - token * heads : 0;
        stage_query<kFormat, T, kM>(qs, q_unscale, row, q + b * q_sb + token * q_sq + head * q_sh,
                                    qpe + b * qpe_sb + token * qpe_sq + head * qpe_sh, live, [&] {
                                      if (mt == 0) fill_ring();
                                    });
        // The next row's query -> L2 now, so that the next segment stages it from L2.
        if (b < last_row && live) {
          const int line = tid & 7;  // 128-byte lines: 8 of the latent row, the rope row's first
          tilegym_cutlass::prefetch_l2(reinterpret_cast<const char*>(q + (b + 1) * q_sb + token * q_sq + head * q_sh) + 128 * line);
          if (line == 0) tilegym_cutlass::prefetch_l2(qpe + (b + 1) * qpe_sb + token * qpe_sq + head * qpe_sh);
        }
      }
    }
    fence_async_shared();  // the staged query -> visible to every warpgroup's wgmma
    __syncthreads();

    // Per row tile mt: rows 16 mt + g and 16 mt + g + 8 of this thread ([mt][h]).
    float m[kM][2], l[kM][2];  // running max (log2 units), this lane's share of the sums
    int limit[kM][2];
    float row_scale[kM][2];  // kPerTensor: score scale of the rows (kDsMla scales S^T per token instead)
    float col_unscale[4 * kM];  // kDsMla: q_unscale of the S^T columns this thread holds (rows 8 j + 2 quad + e)
    float acc[kM][16][4];
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = kTileRows * mt + g + 8 * h;
        m[mt][h] = -INFINITY;
        l[mt][h] = 0.f;
        limit[mt][h] = causal ? len - q_len + 1 + r / heads : len;
        row_scale[mt][h] = qk_scale_log2 * kv_scale * q_unscale[r];
      }
#pragma unroll
      for (int j = 0; j < 16; ++j) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
    }
#pragma unroll
    for (int k = 0; k < 4 * kM; ++k) col_unscale[k] = q_unscale[8 * (k >> 1) + 2 * quad + (k & 1)];
    // V of token 16 ks + 2 quad + (r & 1) + 8 (r >> 1), chunk g of atom w (tokens 8 apart are 1 KB
    // apart); the scales (+ 16 (token - 2 quad)).
    int v_base[2];
#pragma unroll
    for (int odd = 0; odd < 2; ++odd) v_base[odd] = L::kLat + lat_offset(2 * quad + odd, 8 * warp + g, kTokens);
    const int scale_base = L::kScale + 32 * quad + 4 * warp;
    // Blocks entirely below every row's limit need no mask.
    const int unmasked_end = causal ? len - q_len + 1 : len;

    for (int i = wg; i < blocks; i += kGroups) {
      const int blk = first_blk + i;
      const int seq = consumed + i, si = seq % kStages, use = seq / kStages;
      unsigned char* stage = smem + si * L::kStage;
      if constexpr (kGroups > 1) {
        // A stage's uses go to different warpgroups: its barrier may still be in the phase of use - 1
        // (issued by another group, not landed), which the parity of use would take for done. Wait
        // until this use is issued, then for its phase.
        while (load_acquire(&issued[si]) <= use) {
        }
      }
      mbar_wait(&full[si], use & 1);  // TMA wrote through the async proxy, as wgmma reads
      const int valid = len - blk * kTokens;
      if (valid < kTokens) {
        clear_tail(stage, valid);
        fence_async_shared();
        group_sync(wg);
      }

      // S^T [64 tokens, kRows rows] by wgmma. Thread holds tokens 16 warp + g + 8 i' and rows
      // 8 j + 2 quad + e of each part: accumulator element 4 (j + kRows / 8 part) + 2 i' + e.
      float st[2][4 * kM];  // [i'][2 j + e]
      const uint32_t stage_addr = shared_address(stage);
      const TileDesc k_lat = desc128(stage_addr + L::kLat), q_lat = desc128(shared_address(qs) + L::kQLat);
      const TileDesc k_rope = kFormat == kPerTensor ? desc64(stage_addr + L::kRope) : desc128(stage_addr + L::kRope);
      const TileDesc q_rope =
          kFormat == kPerTensor ? desc64(shared_address(qs) + L::kQRope) : desc128(shared_address(qs) + L::kQRope);
      if constexpr (kFormat == kPerTensor) {
        // k-steps of kChunk into fresh accumulators, summed in float32 (two in flight): the fp8 MMA
        // adds into its accumulator with reduced precision, which grows with the accumulated value.
        constexpr int kSteps = (kD + kP) / 32, kChunks = (kSteps + kChunk - 1) / kChunk;
        float d[2][L::kN / 2];
#pragma unroll
        for (int ii = 0; ii < 2; ++ii) {
#pragma unroll
          for (int k = 0; k < 4 * kM; ++k) st[ii][k] = 0.f;
        }
#pragma unroll
        for (int c = 0; c <= kChunks; ++c) {
          if (c < kChunks) {
            wgmma_fence();
#pragma unroll
            for (int ks = c * kChunk; ks < (c + 1) * kChunk && ks < kSteps; ++ks) {
              if (ks < kD / 32) {
                const int off = (ks >> 2) * 128 * kTokens + 32 * (ks & 3);  // atom ks / 4, bytes 32 (ks % 4)
                const int qoff = (ks >> 2) * 128 * L::kN + 32 * (ks & 3);
                wgmma_e4m3<L::kN>(d[c & 1], k_lat.at(off), q_lat.at(qoff), ks > c * kChunk);
              } else {
                const int off = 32 * (ks - kD / 32);
                wgmma_e4m3<L::kN>(d[c & 1], k_rope.at(off), q_rope.at(off), ks > c * kChunk);
              }
            }
            wgmma_commit();
          }
          if (c > 0) {  // chunk c - 1 is done: fold it
            if (c < kChunks) {
              wgmma_wait<1>();
            } else {
              wgmma_wait<0>();
            }
            fence_regs(d[(c - 1) & 1]);
#pragma unroll
            for (int ii = 0; ii < 2; ++ii) {
#pragma unroll
              for (int k = 0; k < 4 * kM; ++k) {
#pragma unroll
                for (int p = 0; p < kParts<T>; ++p) {
                  st[ii][k] += d[(c - 1) & 1][4 * ((k >> 1) + (kRows / 8) * p) + 2 * ii + (k & 1)];
                }
              }
            }
          }
        }
      } else if constexpr (kM == 2) {
        // Scale group c's four k-steps into d[c & 1] (two in flight), the rope's beside the last;
        // each group is folded as it finishes: st += its tokens' scale x (part 0 + part 1).
        float d[2][32], dr[16], scs[2][4];
#pragma unroll
        for (int ii = 0; ii < 2; ++ii) {
          const float4 sc = *reinterpret_cast<const float4*>(stage + L::kScale + 16 * (16 * warp + g + 8 * ii));
          scs[ii][0] = sc.x, scs[ii][1] = sc.y, scs[ii][2] = sc.z, scs[ii][3] = sc.w;
#pragma unroll
          for (int k = 0; k < 8; ++k) st[ii][k] = 0.f;
        }
#pragma unroll
        for (int c = 0; c <= 4; ++c) {
          if (c < 4) {
            wgmma_fence();
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              wgmma_e4m3<64>(d[c & 1], k_lat.at(c * 128 * kTokens + 32 * k), q_lat.at(c * 128 * L::kN + 32 * k), k > 0);
            }
            if (c == 3) {
#pragma unroll
              for (int k = 0; k < 4; ++k) wgmma_bf16_n32(dr, k_rope.at(32 * k), q_rope.at(32 * k), k > 0);
            }
            wgmma_commit();
          }
          if (c > 0) {
            if (c < 4) {
              wgmma_wait<1>();
            } else {
              wgmma_wait<0>();
            }
            fence_regs(d[(c - 1) & 1]);
#pragma unroll
            for (int ii = 0; ii < 2; ++ii) {
#pragma unroll
              for (int k = 0; k < 8; ++k) {
                const int e = 4 * (k >> 1) + 2 * ii + (k & 1);
                st[ii][k] = fmaf(scs[ii][c - 1], d[(c - 1) & 1][e] + d[(c - 1) & 1][e + 16], st[ii][k]);
              }
            }
          }
        }
        fence_regs(dr);
#pragma unroll
        for (int ii = 0; ii < 2; ++ii) {
#pragma unroll
          for (int k = 0; k < 8; ++k) st[ii][k] = fmaf(st[ii][k], col_unscale[k], dr[4 * (k >> 1) + 2 * ii + (k & 1)]);
        }
      } else {
        float d[4][16];  // per scale group
        float dr[8];     // rope
        wgmma_fence();
#pragma unroll
        for (int grp = 0; grp < 4; ++grp) {
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            wgmma_e4m3<32>(d[grp], k_lat.at(grp * 128 * kTokens + 32 * k), q_lat.at(grp * 128 * L::kN + 32 * k), k > 0);
          }
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          wgmma_bf16_n16(dr, k_rope.at(32 * k), q_rope.at(32 * k), k > 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
#pragma unroll
        for (int grp = 0; grp < 4; ++grp) fence_regs(d[grp]);
        fence_regs(dr);
#pragma unroll
        for (int ii = 0; ii < 2; ++ii) {
          const int t = 16 * warp + g + 8 * ii;
          const float4 sc = *reinterpret_cast<const float4*>(stage + L::kScale + 16 * t);
          const float scs[4] = {sc.x, sc.y, sc.z, sc.w};
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const int e = 4 * (k >> 1) + 2 * ii + (k & 1);
            float sum = 0.f;
#pragma unroll
            for (int grp = 0; grp < 4; ++grp) sum += scs[grp] * (d[grp][e] + d[grp][e + 8]);
            st[ii][k] = fmaf(sum, col_unscale[k], dr[e]);
          }
        }
      }
#pragma unroll
      for (int ii = 0; ii < 2; ++ii) {
#pragma unroll
        for (int k = 0; k < 4 * kM; ++k) {
          s_x[(8 * (k >> 1) + 2 * quad + (k & 1)) * kSRow + 16 * warp + g + 8 * ii] = st[ii][k];
        }
      }
      group_sync(wg);  // S is complete
      // sp[mt][nt][k]: row 16 mt + g + 8 (k >> 1), token 8 nt + 2 quad + (k & 1) (the mma C layout).
      float sp[kM][kNt][4];
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float2 v = *reinterpret_cast<const float2*>(s_x + (kTileRows * mt + g + 8 * h) * kSRow + 8 * nt + 2 * quad);
            sp[mt][nt][2 * h] = v.x;
            sp[mt][nt][2 * h + 1] = v.y;
          }
        }
      }

      // Mask (only a block that reaches a row's limit), the block's row maxima of the raw scores
      // (quad shuffles: every warp has every token); the score scale (> 0) goes into exp2's FMA.
      if ((blk + 1) * kTokens > unmasked_end) {
#pragma unroll
        for (int mt = 0; mt < kM; ++mt) {
#pragma unroll
          for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
            for (int k = 0; k < 4; ++k) {
              const int pos = blk * kTokens + 8 * nt + 2 * quad + (k & 1);
              sp[mt][nt][k] = pos < limit[mt][k >> 1] ? sp[mt][nt][k] : -INFINITY;
            }
          }
        }
      }
      // P = exp2(S - m) in f16 as A fragments: k-step ks takes n-tiles 2 ks (a0, a1) and 2 ks + 1 (a2, a3).
      uint32_t pf[kM][kKs][4];
#pragma unroll
      for (int mt = 0; mt < kM; ++mt) {
        float bmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
          for (int k = 0; k < 4; ++k) bmax[k >> 1] = fmaxf(bmax[k >> 1], sp[mt][nt][k]);
        }
        float m_safe[2], alpha[2], sf[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          sf[h] = kFormat == kPerTensor ? row_scale[mt][h] : qk_scale_log2;
          bmax[h] = fmaxf(bmax[h], __shfl_xor_sync(0xffffffff, bmax[h], 1));
          bmax[h] = fmaxf(bmax[h], __shfl_xor_sync(0xffffffff, bmax[h], 2));
          const float m_new = fmaxf(m[mt][h], bmax[h] * sf[h]);
          m_safe[h] = m_new == -INFINITY ? 0.f : m_new;  // a row with no token yet: no inf - inf
          alpha[h] = fast_exp2(m[mt][h] - m_safe[h]);
          m[mt][h] = m_new;
          l[mt][h] *= alpha[h];
        }
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float p0 = fast_exp2(fmaf(sp[mt][nt][2 * h], sf[h], -m_safe[h]));
            const float p1 = fast_exp2(fmaf(sp[mt][nt][2 * h + 1], sf[h], -m_safe[h]));
            l[mt][h] += p0 + p1;
            __half2 pair = __floats2half2_rn(p0, p1);
            pf[mt][nt >> 1][2 * (nt & 1) + h] = *reinterpret_cast<uint32_t*>(&pair);
          }
        }
        if (__any_sync(0xffffffff, alpha[0] != 1.f || alpha[1] != 1.f)) {  // the max moved for a row
#pragma unroll
          for (int j = 0; j < 16; ++j) {
            acc[mt][j][0] *= alpha[0];
            acc[mt][j][1] *= alpha[0];
            acc[mt][j][2] *= alpha[1];
            acc[mt][j][3] *= alpha[1];
          }
        }
      }

      // O[:, 128 warp ..] += P . V: the lane reads tokens 16 ks + {2q, 2q + 1, 2q + 8, 2q + 9}, widens
      // them once and uses them for every row tile.
#pragma unroll
      for (int ks = 0; ks < kKs; ++ks) {
        uint4 vw[4];
        float vs[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int token_step = 16 * ks + 8 * (r >> 1);  // + 2 quad + (r & 1), in the bases
          vw[r] = *reinterpret_cast<const uint4*>(stage + v_base[r & 1] + 128 * token_step);
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
#pragma unroll
              for (int mt = 0; mt < kM; ++mt) mma_f16(acc[mt][4 * w4 + 2 * half + e], pf[mt][ks], b0, b1);
            }
          }
        }
      }
      group_sync(wg);  // every warp of the group is done with the stage and with S
      if (warp == 0 && (kAcross ? seq + kStages < piece_blocks : i + kStages < blocks)) issue_piece_block(seq + kStages);
    }
    consumed += blocks;

    // Row sums: lane share -> quad (every warp of a group saw every token of its blocks).
    float total[kM][2];
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        total[mt][h] = l[mt][h] + __shfl_xor_sync(0xffffffff, l[mt][h], 1);
        total[mt][h] += __shfl_xor_sync(0xffffffff, total[mt][h], 2);
      }
    }
    if constexpr (kGroups > 1) {
      // Warpgroups 1.. hand (O, m, sums) to warpgroup 0 through the ring (no copy is in flight: every
      // block issued was consumed); thread t of each group holds the same rows and columns. Per row
      // tile 17 float4 a thread: O, then (m, sums).
      float* merge = reinterpret_cast<float*>(smem);
      __syncthreads();
      if (wg > 0) {
        float4* mine = reinterpret_cast<float4*>(merge + (wg - 1) * kMergeFloats);
#pragma unroll
        for (int mt = 0; mt < kM; ++mt) {
#pragma unroll
          for (int j = 0; j < 16; ++j) {
            mine[(17 * mt + j) * kThreads + wt] = make_float4(acc[mt][j][0], acc[mt][j][1], acc[mt][j][2], acc[mt][j][3]);
          }
          mine[(17 * mt + 16) * kThreads + wt] = make_float4(m[mt][0], m[mt][1], total[mt][0], total[mt][1]);
        }
      }
      __syncthreads();
      if (wg > 0) continue;
#pragma unroll 1
      for (int w = 1; w < kGroups; ++w) {
        const float4* other = reinterpret_cast<const float4*>(merge + (w - 1) * kMergeFloats);
#pragma unroll
        for (int mt = 0; mt < kM; ++mt) {
          const float4 state = other[(17 * mt + 16) * kThreads + wt];
          const float m_other[2] = {state.x, state.y}, total_other[2] = {state.z, state.w};
          float mine_scale[2], other_scale[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float m_new = fmaxf(m[mt][h], m_other[h]);
            const float safe = m_new == -INFINITY ? 0.f : m_new;  // neither group saw a token: no inf - inf
            mine_scale[h] = fast_exp2(m[mt][h] - safe);
            other_scale[h] = fast_exp2(m_other[h] - safe);
            total[mt][h] = total[mt][h] * mine_scale[h] + total_other[h] * other_scale[h];
            m[mt][h] = m_new;
          }
#pragma unroll
          for (int j = 0; j < 16; ++j) {
            const float4 v = other[(17 * mt + j) * kThreads + wt];
            acc[mt][j][0] = acc[mt][j][0] * mine_scale[0] + v.x * other_scale[0];
            acc[mt][j][1] = acc[mt][j][1] * mine_scale[0] + v.y * other_scale[0];
            acc[mt][j][2] = acc[mt][j][2] * mine_scale[1] + v.z * other_scale[1];
            acc[mt][j][3] = acc[mt][j][3] * mine_scale[1] + v.w * other_scale[1];
          }
        }
      }
    }
    // The output carries kPerTensor's cache scale; a partial does not (the combine applies it).
    const float out_factor = kFormat == kPerTensor ? kv_scale : 1.f;
#pragma unroll
    for (int mt = 0; mt < kM; ++mt) {
      float inv[2], lse[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const bool empty = total[mt][h] == 0.f;  // no token seen: zeros, lse -inf; NaN data gives NaN
        inv[h] = empty ? 0.f : 1.f / total[mt][h];
        lse[h] = empty ? -INFINITY : (m[mt][h] + log2f(total[mt][h])) * kLn2;
      }
      // acc[mt][j][2 h + e] is row 16 mt + g + 8 h, column 128 warp + 16 (2 quad + e) + j: 16 consecutive columns.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = kTileRows * mt + g + 8 * h;
        if (r >= query_rows) continue;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = 128 * warp + 16 * (2 * quad + e);
          if (whole) {
            store16_columns(out + ((long long)b * query_rows + r) * kD + col, acc[mt], 2 * h + e, inv[h] * out_factor);
          } else {
            store16_columns(part_out + (slot * query_rows + r) * kD + col, acc[mt], 2 * h + e, inv[h]);
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
}
