// MLA decoding over a split schedule, CUDA C++ with CuTe for sm_90a (wgmma and TMA), for 1-1024 query
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
//        m_A = max(m, rowmax S_A); P_A = exp2(S_A - m_A), stored; O_L, l *= exp2(m - m_A);
//        O_L += P_A V_A,L issued (P_A from registers), then P_A's store fenced -> (m_A, P_A);
//        release buffer 0's tiles 0..3;
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
//   faster with an fp8 cache than 32-bit stores, 1-2% with bf16, and fewer spills). WG0 issues
//   P_A V_A,L before the proxy fence that makes P_A's shared copy visible to WG1's matmul, as FlashMLA
//   orders it: the fence waits for the stores, which contend with WG1's score matmuls for shared
//   memory (same-call A/B on an H100: 0-2.5% faster at 128 heads, unchanged at 16-64; session 39).
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
// memory (the cache may hold NaN there), their scores masked. A CTA alone (kPair = 1) loads the cache
// with an L2 evict-first hint, so the stream leaves the partial outputs in L2 for the combine (same-call
// A/B: 1-3% faster at 16-64 heads; session 22); a pair loads with the normal policy (its partner
// re-reads the block).
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
// kFp8 = 2 (fp8_ds_mla's 656-byte tokens, more query rows than the fp8 kernel takes; bf16 queries): the
// same, with each 128-column group of a token multiplied by its float32 scale (rounded to fp16) as its
// e4m3 values are widened (the product rounded once to fp16). The scorer's first side brings the
// block's scales by TMA, [64 tokens, 16 B] into the last KB of that side's second fp16 tile (free until
// the scorer's first widening, which reads them into registers before anything is written there). The
// rope arrives as bf16 in the 128-byte swizzle and is scored as it lands, by bf16 wgmma with the rope
// query in bf16 (scaled by the row's power of two). Traffic: L * 656 B of cache per CTA.
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

// kFp8: fp8 tiles widened per barrier (1 or 2; H200 sweep in benchmarks/NOTES_cutlass.md).
#ifndef TILEGYM_FP8_WIDEN_TILES
#define TILEGYM_FP8_WIDEN_TILES 2
#endif
// bf16/fp16 caches in the fp8 step order (the header's second table), their loads still issued by the
// producer warpgroup: 1 for an A/B against the first table's order (0). On an H100 it was within 1-4%
// of it, either way by shape (benchmarks/NOTES_cutlass.md, "Session 38").
#ifndef TILEGYM_WIDE_PIPELINED
#define TILEGYM_WIDE_PIPELINED 0
#endif

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
// kFp8's order: whether the block of kTokens positions from pos0 reaches past either of a thread's two
// row limits (only those blocks are masked). There the score scale is folded into the exponent (one
// FFMA per score) and applied to the row max after it is taken, exact because the scale is > 0 (the
// contract's); same-call A/B 1-2% faster with fp8 at 64-128 heads.
__device__ __forceinline__ bool block_needs_mask(int pos0, const int (&limit)[2]) {
  return pos0 + kTokens > min(limit[0], limit[1]);
}
// Named barriers (0 is __syncthreads): one warpgroup arrives, the other waits.
inline constexpr int kBarMaxA = 1;  // WG0 -> WG1: m_A and P_A
inline constexpr int kBarMaxB = 2;  // WG1 -> WG0: m_B and P_B (and P_A's buffer is free)
inline constexpr int kBarScoresA = 3;  // WG0 -> WG1: S_A's matmuls are issued
inline constexpr int kBarPAFree = 6;   // WG1 -> WG0: P_A V_A,R is done, P_A's shared copy may be rewritten
// kFp8's step order: P_A is published scaled to m_B, and P_A V_A,R comes after WG1's own P_B V_B,R.
inline constexpr int kBarPAReady = 7;     // WG0 -> WG1: P_A (relative to m_B) is in shared memory
inline constexpr int kBarPVARIssued = 8;  // WG1 -> WG0: P_B is in shared memory and P_A V_A,R issued
inline constexpr int kBarConsumers = 9;   // both consumer warpgroups (bf16/fp16, beside the producer)
// bf16/fp16: registers per thread after setmaxnreg (3 x 128 threads launched at 168: 2 x 240 + 24 <= 512).
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
    return tilegym_cutlass::pack_pair(static_cast<const T*>(nullptr), lo, hi);
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
  uint64_t full[2][kTiles];                 // (buffer, tile) has landed
  uint64_t empty[2][2];                     // bf16/fp16: (buffer, side) is no longer read (4 warp arrivals)
  uint64_t pair[2];                         // kMerge: the partner's buffers are free (1), its half has landed (128)
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

// kFp8: where tile t (0..7 latent, 8 the rope) of a buffer lands as fp8 bytes and where it is widened.
inline constexpr int kFp8TileBytes = kTokens * 64;
__device__ __forceinline__ unsigned char* fp8_staging(SharedStorage& smem, int buf, int t) {
  if (t == 8) return smem.kpe[buf] + kFp8TileBytes;
  return smem.kv[buf] + (t / kLeftTiles) * (kLeftTiles * kTileBytes) + 2 * kTileBytes + (t % kLeftTiles) * kFp8TileBytes;
}
__device__ __forceinline__ unsigned char* wide_tile(SharedStorage& smem, int buf, int t) {
  return t == 8 ? smem.kpe[buf] : smem.kv[buf] + t * kTileBytes;
}
// kFp8 = 2 (fp8_ds_mla): a token's four float32 scales, one per 128 columns, and where a block's land: the
// last KB of the second fp16 tile of side buf (buffer buf's scorer widens that side first).
inline constexpr int kDsScaleBytes = 16;
__device__ __forceinline__ unsigned char* ds_scale_slot(SharedStorage& smem, int buf) {
  return wide_tile(smem, buf, buf * kLeftTiles + 1) + kTileBytes - kTokens * kDsScaleBytes;
}
// An f16x2 word times the f16 scale in one half of `scales` (high: the upper), rounded to f16.
__device__ __forceinline__ uint32_t scale_f16x2(uint32_t v, uint32_t scales, bool high) {
  const uint32_t s = high ? (scales >> 16) * 0x10001u : (scales & 0xffffu) * 0x10001u;
  uint32_t out;
  asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(out) : "r"(v), "r"(s));
  return out;
}

// Four e4m3 bytes -> two f16x2 (bytes 0, 1 -> lo; bytes 2, 3 -> hi), exactly. The word is split into
// its 16-bit halves by a move (no shifts).
__device__ __forceinline__ void e4m3x4_to_f16x4(uint32_t word, uint32_t& lo, uint32_t& hi) {
  asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(word));
}

// kFp8: tiles t0 .. t0 + n - 1 of buffer buf (n = 1 or 2 of one side, or the rope), fp8 staging -> the swizzled
// fp16 tiles, by the 128 threads of warpgroup wg (thread wt: 16-byte pieces wt, wt + 128 of each: token
// u / 4, columns 16 (u % 4) .., which widen into the row's 16-byte chunks 2 (u % 4) and 2 (u % 4) + 1; a
// warp reads 512 contiguous bytes and writes eight whole 128-byte rows). All reads are issued before any
// conversion; one barrier makes the tiles visible to wgmma.
// kDsMla (buf == wg, the scorer): the first call of a block (t0 = 4 wg) reads the scales of this thread's
// two tokens into ds_scales[token][pair of groups] as f16x2; every tile is multiplied by its group's.
template <int n, bool kDsMla>
__device__ __forceinline__ void widen_fp8_tiles(SharedStorage& smem, int buf, int t0, int wg, int wt,
                                                uint32_t (&ds_scales)[2][2]) {
  uint4 v[n][2];
#pragma unroll
  for (int k = 0; k < n; ++k) {
    const unsigned char* src = fp8_staging(smem, buf, t0 + k);
#pragma unroll
    for (int i = 0; i < 2; ++i) v[k][i] = *reinterpret_cast<const uint4*>(src + (i * 128 + wt) * 16);
  }
  const bool first = kDsMla && t0 == wg * kLeftTiles;
  if (first) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float4 sc = *reinterpret_cast<const float4*>(ds_scale_slot(smem, buf) + ((i * 128 + wt) >> 2) * kDsScaleBytes);
      const __half2 lo = __floats2half2_rn(sc.x, sc.y), hi = __floats2half2_rn(sc.z, sc.w);
      memcpy(&ds_scales[i][0], &lo, 4);
      memcpy(&ds_scales[i][1], &hi, 4);
    }
  }
  // Tile j of a side writes the fp8 bytes of tiles 2j - 4 and 2j - 3: when those are in this group (its
  // last tile is the side's), or for the rope (its own bytes), every read comes before any write; so too
  // the scales' reads before a first group of two writes over their slot.
  const int last = t0 + n - 1;
  if (last % kLeftTiles == kLeftTiles - 1 || last == 8 || (first && n == 2))
    asm volatile("bar.sync %0, 128;\n" ::"r"(4 + wg) : "memory");
#pragma unroll
  for (int k = 0; k < n; ++k) {
    unsigned char* dst = wide_tile(smem, buf, t0 + k);
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int u = i * 128 + wt, token = u >> 2, chunk = 2 * (u & 3);
      uint4 lo, hi;  // fp16 columns 16 (u % 4) .. + 7 and + 8 .. + 15
      e4m3x4_to_f16x4(v[k][i].x, lo.x, lo.y);
      e4m3x4_to_f16x4(v[k][i].y, lo.z, lo.w);
      e4m3x4_to_f16x4(v[k][i].z, hi.x, hi.y);
      e4m3x4_to_f16x4(v[k][i].w, hi.z, hi.w);
      if constexpr (kDsMla) {  // the tile's 128-column group: (t0 + k) / 2
        const uint32_t sc = ds_scales[i][(t0 + k) >> 2];
        const bool high = ((t0 + k) >> 1) & 1;
        lo.x = scale_f16x2(lo.x, sc, high), lo.y = scale_f16x2(lo.y, sc, high);
        lo.z = scale_f16x2(lo.z, sc, high), lo.w = scale_f16x2(lo.w, sc, high);
        hi.x = scale_f16x2(hi.x, sc, high), hi.y = scale_f16x2(hi.y, sc, high);
        hi.z = scale_f16x2(hi.z, sc, high), hi.w = scale_f16x2(hi.w, sc, high);
      }
      unsigned char* row = dst + token * 128;
      *reinterpret_cast<uint4*>(row + ((chunk ^ (token & 7)) << 4)) = lo;
      *reinterpret_cast<uint4*>(row + (((chunk + 1) ^ (token & 7)) << 4)) = hi;
    }
  }
  fence_async_shared();
  asm volatile("bar.sync %0, 128;\n" ::"r"(4 + wg) : "memory");
}

// kFp8 with a bf16 query: the power of two that puts a row's largest magnitude amax in [2^14, 2^15)
// (1 for a row of zeros, infinities or NaN; kept within 2^+-100 so it stays a finite float).
__device__ __forceinline__ float fp16_row_factor(float amax) {
  if (!(amax > 0.f) || !(amax < INFINITY)) return 1.f;
  int e;
  frexpf(amax, &e);  // amax < 2^e
  return ldexpf(1.f, max(-100, min(100, 15 - e)));
}

// Row halves (kMerge): CTAs 2k and 2k + 1 of a cluster split one row between them. Each finished its
// half like any segment: O normalised by its row sums (inv) and its lse (natural log). CTA h then
// writes output columns 256 h .. 256 h + 255 of the row: its warpgroup h keeps its O there, and its
// other warpgroup sends its normalised O and lse to the partner's warpgroup of the same columns, whose
// thread wt owns the same accumulator elements. They land in the partner's KV buffers, which are free
// once the partner's consumers have passed their last step (the partner's arrival on pair[0]), and
// pair[1] counts the 128 senders. The merge is the combine's: out = sum of exp(lse_i - lse) O_i.
// No partial goes through global memory and the combine skips the row.
// Traffic: 64 x 256 x 4 B + 64 x 4 B to the partner (distributed shared memory), 64 x 256 x sizeof(T) B
// of output (+ the lse from CTA 0).
template <typename T, typename Acc>
__device__ __forceinline__ void merge_row_halves(SharedStorage& smem, Acc& acc_o, const float (&inv)[2],
                                                 const float (&lse)[2], int h, int wg, int wt, int my_row0, int r0,
                                                 int query_rows, int write_lse, T* out_row0, float* lse_row0) {
  constexpr float kLog2e = 1.4426950408889634f;
  const uint32_t partner = h ^ 1;
  float2* landing = reinterpret_cast<float2*>(smem.kv[0]);   // [64 element pairs][128 threads]
  float* landing_lse = reinterpret_cast<float*>(smem.kv[1]);  // [64 rows]
  if (wg != h) {  // the sender
    tilegym_cutlass::mbar_wait_cluster(&smem.pair[0], 0);
#pragma unroll
    for (int i = 0; i < 128; i += 2) {
      const float sc = inv[row_half(i)];
      tilegym_cutlass::cluster_store2(tilegym_cutlass::cluster_address(landing + (i / 2) * 128 + wt, partner),
                                      acc_o(i) * sc, acc_o(i + 1) * sc);
    }
    if ((wt & 3) == 0) {
#pragma unroll
      for (int k = 0; k < 2; ++k)
        tilegym_cutlass::cluster_store(tilegym_cutlass::cluster_address(landing_lse + my_row0 + 8 * k, partner), lse[k]);
    }
    tilegym_cutlass::cluster_arrive_remote(tilegym_cutlass::cluster_address(&smem.pair[1], partner));
    return;
  }
  if (wt == 0) tilegym_cutlass::cluster_arrive_remote(tilegym_cutlass::cluster_address(&smem.pair[0], partner));
  tilegym_cutlass::mbar_wait_cluster(&smem.pair[1], 0);
  float w_mine[2], w_other[2], lse_row[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const float other = landing_lse[my_row0 + 8 * k];
    if (lse[k] == -INFINITY && other == -INFINITY) {  // no token in either half: zeros, lse -inf
      w_mine[k] = w_other[k] = 0.f;
      lse_row[k] = -INFINITY;
      continue;
    }
    const float mx = fmaxf(lse[k], other);  // NaN in either lse gives NaN below
    const float e0 = exp2f((lse[k] - mx) * kLog2e), e1 = exp2f((other - mx) * kLog2e);
    const float total = e0 + e1;
    w_mine[k] = e0 / total;
    w_other[k] = e1 / total;
    lse_row[k] = mx + log2f(total) * kLn2;
  }
  const int col0 = h * 256;
#pragma unroll
  for (int i = 0; i < 128; i += 2) {
    const int k = row_half(i);
    const int r = r0 + my_row0 + 8 * k;
    if (r >= query_rows) continue;
    const float2 v = landing[(i / 2) * 128 + wt];
    const float sc = inv[k] * w_mine[k];
    *reinterpret_cast<uint32_t*>(out_row0 + (long long)r * kD + col0 + acc_col(i, wt)) =
        Types<T>::pack(acc_o(i) * sc + w_other[k] * v.x, acc_o(i + 1) * sc + w_other[k] * v.y);
  }
  if (h == 0 && write_lse && (wt & 3) == 0) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int r = r0 + my_row0 + 8 * k;
      if (r < query_rows) lse_row0[r] = lse_row[k];
    }
  }
}

}  // namespace tilegym_cute

// kPair = 2 (two or more 64-row groups): groups 2k and 2k + 1 of a piece (blockIdx.y) run as a cluster, which
// puts them on SMs of one GPC. Both read the same blocks at about the same time; from one GPC the
// two reads cost L2 less work (ncu: same DRAM bytes, L2 throughput 47% instead of 57% of peak).
// (Sharing the loads by TMA multicast instead was slower: each refill then waits for the slower CTA
// of the pair.) kPair = 1: a cluster of one CTA, or with kMerge = 1 two CTAs of consecutive pieces
// (blockIdx.x 2k, 2k + 1) that merge a row they split between them in shared memory (see "Row halves").
template <typename T, int kPair, int kFp8, int kMerge>
__global__ void __cluster_dims__(1 + kMerge, kPair, 1) __launch_bounds__(kFp8 ? 256 : 384, 1) mla_decode_cute_split_kernel(
    const T* __restrict__ q, const T* __restrict__ qpe, const int* __restrict__ table, const int* __restrict__ indptr, const int* __restrict__ lens,
    const int* __restrict__ cum_blocks, const int* __restrict__ piece_bounds, const int* __restrict__ piece_rows,
    T* __restrict__ out, float* __restrict__ out_lse, float* __restrict__ part_out, float* __restrict__ part_lse,
    int heads, int q_len, int query_rows, int causal, int write_lse, int paged, int page_size, int num_pages,
    int num_indices, int ragged, int num_pieces, long long q_sb, long long q_sq, long long q_sh, long long qpe_sb,
    long long qpe_sq, long long qpe_sh, long long table_sb, float qk_scale_log2,
    const __grid_constant__ CUtensorMap kv_map, const __grid_constant__ CUtensorMap kpe_map,
    const __grid_constant__ CUtensorMap scale_map, int box_rows, const float* __restrict__ kv_scale) {
  using namespace cute;
  using namespace tilegym_cute;
  using M = std::conditional_t<kFp8 != 0, __half, T>;  // the matmuls' input type
  using E = typename Types<M>::E;
  constexpr bool kDsMla = kFp8 == 2;  // fp8_ds_mla: per-token scales, a bf16 rope
  using Pe = std::conditional_t<kDsMla, __nv_bfloat16, M>;  // the rope matmuls' input type
  using EPe = typename Types<Pe>::E;
  static_assert(!kDsMla || std::is_same_v<T, __nv_bfloat16>, "fp8_ds_mla: bf16 queries (its rope is bf16)");
  constexpr int kRowBytes = kFp8 ? 64 : 128;  // bytes per token of a tile as TMA writes it
  // Tiles scored per wait: one (each tile's matmuls start as it lands); kFp8: TILEGYM_FP8_WIDEN_TILES,
  // widened together under one barrier.
  constexpr int kGroup = kFp8 ? TILEGYM_FP8_WIDEN_TILES : 1;
  // The second table's order: fp8 caches, and bf16/fp16 ones when TILEGYM_WIDE_PIPELINED.
  constexpr bool kPipelined = kFp8 != 0 || TILEGYM_WIDE_PIPELINED != 0;
  static_assert(kGroup == 1 || kGroup == 2, "a side's 4 tiles go in groups of 1 or 2");
  // bf16/fp16 with whole-block boxes: a side's four latent tiles are one TMA box [64 columns, 64 tokens,
  // 4 tiles] of the 4-D latent map, landing on the side's first barrier (its other three stay unarmed).
  const bool side_boxes = kFp8 == 0 && box_rows == kTokens;

  // The swizzled layouts need 1 KB alignment: the launch asks for sizeof(SharedStorage) + 1 KB.
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const unsigned misalign = shared_address(smem_raw) & 1023u;
  SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_raw + ((1024u - misalign) & 1023u));
  auto tile_barrier = [&](int buf, int t) { return &smem.full[buf][side_boxes && t < 8 ? t & ~3 : t]; };

  const int tid = threadIdx.x;
  // 0: block A, O columns 0..255; 1: block B, O columns 256..511. Read through a shuffle so that ptxas
  // knows it is warp-uniform and keeps the per-warpgroup addresses and matmul descriptors in uniform
  // registers (session 40: 6% fewer instructions, no spills in the step loop, 10-15% faster at 128 heads).
  const int wg = __shfl_sync(0xffffffff, tid / 128, 0);
  const int wt = tid % 128;  // thread inside its warpgroup
  const int piece = blockIdx.x;
  const int r0 = blockIdx.y * kRows;
  const int my_row0 = (wt / 32) * 16 + (wt % 32) / 4;  // this thread's accumulator rows: + 0, + 8
  // The cache's L2 policy: a pair's partner reads the same blocks a little later (tilegym_cutlass::l2_policy).
  const uint64_t policy = tilegym_cutlass::l2_policy(kPair == 1);

  static_assert(kMerge == 0 || (kPair == 1 && kFp8 == 0), "row halves: bf16/fp16, one 64-row group");
  if (tid == 0) {
    for (int i = 0; i < 2 * kTiles; ++i) mbar_init(&smem.full[i / kTiles][i % kTiles], 1);
    for (int i = 0; i < 4; ++i) mbar_init(&smem.empty[i / 2][i % 2], 4);
    if constexpr (kMerge != 0) {
      mbar_init(&smem.pair[0], 1);
      mbar_init(&smem.pair[1], 128);
      tilegym_cutlass::fence_mbarrier_init_cluster();
    }
  }
  tilegym_cutlass::allow_dependent_launch();  // the combine may be placed as SMs free up
  if constexpr (kMerge != 0)
    tilegym_cutlass::cluster_sync();  // the partner's barriers exist before any remote arrival
  else
    __syncthreads();
  // A programmatic dependent launch: what comes before overlaps the previous kernel's end, and nothing
  // a previous kernel wrote (schedule, queries, cache) is read before this wait.
  tilegym_cutlass::wait_for_previous_grid();
  const int start = piece_bounds[piece];
  const int end = piece_bounds[piece + 1];
  const int first_row = piece_rows[piece];
  const int last_row = piece_rows[num_pieces + piece];
  // kMerge: whether pieces 2k and 2k + 1 (this CTA and its partner) split one row between them and hold
  // nothing else; both CTAs (and the combine, which then skips the row) make the same test.
  bool merged = false;
  if constexpr (kMerge != 0) {
    const int e = piece & ~1;
    if (e + 2 <= num_pieces) {
      const int p0 = piece_bounds[e], p1 = piece_bounds[e + 1], p2 = piece_bounds[e + 2];
      const int b0 = piece_rows[e];
      merged = p0 < p1 && p1 < p2 && p0 == cum_blocks[b0] && p2 == cum_blocks[b0 + 1];
    }
  }

  // bf16/fp16: warpgroup 2 is the producer. Its first warp issues every TMA load of the CTA, in block
  // order, each (buffer, side) once the warpgroup that read it last has released it; the consumers
  // never wait on a TMA issue. Registers move to the consumers (setmaxnreg).
  if constexpr (kFp8 == 0) {
    if (wg == 2) {
      asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
      if (wt >= 32) return;
      int used = 0, phases = 0;  // bit 2 buf + side: loaded before; the parity its release will complete
      for (int b = first_row; b <= last_row; ++b) {
        const int row_begin = cum_blocks[b];
        const int row_end = cum_blocks[b + 1];
        const int lo = start > row_begin ? start : row_begin;
        const int hi = end < row_end ? end : row_end;
        if (lo >= hi) continue;
        const int len = lens[b];
        const int* table_row = tilegym_cutlass::page_list(table, indptr, b, paged, ragged, num_indices, table_sb);
        for (int blk = lo - row_begin; blk < hi - row_begin; ++blk) {
          const int buf = (blk - (lo - row_begin)) & 1;
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
              mbar_expect_bytes(&smem.full[buf][t0], boxes * kLeftTiles * kTileBytes);
              if (side == 1) mbar_expect_bytes(&smem.full[buf][8], boxes * kTileBytes);
              if (boxes == 0) continue;
              const auto [unit, row] =
                  tilegym_cutlass::box_origin(table_row, b, blk * kTokens, paged, page_size, num_pages);
              tilegym_cutlass::tma_load_4d(wide_tile(smem, buf, t0), &kv_map, 0, row, t0, unit, &smem.full[buf][t0], policy);
              if (side == 1) tma_load_3d(wide_tile(smem, buf, 8), &kpe_map, 0, row, unit, &smem.full[buf][8], policy);
              continue;
            }
            if (wt == 0) {
              for (int t = t0; t < t1; ++t) mbar_expect_bytes(&smem.full[buf][t], boxes * box_rows * kRowBytes);
            }
            for (int box = wt; box < boxes; box += 32) {  // lanes split a paged block's boxes
              const auto [unit, row] = tilegym_cutlass::box_origin(table_row, b, blk * kTokens + box * box_rows, paged,
                                                                   page_size, num_pages);
              for (int t = t0; t < t1; ++t) {
                unsigned char* dst = wide_tile(smem, buf, t) + box * box_rows * kRowBytes;
                if (t < 8)
                  tilegym_cutlass::tma_load_4d(dst, &kv_map, 0, row, t, unit, &smem.full[buf][t], policy);
                else
                  tma_load_3d(dst, &kpe_map, 0, row, unit, &smem.full[buf][t], policy);
              }
            }
          }
        }
      }
      return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
  }
  // The consumers' CTA-wide barrier (the producer, if any, never joins).
  auto consumers_sync = [&] {
    if constexpr (kFp8 == 0)
      asm volatile("bar.sync %0, 256;\n" ::"r"(kBarConsumers) : "memory");
    else
      __syncthreads();
  };
  // bf16/fp16: this warpgroup is done reading its side of buffer buf (its wgmma waited): one arrival
  // per warp.
  auto release = [&](int buf) {
    if ((wt & 31) == 0) tilegym_cutlass::mbar_arrive(&smem.empty[buf][wg]);
  };

  auto mma_s = make_tiled_mma(typename Types<M>::MmaS{});
  auto mma_s_rope = make_tiled_mma(typename Types<Pe>::MmaSRope{});
  auto mma_local = make_tiled_mma(typename Types<M>::MmaOLocal{});
  auto mma_remote = make_tiled_mma(typename Types<M>::MmaORemote{});
  const float cache_scale = kFp8 == 1 ? *kv_scale : 1.f;  // multiplies scores and output
  auto thr_s = mma_s.get_slice(wt);
  auto thr_s_rope = mma_s_rope.get_slice(wt);
  auto thr_local = mma_local.get_slice(wt);
  auto thr_remote = mma_remote.get_slice(wt);

  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<E*>(smem.q)), WideK<E>{});
  auto tSrQ = thr_s.partition_fragment_A(sQ);  // (MMA, 1, 32) descriptors
  Tensor rQpe = make_tensor<EPe>(FragA{});     // the rope query, registers
  Tensor rP = make_tensor<E>(FragA{});         // this warpgroup's P, registers
  Tensor acc_s = partition_fragment_C(mma_s, Shape<Int<kRows>, Int<kTokens>>{});
  Tensor acc_o = partition_fragment_C(mma_local, Shape<Int<kRows>, _256>{});
  uint32_t* rP32 = reinterpret_cast<uint32_t*>(rP.data());
  uint32_t* rQpe32 = reinterpret_cast<uint32_t*>(rQpe.data());

  int parity[2] = {0, 0};  // of each buffer's barriers

  // kFp8, bf16 query: two bf16 (a 32-bit pair) times factor -> an f16 pair, or with to_bf16 (kDsMla's rope
  // query, which stays bf16) a bf16 pair, exact since the factor is a power of two.
  auto scaled_pair = [](uint32_t bits, float factor, bool to_bf16) {
    __nv_bfloat162 v;
    memcpy(&v, &bits, 4);
    const float2 f = __bfloat1622float2(v);
    uint32_t out;
    if (to_bf16) {
      const __nv_bfloat162 h = __floats2bfloat162_rn(f.x * factor, f.y * factor);
      memcpy(&out, &h, 4);
    } else {
      const __half2 h = __floats2half2_rn(f.x * factor, f.y * factor);
      memcpy(&out, &h, 4);
    }
    return out;
  };
  // kFp8, bf16 query: each thread's own staged chunks of Q's latent part (rows tid / 8 and tid / 8 + 32,
  // chunks tid % 8 + 8 j) -> fp16 in place, scaled per row (fp16_row_factor of the row's largest
  // magnitude over the latent and the rope, gathered over the row's 8 threads); the factors go to
  // smem.q_factor for the rope fragments and the score scale.
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
      if (sub == 0) smem.q_factor[i] = factor;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        uint32_t* w = reinterpret_cast<uint32_t*>(&chunk[j]);
#pragma unroll
        for (int e = 0; e < 4; ++e) w[e] = scaled_pair(w[e], factor, false);
        *reinterpret_cast<uint4*>(smem.q + wide_offset(i, (sub + 8 * j) * 8)) = chunk[j];
      }
    }
  };

  // Q's latent part of batch row b -> shared memory by cp.async (all consumer threads: rows tid / 8 and
  // tid / 8 + 32, 8 chunks each), one commit group.
  auto load_query = [&](int b) {
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
  };

  for (int b = first_row; b <= last_row; ++b) {
    const int row_begin = cum_blocks[b];
    const int row_end = cum_blocks[b + 1];
    const int lo = start > row_begin ? start : row_begin;
    const int hi = end < row_end ? end : row_end;
    if (lo >= hi) continue;
    const bool whole = lo == row_begin && hi == row_end;
    const long long slot = piece + b;
    const int len = lens[b];
    const int first_blk = lo - row_begin, end_blk = hi - row_begin;

    const int* table_row = tilegym_cutlass::page_list(table, indptr, b, paged, ragged, num_indices, table_sb);
    // kFp8: this warpgroup's tiles of block blk into buffer buf by TMA, issued by its first warp: boxes of
    // box_rows tokens (a dense row's whole block, or the part of one page), lane l taking boxes
    // l, l + 32, ...; boxes wholly past the row's length are skipped (their bytes not expected).
    // (bf16/fp16: the producer warpgroup's loop above.)
    // kDsMla: the rope's bf16 rows land where they are scored (128 bytes, swizzled by the map), and the
    // side of the buffer's scorer (buf == wg) also brings the block's scales (16 bytes a token) on the
    // barrier of that side's first tile, the first the scorer waits for.
    auto issue_block = [&](int blk, int buf) {
      if (wt >= 32) return;
      const int boxes = tilegym_cutlass::boxes_in_block(blk, kTokens, len, box_rows);
      const int t0 = wg == 0 ? 0 : kLeftTiles, t1 = wg == 0 ? kLeftTiles : kTiles;
      const bool scales = kDsMla && buf == wg;
      auto row_bytes = [](int t) { return kDsMla && t == 8 ? 2 * kRowBytes : kRowBytes; };
      if (wt == 0) {
        for (int t = t0; t < t1; ++t) {
          const int extra = scales && t == t0 ? kDsScaleBytes : 0;
          mbar_expect_bytes(&smem.full[buf][t], boxes * box_rows * (row_bytes(t) + extra));
        }
      }
      for (int box = wt; box < boxes; box += 32) {
        const auto [unit, row] =
            tilegym_cutlass::box_origin(table_row, b, blk * kTokens + box * box_rows, paged, page_size, num_pages);
        for (int t = t0; t < t1; ++t) {
          unsigned char* dst = kDsMla && t == 8 ? wide_tile(smem, buf, 8) : fp8_staging(smem, buf, t);
          tma_load_3d(dst + box * box_rows * row_bytes(t), t < 8 ? &kv_map : &kpe_map, t < 8 ? t * 64 : 0, row, unit,
                      &smem.full[buf][t], policy);
        }
        if (scales)
          tma_load_3d(ds_scale_slot(smem, buf) + box * box_rows * kDsScaleBytes, &scale_map, 0, row, unit,
                      &smem.full[buf][t0], policy);
      }
    };
    // V rows at or past the row's length (a partial last block) -> zero, in the tiles this warpgroup
    // reads for P V, once they have landed; positions past the length may hold anything (NaN).
    auto clear_tail = [&](int blk, int buf) {
      const int valid = len - blk * kTokens;
      if (valid >= kTokens) return;
      const int t0 = wg == 0 ? 0 : kLeftTiles;
      for (int t = t0; t < t0 + kLeftTiles; ++t) mbar_wait(tile_barrier(buf, t), parity[buf]);
      for (int i = valid * 8 + wt; i < kTokens * 8; i += 128) {  // 16-byte chunks of rows >= valid
        for (int t = t0; t < t0 + kLeftTiles; ++t)
          *reinterpret_cast<uint4*>(smem.kv[buf] + t * kTileBytes + i * 16) = make_uint4(0, 0, 0, 0);
      }
      fence_async_shared();
      asm volatile("bar.sync %0, 128;\n" ::"r"(4 + wg) : "memory");
    };
    consumers_sync();  // the previous segment is done with Q (and, without a producer, every buffer)
    load_query(b);
    if constexpr (kFp8 != 0) {
      issue_block(first_blk, 0);
      if (first_blk + 1 < end_blk) issue_block(first_blk + 1, 1);
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
    if constexpr (kFp8 != 0 && std::is_same_v<T, __nv_bfloat16>) stage_query_as_fp16(b);
    fence_async_shared();
    consumers_sync();
    float score_scale[2];  // per row: log2(e) * sm_scale (kFp8: times the cache's scale over the row's factor)
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      score_scale[k] = qk_scale_log2;
      if constexpr (kFp8 != 0) {
        float factor = 1.f;
        if constexpr (std::is_same_v<T, __nv_bfloat16>) {
          factor = smem.q_factor[my_row0 + 8 * k];
#pragma unroll
          for (int s = 0; s < 4; ++s) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              uint32_t& w = rQpe32[4 * s + 2 * h + k];
              w = scaled_pair(w, factor, kDsMla);
            }
          }
        }
        score_scale[k] = qk_scale_log2 * cache_scale / factor;
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
    // 2 q, 2 q + 1, both row halves); lane l gives the address of row l % 8 of matrix l / 8. fence:
    // end with the proxy fence that makes the copy visible to wgmma (else the caller fences later).
    auto store_p = [&](int b, bool fence = true) __attribute__((always_inline)) {
      const int lane = wt & 31;
      const int st_row = (wt / 32) * 16 + ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint32_t addr = shared_address(smem.p[b] + narrow_offset(st_row, 8 * (2 * q + (lane >> 4))));
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                     "r"(rP32[4 * q]), "r"(rP32[4 * q + 1]), "r"(rP32[4 * q + 2]), "r"(rP32[4 * q + 3])
                     : "memory");
      }
      if (fence) fence_async_shared();
    };

    if constexpr (kPipelined) {
      // fp8 caches (bf16/fp16 ones too under TILEGYM_WIDE_PIPELINED): the step order of the header's
      // second table.
      // Score matmuls S += Q K^T of this warpgroup's buffer (buf = wg: WG0 scores blocks A, WG1 blocks B).
      const int buf = wg;
      uint32_t ds_scales[2][2];  // kDsMla: this thread's two tokens' scales in the block being widened
      // This warpgroup's side of buffer b is no longer read: fp8 refills it with block blk when there
      // is one (next); bf16/fp16 releases it to the producer, which loads on across segments.
      auto done_with = [&](int b, bool next, int blk) __attribute__((always_inline)) {
        if constexpr (kFp8 != 0) {
          if (next) issue_block(blk, b);
        } else {
          release(b);
        }
      };
      auto gemm_tile = [&](auto tile) __attribute__((always_inline)) {
        constexpr int t = decltype(tile)::value;
        if constexpr (t < 8) {
          Tensor sK = make_tensor(make_smem_ptr(reinterpret_cast<E*>(smem.kv[buf])), TileK<E>{});
          auto tSrK = thr_s.partition_fragment_B(sK);
#pragma unroll
          for (int s = 0; s < 4; ++s) {
            gemm(mma_s, tSrQ(_, _, 4 * t + s), tSrK(_, _, 4 * t + s), acc_s);
            mma_s.accumulate_ = GMMA::ScaleOut::One;
          }
        } else {
          Tensor sKpe = make_tensor(make_smem_ptr(reinterpret_cast<EPe*>(smem.kpe[buf])), NarrowK<EPe>{});
          auto tSrKpe = thr_s_rope.partition_fragment_B(sKpe);
          warpgroup_fence_operand(rQpe);
#pragma unroll
          for (int s = 0; s < 4; ++s) gemm(mma_s_rope, rQpe(_, _, s), tSrKpe(_, _, s), acc_s);
        }
      };
      // Tiles first .. first + count - 1 of the block in phase ph: wait until they have landed (TMA writes
      // through the async proxy, as wgmma reads), widen them, issue their matmuls as one commit group.
      auto score_tiles = [&](auto first, auto count, int ph) __attribute__((always_inline)) {
        constexpr int t0 = decltype(first)::value, n = decltype(count)::value;
#pragma unroll
        for (int k = 0; k < n; ++k) {
          const int t = t0 + k;
          if (!side_boxes || t % kLeftTiles == 0 || t == 8) mbar_wait(tile_barrier(buf, t), ph);
        }
        if constexpr (kFp8 != 0 && !(kDsMla && t0 == 8)) widen_fp8_tiles<n, kDsMla>(smem, buf, t0, wg, wt, ds_scales);
        warpgroup_fence_operand(acc_s);
        warpgroup_arrive();
        gemm_tile(Int<t0>{});
        if constexpr (n > 1) gemm_tile(Int<t0 + 1>{});
        warpgroup_commit_batch();
      };
      constexpr int kSideGroups = kLeftTiles / kGroup;  // commit groups of one side's latent tiles
      auto score_side = [&](auto first, int ph) __attribute__((always_inline)) {  // tiles first .. first + 3
        constexpr int s = decltype(first)::value;
        if constexpr (kGroup == 1) {
          score_tiles(Int<s>{}, _1{}, ph), score_tiles(Int<s + 1>{}, _1{}, ph);
          score_tiles(Int<s + 2>{}, _1{}, ph), score_tiles(Int<s + 3>{}, _1{}, ph);
        } else {
          score_tiles(Int<s>{}, _2{}, ph), score_tiles(Int<s + 2>{}, _2{}, ph);
        }
      };
      auto start_scores = [&]() __attribute__((always_inline)) {
        mma_s.accumulate_ = GMMA::ScaleOut::Zero;  // the first latent tile starts S (the rope never comes first)
        mma_s_rope.accumulate_ = GMMA::ScaleOut::One;
      };
      // WG1's block in its refill order: the right side and the rope (refilled after P_B V_B,R), then the
      // left side (refilled by WG0 after P_B V_B,L, the step's last P V).
      auto score_b = [&](int ph) __attribute__((always_inline)) {
        start_scores();
        score_side(Int<kLeftTiles>{}, ph), score_tiles(Int<8>{}, _1{}, ph), score_side(Int<0>{}, ph);
      };
      // Where a warpgroup has no next block: one zeroing k-step on whatever the buffer holds, and empty
      // groups up to a side's count, so that on every path acc_s is last written by a wgmma when the
      // step's final wait comes (a non-wgmma definition there makes ptxas serialise the matmuls, C7515).
      auto score_nothing = [&]() __attribute__((always_inline)) {
        Tensor sK = make_tensor(make_smem_ptr(reinterpret_cast<E*>(smem.kv[buf])), TileK<E>{});
        auto tSrK = thr_s.partition_fragment_B(sK);
        warpgroup_fence_operand(acc_s);
        warpgroup_arrive();
        mma_s.accumulate_ = GMMA::ScaleOut::Zero;
        gemm(mma_s, tSrQ(_, _, 0), tSrK(_, _, 0), acc_s);
#pragma unroll
        for (int g = 0; g < kSideGroups; ++g) warpgroup_commit_batch();
      };
      auto finish_scores = [&]() __attribute__((always_inline)) {
        warpgroup_wait<0>();
        warpgroup_fence_operand(acc_s);
        warpgroup_fence_operand(rQpe);
        warpgroup_fence_operand(acc_o);
      };


      // Each warpgroup's first block; WG1 issues after WG0 has issued, so S_A ends first.
      if (wg == 0) {
        start_scores();
        score_side(Int<0>{}, parity[0]), score_side(Int<kLeftTiles>{}, parity[0]), score_tiles(Int<8>{}, _1{}, parity[0]);
        bar_arrive(kBarScoresA);
      } else {
        bar_wait(kBarScoresA);
        if (first_blk + 1 < end_blk) {
          score_b(parity[1]);
        } else {
          score_nothing();
        }
      }
      finish_scores();

      for (int blk_a = first_blk; blk_a < end_blk; blk_a += 2) {
        const int blk_b = blk_a + 1;
        const bool has_b = blk_b < end_blk;
        const bool next_a = blk_a + 2 < end_blk;  // the next step has a block A
        const bool next_b = blk_b + 2 < end_blk;  // and a block B
        // The probabilities live in acc_s, which the next score matmuls overwrite (wgmma keeps its
        // accumulator registers live anyway): S of block blk (waited) -> masked (blocks that reach past
        // a row's limit only); row maxima, scaled.
        float row_max[2];
        auto take_scores = [&](int blk) __attribute__((always_inline)) {
          const int pos0 = blk * kTokens;
          if (block_needs_mask(pos0, limit)) {
#pragma unroll
            for (int i = 0; i < 32; ++i)
              if (pos0 + acc_col(i, wt) >= limit[row_half(i)]) acc_s(i) = -INFINITY;
          }
#pragma unroll
          for (int k = 0; k < 2; ++k) {
            float mx = -INFINITY;
#pragma unroll
            for (int i = 2 * k; i < 32; i += 4) mx = fmaxf(mx, fmaxf(acc_s(i), acc_s(i + 1)));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
            row_max[k] = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2)) * score_scale[k];
          }
        };
        // P = exp2(S * scale - frame) in place -> rP (packed), this thread's share of the row sums.
        auto exp_scores = [&](const float (&frame)[2]) __attribute__((always_inline)) {
#pragma unroll
          for (int i = 0; i < 32; i += 2) {
            const int k = row_half(i);
            acc_s(i) = fast_exp2(fmaf(acc_s(i), score_scale[k], -frame[k]));
            acc_s(i + 1) = fast_exp2(fmaf(acc_s(i + 1), score_scale[k], -frame[k]));
            l[k] += acc_s(i) + acc_s(i + 1);
            rP32[i / 2] = Types<M>::pack(acc_s(i), acc_s(i + 1));
          }
        };
        if (wg == 0) {
          // S_A (waited) -> m_A; O_L, l to m_A; P_A -> registers; O_L += P_A V_A,L.
          take_scores(blk_a);
          float frame_a[2], scale[2];
#pragma unroll
          for (int k = 0; k < 2; ++k) {
            const float m_a = next_frame(m[k], row_max[k]);
            frame_a[k] = m_a == -INFINITY ? 0.f : m_a;  // a row that has seen no token: shift by 0 (no inf - inf)
            scale[k] = fast_exp2(m[k] - frame_a[k]);
            l[k] *= scale[k];
            if ((wt & 3) == 0) smem.m[0][my_row0 + 8 * k] = m_a;
          }
          bar_arrive(kBarMaxA);  // m_A -> WG1, whose P_B needs it
          exp_scores(frame_a);
          if (reframed(scale)) scale_o(scale);
          clear_tail(blk_a, 0);
          pv_local(0);
          warpgroup_wait<0>();
          warpgroup_fence_operand(acc_o);
          warpgroup_fence_operand(rP);
          done_with(0, next_a, blk_a + 2);  // V_A,L and K_A are no longer read here
          // m_B from WG1 (without a block B, m_B = m_A): P_A to m_B -> shared memory for WG1's P_A V_A,R.
          bar_wait(kBarMaxB);
#pragma unroll
          for (int k = 0; k < 2; ++k) {
            const float m_b = smem.m[1][my_row0 + 8 * k];
            m[k] = m_b == -INFINITY ? 0.f : m_b;
            scale[k] = fast_exp2(frame_a[k] - m[k]);
            l[k] *= scale[k];
          }
#pragma unroll
          for (int i = 0; i < 32; i += 2)
            rP32[i / 2] = Types<M>::pack(acc_s(i) * scale[row_half(i)], acc_s(i + 1) * scale[row_half(i)]);
          store_p(0);
          bar_arrive(kBarPAReady);
          if (has_b) {
            bar_wait(kBarPVARIssued);  // P_B is in shared memory, and WG1's P_A V_A,R is issued
            if (reframed(scale)) scale_o(scale);
            clear_tail(blk_b, 1);
            pv_remote(1);  // O_L += P_B V_B,L
          }
          // The next S_A queues behind it: its left tiles were refilled after P_A V_A,L, its right tiles
          // (by WG1) after P_A V_A,R.
          if (next_a) {
            start_scores();
            score_side(Int<0>{}, parity[0] ^ 1);
          } else {
            score_nothing();
          }
          warpgroup_wait<kSideGroups>();  // P_B V_B,L is done
          warpgroup_fence_operand(acc_o);
          if (has_b) done_with(1, next_b, blk_b + 2);  // V_B,L is no longer read
          if (next_a) score_side(Int<kLeftTiles>{}, parity[0] ^ 1), score_tiles(Int<8>{}, _1{}, parity[0] ^ 1);
        } else {
          // S_B (waited), m_A from WG0 -> m_B = max(m_A, rowmax S_B) -> WG0; O_R, l to m_B;
          // P_B -> registers and shared memory; O_R += P_B V_B,R; then O_R += P_A V_A,R (P_A to m_B, from WG0).
          if (has_b) take_scores(blk_b);
          bar_wait(kBarMaxA);
          float scale[2];
#pragma unroll
          for (int k = 0; k < 2; ++k) {
            const float m_a = smem.m[0][my_row0 + 8 * k];
            const float m_b = has_b ? next_frame(m_a, row_max[k]) : m_a;
            const float frame_b = m_b == -INFINITY ? 0.f : m_b;
            scale[k] = fast_exp2(m[k] - frame_b);
            l[k] *= scale[k];
            m[k] = frame_b;
            if ((wt & 3) == 0) smem.m[1][my_row0 + 8 * k] = m_b;
          }
          bar_arrive(kBarMaxB);
          if (reframed(scale)) scale_o(scale);
          if (has_b) {
            exp_scores(m);
            store_p(1);
            clear_tail(blk_b, 1);
            pv_local(1);  // O_R += P_B V_B,R
          }
          clear_tail(blk_a, 0);
          bar_wait(kBarPAReady);
          pv_remote(0);  // O_R += P_A V_A,R
          if (has_b) {
            bar_arrive(kBarPVARIssued);
            warpgroup_wait<1>();
            warpgroup_fence_operand(rP);
            done_with(1, next_b, blk_b + 2);  // V_B,R and K_B's rope are no longer read
          }
          warpgroup_wait<0>();
          warpgroup_fence_operand(acc_o);
          warpgroup_fence_operand(rP);
          done_with(0, next_a, blk_a + 2);  // V_A,R and K_A's rope are no longer read
          if (next_b) {
            score_b(parity[1] ^ 1);  // the next S_B
          } else {
            score_nothing();
          }
        }
        finish_scores();
        parity[0] ^= 1;
        if (has_b) parity[1] ^= 1;
      }
    } else {
      // bf16/fp16 caches: the step order of the header's first table.
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
          // Tile t: wait until it has landed (TMA writes through the async proxy, as wgmma reads), then
          // issue its matmuls as one commit group.
          auto score_tile = [&](auto tile) {
            constexpr int t = decltype(tile)::value;
            if (!side_boxes || t % kLeftTiles == 0 || t == 8) mbar_wait(tile_barrier(buf, t), parity[buf]);
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
        auto softmax_to = [&](int buf, const float (&safe)[2], bool fence = true) __attribute__((always_inline)) {
#pragma unroll
          for (int i = 0; i < 32; i += 2) {
            const int k = row_half(i);
            p[i] = fast_exp2(p[i] - safe[k]);
            p[i + 1] = fast_exp2(p[i + 1] - safe[k]);
            l[k] += p[i] + p[i + 1];
            rP32[i / 2] = Types<M>::pack(p[i], p[i + 1]);
          }
          store_p(buf, fence);
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
          softmax_to(0, m, false);  // P_A -> shared memory, not yet fenced
          if (reframed(scale)) scale_o(scale);  // O_L is this warpgroup's alone
          clear_tail(blk_a, 0);
          pv_local(0);  // reads P_A from registers, so it need not wait for the fence WG1's copy needs
          fence_async_shared();
          bar_arrive(kBarMaxA);
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
      inv[k] = empty ? 0.f : cache_scale / total;
      lse[k] = empty ? -INFINITY : (m[k] + log2f(total)) * kLn2;
    }
    if constexpr (kMerge != 0) {
      if (merged) {  // the piece's only segment
        merge_row_halves(smem, acc_o, inv, lse, piece & 1, wg, wt, my_row0, r0, query_rows, write_lse,
                         out + (long long)b * query_rows * kD, out_lse + (long long)b * query_rows);
        continue;
      }
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
