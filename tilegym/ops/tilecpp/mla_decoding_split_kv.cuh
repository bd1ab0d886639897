// MLA decoding, split-KV stage: one program = (split, head group, batch row).
//
// Each program attends BLOCK_H query heads of one batch row to the KV tokens of one split,
// BLOCK_N tokens per step. It loads a [BLOCK_N, 512] latent tile and a [BLOCK_N, 64] rope tile
// ONCE per step and uses them for all BLOCK_H heads: as K for the scores
// (S^T[N, H] = kv[N, 512] . q^T[512, H] + kpe[N, 64] . qpe^T[64, H]) and as V for the output
// (acc^T[512, H] += kv^T[512, N] . P^T[N, H]), with an online (exp2) softmax in float32.
// It writes the split's normalised float32 output and its natural-log lse; splitk_reduce.cuh
// merges the splits. With a single split the program writes the final output (dtype T) and
// lse directly and no combine runs.
// OCCUPANCY is the compiler hint for CTAs per SM (2 makes it fit two ~110 KB programs per SM).
//
// Memory traffic per program (bf16/fp16, D = 512, P = 64, L = tokens of its split):
//   reads  L * 576 * 2 B of KV (once, whatever BLOCK_H) + BLOCK_H * 576 * 2 B of q/qpe,
//   writes BLOCK_H * (512 + 1) * 4 B of partial output and lse (one split: BLOCK_H * 512 * 2 B).
// Whole launch: B * S * 1152 B of KV per head group (the minimum when one group holds all heads)
//   + B * H * N_splits * 2052 B of partials, which splitk_reduce reads back once.
//
// Sizes (heads, seq_len, splits, strides, kv_lens) are runtime arguments; only the dtype and
// the tile shape are template parameters. Strides are in elements; kv/kpe rows and q/qpe
// heads must be 16-byte aligned (the launcher checks), so loads are 128-bit vectors.
#pragma once

#include "common.cuh"

template <typename T, int BLOCK_H, int BLOCK_N, int OCCUPANCY>
[[using cutile: hint(0, occupancy = OCCUPANCY)]]
__tile_global__ void mla_split_kv_kernel(const T* __restrict__ q, const T* __restrict__ qpe,
                                         const T* __restrict__ kv, const T* __restrict__ kpe,
                                         const int* __restrict__ kv_lens, float* __restrict__ partial_out,
                                         float* __restrict__ partial_lse, T* __restrict__ out,
                                         float* __restrict__ out_lse, int heads, int seq_len, int num_splits,
                                         int kv_len_per_split, int has_kv_lens, int write_lse, long long q_sb,
                                         long long q_sh, long long qpe_sb, long long qpe_sh, long long kv_sb,
                                         long long kv_ss, long long kpe_sb, long long kpe_ss, float qk_scale_log2) {
  namespace ct = cuda::tiles;
  constexpr int D = 512;  // latent width: K's first D columns and all of V
  constexpr int P = 64;   // rope width: the rest of K
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
  partial_out = ct::assume_aligned<16>(partial_out);
  q_sb = ct::assume_divisible<8>(q_sb);
  q_sh = ct::assume_divisible<8>(q_sh);
  qpe_sb = ct::assume_divisible<8>(qpe_sb);
  qpe_sh = ct::assume_divisible<8>(qpe_sh);
  kv_sb = ct::assume_divisible<8>(kv_sb);
  kv_ss = ct::assume_divisible<8>(kv_ss);
  kpe_sb = ct::assume_divisible<8>(kpe_sb);
  kpe_ss = ct::assume_divisible<8>(kpe_ss);

  const int split = ct::bid().x;
  const int h0 = ct::bid().y * BLOCK_H;
  const int b = ct::bid().z;

  // This split covers tokens [start, stop): clamp the row length to [0, seq_len] first.
  int len = seq_len;
  if (has_kv_lens) {
    len = kv_lens[b];
    len = len < 0 ? 0 : (len > seq_len ? seq_len : len);
  }
  const int start = split * kv_len_per_split;
  const int stop = start + kv_len_per_split < len ? start + kv_len_per_split : len;

  auto h = ct::iota<i32_H>();
  auto h_ok = (h + h0) < heads;
  auto h_col = ct::reshape(h, ct::shape<BLOCK_H, 1>{});
  auto h_ok_col = ct::reshape(h_ok, ct::shape<BLOCK_H, 1>{});
  auto d_row = ct::reshape(ct::iota<i32_D>(), ct::shape<1, D>{});
  auto p_row = ct::reshape(ct::iota<i32_P>(), ct::shape<1, P>{});
  auto n_col = ct::reshape(ct::iota<i32_N>(), ct::shape<BLOCK_N, 1>{});

  const T* q_base = q + b * q_sb + h0 * q_sh;
  const T* qpe_base = qpe + b * qpe_sb + h0 * qpe_sh;
  auto q_dh = ct::transpose(ct::load_masked(q_base + (h_col * (int)q_sh + d_row), h_ok_col, T(0)));
  auto qpe_ph = ct::transpose(ct::load_masked(qpe_base + (h_col * (int)qpe_sh + p_row), h_ok_col, T(0)));

  auto m = ct::full<f32_1H>(-INFINITY);  // running max of the log2-scaled scores
  auto l = ct::zeros<f32_1H>();           // running sum of exp2(score - m)
  auto acc = ct::zeros<f32_DH>();         // running unnormalised output, transposed

  // Offsets inside one [BLOCK_N, *] step stay small, so they are int32; the step's base
  // pointer carries the (64-bit) batch and token offsets.
  auto kv_offs = n_col * (int)kv_ss + d_row;
  auto kpe_offs = n_col * (int)kpe_ss + p_row;
  const int num_blocks = stop > start ? (stop - start + BLOCK_N - 1) / BLOCK_N : 0;
  for (int blk : ct::irange(0, num_blocks)) {
    const int pos0 = start + blk * BLOCK_N;
    auto row_ok = (n_col + pos0) < stop;
    const T* kv_blk = kv + b * kv_sb + pos0 * kv_ss;
    const T* kpe_blk = kpe + b * kpe_sb + pos0 * kpe_ss;
    auto kv_t = ct::load_masked(kv_blk + kv_offs, row_ok, T(0));
    auto kpe_t = ct::load_masked(kpe_blk + kpe_offs, row_ok, T(0));
    auto s = ct::mma(kpe_t, qpe_ph, ct::mma(kv_t, q_dh, ct::zeros<f32_NH>()));
    s = ct::select(row_ok, s * qk_scale_log2, ct::full<f32_NH>(-INFINITY));
    // Every step holds at least one valid token, so m_new is finite from the first step on.
    auto m_new = ct::max(m, ct::reduce_max(s, ct::integral_constant<0>{}));
    auto p = ct::exp2(s - m_new);
    auto alpha = ct::exp2(m - m_new);
    l = l * alpha + ct::sum(p, ct::integral_constant<0>{});
    acc = ct::mma(ct::transpose(kv_t), ct::element_cast<T>(p), acc * alpha);
    m = m_new;
  }

  // An empty split (no valid token) writes zeros and lse = -inf, which the combine ignores.
  auto nonempty = l > 0.0f;
  auto out_dh = acc / ct::select(nonempty, l, ct::full<f32_1H>(1.0f));
  auto lse = ct::select(nonempty, (m + ct::log2(l)) * tilegym::kLn2, ct::full<f32_1H>(-INFINITY));

  auto h_row_ok = ct::reshape(h_ok, ct::shape<1, BLOCK_H>{});
  if (num_splits == 1) {
    // One split: this program's result is final. Write out [B, H, D] (contiguous) in T and the
    // lse [B, H] when asked, and skip the combine.
    T* out_base = out + ((long long)b * heads + h0) * D;
    ct::store_masked(out_base + (h_col * D + d_row), ct::element_cast<T>(ct::transpose(out_dh)), h_ok_col);
    if (write_lse) {
      ct::store_masked(out_lse + ((long long)b * heads + h0) + ct::reshape(h, ct::shape<1, BLOCK_H>{}), lse, h_row_ok);
    }
  } else {
    // partial_out [B, H, num_splits, D] and partial_lse [B, H, num_splits], contiguous.
    float* out_base = partial_out + (((long long)b * heads + h0) * num_splits + split) * D;
    ct::store_masked(out_base + (h_col * (num_splits * D) + d_row), ct::transpose(out_dh), h_ok_col);
    float* lse_base = partial_lse + ((long long)b * heads + h0) * num_splits + split;
    ct::store_masked(lse_base + h * num_splits, ct::reshape(lse, ct::shape<BLOCK_H>{}), h_ok);
  }
}
