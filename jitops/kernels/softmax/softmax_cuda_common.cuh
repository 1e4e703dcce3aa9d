// Device helpers shared by the softmax forward and backward CUDA kernels:
// 16-byte vector packs, warp and block reductions, the (max, sum) pair of
// online softmax, and the host-side shape classes.
//
// Shape classes (both directions; `n` is the length of the softmax dim):
//   inner == 1, n <= 1024          a warp, or a sub-warp of 1..32 lanes, per row;
//                                  the row lives in registers, one global read.
//   inner == 1, longer rows        one block per row; the forward caches the row
//                                  in shared memory when it fits (one read), else
//                                  streams it twice with online (max, sum).
//   inner == 1, few long rows      each row split across several blocks: partial
//                                  (max, sum) per slice, then a second kernel
//                                  combines them and writes its slice.
//   inner > 1                      tiles of (up to) 32 contiguous inner columns ×
//                                  a slab of the softmax dim per block: loads are
//                                  coalesced over the inner dim.
#pragma once

#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>

#include <cstdint>
#include <limits>

namespace jitops_softmax {
namespace cuda {

constexpr int kWarp = 32;

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Elements of T in 16 bytes.
template <typename T>
constexpr int vec16() {
  return 16 / int(sizeof(T));
}

template <typename T, int N>
__device__ __forceinline__ void load_pack(const T* p, T (&dst)[N]) {
  const Pack<T, N> pk = *reinterpret_cast<const Pack<T, N>*>(p);
#pragma unroll
  for (int i = 0; i < N; ++i) dst[i] = pk.v[i];
}

template <typename T, int N>
__device__ __forceinline__ void store_pack(T* p, const T (&src)[N]) {
  Pack<T, N> pk;
#pragma unroll
  for (int i = 0; i < N; ++i) pk.v[i] = src[i];
  *reinterpret_cast<Pack<T, N>*>(p) = pk;
}

template <typename T>
__device__ __forceinline__ T neg_inf() {
  return -std::numeric_limits<T>::infinity();
}

// Reductions over `width` lanes (a power of two <= 32) of a warp.
template <typename T>
__device__ __forceinline__ T warp_max(T v, int width = kWarp) {
  for (int o = width / 2; o > 0; o /= 2) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o, width));
  return v;
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v, int width = kWarp) {
  for (int o = width / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o, width);
  return v;
}

// Running (max, sum of exp(x - max)) of online softmax.
template <typename T>
struct MaxSum {
  T m, s;
};

template <typename T>
__device__ __forceinline__ MaxSum<T> combine(MaxSum<T> a, MaxSum<T> b) {
  const T m = fmax(a.m, b.m);
  // A part with no elements yet has m = -inf and s = 0: never form -inf - -inf.
  const T sa = a.m == m ? a.s : a.s * exp(a.m - m);
  const T sb = b.m == m ? b.s : b.s * exp(b.m - m);
  return {m, sa + sb};
}

template <typename T>
__device__ __forceinline__ MaxSum<T> warp_combine(MaxSum<T> v, int width = kWarp) {
  for (int o = width / 2; o > 0; o /= 2) {
    MaxSum<T> other{__shfl_xor_sync(0xffffffffu, v.m, o, width), __shfl_xor_sync(0xffffffffu, v.s, o, width)};
    v = combine(v, other);
  }
  return v;
}

// Block-wide reductions (blockDim.x a multiple of 32, <= 1024); every thread
// gets the result. `shared` holds at least 32 values.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read by a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : T(0);
  return warp_sum(v);
}

template <typename T>
__device__ __forceinline__ T block_max(T v, T* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : neg_inf<T>();
  return warp_max(v);
}

template <typename T>
__device__ __forceinline__ MaxSum<T> block_combine(MaxSum<T> v, T* shared_m, T* shared_s) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  v = warp_combine(v);
  __syncthreads();
  if (lane == 0) {
    shared_m[warp] = v.m;
    shared_s[warp] = v.s;
  }
  __syncthreads();
  v = lane < warps ? MaxSum<T>{shared_m[lane], shared_s[lane]} : MaxSum<T>{neg_inf<T>(), T(0)};
  return warp_combine(v);
}

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

inline int next_pow2(int64_t v) {  // saturates at 2^30
  int p = 1;
  while (p < v && p < (1 << 30)) p *= 2;
  return p;
}

inline int sm_count() {
  int dev = c10::cuda::current_device();
  int sms = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return sms;
}

inline int64_t smem_optin() {
  int dev = c10::cuda::current_device();
  int bytes = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return bytes;
}

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace cuda
}  // namespace jitops_softmax
