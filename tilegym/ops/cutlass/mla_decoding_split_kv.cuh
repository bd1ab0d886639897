// MLA decoding over a split schedule, CUDA C++ with CuTe for sm_90a (wgmma and TMA), for 1-128 query
// rows per KV read (the compute-bound case: 64/128 heads, or several new tokens per row). Two
// warpgroups take alternate KV blocks ("seesaw"), so one's softmax overlaps the other's matmuls.
//
// One CTA = (piece p of the schedule, group of 64 query rows); two consumer warpgroups (bf16/fp16:
// and a third, the producer, that issues every TMA load; 384 threads; kFp8: 256); one wave of
// persistent CTAs (tilegym/ops/schedule.py). The CTA walks the batch rows its piece meets
// and, for each, attends its 64 query rows (r = token * heads + head; rows past query_rows are zero
// and never stored) to the row's KV blocks [lo, hi) inside the piece, 64 tokens per block, two
// blocks per step: block A in buffer 0, block B in buffer 1. A segment that is the whole row
// writes the final output and lse; the others a float32 partial and natural-log lse to work slot
// p + b, merged by mla_decoding_combine.cuh. Causal MTP: token i of a row of length L sees
// positions < L - q_len + 1 + i.
//
// Tiles (bf16/fp16, D = 512 latent columns, P = 64 rope columns, N = 64 tokens per block):
//   shared memory  Q [64, 512]                                      64 KB, once per segment (cp.async)
//                  2 buffers x 9 tiles [64 tokens, 64 columns]      144 KB (TMA; 8 latent tiles, rope)
//                  P_A, P_B [64, 64] (bf16/fp16 probabilities)       16 KB
//   registers      Qpe [64, 64] as wgmma A fragments (16 per thread); O_L or O_R [64, 256] float
//                  (128 per thread); S [64, 64] float (32 per thread)
//   Every shared tile is in the 128-byte-swizzled layout wgmma reads; the KV tiles are read both as
//   K [64 tokens, 512] (K-major, S = Q K^T) and as V^T [512, 64 tokens] (MN-major, O += P V).
// Per step, warpgroup 0 (owns O_L = output columns 0..255) and warpgroup 1 (O_R = 256..511), m the
// running row max (log2 units; in fact a lagging frame, see below), "->" a named
// barrier to the other warpgroup. bf16/fp16 caches:
//   WG0  S_A = Q K_A^T (wgmma 64x64x16, 36 k-steps; the rope k-steps from registers) -> (issued);
//        m_A = max(m, rowmax S_A); P_A = exp2(S_A - m_A) -> (m_A, P_A); O_L, l *= exp2(m - m_A);
//        O_L += P_A V_A,L (P_A from registers); release buffer 0's tiles 0..3;
//        (m_B, P_B) ->; O_L, l *= exp2(m_A - m_B); O_L += P_B V_B,L (P_B from shared memory);
//        release buffer 1's tiles 0..3; (P_A free) ->.
//   WG1  (issued) ->; S_B = Q K_B^T; (m_A, P_A) ->; O_R, l *= exp2(m - m_A); O_R += P_A V_A,R;
//        m_B = max(m_A, rowmax S_B); P_B = exp2(S_B - m_B) -> (m_B, P_B); once P_A V_A,R is done,
//        release buffer 0's tiles 4..8 -> (P_A free); O_R, l *= exp2(m_A - m_B); O_R += P_B V_B,R;
//        release buffer 1's tiles 4..8.
//   WG2  (the producer, one warp) for each block of the CTA in order, each side of its buffer once
//        released: one TMA box of the side's 4 latent tiles (+ the rope for side 1).
//   So buffer 0 is free half a step before buffer 1, and the two refills overlap different matmuls.
//   A release is one mbarrier arrival per warp; the consumers never wait on a TMA issue, which under
//   load took ~1000 cycles of a ~6900-cycle step per refill when they issued their own (session 21's
//   step timeline; same-process A/Bs: 0-9% faster at 128 heads, dense or in pages of 64, 1-2% faster
//   at 64 heads in pages of 64, 1% slower there dense, 0-4% slower in pages of 16;
//   benchmarks/NOTES_cutlass.md, "Session 21").
//   S_B's matmuls queue behind S_A's, so S_A ends first and its softmax overlaps S_B, and block B's
//   tiles (refilled last) get S_A's time to land; P_B goes out before P_A V_A,R is done, and WG0
//   rewrites P_A's shared copy only after "P_A free" (same-call A/B: 3-6% off at 128 heads).
//   A warpgroup writes its P to shared memory with stmatrix (four 8x8 matrices per instruction; 5-7%
//   faster with an fp8 cache than 32-bit stores, 1-2% with bf16, and fewer spills).
//   Each warpgroup sums the probabilities it computed; the two sums are added at the segment's end.
//   m is a frame, not the exact running max: it moves only when a block's max exceeds it by more than
//   2^8 (kReframeLog2), so probabilities stay <= 256 (exact enough in bf16/fp16, and float sums) and a
//   thread whose rows kept their frame skips rescaling O (128 multiplies) before a P V; with random
//   data it rarely moves after a row's first block (same-call A/B: 2-5% faster at 64-128 heads; the
//   fp8 order below does the same: 1-3%).
// fp8 caches (kFp8) take another order, whose P V matmuls free buffer 0 later but whose score
// matmuls (and their widening) overlap the step's last P V (same-call A/B: 7-8% faster with fp8 at
// 64-128 heads, 2-9% slower with bf16). Each warpgroup enters a step with its block's S computed:
//   WG0  m_A = max(m, rowmax S_A) -> (m_A); P_A = exp2(S_A - m_A); O_L, l *= exp2(m - m_A);
//        O_L += P_A V_A,L; refill buffer 0's tiles 0..3; (m_B) ->; P_A * exp2(m_A - m_B) -> shared
//        memory -> (P_A); (P_B, P_A V_A,R issued) ->; O_L, l *= exp2(m_A - m_B); O_L += P_B V_B,L;
//        issue the next S_A's tiles 0..3; once P_B V_B,L is done, refill buffer 1's tiles 0..3;
//        issue the next S_A's tiles 4..8.
//   WG1  (m_A) ->; m_B = max(m_A, rowmax S_B) -> (m_B); O_R, l *= exp2(m - m_B); P_B -> registers and
//        shared memory; O_R += P_B V_B,R; (P_A) ->; O_R += P_A V_A,R -> (P_B, P_A V_A,R issued); once
//        P_B V_B,R is done, refill buffer 1's tiles 4..8; once P_A V_A,R is done, refill buffer 0's
//        tiles 4..8; issue the next S_B (tiles 4..8, then 0..3).
//   There the probabilities live in the score accumulator's registers, and a warpgroup without a next
//   block issues one zeroing k-step instead of its next S, so that ptxas never sees the accumulator
//   written by other instructions inside a wgmma pipeline stage (it would serialise the matmuls, C7515).
// Loads: TMA boxes of [box_rows tokens, 64 columns] per tile, one mbarrier per (buffer, tile)
// counting the bytes (bf16/fp16 with whole-block boxes: one box [4 tiles, 64 tokens, 64 columns] per
// side from a 4-D view of the latent, landing on the side's first barrier); the score matmuls wait
// tile by tile, in tile order (bf16: WG1 starting at tile
// 4, the half it refills itself, was 0-2% slower in same-call A/Bs) or, in fp8's order, WG1 in its
// refill order (4..8, then 0..3). Issuing each bf16 refill after the next matmul instead of before it
// was 40-50% slower (7-16% without branches): a load issued late is a load waited for.
// A dense row's block is one box per tile; a paged cache's block is one box per page part
// (box_rows = gcd(page_size, 64): 64 boxes of one token for pages of one token). Boxes wholly past
// the row's length are not loaded; V rows past the length in a partial block are zeroed in shared
// memory (the cache may hold NaN there), their scores masked.
//
// Memory traffic per CTA (L = tokens of its piece, R = batch rows it meets):
//   reads  L * 576 * 2 B of KV (+ 4 B of page id per box when paged) and R * 64 * 576 * 2 B of
//          queries; writes per row met 64 * 512 * 4 B of partial output + 64 * 4 B of lse (a whole
//          row: 64 * 512 * 2 B final output, + lse when asked).
//   With more than 64 query rows the KV of a piece is read once per 64-row group (the groups of a
//   piece run at the same time on one GPC, kPair, and the second read hits L2).
//
// kFp8 = 1 (a per-tensor fp8 e4m3 cache, more than 16 query rows): the same schedule, steps and
// matmuls in fp16. Each tile arrives by TMA as fp8 [64 tokens, 64 bytes] (4 KB, unswizzled) into the
// upper half of its side's fp16 region (tiles 0..3 -> bytes 16-32 KB of the latent buffer, tiles 4..7
// -> 48-64 KB, the rope -> 4-8 KB of its 8 KB tile), and the warpgroup that scores the block widens it
// there into the swizzled fp16 tile (cvt.rn.f16x2.e4m3x2, exact) just before its score matmuls read
// it: tile j of a side writes bytes 8j..8j+8 KB of the side, which hold the fp8 bytes of tiles 2j-4 and
// 2j-3, already widened (the side's last tile, j = 3, reads all of its bytes before it writes). The
// query is staged as fp16: a bf16 row is scaled by a power of two that puts its largest element in
// [2^14, 2^15) (exact unless an element is 2^24 below it), whose inverse, times the cache's scale,
// goes into the row's score scale; the output is multiplied by the cache's scale once. Tiles are
// widened two per barrier by the warpgroup that scores them, as they land. Traffic per CTA as below
// with the cache read as L * 576 * 1 B; shared memory gains the widening: 36 KB read and 72 KB
// written per block.
//
// Layout: the TMA maps view the latent and rope caches as [units, rows, columns] (a 16-bit latent as
// [units, 8 tiles, rows, 64 columns], the tile stride 128 B below the row stride): dense = (batch
// rows, tokens), paged = (pages, page_size) with the pages of a row from a block-table row
// (ragged = 0) or kv_indices[kv_indptr[b]:] (ragged = 1). Page ids are clamped to [0, num_pages) and
// lengths were clamped to the row's pages by the schedule: no read leaves the cache. Strides are in
// elements; rows must be 16-byte aligned (the launcher checks).
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "common.cuh"

namespace tilegym_cute {

using namespace cute;

inline constexpr int kD = 512;        // latent width: K's first D columns and all of V
inline constexpr int kP = 64;         // rope width: the rest of K
inline constexpr int kRows = 64;      // query rows per CTA (the wgmma M)
inline constexpr int kTokens = 64;    // KV tokens per block
inline constexpr int kTiles = 9;      // 64-column tiles of a block: 8 latent, then the rope
inline constexpr int kLeftTiles = 4;  // tiles 0..3: V's left half, filled by warpgroup 0
inline constexpr float kLn2 = 0.6931471805599453f;
// A row's frame (the max its probabilities are taken against) moves only when a block's max exceeds
// it by more than this (log2 units): probabilities stay <= 2^8, and O is rescaled far less often.
inline constexpr float kReframeLog2 = 8.f;
__device__ __forceinline__ float next_frame(float frame, float block_max) {
  return block_max > frame + kReframeLog2 ? block_max : frame;
}
__device__ __forceinline__ bool reframed(const float (&scale)[2]) { return scale[0] != 1.f || scale[1] != 1.f; }
// Named barriers (0 is __syncthreads): one warpgroup arrives, the other waits.
inline constexpr int kBarMaxA = 1;  // WG0 -> WG1: m_A and P_A
inline constexpr int kBarMaxB = 2;  // WG1 -> WG0: m_B and P_B (and P_A's buffer is free)
inline constexpr int kBarScoresA = 3;  // WG0 -> WG1: S_A's matmuls are issued
inline constexpr int kBarPAFree = 6;   // WG1 -> WG0: P_A V_A,R is done, P_A's shared copy may be rewritten
inline constexpr int kBarConsumers = 9;   // both consumer warpgroups (beside the producer)
inline constexpr int kBarWiden = 10;      // kFp8: the producer's widening warps
// kFp8: the producer's warps 1..3 widen the fp8 tiles (its warp 0 issues the loads).
inline constexpr int kWideners = 96;
// Registers per thread after setmaxnreg: 3 x 128 threads launched at 168 (65536 / 384, rounded down to
// 8) hold 3 x 168 = 504 per thread triple; the consumers take 240 each, the producer what is left.
inline constexpr int kConsumerRegisters = 240;
inline constexpr int kProducerRegisters = 24;

// The input type's CuTe element type and its wgmma atoms (CuTe picks the instruction from the
// element types, tile shape and operand majors): scores S = Q K^T (64x64x16, Q from shared memory;
// the rope k-steps with Q from registers) and O += P V (64x256x16, P from registers or shared).
template <typename T>
struct Types {
  using E = std::conditional_t<std::is_same_v<T, __half>, cute::half_t, cute::bfloat16_t>;
  using MmaS = decltype(GMMA::ss_op_selector<E, E, float, Shape<_64, _64, _16>, GMMA::Major::K, GMMA::Major::K>());
  using MmaSRope = decltype(GMMA::rs_op_selector<E, E, float, Shape<_64, _64, _16>, GMMA::Major::K, GMMA::Major::K>());
  using MmaOLocal = decltype(GMMA::rs_op_selector<E, E, float, Shape<_64, _256, _16>, GMMA::Major::K, GMMA::Major::MN>());
  using MmaORemote = decltype(GMMA::ss_op_selector<E, E, float, Shape<_64, _256, _16>, GMMA::Major::K, GMMA::Major::MN>());
  // Two floats rounded to T, packed as one 32-bit register (lo in the low half).
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    uint32_t bits;
    if constexpr (std::is_same_v<T, __half>) {
      const __half2 v = __floats2half2_rn(lo, hi);
      memcpy(&bits, &v, 4);
    } else {
      const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
      memcpy(&bits, &v, 4);
    }
    return bits;
  }
};

// Shared-memory layouts (element type E, 2 bytes). Q's latent tile [64, 512]: 8-row groups of 8 KB,
// inside a group the eight 64-column atoms side by side (1 KB each), inside an atom 8 rows of 128 B
// whose 16-byte chunks are XOR-swizzled by the row; narrow tiles [64, 64] (P, the rope tile): one
// atom per 8-row group. The byte offsets are wide_offset / narrow_offset.
template <typename E>
using WideK = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<E>{}, Shape<Int<kRows>, Int<kD>>{}, Step<_2, _1>{}));
template <typename E>
using NarrowK = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<E>{}, Shape<Int<kRows>, Int<kP>>{}));
// KV buffers as TMA writes them: 9 tiles of [64 tokens, 64 columns] (8 KB each, one per column
// tile, tokens at 128 B), read as K [64 tokens, 512] (K-major) and as V^T [512, 64 tokens] (MN-major).
template <typename E>
using TileK = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<E>{}, Shape<Int<kTokens>, Int<kD>>{}, Step<_1, _2>{}));
template <typename E>
using TileMN = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<E>{}, Shape<Int<kD>, Int<kTokens>>{}, Step<_2, _1>{}));
inline constexpr int kTileBytes = kTokens * 128;
// A [64, 64] operand held in registers by a warpgroup (wgmma's A fragment for 4 k-steps of 16): the
// element order of the 64x64 float accumulator, so P converts in place.
using FragA = Layout<Shape<Shape<_2, _2, _2>, _1, _4>, Stride<Stride<_1, _2, _4>, _0, _8>>;

__host__ __device__ __forceinline__ int wide_offset(int row, int col) {
  return (row >> 3) * 8192 + (col >> 6) * 1024 + (row & 7) * 128 + ((((col & 63) >> 3) ^ (row & 7)) << 4) + (col & 7) * 2;
}
__host__ __device__ __forceinline__ int narrow_offset(int row, int col) {
  return (row >> 3) * 1024 + (row & 7) * 128 + (((col >> 3) ^ (row & 7)) << 4) + (col & 7) * 2;
}

// Accumulator element i of a thread in a 64xN wgmma tile: column (i / 4) * 8 + (lane % 4) * 2 + i % 2,
// row my_row0 + 8 * row_half(i) with my_row0 = 16 * warp + lane / 4.
__host__ __device__ constexpr int row_half(int i) { return (i >> 1) & 1; }
__device__ __forceinline__ int acc_col(int i, int wt) { return (i >> 2) * 8 + (wt & 3) * 2 + (i & 1); }

struct SharedStorage {  // placed on a 1 KB boundary by the kernel
  unsigned char q[kRows * kD * 2];
  unsigned char kv[2][kTokens * kD * 2];
  unsigned char kpe[2][kTokens * kP * 2];
  unsigned char p[2][kRows * kTokens * 2];  // P_A (relative to m_A), P_B (to m_B)
  float m[2][kRows];                        // m_A, m_B of the current step
  float sum[2][kRows];                      // per-warpgroup row sums at the end of a segment
  float q_factor[kRows];                    // kFp8: the power of two each query row was scaled by
  float row_scale[kRows];                   // kFp8: each row's score scale (log2 units; cache scale / factor)
  uint64_t full[2][kTiles];                 // (buffer, tile) has landed (kFp8: as fp8 bytes, in staging)
  uint64_t empty[2][2];                     // (buffer, side) is no longer read (4 warp arrivals)
  uint64_t ready[2][2];                     // kFp8: (buffer, side) is widened (side 1 with the rope)
};

using tilegym_cutlass::commit_async_copies;
using tilegym_cutlass::cp_async16;
using tilegym_cutlass::fence_async_shared;
using tilegym_cutlass::wait_async_copies;

using tilegym_cutlass::fast_exp2;
using tilegym_cutlass::shared_address;
__device__ __forceinline__ void bar_arrive(int id) { asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory"); }
__device__ __forceinline__ void bar_wait(int id) { asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory"); }
using tilegym_cutlass::mbar_expect_bytes;
using tilegym_cutlass::mbar_init;
using tilegym_cutlass::mbar_wait;
using tilegym_cutlass::tma_load_3d;
using tilegym_cutlass::Segment;
using tilegym_cutlass::segment_of;

// kFp8: where tile t (0..7 latent, 8 the rope) of a buffer lands as fp8 bytes (a region's upper half, see
// widen_region) and where it is widened.
inline constexpr int kFp8TileBytes = kTokens * 64;
__device__ __forceinline__ unsigned char* fp8_staging(SharedStorage& smem, int buf, int t) {
  if (t == 8) return smem.kpe[buf] + kFp8TileBytes;
  return smem.kv[buf] + (t / kLeftTiles) * (kLeftTiles * kTileBytes) + 2 * kTileBytes + (t % kLeftTiles) * kFp8TileBytes;
}
__device__ __forceinline__ unsigned char* wide_tile(SharedStorage& smem, int buf, int t) {
  return t == 8 ? smem.kpe[buf] : smem.kv[buf] + t * kTileBytes;
}

// Two e4m3 values (the low 16 bits of x, the first in the low byte) -> f16x2, exactly.
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t x) {
  uint32_t y;
  asm("{\n .reg .b16 lo;\n cvt.u16.u32 lo, %1;\n cvt.rn.f16x2.e4m3x2 %0, lo;\n}\n" : "=r"(y) : "r"(x));
  return y;
}

// kFp8: one region of rows (a side's four latent tiles, 256 rows, or the rope tile, 64 rows) widened in
// place by the producer's widening warps (w = 0 .. kWideners - 1): its fp8 bytes, [rows, 64 B] as TMA
// wrote them into the region's upper half, -> fp16 [rows, 128 B] in the 128-byte swizzle wgmma reads,
// from the region's start. Each thread takes 16-byte chunks (16 values) w, w + kWideners, ... in
// batches; writing row R covers the staging rows 2 R - rows and 2 R - rows + 1, which are at or before
// R, so once a batch's rows reach the upper half, a barrier between its reads and its writes keeps
// every staging row read before it is overwritten (and no later batch reads a row a batch wrote).
template <int kRegionRows>
__device__ __forceinline__ void widen_region(unsigned char* base, int w) {
  constexpr int kChunks = kRegionRows * 4;
  const unsigned char* staging = base + kRegionRows * 64;
#pragma unroll 1
  for (int c0 = 0; c0 < kChunks; c0 += kWideners) {
    const int c = c0 + w;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (c < kChunks) v = *reinterpret_cast<const uint4*>(staging + c * 16);
    if (c0 + kWideners > kChunks / 2) asm volatile("bar.sync %0, %1;\n" ::"n"(kBarWiden), "n"(kWideners) : "memory");
    if (c < kChunks) {
      const int row = c >> 2, chunk = (c & 3) * 2;  // the row's fp16 chunks 2 (c % 4) and 2 (c % 4) + 1
      unsigned char* dst = base + row * 128;
      *reinterpret_cast<uint4*>(dst + ((chunk ^ (row & 7)) << 4)) =
          make_uint4(e4m3x2_to_f16x2(v.x), e4m3x2_to_f16x2(v.x >> 16), e4m3x2_to_f16x2(v.y), e4m3x2_to_f16x2(v.y >> 16));
      *reinterpret_cast<uint4*>(dst + (((chunk + 1) ^ (row & 7)) << 4)) =
          make_uint4(e4m3x2_to_f16x2(v.z), e4m3x2_to_f16x2(v.z >> 16), e4m3x2_to_f16x2(v.w), e4m3x2_to_f16x2(v.w >> 16));
    }
  }
}

// kFp8 with a bf16 query: the power of two that puts a row's largest magnitude amax in [2^14, 2^15)
// (1 for a row of zeros, infinities or NaN; kept within 2^+-100 so it stays a finite float).
__device__ __forceinline__ float fp16_row_factor(float amax) {
  if (!(amax > 0.f) || !(amax < INFINITY)) return 1.f;
  int e;
  frexpf(amax, &e);  // amax < 2^e
  return ldexpf(1.f, max(-100, min(100, 15 - e)));
}

}  // namespace tilegym_cute

// kPair = 2 (two 64-row groups): the groups of a piece (blockIdx.y 0 and 1) run as a cluster, which
// puts them on SMs of one GPC. Both read the same blocks at about the same time; from one GPC the
// two reads cost L2 less work (ncu: same DRAM bytes, L2 throughput 47% instead of 57% of peak).
// (Sharing the loads by TMA multicast instead was slower: each refill then waits for the slower CTA
// of the pair.) kPair = 1: a cluster of one CTA.
template <typename T, int kPair, int kFp8>
__global__ void __cluster_dims__(1, kPair, 1) __launch_bounds__(384, 1) mla_decode_cute_split_kernel(
    const T* __restrict__ q, const T* __restrict__ qpe, const int* __restrict__ table, const int* __restrict__ indptr, const int* __restrict__ lens,
    const int* __restrict__ cum_blocks, const int* __restrict__ blocks_per_program, const int* __restrict__ piece_rows,
    T* __restrict__ out, float* __restrict__ out_lse, float* __restrict__ part_out, float* __restrict__ part_lse,
    int heads, int q_len, int query_rows, int causal, int write_lse, int paged, int page_size, int num_pages,
    int num_indices, int ragged, int num_pieces, long long q_sb, long long q_sq, long long q_sh, long long qpe_sb,
    long long qpe_sq, long long qpe_sh, long long table_sb, float qk_scale_log2,
    const __grid_constant__ CUtensorMap kv_map, const __grid_constant__ CUtensorMap kpe_map, int box_rows,
    const float* __restrict__ kv_scale) {
  using namespace cute;
  using namespace tilegym_cute;
  using M = std::conditional_t<kFp8 != 0, __half, T>;  // the matmuls' input type
  using E = typename Types<M>::E;
  constexpr int kRowBytes = kFp8 ? 64 : 128;      // bytes per token of a tile as TMA writes it
  constexpr int kLandBytes = kTokens * kRowBytes;  // bytes of a whole tile as TMA writes it
  // Whole-block boxes: a side's four latent tiles are one TMA box [64 columns, 64 tokens, 4 tiles] of the
  // 4-D latent map, landing on the side's first barrier (its other three stay unarmed).
  const bool side_boxes = box_rows == kTokens;

  // The swizzled layouts need 1 KB alignment: the launch asks for sizeof(SharedStorage) + 1 KB.
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const unsigned misalign = shared_address(smem_raw) & 1023u;
  SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_raw + ((1024u - misalign) & 1023u));
  // Where tile t of buffer buf lands, and the barrier that says it has (nullptr: a side box's other
  // tiles, which land with its first).
  auto land = [&](int buf, int t) { return kFp8 ? fp8_staging(smem, buf, t) : wide_tile(smem, buf, t); };
  auto landed = [&](int buf, int t) -> uint64_t* {
    return !side_boxes || t % kLeftTiles == 0 || t == 8 ? &smem.full[buf][t] : nullptr;
  };
  // The barrier a consumer waits on before reading tile t of buffer buf (nullptr: an earlier one covers
  // it): the landing itself, or with kFp8 the widening of the tile's side.
  auto tile_ready = [&](int buf, int t) -> uint64_t* {
    if constexpr (kFp8 != 0) return t == 0 || t == kLeftTiles ? &smem.ready[buf][t / kLeftTiles] : nullptr;
    return landed(buf, t);
  };

  const int tid = threadIdx.x;
  const int wg = tid / 128;  // 0: block A, O columns 0..255; 1: block B, O columns 256..511; 2: producer
  const int wt = tid % 128;  // thread inside its warpgroup
  const int piece = blockIdx.x;
  const int r0 = blockIdx.y * kRows;
  const int per = blocks_per_program[0];
  const int start = piece * per;
  const int first_row = piece_rows[piece];
  const int last_row = piece_rows[num_pieces + piece];
  const int my_row0 = (wt / 32) * 16 + (wt % 32) / 4;  // this thread's accumulator rows: + 0, + 8

  if (tid == 0) {
    for (int i = 0; i < 2 * kTiles; ++i) mbar_init(&smem.full[i / kTiles][i % kTiles], 1);
    for (int i = 0; i < 4; ++i) mbar_init(&smem.empty[i / 2][i % 2], 4);
    for (int i = 0; i < 4; ++i) mbar_init(&smem.ready[i / 2][i % 2], kWideners);
  }
  tilegym_cutlass::allow_dependent_launch();  // the combine may be placed as SMs free up
  __syncthreads();

  // Warpgroup 2 is the producer; registers move to the consumers (setmaxnreg). Its first warp issues
  // every TMA load of the CTA, in block order, each (buffer, side) once the warpgroup that read it last
  // has released it; the consumers never wait on a TMA issue. kFp8: its other three warps widen each
  // landed side, in block order, and mark it ready.
  if (wg == 2) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
    if (wt >= 32) {
      if constexpr (kFp8 != 0) {
        const int w = wt - 32;
        int phases = 0;  // bit buf: the parity of buffer buf's next landing
        for (int b = first_row; b <= last_row; ++b) {
          const Segment seg = segment_of(cum_blocks, b, start, per);
#pragma unroll 1
          for (int i = 0; i < seg.hi - seg.lo; ++i) {
            const int buf = i & 1, ph = (phases >> buf) & 1;
            phases ^= 1 << buf;
#pragma unroll 1
            for (int side = 0; side < 2; ++side) {
              for (int t = side * kLeftTiles; t < (side ? kTiles : kLeftTiles); ++t)
                if (uint64_t* bar = landed(buf, t)) mbar_wait(bar, ph);
              widen_region<kLeftTiles * kTokens>(smem.kv[buf] + side * kLeftTiles * kTileBytes, w);
              if (side == 1) widen_region<kTokens>(smem.kpe[buf], w);
              fence_async_shared();  // the widened tiles -> the consumers' wgmma (async proxy)
              tilegym_cutlass::mbar_arrive(&smem.ready[buf][side]);
            }
          }
        }
      }
      return;
    }
    int used = 0, phases = 0;  // bit 2 buf + side: loaded before; the parity its release will complete
    for (int b = first_row; b <= last_row; ++b) {
      const Segment seg = segment_of(cum_blocks, b, start, per);
      if (seg.lo >= seg.hi) continue;
      const int len = lens[b];
      const int* table_row = tilegym_cutlass::page_list(table, indptr, b, paged, ragged, num_indices, table_sb);
      for (int blk = seg.lo - seg.row_begin; blk < seg.hi - seg.row_begin; ++blk) {
        const int buf = (blk - (seg.lo - seg.row_begin)) & 1;
        const int boxes = tilegym_cutlass::boxes_in_block(blk, kTokens, len, box_rows);
#pragma unroll 1
        for (int side = 0; side < 2; ++side) {
          const int bit = 1 << (2 * buf + side);
          if (used & bit) {
            mbar_wait(&smem.empty[buf][side], (phases & bit) != 0);
            phases ^= bit;
          }
          used |= bit;
          const int t0 = side == 0 ? 0 : kLeftTiles, t1 = side == 0 ? kLeftTiles : kTiles;
          if (side_boxes) {  // boxes is 0 or 1
            if (wt != 0) continue;
            mbar_expect_bytes(&smem.full[buf][t0], boxes * kLeftTiles * kLandBytes);
            if (side == 1) mbar_expect_bytes(&smem.full[buf][8], boxes * kLandBytes);
            if (boxes == 0) continue;
            const auto [unit, row] = tilegym_cutlass::box_origin(table_row, b, blk * kTokens, paged, page_size, num_pages);
            tilegym_cutlass::tma_load_4d(land(buf, t0), &kv_map, 0, row, t0, unit, &smem.full[buf][t0]);
            if (side == 1) tma_load_3d(land(buf, 8), &kpe_map, 0, row, unit, &smem.full[buf][8]);
            continue;
          }
          if (wt == 0) {
            for (int t = t0; t < t1; ++t) mbar_expect_bytes(&smem.full[buf][t], boxes * box_rows * kRowBytes);
          }
          for (int box = wt; box < boxes; box += 32) {  // lanes split a paged block's boxes
            const auto [unit, row] = tilegym_cutlass::box_origin(table_row, b, blk * kTokens + box * box_rows, paged,
                                                                 page_size, num_pages);
            for (int t = t0; t < t1; ++t) {
              unsigned char* dst = land(buf, t) + box * box_rows * kRowBytes;
              if (t < 8)
                tilegym_cutlass::tma_load_4d(dst, &kv_map, 0, row, t, unit, &smem.full[buf][t]);
              else
                tma_load_3d(dst, &kpe_map, 0, row, unit, &smem.full[buf][t]);
            }
          }
        }
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
  // The consumers' CTA-wide barrier (the producer never joins).
  auto consumers_sync = [&] { asm volatile("bar.sync %0, 256;\n" ::"r"(kBarConsumers) : "memory"); };
  // This warpgroup is done reading its side of buffer buf (its wgmma waited): one arrival per warp.
  auto release = [&](int buf) {
    if ((wt & 31) == 0) tilegym_cutlass::mbar_arrive(&smem.empty[buf][wg]);
  };

  auto mma_s = make_tiled_mma(typename Types<M>::MmaS{});
  auto mma_s_rope = make_tiled_mma(typename Types<M>::MmaSRope{});
  auto mma_local = make_tiled_mma(typename Types<M>::MmaOLocal{});
  auto mma_remote = make_tiled_mma(typename Types<M>::MmaORemote{});
  auto thr_s = mma_s.get_slice(wt);
  auto thr_s_rope = mma_s_rope.get_slice(wt);
  auto thr_local = mma_local.get_slice(wt);
  auto thr_remote = mma_remote.get_slice(wt);

  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<E*>(smem.q)), WideK<E>{});
  auto tSrQ = thr_s.partition_fragment_A(sQ);  // (MMA, 1, 32) descriptors
  Tensor rQpe = make_tensor<E>(FragA{});       // the rope query, registers
  Tensor rP = make_tensor<E>(FragA{});         // this warpgroup's P, registers
  Tensor acc_s = partition_fragment_C(mma_s, Shape<Int<kRows>, Int<kTokens>>{});
  Tensor acc_o = partition_fragment_C(mma_local, Shape<Int<kRows>, _256>{});
  uint32_t* rP32 = reinterpret_cast<uint32_t*>(rP.data());
  uint32_t* rQpe32 = reinterpret_cast<uint32_t*>(rQpe.data());

  int parity[2] = {0, 0};  // of each buffer's barriers

  // kFp8, bf16 query: two bf16 (a 32-bit pair) times factor -> an f16 pair.
  auto scaled_fp16_pair = [](uint32_t bits, float factor) {
    __nv_bfloat162 v;
    memcpy(&v, &bits, 4);
    const float2 f = __bfloat1622float2(v);
    const __half2 h = __floats2half2_rn(f.x * factor, f.y * factor);
    uint32_t out;
    memcpy(&out, &h, 4);
    return out;
  };
  // kFp8, bf16 query: each thread's own staged chunks of Q's latent part (rows tid / 8 and tid / 8 + 32,
  // chunks tid % 8 + 8 j) -> fp16 in place, scaled per row (fp16_row_factor of the row's largest
  // magnitude over the latent and the rope, gathered over the row's 8 threads); the factors go to
  // smem.q_factor for the rope fragments, and the rows' score scales to smem.row_scale.
  auto stage_query_as_fp16 = [&](int b) {
    const int sub = tid & 7;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = (tid >> 3) + 32 * half;
      const int r = r0 + i;
      uint4 chunk[8];
      float amax = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        chunk[j] = *reinterpret_cast<const uint4*>(smem.q + wide_offset(i, (sub + 8 * j) * 8));
        const uint32_t* w = reinterpret_cast<const uint32_t*>(&chunk[j]);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          __nv_bfloat162 v;
          memcpy(&v, &w[e], 4);
          const float2 f = __bfloat1622float2(v);
          amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
        }
      }
      if (r < query_rows) {  // this thread's 8 rope elements of the row
        const int token = r / heads, head = r - token * heads;
        const uint32_t* rope = reinterpret_cast<const uint32_t*>(qpe + b * qpe_sb + token * qpe_sq + head * qpe_sh);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          __nv_bfloat162 v;
          const uint32_t bits = rope[sub * 4 + e];
          memcpy(&v, &bits, 4);
          const float2 f = __bfloat1622float2(v);
          amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
        }
      }
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, 2));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffff, amax, 4));
      const float factor = fp16_row_factor(amax);
      if (sub == 0) smem.q_factor[i] = factor, smem.row_scale[i] = qk_scale_log2 * *kv_scale / factor;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        uint32_t* w = reinterpret_cast<uint32_t*>(&chunk[j]);
#pragma unroll
        for (int e = 0; e < 4; ++e) w[e] = scaled_fp16_pair(w[e], factor);
        *reinterpret_cast<uint4*>(smem.q + wide_offset(i, (sub + 8 * j) * 8)) = chunk[j];
      }
    }
  };

  for (int b = first_row; b <= last_row; ++b) {
    const Segment seg = segment_of(cum_blocks, b, start, per);
    if (seg.lo >= seg.hi) continue;
    const bool whole = seg.lo == seg.row_begin && seg.hi == seg.row_end;
    const long long slot = piece + b;
    const int len = lens[b];
    const int first_blk = seg.lo - seg.row_begin, end_blk = seg.hi - seg.row_begin;

    // V rows at or past the row's length (a partial last block) -> zero, in the tiles this warpgroup
    // reads for P V, once they have landed; positions past the length may hold anything (NaN).
    auto clear_tail = [&](int blk, int buf) {
      const int valid = len - blk * kTokens;
      if (valid >= kTokens) return;
      const int t0 = wg == 0 ? 0 : kLeftTiles;
      for (int t = t0; t < t0 + kLeftTiles; ++t)
        if (uint64_t* bar = tile_ready(buf, t)) mbar_wait(bar, parity[buf]);
      for (int i = valid * 8 + wt; i < kTokens * 8; i += 128) {  // 16-byte chunks of rows >= valid
        for (int t = t0; t < t0 + kLeftTiles; ++t)
          *reinterpret_cast<uint4*>(smem.kv[buf] + t * kTileBytes + i * 16) = make_uint4(0, 0, 0, 0);
      }
      fence_async_shared();
      asm volatile("bar.sync %0, 128;\n" ::"r"(4 + wg) : "memory");
    };
    consumers_sync();  // the previous segment is done with Q
    {
      // Q's latent part -> shared memory (all threads: rows tid / 8 and tid / 8 + 32, 8 chunks each).
      const int sub = tid & 7;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = (tid >> 3) + 32 * half;
        const int r = r0 + i;
        const bool ok = r < query_rows;
        const int token = ok ? r / heads : 0, head = ok ? r - token * heads : 0;
        const T* row = q + b * q_sb + token * q_sq + head * q_sh;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int col = (sub + 8 * j) * 8;
          cp_async16(smem.q + wide_offset(i, col), ok ? row + col : q, ok);
        }
      }
      commit_async_copies();
    }
    // The rope query as A fragments: element i of k-step s is row my_row0 + 8 * ((i / 2) % 2),
    // column 16 s + (wt % 4) * 2 + 8 * ((i / 4) % 2) + i % 2.
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int r = r0 + my_row0 + 8 * k;
      const bool ok = r < query_rows;
      const int token = ok ? r / heads : 0, head = ok ? r - token * heads : 0;
      const uint32_t* row = reinterpret_cast<const uint32_t*>(qpe + b * qpe_sb + token * qpe_sq + head * qpe_sh);
#pragma unroll
      for (int s = 0; s < 4; ++s) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int col = 16 * s + (wt & 3) * 2 + 8 * h;
          rQpe32[4 * s + 2 * h + k] = ok ? row[col / 2] : 0u;
        }
      }
    }
    wait_async_copies<0>();  // Q (the KV copies are tracked by the barriers, not by groups)
    if constexpr (kFp8 != 0) {
      if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        stage_query_as_fp16(b);
      } else if (tid < kRows) {
        smem.row_scale[tid] = qk_scale_log2 * *kv_scale;
      }
    }
    fence_async_shared();
    consumers_sync();
    if constexpr (kFp8 != 0 && std::is_same_v<T, __nv_bfloat16>) {  // the rope query, scaled as its row
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const float factor = smem.q_factor[my_row0 + 8 * k];
#pragma unroll
        for (int s = 0; s < 4; ++s) {
#pragma unroll
          for (int h = 0; h < 2; ++h) rQpe32[4 * s + 2 * h + k] = scaled_fp16_pair(rQpe32[4 * s + 2 * h + k], factor);
        }
      }
    }

    // Per-row state of this thread's two rows: running max (log2 units), this warpgroup's share of
    // the sum (this thread's columns), the causal limit.
    float m[2] = {-INFINITY, -INFINITY};
    float l[2] = {0.f, 0.f};
    int limit[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int r = r0 + my_row0 + 8 * k;
      limit[k] = causal ? len - q_len + 1 + r / heads : len;
    }
    clear(acc_o);

    // O (this warpgroup's half) += P . V_half of buffer b, with P from registers (rP) or from shared
    // memory (smem.p[b]).
    auto pv_local = [&](int b) __attribute__((always_inline)) {
      Tensor sVt = make_tensor(make_smem_ptr(reinterpret_cast<E*>(smem.kv[b])), TileMN<E>{});
      auto tOrV = thr_local.partition_fragment_B(local_tile(sVt, Shape<_256, Int<kTokens>>{}, make_coord(wg, 0)));
      warpgroup_fence_operand(rP);
      warpgroup_fence_operand(acc_o);
      warpgroup_arrive();
#pragma unroll
      for (int s = 0; s < 4; ++s) gemm(mma_local, rP(_, _, s), tOrV(_, _, s), acc_o);
      warpgroup_commit_batch();
    };
    auto pv_remote = [&](int b) __attribute__((always_inline)) {
      Tensor sP = make_tensor(make_smem_ptr(reinterpret_cast<E*>(smem.p[b])), NarrowK<E>{});
      auto tOrP = thr_remote.partition_fragment_A(sP);
      Tensor sVt = make_tensor(make_smem_ptr(reinterpret_cast<E*>(smem.kv[b])), TileMN<E>{});
      auto tOrV = thr_remote.partition_fragment_B(local_tile(sVt, Shape<_256, Int<kTokens>>{}, make_coord(wg, 0)));
      warpgroup_fence_operand(acc_o);
      warpgroup_arrive();
#pragma unroll
      for (int s = 0; s < 4; ++s) gemm(mma_remote, tOrP(_, _, s), tOrV(_, _, s), acc_o);
      warpgroup_commit_batch();
    };
    auto scale_o = [&](const float (&scale)[2]) __attribute__((always_inline)) {
#pragma unroll
      for (int i = 0; i < 128; ++i) acc_o(i) *= scale[row_half(i)];
    };
    // rP -> smem.p[b] for the other warpgroup's P V. rP32[2 j + h] holds rows my_row0 + 8 h, columns
    // 8 j + (lane % 4) * 2 + {0, 1}: the 8x8 matrices of stmatrix, four per instruction (column groups
    // 2 q, 2 q + 1, both row halves); lane l gives the address of row l % 8 of matrix l / 8.
    auto store_p = [&](int b) __attribute__((always_inline)) {
      const int lane = wt & 31;
      const int st_row = (wt / 32) * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint32_t addr = shared_address(smem.p[b] + narrow_offset(st_row, 8 * (2 * q + (lane >> 4))));
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                     "r"(rP32[4 * q]), "r"(rP32[4 * q + 1]), "r"(rP32[4 * q + 2]), "r"(rP32[4 * q + 3])
                     : "memory");
      }
      fence_async_shared();
    };

    // The step order of the header's table.
    for (int blk_a = first_blk; blk_a < end_blk; blk_a += 2) {
      const int blk_b = blk_a + 1;
      const bool has_b = blk_b < end_blk;
      const int buf = wg;  // the buffer whose block this warpgroup scores
      const int my_blk = wg == 0 ? blk_a : blk_b;
      float p[32];  // this warpgroup's probabilities (float), accumulator order
      float row_max[2];

      // S = Q K^T over this warpgroup's block, tile by tile as the tiles land; scaled, masked, row maxima.
      auto score_block = [&]() __attribute__((always_inline)) {
        Tensor sK = make_tensor(make_smem_ptr(reinterpret_cast<E*>(smem.kv[buf])), TileK<E>{});
        Tensor sKpe = make_tensor(make_smem_ptr(reinterpret_cast<E*>(smem.kpe[buf])), NarrowK<E>{});
        auto tSrK = thr_s.partition_fragment_B(sK);
        auto tSrKpe = thr_s_rope.partition_fragment_B(sKpe);
        mma_s.accumulate_ = GMMA::ScaleOut::Zero;
        mma_s_rope.accumulate_ = GMMA::ScaleOut::One;
        auto gemm_tile = [&](auto tile) {
          constexpr int t = decltype(tile)::value;
          if constexpr (t < 8) {
#pragma unroll
            for (int s = 0; s < 4; ++s) {
              gemm(mma_s, tSrQ(_, _, 4 * t + s), tSrK(_, _, 4 * t + s), acc_s);
              mma_s.accumulate_ = GMMA::ScaleOut::One;
            }
          } else {
            warpgroup_fence_operand(rQpe);
#pragma unroll
            for (int s = 0; s < 4; ++s)
              gemm(mma_s_rope, rQpe(_, _, s), tSrKpe(_, _, s), acc_s);
          }
        };
        // Tile t: wait until it is ready (TMA writes through the async proxy, as wgmma reads; so do the
        // kFp8 widening's writes, after their fence), then issue its matmuls as one commit group.
        auto score_tile = [&](auto tile) {
          constexpr int t = decltype(tile)::value;
          if (uint64_t* bar = tile_ready(buf, t)) mbar_wait(bar, parity[buf]);
          warpgroup_fence_operand(acc_s);
          warpgroup_arrive();
          gemm_tile(tile);
          warpgroup_commit_batch();
        };
        score_tile(_0{}), score_tile(_1{}), score_tile(_2{}), score_tile(_3{});
        score_tile(_4{}), score_tile(_5{}), score_tile(_6{}), score_tile(_7{}), score_tile(_8{});
        if (wg == 0) bar_arrive(kBarScoresA);
        warpgroup_wait<0>();
        warpgroup_fence_operand(acc_s);
        warpgroup_fence_operand(rQpe);
        // Scale and mask (the fp8 order's fold was 1-4% slower here at 128 heads, same-call A/B).
        // The score scale: log2(e) * sm_scale; kFp8: per row, times the cache's scale over the row's query
        // factor (read here, not held across the step: the registers are spent).
        const float score_scale[2] = {kFp8 ? smem.row_scale[my_row0] : qk_scale_log2,
                                      kFp8 ? smem.row_scale[my_row0 + 8] : qk_scale_log2};
        const int pos0 = my_blk * kTokens;
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          const int pos = pos0 + acc_col(i, wt);
          p[i] = pos < limit[row_half(i)] ? acc_s(i) * score_scale[row_half(i)] : -INFINITY;
        }
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          float mx = -INFINITY;
#pragma unroll
          for (int i = 2 * k; i < 32; i += 4) mx = fmaxf(mx, fmaxf(p[i], p[i + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
          row_max[k] = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
        }
      };
      // WG1 issues S_B after WG0 has issued S_A, so S_A finishes first (its softmax then overlaps S_B)
      // and block B's tiles, refilled last in the previous step, get S_A's time to land.
      if (wg == 1) bar_wait(kBarScoresA);
      if (wg == 0 || has_b) score_block();

      // P = exp2(S - m) for this warpgroup's block -> registers (rP) and shared memory (smem.p[buf]);
      // this thread's share of the row sums.
      auto softmax_to = [&](int buf, const float (&safe)[2]) __attribute__((always_inline)) {
#pragma unroll
        for (int i = 0; i < 32; i += 2) {
          const int k = row_half(i);
          p[i] = fast_exp2(p[i] - safe[k]);
          p[i + 1] = fast_exp2(p[i + 1] - safe[k]);
          l[k] += p[i] + p[i + 1];
          rP32[i / 2] = Types<M>::pack(p[i], p[i + 1]);
        }
        store_p(buf);
      };

      if (wg == 0) {
        // m_A = max(m, rowmax S_A); O_L, l to m_A; P_A -> WG1 with m_A; O_L += P_A V_A,L.
        float m_a[2], scale[2];
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          m_a[k] = next_frame(m[k], row_max[k]);
          // A row that has seen no token keeps m = -inf: shift by 0 then (no inf - inf).
          const float safe = m_a[k] == -INFINITY ? 0.f : m_a[k];
          scale[k] = fast_exp2(m[k] - safe);
          l[k] *= scale[k];
          m[k] = safe;  // for softmax_to
          if ((wt & 3) == 0) smem.m[0][my_row0 + 8 * k] = m_a[k];
        }
        softmax_to(0, m);
        bar_arrive(kBarMaxA);
        if (reframed(scale)) scale_o(scale);  // O_L is this warpgroup's alone: after publishing P_A
        clear_tail(blk_a, 0);
        pv_local(0);
        warpgroup_wait<0>();
        warpgroup_fence_operand(acc_o);
        warpgroup_fence_operand(rP);
        release(0);  // V_A,L and K_A are no longer read here
        // m_B from WG1 (it arrives on every step; without a block B, m_B = m_A).
        bar_wait(kBarMaxB);
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const float m_b = has_b ? smem.m[1][my_row0 + 8 * k] : m_a[k];
          scale[k] = fast_exp2(m_a[k] - (m_b == -INFINITY ? 0.f : m_b));
          l[k] *= scale[k];
          m[k] = m_b;
        }
        if (has_b) {
          if (reframed(scale)) scale_o(scale);
          clear_tail(blk_b, 1);
          pv_remote(1);  // O_L += P_B V_B,L
          warpgroup_wait<0>();
          warpgroup_fence_operand(acc_o);
          release(1);  // V_B,L is no longer read
        }
        bar_wait(kBarPAFree);  // WG1's P_A V_A,R is done: the next softmax_to(0) may rewrite P_A
      } else {
        // P_A, m_A from WG0: O_R, l to m_A, O_R += P_A V_A,R; then m_B = max(m_A, rowmax S_B), P_B -> WG0,
        // O_R, l to m_B, O_R += P_B V_B,R.
        bar_wait(kBarMaxA);
        float m_a[2], scale[2];
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          m_a[k] = smem.m[0][my_row0 + 8 * k];
          scale[k] = fast_exp2(m[k] - (m_a[k] == -INFINITY ? 0.f : m_a[k]));
          l[k] *= scale[k];
        }
        if (reframed(scale)) scale_o(scale);
        clear_tail(blk_a, 0);
        pv_remote(0);  // O_R += P_A V_A,R
        float safe_b[2];
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          m[k] = has_b ? next_frame(m_a[k], row_max[k]) : m_a[k];
          safe_b[k] = m[k] == -INFINITY ? 0.f : m[k];
          scale[k] = fast_exp2(m_a[k] - safe_b[k]);
          l[k] *= scale[k];
        }
        if (has_b) softmax_to(1, safe_b);  // P_B relative to m_B (overlaps P_A V_A,R)
        if (has_b) {
#pragma unroll
          for (int k = 0; k < 2; ++k)
            if ((wt & 3) == 0) smem.m[1][my_row0 + 8 * k] = m[k];
        }
        bar_arrive(kBarMaxB);  // (m_B, P_B) -> WG0, whose P_B V_B,L need not wait for P_A V_A,R
        warpgroup_wait<0>();
        warpgroup_fence_operand(acc_o);
        release(0);  // V_A,R and K_A's rope are no longer read
        bar_arrive(kBarPAFree);
        if (has_b) {
          if (reframed(scale)) scale_o(scale);
          clear_tail(blk_b, 1);
          pv_local(1);  // O_R += P_B V_B,R
          warpgroup_wait<0>();
          warpgroup_fence_operand(acc_o);
          warpgroup_fence_operand(rP);
          release(1);  // V_B,R and K_B's rope are no longer read
        }
      }
      parity[0] ^= 1;
      if (has_b) parity[1] ^= 1;
    }

    // Row sums: this thread's share -> the quad's -> both warpgroups'.
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      l[k] += __shfl_xor_sync(0xffffffff, l[k], 1);
      l[k] += __shfl_xor_sync(0xffffffff, l[k], 2);
      if ((wt & 3) == 0) smem.sum[wg][my_row0 + 8 * k] = l[k];
    }
    consumers_sync();
    float inv[2], lse[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int row = my_row0 + 8 * k;
      const float total = smem.sum[0][row] + smem.sum[1][row];
      // A row that saw no token: zeros and lse -inf. NaN in the data makes total NaN: NaN out.
      const bool empty = total == 0.f;
      inv[k] = empty ? 0.f : (kFp8 ? *kv_scale : 1.f) / total;
      lse[k] = empty ? -INFINITY : (m[k] + log2f(total)) * kLn2;
    }
    const int col0 = wg * 256;
#pragma unroll
    for (int i = 0; i < 128; i += 2) {
      const int row = my_row0 + 8 * row_half(i);
      const int r = r0 + row;
      if (r >= query_rows) continue;
      const float sc = inv[row_half(i)];
      const int col = col0 + acc_col(i, wt);
      if (whole) {
        *reinterpret_cast<uint32_t*>(out + ((long long)b * query_rows + r) * kD + col) =
            Types<T>::pack(acc_o(i) * sc, acc_o(i + 1) * sc);
      } else {
        *reinterpret_cast<float2*>(part_out + (slot * query_rows + r) * kD + col) =
            make_float2(acc_o(i) * sc, acc_o(i + 1) * sc);
      }
    }
    if (wg == 0 && (wt & 3) == 0) {
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int r = r0 + my_row0 + 8 * k;
        if (r >= query_rows) continue;
        if (whole) {
          if (write_lse) out_lse[(long long)b * query_rows + r] = lse[k];
        } else {
          part_lse[slot * query_rows + r] = lse[k];
        }
      }
    }
  }
}
