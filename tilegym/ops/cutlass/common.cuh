// Shared helpers of the cutlass backend's kernels (mla_decoding_split_kv.cuh, the wgmma kernel, and
// mla_decoding_split_kv_fp8.cuh): asynchronous 16-byte copies, the proxy fence before wgmma reads
// them, shared addresses, exp2, two floats packed as 16-bit values, mbarriers and TMA loads, and the
// page lookup and TMA box coordinates of the split schedule's cache layouts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

namespace tilegym_cutlass {

// 16 bytes global -> shared without registers; valid = false reads nothing and zero-fills the chunk
// (gmem must still be a valid address).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void commit_async_copies() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait_async_copies() {  // all but the N newest groups have landed
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Generic-proxy writes (cp.async, st.shared) become visible to wgmma (async proxy) after this fence
// and a barrier.
__device__ __forceinline__ void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// The shared-state-space address of a pointer into shared memory (what PTX shared:: operands take).
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 2^x on the MUFU unit (flushes denormal results to zero; 2^-inf = 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// a and b rounded to T (bf16 or fp16; the pointer only picks the type), as one 32-bit word, a in the low half.
__device__ __forceinline__ uint32_t pack_pair(const __nv_bfloat16*, float a, float b) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack_pair(const __half*, float a, float b) {
  const __half2 v = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// mbarriers (one arrival each here) and TMA: a box of a 3-D tensor map completes its bytes on an
// mbarrier that expected them.
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_bytes(uint64_t* bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(bar)), "r"(bytes) : "memory");
}
// One arrival on bar (its phase completes after the count given to mbar_init).
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_address(bar)) : "memory");
}
// The L2 policy a cache load passes (createpolicy): evict_first for a stream read once, so that it does
// not push out of L2 what is read again later, the partial outputs the combine reads at the end
// (FlashMLA gives its KV loads the same hint; same-process A/B with 16-64 heads 1-3% faster, session 22);
// evict_normal (no preference) where a cluster partner reads the same lines a little later.
__device__ __forceinline__ uint64_t l2_policy(bool evict_first) {
  uint64_t policy;
  if (evict_first)
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  else
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
// TMA: the box at (c0, c1, c2) of the tensor map at `map` (a __grid_constant__ parameter) -> dst;
// its bytes complete on bar; L2 keeps the lines as `policy` says (l2_policy).
__device__ __forceinline__ void tma_load_3d(void* dst, const void* map, int c0, int c1, int c2, uint64_t* bar,
                                            uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3, "
      "%4}], [%5], %6;\n" ::"r"(shared_address(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(shared_address(bar)), "l"(policy)
      : "memory");
}
// The same for a 4-D map: the box at (c0, c1, c2, c3).
__device__ __forceinline__ void tma_load_4d(void* dst, const void* map, int c0, int c1, int c2, int c3, uint64_t* bar,
                                            uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, %3, "
      "%4, %5}], [%6], %7;\n" ::"r"(shared_address(dst)),
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(shared_address(bar)), "l"(policy)
      : "memory");
}
// A contiguous copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) global -> dst; its
// bytes complete on bar. For rows too narrow for a TMA box (a tensor copy writes whole 128-byte
// aligned destinations).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, int bytes, uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;\n" ::"r"(
          shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(bar)), "l"(policy)
      : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, int parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(shared_address(bar)), "r"(parity)
        : "memory");
  }
}

// Distributed shared memory (clusters): the address of the same shared variable in CTA `rank` of the
// cluster, a float store there, an arrival on an mbarrier there (ordered after this thread's earlier
// stores, cluster scope), a wait on a local mbarrier that remote CTAs arrive on, and the cluster's
// barrier (every thread of every CTA of the cluster).
__device__ __forceinline__ uint32_t cluster_address(const void* p, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(shared_address(p)), "r"(rank));
  return remote;
}
__device__ __forceinline__ void cluster_store(uint32_t remote, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(remote), "f"(v) : "memory");
}
__device__ __forceinline__ void cluster_store2(uint32_t remote, float a, float b) {
  asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};\n" ::"r"(remote), "f"(a), "f"(b) : "memory");
}
__device__ __forceinline__ void cluster_arrive_remote(uint32_t remote_bar) {
  asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(remote_bar) : "memory");
}
__device__ __forceinline__ void mbar_wait_cluster(uint64_t* bar, int parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(shared_address(bar)), "r"(parity)
        : "memory");
  }
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void fence_mbarrier_init_cluster() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// Programmatic dependent launch (sm_90): a split kernel lets the next kernel of its stream (the
// combine, launched with programmatic stream serialization) start once every CTA has said so; the
// combine waits for the split grid to finish, and its writes to be visible, before it reads them.
// Both are no-ops in a launch without that attribute.
__device__ __forceinline__ void allow_dependent_launch() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
__device__ __forceinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

// Asks L2 to hold the 128-byte line at p (no register, no wait).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }

// Batch row b's page list: a block-table row (paged), or kv_indices[kv_indptr[b]:] (ragged, the
// start clamped to the list). Unused for dense caches.
__device__ __forceinline__ const int* page_list(const int* table, const int* indptr, int b, int paged, int ragged,
                                                int num_indices, long long table_sb) {
  if (!paged) return table;
  if (!ragged) return table + b * table_sb;
  int s = indptr[b];
  s = s < 0 ? 0 : (s > num_indices ? num_indices : s);
  return table + s;
}

// The page holding position pos of a row, clamped to [0, num_pages): no read leaves the cache.
__device__ __forceinline__ int page_of(const int* pages, int pos, int page_size, int num_pages) {
  const int page = pages[pos / page_size];
  return page < 0 ? 0 : (page >= num_pages ? num_pages - 1 : page);
}

// TMA boxes of box_rows tokens that block blk (block_tokens tokens) of a row of len tokens needs:
// boxes wholly past the length are not loaded (nor their bytes expected).
__device__ __forceinline__ int boxes_in_block(int blk, int block_tokens, int len, int box_rows) {
  const int rem = len - blk * block_tokens;
  return min(block_tokens / box_rows, (rem + box_rows - 1) / box_rows);
}

// The (unit, row) coordinates of position pos of batch row b in a cache map viewed as [units, rows,
// columns]: (b, pos) for a dense cache, (its page, pos % page_size) for a paged one.
struct BoxOrigin {
  int unit, row;
};
__device__ __forceinline__ BoxOrigin box_origin(const int* pages, int b, int pos, int paged, int page_size,
                                                int num_pages) {
  BoxOrigin at{b, pos};
  if (paged) {
    at.unit = page_of(pages, pos, page_size, num_pages);
    at.row = pos % page_size;
  }
  return at;
}

}  // namespace tilegym_cutlass
