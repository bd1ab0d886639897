// MLA decoding over a split schedule: one program = (piece, query-row group), one wave in all.
//
// The schedule (tilegym/ops/schedule.py) cuts the step's KV blocks into pieces [piece_bounds[p],
// piece_bounds[p + 1]), balanced in blocks plus segment starts; the program of piece p walks the rows
// it meets (piece_rows[0][p] .. piece_rows[1][p]) and, for each, attends
// BLOCK_H query rows (new token x head pairs, r = token * heads + head) of row b to the row's KV
// blocks [lo, hi) inside the piece, BLOCK_N tokens per step. It loads a [BLOCK_N, 512] latent tile and a
// [BLOCK_N, 64] rope tile ONCE per step and uses them for all BLOCK_H rows: as K for the scores
// (S^T[N, H] = kv[N, 512] . q^T[512, H] + kpe[N, 64] . qpe^T[64, H]) and as V for the output
// (acc^T[512, H] += kv^T[512, N] . P^T[N, H]), with an online (exp2) softmax in float32.
// A segment that is the whole row writes the final output (dtype T) and lse; the others write a
// float32 partial output and natural-log lse to work slot p + b, merged by mla_decoding_combine.cuh.
//
// LAYOUT: 0 dense rows (kv[b, t]); 1 pages of at least BLOCK_N tokens (one page id per step, read a
// step ahead; the tile is contiguous like a dense one); 2 smaller pages (one page id and one strided
// load per page).
// Page ids come from a block-table row (ragged = 0) or from kv_indices[kv_indptr[b]:] (ragged =
// 1); they are clamped to [0, num_pages), lengths were clamped to the row's pages by the
// schedule: no read leaves the cache. Causal MTP: token i of a row of length L sees positions
// < L - q_len + 1 + i.
// OCCUPANCY is the compiler hint for CTAs per SM.
//
// Types: T is the query and output dtype (bf16/fp16); KV the cache element (T, or __nv_fp8_e4m3
// for an fp8 cache whose value is kv * kv_scale); M the MMA element type (T; __half with an fp8
// cache). An fp8 tile is widened to M (exact), never scaled: kv_scale, read once per program from
// its device pointer (no host sync, graph-safe), multiplies the score scale, and, since V is the
// same latent tile, the output once (out = (P . kv_fp8) * kv_scale / l). A bf16 query is then
// rescaled per row by a power of two and cast to f16 (exact for entries within 2^24 of the row's
// largest), its factor folded into that row's score scale. Tile size built for fp8: 16 x 64
// (BLOCK_H x BLOCK_N) for every head count. The fp8 tiles arrive by 128-bit async copies like 16-bit
// ones; the MMA warps then widen them from shared memory (SASS: LDS.U16 + F2FP.F16.E4M3 + STS.128
// per pair of elements), which bounds the fp8 kernel by instruction latency, not by memory
// (benchmarks/NOTES_tilecpp.md, "fp8 cache").
//
// Memory traffic per program (D = 512, P = 64, L = tokens of its piece, e = 2 B for a bf16/fp16
// cache and 1 B for fp8, t = 2 B for the query/output dtype):
//   reads  L * 576 * e of KV (once, whatever BLOCK_H), and per row met BLOCK_H * 576 * t of
//          queries (+ one 4-byte page id per step or per token with pages, + 4 B of kv_scale),
//   writes per row met BLOCK_H * 512 * 4 B of partial output + BLOCK_H * 4 B of lse (a whole
//          row: BLOCK_H * 512 * t, final).
// Whole launch with one query-row group: the cache of the tokens present, once.
//
// Sizes, strides, lengths and the schedule are runtime arguments; only the dtypes, the tile shape
// and the layout kind are template parameters. Strides are in elements; rows must be 16-byte
// aligned (the launcher checks), so loads are 128-bit vectors.
#pragma once

#include <cuda_fp8.h>

#include "common.cuh"

namespace tilegym {

// Rows [pos0, pos0 + N) of one batch row whose pages (PAGE tokens each) are listed at table_row,
// as one [N, W] tile: one scalar page id and one strided load per page, concatenated, so every
// load stays a plain strided tile (the tile compiler turns those into async copies that feed
// wgmma; a per-token gathered tile does not). Positions at or past len read nothing.
template <int N, int PAGE, int W, typename T>
__tile__ auto load_paged_rows(const T* base, const int* table_row, int pos0, int len, int num_pages, long long s0,
                              long long s1) {
  namespace ct = cuda::tiles;
  if constexpr (N == PAGE) {
    int page = pos0 < len ? table_row[pos0 / PAGE] : 0;
    page = page < 0 ? 0 : (page >= num_pages ? num_pages - 1 : page);
    auto n = ct::reshape(ct::iota<ct::tile<int, ct::shape<PAGE>>>(), ct::shape<PAGE, 1>{});
    auto w = ct::reshape(ct::iota<ct::tile<int, ct::shape<W>>>(), ct::shape<1, W>{});
    return ct::load_masked(base + page * s0 + (n * (int)s1 + w), (n + pos0) < len, T(0));
  } else {
    return ct::cat(load_paged_rows<N / 2, PAGE, W>(base, table_row, pos0, len, num_pages, s0, s1),
                   load_paged_rows<N / 2, PAGE, W>(base, table_row, pos0 + N / 2, len, num_pages, s0, s1),
                   ct::integral_constant<0>{});
  }
}

template <typename A, typename B>
inline constexpr bool same_v = false;
template <typename A>
inline constexpr bool same_v<A, A> = true;

// A cache tile as T for the MMAs: an fp8 tile is widened (exact: e4m3 fits in bf16 and fp16); a T
// tile is returned as is.
template <typename T, typename KV, typename Tile>
__tile__ auto widen(Tile t) {
  if constexpr (sizeof(KV) == sizeof(T)) {
    return t;
  } else {
    return cuda::tiles::element_cast<T>(t);
  }
}

// The first row in [b, last] that holds blocks. The schedule starts and ends every piece on a row with
// blocks, so the piece's loop visits only rows it has blocks of: an empty row inside a piece is passed
// over here, with no branch around a row's pass (one on the H200 did not finish, session 24).
__tile__ inline int next_row_with_blocks(const int* __restrict__ cum_blocks, int b, int last) {
  while (b < last && cum_blocks[b + 1] == cum_blocks[b]) ++b;
  return b;
}

}  // namespace tilegym

template <typename T, typename KV, typename M, int BLOCK_H, int BLOCK_N, int OCCUPANCY, int LAYOUT, int PAGE_SIZE>
[[using cutile: hint(0, occupancy = OCCUPANCY)]]
__tile_global__ void mla_decode_split_kernel(
    const T* __restrict__ q, const T* __restrict__ qpe, const KV* __restrict__ kv, const KV* __restrict__ kpe,
    const int* __restrict__ table, const int* __restrict__ indptr, const int* __restrict__ lens,
    const int* __restrict__ cum_blocks, const int* __restrict__ piece_bounds, const int* __restrict__ piece_rows,
    const float* __restrict__ kv_scale,
    T* __restrict__ out, float* __restrict__ out_lse, float* __restrict__ part_out, float* __restrict__ part_lse,
    int heads, int q_len, int query_rows, int causal, int write_lse, int page_size, int num_pages, int num_indices,
    int ragged, int num_pieces, long long q_sb, long long q_sq, long long q_sh, long long qpe_sb, long long qpe_sq, long long qpe_sh,
    long long kv_s0, long long kv_s1, long long kpe_s0, long long kpe_s1, long long table_sb, float qk_scale_log2) {
  namespace ct = cuda::tiles;
  constexpr int D = 512;  // latent width: K's first D columns and all of V
  constexpr int P = 64;   // rope width: the rest of K
  // An fp8 cache (KV = __nv_fp8_e4m3, 1 byte) holds value / kv_scale: its tiles are widened to T in
  // registers (exact), the scale goes once into the score scale and once into the output.
  constexpr bool FP8 = sizeof(KV) == 1;
  // M: the MMA element type. T for a T cache; for an fp8 cache T or __half (one-instruction e4m3 ->
  // f16 widening; a bf16 query is then rescaled per row by a power of two and cast to f16: exact for
  // every entry within 2^24 of the row's largest).
  constexpr bool RESCALE_Q = FP8 && !tilegym::same_v<M, T>;
  using i32_H = ct::tile<int, ct::shape<BLOCK_H>>;
  using i32_N = ct::tile<int, ct::shape<BLOCK_N>>;
  using i32_D = ct::tile<int, ct::shape<D>>;
  using i32_P = ct::tile<int, ct::shape<P>>;
  using f32_NH = ct::tile<float, ct::shape<BLOCK_N, BLOCK_H>>;
  using f32_1H = ct::tile<float, ct::shape<1, BLOCK_H>>;
  using f32_DH = ct::tile<float, ct::shape<D, BLOCK_H>>;

  q = ct::assume_aligned<16>(q);
  qpe = ct::assume_aligned<16>(qpe);
  kv = ct::assume_aligned<16>(kv);
  kpe = ct::assume_aligned<16>(kpe);
  part_out = ct::assume_aligned<16>(part_out);
  q_sb = ct::assume_divisible<8>(q_sb);
  q_sq = ct::assume_divisible<8>(q_sq);
  q_sh = ct::assume_divisible<8>(q_sh);
  qpe_sb = ct::assume_divisible<8>(qpe_sb);
  qpe_sq = ct::assume_divisible<8>(qpe_sq);
  qpe_sh = ct::assume_divisible<8>(qpe_sh);
  constexpr int KV_VEC = 16 / sizeof(KV);  // cache elements per 16 bytes
  kv_s0 = ct::assume_divisible<KV_VEC>(kv_s0);
  kv_s1 = ct::assume_divisible<KV_VEC>(kv_s1);
  kpe_s0 = ct::assume_divisible<KV_VEC>(kpe_s0);
  kpe_s1 = ct::assume_divisible<KV_VEC>(kpe_s1);

  float v_scale = 1.0f;
  if constexpr (FP8) {
    v_scale = kv_scale[0];  // device scalar: no host sync
    qk_scale_log2 = qk_scale_log2 * v_scale;
  }

  const int piece = ct::bid().x;
  const int r0 = ct::bid().y * BLOCK_H;
  const int start = piece_bounds[piece];
  const int end = piece_bounds[piece + 1];
  const int first_row = piece_rows[piece];
  const int last_row = piece_rows[num_pieces + piece];

  auto r = ct::iota<i32_H>() + r0;
  auto r_ok = r < query_rows;
  auto token = r / ct::full<i32_H>(heads);
  auto head = r - token * heads;
  auto r_ok_col = ct::reshape(r_ok, ct::shape<BLOCK_H, 1>{});
  auto d_row = ct::reshape(ct::iota<i32_D>(), ct::shape<1, D>{});
  auto p_row = ct::reshape(ct::iota<i32_P>(), ct::shape<1, P>{});
  auto n_col = ct::reshape(ct::iota<i32_N>(), ct::shape<BLOCK_N, 1>{});

  // A plain loop, not ct::irange: the tile compiler then emits the row's pass once (ct::irange: two or
  // three copies; 16 x 64 on sm_90: 272 wgmma sites and no spills, against 544-816 and 112-336 bytes).
  for (int b = first_row; b <= last_row; b = tilegym::next_row_with_blocks(cum_blocks, b + 1, last_row)) {
    const int row_begin = cum_blocks[b];
    const int row_end = cum_blocks[b + 1];
    const int lo = start > row_begin ? start : row_begin;
    const int hi = end < row_end ? end : row_end;
    // lo < hi here (rows without blocks are passed over; were one entered, its pass would run no step
    // and write the empty row's answer, zeros and lse -inf).
    {
      const bool whole = lo == row_begin && hi == row_end;
      const int slot = piece + b;
      const int len = lens[b];
      // Query rows stay inside one batch row: their offsets are small int32.
      auto q_rows = ct::reshape(token * (int)q_sq + head * (int)q_sh, ct::shape<BLOCK_H, 1>{});
      auto qpe_rows = ct::reshape(token * (int)qpe_sq + head * (int)qpe_sh, ct::shape<BLOCK_H, 1>{});
      auto q_in = ct::transpose(ct::load_masked(q + b * q_sb + (q_rows + d_row), r_ok_col, T(0)));
      auto qpe_in = ct::transpose(ct::load_masked(qpe + b * qpe_sb + (qpe_rows + p_row), r_ok_col, T(0)));
      // Scores of this row group, log2 units: S * score_scale (per query row when the query is rescaled).
      auto score_scale = ct::full<f32_1H>(qk_scale_log2);
      ct::tile<M, ct::shape<D, BLOCK_H>> q_dh;
      ct::tile<M, ct::shape<P, BLOCK_H>> qpe_ph;
      if constexpr (RESCALE_Q) {
        auto q32 = ct::element_cast<float>(q_in);
        auto qpe32 = ct::element_cast<float>(qpe_in);
        auto amax = ct::max(ct::reduce_max(ct::abs(q32), ct::integral_constant<0>{}),
                            ct::reduce_max(ct::abs(qpe32), ct::integral_constant<0>{}));
        // Largest entry to [2^14, 2^15): far from the f16 maximum, and the scores undo it exactly.
        auto head_scale = ct::exp2(ct::floor(ct::log2(ct::select(amax > 0.0f, amax, ct::full<f32_1H>(1.0f)))) - 14.0f);
        q_dh = ct::element_cast<M>(q32 / head_scale);
        qpe_ph = ct::element_cast<M>(qpe32 / head_scale);
        score_scale = score_scale * head_scale;
      } else {
        q_dh = q_in;
        qpe_ph = qpe_in;
      }

      // Causal MTP: the last position each query row may see (exclusive), as a [1, BLOCK_H] row.
      auto limit_h = causal ? (token + (len - q_len + 1)) : ct::full<i32_H>(len);
      auto limit = ct::reshape(limit_h, ct::shape<1, BLOCK_H>{});

      const int* table_row = table;
      if (LAYOUT != 0) {
        if (ragged) {
          int start = indptr[b];
          start = start < 0 ? 0 : (start > num_indices ? num_indices : start);
          table_row = table + start;
        } else {
          table_row = table + b * table_sb;
        }
      }

      auto m = ct::full<f32_1H>(-INFINITY);  // running max of the log2-scaled scores
      auto l = ct::zeros<f32_1H>();           // running sum of exp2(score - m)
      auto acc = ct::zeros<f32_DH>();         // running unnormalised output, transposed

      // Offsets inside one contiguous [BLOCK_N, *] step stay small (int32); the step's base pointer
      // carries the 64-bit row, page and token offsets.
      auto kv_offs = n_col * (int)kv_s1 + d_row;
      auto kpe_offs = n_col * (int)kpe_s1 + p_row;
      // LAYOUT 1: each step's page id is read one step ahead, so no tile load's address waits on a load
      // of its own step (read in the step, the 16 x 64 build spilled 584 bytes and pages of 64 ran 1.7x
      // slower: session 26).
      int page_next = 0;
      if constexpr (LAYOUT == 1) page_next = table_row[(lo - row_begin) * BLOCK_N / page_size];
      for (int blk : ct::irange(lo - row_begin, hi - row_begin)) {
        const int pos0 = blk * BLOCK_N;
        auto pos = n_col + pos0;
        auto row_ok = pos < len;
        ct::tile<KV, ct::shape<BLOCK_N, D>> kv_t;
        ct::tile<KV, ct::shape<BLOCK_N, P>> kpe_t;
        if constexpr (LAYOUT == 0) {
          kv_t = ct::load_masked(kv + b * kv_s0 + pos0 * kv_s1 + kv_offs, row_ok, KV(0));
          kpe_t = ct::load_masked(kpe + b * kpe_s0 + pos0 * kpe_s1 + kpe_offs, row_ok, KV(0));
        } else if constexpr (LAYOUT == 1) {
          int page = page_next;
          page = page < 0 ? 0 : (page >= num_pages ? num_pages - 1 : page);
          if (blk + 1 < hi - row_begin) page_next = table_row[(pos0 + BLOCK_N) / page_size];
          const long long slot0 = pos0 % page_size;
          kv_t = ct::load_masked(kv + page * kv_s0 + slot0 * kv_s1 + kv_offs, row_ok, KV(0));
          kpe_t = ct::load_masked(kpe + page * kpe_s0 + slot0 * kpe_s1 + kpe_offs, row_ok, KV(0));
        } else {
          // Pages smaller than a step (PAGE_SIZE tokens, a template argument): one page id and one
          // strided load per page.
          kv_t = tilegym::load_paged_rows<BLOCK_N, PAGE_SIZE, D>(kv, table_row, pos0, len, num_pages, kv_s0, kv_s1);
          kpe_t = tilegym::load_paged_rows<BLOCK_N, PAGE_SIZE, P>(kpe, table_row, pos0, len, num_pages, kpe_s0, kpe_s1);
        }
        auto kv_w = tilegym::widen<M, KV>(kv_t);
        auto kpe_w = tilegym::widen<M, KV>(kpe_t);
        auto s = ct::mma(kpe_w, qpe_ph, ct::mma(kv_w, q_dh, ct::zeros<f32_NH>()));
        if constexpr (RESCALE_Q) {
          s = s * score_scale;
        } else {
          s = s * qk_scale_log2;
        }
        s = ct::select(pos < limit, s, ct::full<f32_NH>(-INFINITY));
        auto m_new = ct::max(m, ct::reduce_max(s, ct::integral_constant<0>{}));
        // A query row that sees no token of this step (causal MTP) keeps m = -inf: shift by 0 then.
        auto m_safe = ct::select(m_new == -INFINITY, ct::zeros<f32_1H>(), m_new);
        auto p = ct::exp2(s - m_safe);
        auto alpha = ct::exp2(m - m_safe);
        l = l * alpha + ct::sum(p, ct::integral_constant<0>{});
        acc = ct::mma(ct::transpose(kv_w), ct::element_cast<M>(p), acc * alpha);
        m = m_new;
      }

      // A query row that saw no token writes zeros and lse = -inf (the combine ignores it); NaN in
      // the row's data makes l NaN, and then the lse too, so the combine keeps the NaN.
      auto empty = l == 0.0f;
      auto out_dh = acc / ct::select(empty, ct::full<f32_1H>(1.0f), l);
      if constexpr (FP8) out_dh = out_dh * v_scale;
      auto lse = ct::select(empty, ct::full<f32_1H>(-INFINITY), (m + ct::log2(l)) * tilegym::kLn2);
      auto r_col = ct::reshape(r, ct::shape<BLOCK_H, 1>{});
      if (whole) {
        // out [B, Q, H, D] and lse [B, Q, H], contiguous: query row r of batch row b is b * query_rows + r.
        T* out_base = out + (long long)b * query_rows * D;
        ct::store_masked(out_base + (r_col * D + d_row), ct::element_cast<T>(ct::transpose(out_dh)), r_ok_col);
        if (write_lse) {
          ct::store_masked(out_lse + (long long)b * query_rows + ct::reshape(r, ct::shape<1, BLOCK_H>{}), lse,
                           ct::reshape(r_ok, ct::shape<1, BLOCK_H>{}));
        }
      } else {
        // part_out [slots, query_rows, D] and part_lse [slots, query_rows], contiguous.
        float* part_base = part_out + (long long)slot * query_rows * D;
        ct::store_masked(part_base + (r_col * D + d_row), ct::transpose(out_dh), r_ok_col);
        ct::store_masked(part_lse + (long long)slot * query_rows + r, ct::reshape(lse, ct::shape<BLOCK_H>{}), r_ok);
      }
    }
  }
}
