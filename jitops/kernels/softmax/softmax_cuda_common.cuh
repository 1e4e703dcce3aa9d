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
//   inner > 1                      tiles of contiguous inner columns (loads are
//                                  coalesced over the inner dim) × the threads that
//                                  share a column, as many as torch's spatial kernels
//                                  use (strided_dim_threads), summing in torch's order:
//                                  the same bits as torch.
#pragma once

#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
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

// Pairwise halving over threadIdx.y of column threadIdx.x (blockDim.y a power of two), the tree of torch's
// spatialBlockReduceX; every thread of the column gets the result. `sm` holds blockDim.x * blockDim.y values.
template <typename T, typename Op>
__device__ __forceinline__ T column_reduce(T v, T* sm, Op op) {
  if (blockDim.y == 1) return v;
  const int tx = blockDim.x, x = threadIdx.x, y = threadIdx.y;
  __syncthreads();  // `sm` may still be read by a previous reduction
  sm[y * tx + x] = v;
  for (int off = blockDim.y / 2; off > 0; off /= 2) {
    __syncthreads();
    if (y < off) sm[y * tx + x] = op(sm[y * tx + x], sm[(y + off) * tx + x]);
  }
  __syncthreads();
  return sm[x];
}

struct MaxOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return fmax(a, b); }
};

struct AddOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};

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

// inner > 1: how many threads share one column's reduction, chosen as torch's spatial kernels choose it
// (SoftMax.cu, SpatialSoftMax_getBlockSize): one when inner > 64 or n < 64, else the largest power of two d
// with d * inner <= 1024 and d <= n. Thread y of a column sums elements y, y + d, y + 2d, ... in order and the
// d partials meet in column_reduce's tree, as torch's do: a float sum depends on its order, so this is what
// makes the outputs torch's bits. d * next_pow2(inner) <= 1024 always (1024 / d is a power of two >= inner).
inline int strided_dim_threads(int64_t n, int64_t inner) {
  const int64_t cols = std::min<int64_t>(inner, 1024);
  int64_t d = 1;
  if (cols <= 64 && n >= 64) {
    while (cols * d <= 1024 && d <= n) d *= 2;
    d /= 2;
  }
  return int(d);
}

// The launch of a strided kernel: block (columns, strided_dim_threads), the columns a power of two that keeps
// loads coalesced, halved (down to 8) while the grid would leave SMs idle; grid.y walks the outer dim.
struct StridedLaunch {
  dim3 grid, block;
};

inline StridedLaunch strided_launch(int64_t outer, int64_t n, int64_t inner) {
  const int ty = strided_dim_threads(n, inner);
  int tx = std::min(next_pow2(inner), std::min(256, 1024 / ty));
  const int floor = ty == 1 ? 32 : 8;
  while (tx > floor && outer * ceil_div(inner, tx) < 4 * int64_t(sm_count())) tx /= 2;
  return {dim3(unsigned(ceil_div(inner, tx)), unsigned(std::min<int64_t>(outer, 65535))), dim3(unsigned(tx), unsigned(ty))};
}

}  // namespace cuda
}  // namespace jitops_softmax
