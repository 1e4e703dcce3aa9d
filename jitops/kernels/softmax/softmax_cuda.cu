// softmax / log_softmax kernels for CUDA.
//
// Last-dim case: one block per row, block-wide max and sum through warp
// shuffles and shared memory. Other dims: one thread per (outer, inner)
// column. Half and bfloat16 accumulate in float. Kernels run on the current
// stream under a device guard. Headers are c10's lean CUDA ones, not
// <ATen/cuda/CUDAContext.h>, which also pulls in cuBLAS/cuSPARSE/cuSOLVER
// headers: slower to parse, and absent from a minimal CUDA toolkit.
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <c10/core/WrapDimMinimal.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cfloat>

#include "softmax_common.h"

namespace jitops_softmax {
namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;

template <typename T>
__device__ __forceinline__ T warp_max(T v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Reduce across the block; every thread gets the result.
template <typename T, bool MAX>
__device__ __forceinline__ T block_reduce(T v, T* shared) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  v = MAX ? warp_max(v) : warp_sum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / kWarp;
  T r = threadIdx.x < warps ? shared[threadIdx.x] : (MAX ? T(-INFINITY) : T(0));
  if (warp == 0) r = MAX ? warp_max(r) : warp_sum(r);
  if (threadIdx.x == 0) shared[0] = r;
  __syncthreads();
  r = shared[0];
  __syncthreads();
  return r;
}

template <typename scalar_t, bool LOG>
__global__ void lastdim_kernel(const scalar_t* __restrict__ in, scalar_t* __restrict__ out, int64_t n) {
  using acc_t = at::opmath_type<scalar_t>;
  __shared__ acc_t shared[kThreads / kWarp];
  const scalar_t* row = in + blockIdx.x * n;
  scalar_t* dst = out + blockIdx.x * n;
  acc_t mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = fmax(mx, static_cast<acc_t>(row[j]));
  mx = block_reduce<acc_t, true>(mx, shared);
  acc_t sum = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) sum += exp(static_cast<acc_t>(row[j]) - mx);
  sum = block_reduce<acc_t, false>(sum, shared);
  if (LOG) {
    const acc_t shift = mx + log(sum);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      dst[j] = static_cast<scalar_t>(static_cast<acc_t>(row[j]) - shift);
  } else {
    const acc_t scale = acc_t(1) / sum;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x)
      dst[j] = static_cast<scalar_t>(exp(static_cast<acc_t>(row[j]) - mx) * scale);
  }
}

template <typename scalar_t, bool LOG>
__global__ void strided_kernel(const scalar_t* __restrict__ in, scalar_t* __restrict__ out,
                               int64_t outer, int64_t n, int64_t inner) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t col = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (col >= outer * inner) return;
  const int64_t o = col / inner;
  const int64_t k = col % inner;
  const scalar_t* src = in + o * n * inner + k;
  scalar_t* dst = out + o * n * inner + k;
  acc_t mx = -INFINITY;
  for (int64_t d = 0; d < n; ++d) mx = fmax(mx, static_cast<acc_t>(src[d * inner]));
  acc_t sum = 0;
  for (int64_t d = 0; d < n; ++d) sum += exp(static_cast<acc_t>(src[d * inner]) - mx);
  for (int64_t d = 0; d < n; ++d) {
    const acc_t v = static_cast<acc_t>(src[d * inner]) - mx;
    dst[d * inner] = static_cast<scalar_t>(LOG ? v - log(sum) : exp(v) / sum);
  }
}

template <bool LOG>
at::Tensor forward_cuda(const at::Tensor& x, int64_t dim) {
  constexpr const char* op = LOG ? "log_softmax" : "softmax";
  check_input(op, x, dim);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t d = c10::maybe_wrap_dim(dim, x.dim());
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty(xc.sizes(), xc.options());
  if (xc.numel() == 0) return y;
  const int64_t n = x.dim() == 0 ? 1 : xc.size(d);
  int64_t inner = 1;
  for (int64_t i = d + 1; i < x.dim(); ++i) inner *= xc.size(i);
  const int64_t outer = xc.numel() / (n * inner);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), op, [&] {
    const scalar_t* in = xc.const_data_ptr<scalar_t>();
    scalar_t* out = y.mutable_data_ptr<scalar_t>();
    if (inner == 1) {
      lastdim_kernel<scalar_t, LOG><<<outer, kThreads, 0, stream>>>(in, out, n);
    } else {
      const int64_t cols = outer * inner;
      const int64_t blocks = (cols + kThreads - 1) / kThreads;
      strided_kernel<scalar_t, LOG><<<blocks, kThreads, 0, stream>>>(in, out, outer, n, inner);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return y;
}

}  // namespace

at::Tensor softmax_cuda(const at::Tensor& x, int64_t dim) { return forward_cuda<false>(x, dim); }
at::Tensor log_softmax_cuda(const at::Tensor& x, int64_t dim) { return forward_cuda<true>(x, dim); }

}  // namespace jitops_softmax
