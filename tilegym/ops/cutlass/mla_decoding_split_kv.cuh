// MLA decoding over a split schedule, CUDA C++ with CuTe for sm_90a (wgmma).
//
// One CTA = (piece p of the schedule, group of 64 query rows); 256 threads = two warpgroups; one
// wave of persistent CTAs (tilegym/ops/schedule.py). The CTA walks the batch rows its piece meets
// (piece_rows[0][p] .. piece_rows[1][p]) and, for each, attends its 64 query rows (r = token *
// heads + head, rows past query_rows are zero and never stored) to the row's KV blocks [lo, hi)
// inside the piece, 64 tokens per block. A segment that is the whole row writes the final output
// and lse; the others a float32 partial and natural-log lse to work slot p + b, merged by
// mla_decoding_combine.cuh. Causal MTP: token i of a row of length L sees positions < L - q_len + 1 + i.
//
// Tiles (bf16/fp16, D = 512 latent columns, P = 64 rope columns, N = 64 tokens per block):
//   shared memory  Q [64, 512] + Qpe [64, 64]                       72 KB, once per segment
//                  2 stages x (KV [64, 512] + KPE [64, 64])          144 KB, double-buffered
//                  P [64, 64] (bf16/fp16 probabilities)               8 KB
//   all in the 128-byte-swizzled layout wgmma reads (8 rows x 128 B atoms; latent atoms of one
//   8-token group side by side, so the same KV bytes serve as K (K-major) and as V (MN-major)).
//   warpgroup w  S_w [64 rows, 32 tokens] = Q . K[32w .. 32w + 32)^T   (wgmma 64x32x16, K = 576)
//                softmax of S_w with the row max shared between the two warpgroups (shared memory
//                + named barrier), P_w -> shared memory,
//                O_w [64 rows, 256 cols] += P [64, 64] . V[:, 256w .. 256w + 256)  (wgmma 64x256x16)
//   O_w lives in registers (128 floats per thread); the running max / sum per row in registers.
// Loads: cp.async 16-byte chunks (8 threads per token row, 128 B per instruction), one token's page
// looked up per thread and block; positions at or past the row's length are zero-filled (their
// scores are masked, their V rows are zero). The next block's loads fly while this block computes.
//
// Memory traffic per CTA (L = tokens of its piece, R = batch rows it meets):
//   reads  L * 576 * 2 B of KV (+ 4 B of page id per token when paged) and R * 64 * 576 * 2 B of
//          queries; writes per row met 64 * 512 * 4 B of partial output + 64 * 4 B of lse (a whole
//          row: 64 * 512 * 2 B final output, + lse when asked).
//   With more than 64 query rows the KV of a piece is read once per 64-row group (the groups of a
//   piece run at the same time, so the second read mostly hits L2).
//
// Layout: paged = 0 dense rows (kv[b, t]); paged = 1 pages of page_size tokens from a block table
// row (ragged = 0) or kv_indices[kv_indptr[b]:] (ragged = 1). Page ids are clamped to
// [0, num_pages) and lengths were clamped to the row's pages by the schedule: no read leaves the
// cache. Strides are in elements; rows must be 16-byte aligned (the launcher checks).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cute/tensor.hpp>
#include <cute/atom/mma_atom.hpp>
#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>

#include "common.cuh"

namespace tilegym_cute {

using namespace cute;

inline constexpr int kD = 512;       // latent width: K's first D columns and all of V
inline constexpr int kP = 64;        // rope width: the rest of K
inline constexpr int kRows = 64;     // query rows per CTA (the wgmma M)
inline constexpr int kTokens = 64;   // KV tokens per block
inline constexpr int kThreads = 256; // two warpgroups
inline constexpr float kLn2 = 0.6931471805599453f;

template <typename T>
struct Types;
template <>
struct Types<__nv_bfloat16> {
  using E = cute::bfloat16_t;
  using MmaS = SM90_64x32x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>;
  using MmaO = SM90_64x256x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::MN>;
  static __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
};
template <>
struct Types<__half> {
  using E = cute::half_t;
  using MmaS = SM90_64x32x16_F32F16F16_SS<GMMA::Major::K, GMMA::Major::K>;
  using MmaO = SM90_64x256x16_F32F16F16_SS<GMMA::Major::K, GMMA::Major::MN>;
  static __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
};

// Shared-memory layouts (element type E, 2 bytes). Latent tiles [rows, 512]: 8-row groups of
// 8 KB, inside a group the eight 64-column atoms side by side (1 KB each), inside an atom 8 rows of
// 128 B whose 16-byte chunks are XOR-swizzled by the row: byte offset of (row, col) =
//   (row / 8) * 8192 + (col / 64) * 1024 + (row % 8) * 128 + (((col % 64) / 8) ^ (row % 8)) * 16 + (col % 8) * 2.
// Narrow tiles [rows, 64]: one atom per 8-row group (1 KB).
template <typename E>
using WideK = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<E>{}, Shape<Int<kRows>, Int<kD>>{}, Step<_2, _1>{}));
template <typename E>
using HalfWideK = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<E>{}, Shape<_32, Int<kD>>{}, Step<_2, _1>{}));
template <typename E>
using NarrowK = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<E>{}, Shape<Int<kRows>, Int<kP>>{}));
template <typename E>
using HalfNarrowK = decltype(tile_to_shape(GMMA::Layout_K_SW128_Atom<E>{}, Shape<_32, Int<kP>>{}));
// The same latent KV bytes as V^T [512 columns, 64 tokens] (MN-major for the second wgmma).
template <typename E>
using WideMN = decltype(tile_to_shape(GMMA::Layout_MN_SW128_Atom<E>{}, Shape<Int<kD>, Int<kTokens>>{}, Step<_1, _2>{}));

__host__ __device__ __forceinline__ int wide_offset(int row, int col) {  // bytes, see above
  return (row >> 3) * 8192 + (col >> 6) * 1024 + (row & 7) * 128 + ((((col & 63) >> 3) ^ (row & 7)) << 4) + (col & 7) * 2;
}
__host__ __device__ __forceinline__ int narrow_offset(int row, int col) {  // bytes, [rows, 64] tiles
  return (row >> 3) * 1024 + (row & 7) * 128 + (((col >> 3) ^ (row & 7)) << 4) + (col & 7) * 2;
}

// Which of its two rows accumulator element i of a thread belongs to: the wgmma accumulator's values
// run (column pair, row + 8, next 8 columns), so it is bit 1 of i; a compile-time constant in
// unrolled loops (the per-row state stays in registers).
__host__ __device__ constexpr int row_half(int i) { return (i >> 1) & 1; }

struct alignas(1024) SharedStorage {
  unsigned char q[kRows * kD * 2];
  unsigned char qpe[kRows * kP * 2];
  unsigned char kv[2][kTokens * kD * 2];
  unsigned char kpe[2][kTokens * kP * 2];
  unsigned char p[kRows * kTokens * 2];
  float red[2][kRows];  // per-warpgroup row max (per block) or row sum (at the end)
};

using tilegym_cutlass::commit_async_copies;
using tilegym_cutlass::cp_async16;
using tilegym_cutlass::fence_async_shared;
using tilegym_cutlass::wait_async_copies;
__device__ __forceinline__ void bar_sync_both() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }

// Issue the cp.async loads of 64 rows x 576 columns: row i's latent part from lat(i), rope part
// from rope(i) (nullptr: zero-fill). Thread t takes rows t / 8 and t / 8 + 32, chunks t % 8 + 8 j.
// Rows without data (nullptr) are zero-filled; their copies name `fallback` (a valid address, never read).
template <typename T, typename RowPtr>
__device__ __forceinline__ void load_rows(unsigned char* lat_smem, unsigned char* rope_smem, RowPtr row_ptrs,
                                          const T* fallback) {
  const int sub = threadIdx.x & 7;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = (threadIdx.x >> 3) + 32 * half;
    const auto [lat, rope] = row_ptrs(row);
    const bool ok = lat != nullptr;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int col = (sub + 8 * j) * 8;
      cp_async16(lat_smem + wide_offset(row, col), ok ? lat + col : fallback, ok);
    }
    cp_async16(rope_smem + narrow_offset(row, sub * 8), ok ? rope + sub * 8 : fallback, ok);
  }
}

template <typename T>
struct RowPair {
  const T* lat;
  const T* rope;
};

}  // namespace tilegym_cute

template <typename T>
__global__ void __launch_bounds__(256, 1) mla_decode_cute_split_kernel(
    const T* __restrict__ q, const T* __restrict__ qpe, const T* __restrict__ kv, const T* __restrict__ kpe,
    const int* __restrict__ table, const int* __restrict__ indptr, const int* __restrict__ lens,
    const int* __restrict__ cum_blocks, const int* __restrict__ blocks_per_program, const int* __restrict__ piece_rows,
    T* __restrict__ out, float* __restrict__ out_lse, float* __restrict__ part_out, float* __restrict__ part_lse,
    int heads, int q_len, int query_rows, int causal, int write_lse, int paged, int page_size, int num_pages,
    int num_indices, int ragged, int num_pieces, long long q_sb, long long q_sq, long long q_sh, long long qpe_sb,
    long long qpe_sq, long long qpe_sh, long long kv_s0, long long kv_s1, long long kpe_s0, long long kpe_s1,
    long long table_sb, float qk_scale_log2) {
  using namespace cute;
  using namespace tilegym_cute;
  using E = typename Types<T>::E;

  // The swizzled layouts need 1 KB alignment: the launch asks for sizeof(SharedStorage) + 1 KB.
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const unsigned misalign = static_cast<unsigned>(__cvta_generic_to_shared(smem_raw)) & 1023u;
  SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_raw + ((1024u - misalign) & 1023u));

  const int tid = threadIdx.x;
  const int wg = tid / 128;  // warpgroup: tokens [32 wg, 32 wg + 32) of S, columns [256 wg, 256 wg + 256) of O
  const int wt = tid % 128;  // thread inside its warpgroup
  const int piece = blockIdx.x;
  const int r0 = blockIdx.y * kRows;
  const int per = blocks_per_program[0];
  const int start = piece * per;
  const int first_row = piece_rows[piece];
  const int last_row = piece_rows[num_pieces + piece];

  auto mma_s = make_tiled_mma(typename Types<T>::MmaS{});
  auto mma_o = make_tiled_mma(typename Types<T>::MmaO{});
  auto thr_s = mma_s.get_slice(wt);
  auto thr_o = mma_o.get_slice(wt);

  // Shared-memory tensors (wgmma operands).
  Tensor sQ = make_tensor(make_smem_ptr(reinterpret_cast<E*>(smem.q)), WideK<E>{});
  Tensor sQpe = make_tensor(make_smem_ptr(reinterpret_cast<E*>(smem.qpe)), NarrowK<E>{});
  Tensor sP = make_tensor(make_smem_ptr(reinterpret_cast<E*>(smem.p)), NarrowK<E>{});
  auto tSrQ = thr_s.partition_fragment_A(sQ);
  auto tSrQpe = thr_s.partition_fragment_A(sQpe);
  auto tOrP = thr_o.partition_fragment_A(sP);

  // Which rows / columns each accumulator element holds.
  Tensor tScS = thr_s.partition_C(make_identity_tensor(Shape<Int<kRows>, _32>{}));
  Tensor tOcO = thr_o.partition_C(make_identity_tensor(Shape<Int<kRows>, _256>{}));
  Tensor acc_s = partition_fragment_C(mma_s, Shape<Int<kRows>, _32>{});
  Tensor acc_o = partition_fragment_C(mma_o, Shape<Int<kRows>, _256>{});
  // The two rows this thread holds (wgmma accumulator layout: warp w of the group has rows
  // 16 w .. 16 w + 15, lane l rows l / 4 and l / 4 + 8); slot = (row / 8) % 2.
  const int my_row0 = (wt / 32) * 16 + (wt % 32) / 4;

  for (int b = first_row; b <= last_row; ++b) {
    const int row_begin = cum_blocks[b];
    const int row_end = cum_blocks[b + 1];
    const int lo = start > row_begin ? start : row_begin;
    const int hi = start + per < row_end ? start + per : row_end;
    if (lo >= hi) continue;
    const bool whole = lo == row_begin && hi == row_end;
    const long long slot = piece + b;
    const int len = lens[b];

    const int* table_row = tilegym_cutlass::page_list(table, indptr, b, paged, ragged, num_indices, table_sb);
    auto token_rows = [&](int blk) {
      return [=](int i) {
        const int pos = blk * kTokens + i;
        if (pos >= len) return RowPair<T>{nullptr, nullptr};
        long long lat_off, rope_off;
        if (paged) {
          const long long page = tilegym_cutlass::page_of(table_row, pos, page_size, num_pages);
          const long long in_page = pos % page_size;
          lat_off = page * kv_s0 + in_page * kv_s1;
          rope_off = page * kpe_s0 + in_page * kpe_s1;
        } else {
          lat_off = b * kv_s0 + pos * kv_s1;
          rope_off = b * kpe_s0 + pos * kpe_s1;
        }
        return RowPair<T>{kv + lat_off, kpe + rope_off};
      };
    };

    __syncthreads();  // the previous segment is done with every buffer
    load_rows(smem.q, smem.qpe, [&](int i) {
      const int r = r0 + i;
      if (r >= query_rows) return RowPair<T>{nullptr, nullptr};
      const int token = r / heads, head = r - token * heads;
      return RowPair<T>{q + b * q_sb + token * q_sq + head * q_sh, qpe + b * qpe_sb + token * qpe_sq + head * qpe_sh};
    }, q);
    const int first_blk = lo - row_begin, end_blk = hi - row_begin;
    load_rows(smem.kv[0], smem.kpe[0], token_rows(first_blk), kv);
    commit_async_copies();

    // Per-row state of this thread's two rows: running max (log2 units), this thread's share of the sum.
    float m[2] = {-INFINITY, -INFINITY};
    float l[2] = {0.f, 0.f};
    int limit[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int r = r0 + my_row0 + 8 * k;
      limit[k] = causal ? len - q_len + 1 + r / heads : len;
    }
    clear(acc_o);

    for (int blk = first_blk; blk < end_blk; ++blk) {
      const int stage = (blk - first_blk) & 1;
      if (blk + 1 < end_blk) {
        load_rows(smem.kv[stage ^ 1], smem.kpe[stage ^ 1], token_rows(blk + 1), kv);
        commit_async_copies();
        wait_async_copies<1>();
      } else {
        wait_async_copies<0>();
      }
      fence_async_shared();
      __syncthreads();

      // S_w = Q . K_w^T over this warpgroup's 32 tokens.
      E* kv_stage = reinterpret_cast<E*>(smem.kv[stage]);
      E* kpe_stage = reinterpret_cast<E*>(smem.kpe[stage]);
      Tensor sK = make_tensor(make_smem_ptr(kv_stage + wg * 32 * kD), HalfWideK<E>{});
      Tensor sKpe = make_tensor(make_smem_ptr(kpe_stage + wg * 32 * kP), HalfNarrowK<E>{});
      auto tSrK = thr_s.partition_fragment_B(sK);
      auto tSrKpe = thr_s.partition_fragment_B(sKpe);
      mma_s.accumulate_ = GMMA::ScaleOut::Zero;
      warpgroup_fence_operand(acc_s);
      warpgroup_arrive();
#pragma unroll
      for (int k = 0; k < size<2>(tSrQ); ++k) {
        gemm(mma_s, tSrQ(_, _, k), tSrK(_, _, k), acc_s);
        mma_s.accumulate_ = GMMA::ScaleOut::One;
      }
#pragma unroll
      for (int k = 0; k < size<2>(tSrQpe); ++k) {
        gemm(mma_s, tSrQpe(_, _, k), tSrKpe(_, _, k), acc_s);
      }
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_s);

      // Scale, mask, and this warpgroup's row max.
      const int pos0 = blk * kTokens + wg * 32;
      float bmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int i = 0; i < size(acc_s); ++i) {
        const int k = row_half(i);
        const int pos = pos0 + get<1>(tScS(i));
        const float s = pos < limit[k] ? acc_s(i) * qk_scale_log2 : -INFINITY;
        acc_s(i) = s;
        bmax[k] = fmaxf(bmax[k], s);
      }
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        bmax[k] = fmaxf(bmax[k], __shfl_xor_sync(0xffffffff, bmax[k], 1));
        bmax[k] = fmaxf(bmax[k], __shfl_xor_sync(0xffffffff, bmax[k], 2));
        if ((wt & 3) == 0) smem.red[wg][my_row0 + 8 * k] = bmax[k];
      }
      bar_sync_both();
      float m_safe[2], alpha[2];
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int row = my_row0 + 8 * k;
        const float m_new = fmaxf(m[k], fmaxf(smem.red[0][row], smem.red[1][row]));
        // A row that has seen no token yet keeps m = -inf: shift by 0 then (no inf - inf).
        m_safe[k] = m_new == -INFINITY ? 0.f : m_new;
        alpha[k] = exp2f(m[k] - m_safe[k]);
        m[k] = m_new;
        l[k] *= alpha[k];
      }
      // P_w = exp2(S_w - m) -> shared memory, rows' sums.
#pragma unroll
      for (int i = 0; i < size(acc_s); ++i) {
        const int row = get<0>(tScS(i));
        const int k = row_half(i);
        const float p = exp2f(acc_s(i) - m_safe[k]);
        l[k] += p;
        *reinterpret_cast<T*>(smem.p + narrow_offset(row, wg * 32 + get<1>(tScS(i)))) = Types<T>::from_float(p);
      }
#pragma unroll
      for (int i = 0; i < size(acc_o); ++i) {
        acc_o(i) *= alpha[row_half(i)];
      }
      fence_async_shared();
      bar_sync_both();

      // O_w += P . V_w (this warpgroup's 256 columns, all 64 tokens).
      Tensor sVt = make_tensor(make_smem_ptr(kv_stage), WideMN<E>{});
      Tensor sV = local_tile(sVt, Shape<_256, Int<kTokens>>{}, make_coord(wg, 0));
      auto tOrV = thr_o.partition_fragment_B(sV);
      warpgroup_fence_operand(acc_o);
      warpgroup_arrive();
#pragma unroll
      for (int k = 0; k < size<2>(tOrP); ++k) {
        gemm(mma_o, tOrP(_, _, k), tOrV(_, _, k), acc_o);
      }
      warpgroup_commit_batch();
      warpgroup_wait<0>();
      warpgroup_fence_operand(acc_o);
      __syncthreads();  // both warpgroups are done with this stage before it is refilled
    }

    // Row sums: this thread's share -> the quad's -> both warpgroups'.
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      l[k] += __shfl_xor_sync(0xffffffff, l[k], 1);
      l[k] += __shfl_xor_sync(0xffffffff, l[k], 2);
      if ((wt & 3) == 0) smem.red[wg][my_row0 + 8 * k] = l[k];
    }
    bar_sync_both();
    float inv[2];
    float lse[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int row = my_row0 + 8 * k;
      const float total = smem.red[0][row] + smem.red[1][row];
      // A row that saw no token: zeros and lse -inf. NaN in the data makes total NaN: NaN out.
      const bool empty = total == 0.f;
      inv[k] = empty ? 0.f : 1.f / total;
      lse[k] = empty ? -INFINITY : (m[k] + log2f(total)) * kLn2;
    }
    if (whole) {
      T* out_base = out + (long long)b * query_rows * kD;
#pragma unroll
      for (int i = 0; i < size(acc_o); ++i) {
        const int row = get<0>(tOcO(i));
        const int r = r0 + row;
        if (r < query_rows) {
          out_base[(long long)r * kD + wg * 256 + get<1>(tOcO(i))] = Types<T>::from_float(acc_o(i) * inv[row_half(i)]);
        }
      }
      if (write_lse && wg == 0 && (wt & 3) == 0) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const int r = r0 + my_row0 + 8 * k;
          if (r < query_rows) out_lse[(long long)b * query_rows + r] = lse[k];
        }
      }
    } else {
      float* part_base = part_out + slot * query_rows * kD;
#pragma unroll
      for (int i = 0; i < size(acc_o); ++i) {
        const int row = get<0>(tOcO(i));
        const int r = r0 + row;
        if (r < query_rows) {
          part_base[(long long)r * kD + wg * 256 + get<1>(tOcO(i))] = acc_o(i) * inv[row_half(i)];
        }
      }
      if (wg == 0 && (wt & 3) == 0) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          const int r = r0 + my_row0 + 8 * k;
          if (r < query_rows) part_lse[slot * query_rows + r] = lse[k];
        }
      }
    }
  }
}
