// softmax / log_softmax forward kernels for CUDA. The strategy follows the
// shape (see softmax_cuda_common.cuh for the classes). Half and bfloat16
// compute in float and round once; f32/f64 use full-precision exp/log.
// Kernels run on the current stream under a device guard; every launch is
// checked. Headers are c10's lean CUDA ones, not <ATen/cuda/CUDAContext.h>
// (which also pulls in cuBLAS/cuSPARSE/cuSOLVER headers).
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "softmax_common.h"
#include "softmax_cuda_common.cuh"

namespace jitops_softmax {
namespace cuda {
namespace {

constexpr int kWarpBlock = 128;  // threads per block of the warp-per-row kernel

template <typename acc_t, bool LOG>
__device__ __forceinline__ acc_t finish(acc_t x, acc_t m, acc_t s_or_log) {
  return LOG ? x - m - s_or_log : exp(x - m) / s_or_log;
}

// ------------------------------------------------ short rows: a (sub-)warp per row
// `width` lanes (a power of two <= 32) share a row of n <= width * ITERS * VEC.
template <typename T, bool LOG, int VEC, int ITERS>
__global__ void warp_forward(const T* __restrict__ in, T* __restrict__ out, int64_t rows, int n, int width) {
  using acc_t = at::opmath_type<T>;
  const int lane = threadIdx.x % width;
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / width;
  const bool valid = row < rows;  // every lane still joins the shuffles
  const T* src = in + (valid ? row : 0) * n;
  acc_t x[ITERS][VEC];
  acc_t m = neg_inf<acc_t>();
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = (it * width + lane) * VEC;
    T t[VEC];
    if (valid && j < n) {
      if constexpr (VEC > 1) load_pack<T, VEC>(src + j, t); else t[0] = src[j];
#pragma unroll
      for (int v = 0; v < VEC; ++v) {
        x[it][v] = static_cast<acc_t>(t[v]);
        m = fmax(m, x[it][v]);
      }
    } else {
#pragma unroll
      for (int v = 0; v < VEC; ++v) x[it][v] = neg_inf<acc_t>();
    }
  }
  m = warp_max(m, width);
  acc_t s = 0;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    if ((it * width + lane) * VEC < n) {
#pragma unroll
      for (int v = 0; v < VEC; ++v) s += exp(x[it][v] - m);
    }
  }
  s = warp_sum(s, width);
  if (!valid) return;
  const acc_t div = LOG ? log(s) : s;
  T* dst = out + row * n;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = (it * width + lane) * VEC;
    if (j < n) {
      T t[VEC];
#pragma unroll
      for (int v = 0; v < VEC; ++v) t[v] = static_cast<T>(finish<acc_t, LOG>(x[it][v], m, div));
      if constexpr (VEC > 1) store_pack<T, VEC>(dst + j, t); else dst[j] = t[0];
    }
  }
}

template <typename T, bool LOG, int VEC, int ITERS>
void launch_warp_forward(const T* in, T* out, int64_t rows, int n, int width, cudaStream_t stream) {
  if constexpr (ITERS * VEC <= 32) {
    const int64_t blocks = ceil_div(rows * width, kWarpBlock);
    warp_forward<T, LOG, VEC, ITERS><<<blocks, kWarpBlock, 0, stream>>>(in, out, rows, n, width);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  } else {
    TORCH_INTERNAL_ASSERT(false, "softmax: no warp kernel for ", ITERS, " x ", VEC, " elements per lane");
  }
}

template <typename T, bool LOG, int VEC>
void warp_forward_dispatch(const T* in, T* out, int64_t rows, int n, cudaStream_t stream) {
  const int packs = int(ceil_div(n, VEC));
  const int width = std::min(kWarp, next_pow2(packs));
  const int iters = next_pow2(ceil_div(packs, width));
  switch (iters) {
    case 1: return launch_warp_forward<T, LOG, VEC, 1>(in, out, rows, n, width, stream);
    case 2: return launch_warp_forward<T, LOG, VEC, 2>(in, out, rows, n, width, stream);
    case 4: return launch_warp_forward<T, LOG, VEC, 4>(in, out, rows, n, width, stream);
    case 8: return launch_warp_forward<T, LOG, VEC, 8>(in, out, rows, n, width, stream);
    case 16: return launch_warp_forward<T, LOG, VEC, 16>(in, out, rows, n, width, stream);
    case 32: return launch_warp_forward<T, LOG, VEC, 32>(in, out, rows, n, width, stream);
    default: TORCH_INTERNAL_ASSERT(false, "softmax: row of ", n, " is too long for the warp kernel");
  }
}

// ------------------------------------------------ medium rows: a block per row, row cached in shared memory
// One global read: the row goes to shared memory (as T) while each thread
// takes its max; then the sum and the output come from shared memory.
template <typename T, bool LOG, int VEC>
__global__ void block_smem_forward(const T* __restrict__ in, T* __restrict__ out, int n) {
  using acc_t = at::opmath_type<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __shared__ acc_t red[kWarp];
  T* cache = reinterpret_cast<T*>(smem_raw);
  const T* src = in + int64_t(blockIdx.x) * n;
  T* dst = out + int64_t(blockIdx.x) * n;
  acc_t m = neg_inf<acc_t>();
  for (int j = threadIdx.x * VEC; j < n; j += blockDim.x * VEC) {
    T t[VEC];
    if constexpr (VEC > 1) {
      load_pack<T, VEC>(src + j, t);
      store_pack<T, VEC>(cache + j, t);
    } else {
      t[0] = src[j];
      cache[j] = t[0];
    }
#pragma unroll
    for (int v = 0; v < VEC; ++v) m = fmax(m, static_cast<acc_t>(t[v]));
  }
  m = block_max(m, red);
  acc_t s = 0;
  for (int j = threadIdx.x; j < n; j += blockDim.x) s += exp(static_cast<acc_t>(cache[j]) - m);
  s = block_sum(s, red);
  const acc_t div = LOG ? log(s) : s;
  for (int j = threadIdx.x * VEC; j < n; j += blockDim.x * VEC) {
    T t[VEC];
    if constexpr (VEC > 1) load_pack<T, VEC>(cache + j, t); else t[0] = cache[j];
#pragma unroll
    for (int v = 0; v < VEC; ++v) t[v] = static_cast<T>(finish<acc_t, LOG>(static_cast<acc_t>(t[v]), m, div));
    if constexpr (VEC > 1) store_pack<T, VEC>(dst + j, t); else dst[j] = t[0];
  }
}

// ------------------------------------------------ long rows: online (max, sum), rows split across blocks
// Block (s, r) owns elements [s * chunk, (s + 1) * chunk) of row r.
template <typename T, int VEC>
__global__ void split_stats(const T* __restrict__ in, at::opmath_type<T>* __restrict__ part, int64_t n, int64_t chunk) {
  using acc_t = at::opmath_type<T>;
  __shared__ acc_t red_m[kWarp], red_s[kWarp];
  const int64_t row = blockIdx.y, lo = int64_t(blockIdx.x) * chunk, hi = min(n, lo + chunk);
  const T* src = in + row * n;
  MaxSum<acc_t> ms{neg_inf<acc_t>(), acc_t(0)};
  for (int64_t j = lo + threadIdx.x * VEC; j < hi; j += int64_t(blockDim.x) * VEC) {
    T t[VEC];
    if constexpr (VEC > 1) load_pack<T, VEC>(src + j, t); else t[0] = src[j];
    acc_t pm = static_cast<acc_t>(t[0]);
#pragma unroll
    for (int v = 1; v < VEC; ++v) pm = fmax(pm, static_cast<acc_t>(t[v]));
    acc_t ps = 0;
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      const acc_t x = static_cast<acc_t>(t[v]);
      ps += x == neg_inf<acc_t>() ? acc_t(0) : exp(x - pm);  // an all -inf pack adds nothing
    }
    ms = combine(ms, MaxSum<acc_t>{pm, ps});
  }
  ms = block_combine(ms, red_m, red_s);
  if (threadIdx.x == 0) {
    part[2 * (row * gridDim.x + blockIdx.x)] = ms.m;
    part[2 * (row * gridDim.x + blockIdx.x) + 1] = ms.s;
  }
}

template <typename T, bool LOG, int VEC>
__global__ void split_apply(const T* __restrict__ in, T* __restrict__ out, const at::opmath_type<T>* __restrict__ part,
                            int64_t n, int64_t chunk) {
  using acc_t = at::opmath_type<T>;
  __shared__ acc_t total[2];
  const int64_t row = blockIdx.y, lo = int64_t(blockIdx.x) * chunk, hi = min(n, lo + chunk);
  if (threadIdx.x < kWarp) {  // the first warp combines the row's partials
    MaxSum<acc_t> ms{neg_inf<acc_t>(), acc_t(0)};
    for (int p = threadIdx.x; p < gridDim.x; p += kWarp) {
      ms = combine(ms, MaxSum<acc_t>{part[2 * (row * gridDim.x + p)], part[2 * (row * gridDim.x + p) + 1]});
    }
    ms = warp_combine(ms);
    if (threadIdx.x == 0) {
      total[0] = ms.m;
      total[1] = LOG ? log(ms.s) : ms.s;
    }
  }
  __syncthreads();
  const acc_t m = total[0], div = total[1];
  const T* src = in + row * n;
  T* dst = out + row * n;
  for (int64_t j = lo + threadIdx.x * VEC; j < hi; j += int64_t(blockDim.x) * VEC) {
    T t[VEC];
    if constexpr (VEC > 1) load_pack<T, VEC>(src + j, t); else t[0] = src[j];
#pragma unroll
    for (int v = 0; v < VEC; ++v) t[v] = static_cast<T>(finish<acc_t, LOG>(static_cast<acc_t>(t[v]), m, div));
    if constexpr (VEC > 1) store_pack<T, VEC>(dst + j, t); else dst[j] = t[0];
  }
}

// ------------------------------------------------ other dims: tiles over the inner dim
// Block: blockDim.x contiguous inner columns × blockDim.y threads per column (strided_dim_threads). Torch's
// three passes in torch's order: the max, then the sum of exp(x - max), then the outputs.
// Blocks of up to 1024 threads: __launch_bounds__ keeps the registers within what 1024 threads may hold (an
// H100 refused the float64 kernel's launch without it).
template <typename T, bool LOG>
__global__ void __launch_bounds__(1024)
    strided_forward(const T* __restrict__ in, T* __restrict__ out, int64_t outer, int64_t n, int64_t inner) {
  using acc_t = at::opmath_type<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  acc_t* sm = reinterpret_cast<acc_t*>(smem_raw);  // [blockDim.y][blockDim.x]
  const int ty = blockDim.y;
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool live = k < inner;
  for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
    const T* src = in + o * n * inner + k;
    T* dst = out + o * n * inner + k;
    acc_t m = neg_inf<acc_t>();
    if (live) {
#pragma unroll 4
      for (int64_t d = threadIdx.y; d < n; d += ty) m = fmax(m, static_cast<acc_t>(src[d * inner]));
    }
    m = column_reduce(m, sm, MaxOp{});
    acc_t s = 0;
    if (live) {
#pragma unroll 4
      for (int64_t d = threadIdx.y; d < n; d += ty) s += exp(static_cast<acc_t>(src[d * inner]) - m);
    }
    s = column_reduce(s, sm, AddOp{});
    const acc_t div = LOG ? log(s) : s;
    if (live) {
#pragma unroll 4
      for (int64_t d = threadIdx.y; d < n; d += ty) {
        dst[d * inner] = static_cast<T>(finish<acc_t, LOG>(static_cast<acc_t>(src[d * inner]), m, div));
      }
    }
  }
}

template <typename T, bool LOG>
void forward(const T* in, T* out, const Geometry& g, const at::TensorOptions& opts, cudaStream_t stream) {
  using acc_t = at::opmath_type<T>;
  constexpr int V = vec16<T>();
  const int64_t rows = g.outer, n = g.n;
  if (g.inner > 1) {
    const StridedLaunch l = strided_launch(g.outer, n, g.inner);
    const size_t smem = l.block.y > 1 ? l.block.x * l.block.y * sizeof(acc_t) : 0;
    strided_forward<T, LOG><<<l.grid, l.block, smem, stream>>>(in, out, g.outer, n, g.inner);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  const bool vec = n % V == 0 && aligned16(in) && aligned16(out);
  if (n <= 1024) {
    if (vec) return warp_forward_dispatch<T, LOG, V>(in, out, rows, int(n), stream);
    return warp_forward_dispatch<T, LOG, 1>(in, out, rows, int(n), stream);
  }
  const int sms = sm_count();
  const int64_t bytes = n * int64_t(sizeof(T));
  // Enough rows to fill the GPU and a row that fits in shared memory: one read.
  if (rows >= 2 * sms && bytes + 1024 <= smem_optin() && rows <= INT32_MAX) {
    const int threads = int(std::min<int64_t>(1024, std::max<int64_t>(128, next_pow2(ceil_div(n, (vec ? V : 1) * 8)))));
    auto run = [&](auto kernel) {
      if (bytes > 48 * 1024) {
        C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
      }
      kernel<<<unsigned(rows), threads, size_t(bytes), stream>>>(in, out, int(n));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    if (vec) run(block_smem_forward<T, LOG, V>); else run(block_smem_forward<T, LOG, 1>);
    return;
  }
  // Few rows, or rows too long for shared memory: split each row over enough
  // blocks to give every SM about four, in chunks of at least 2048 elements.
  const int64_t splits = std::max<int64_t>(1, std::min(ceil_div(4 * sms, rows), ceil_div(n, 2048)));
  const int64_t step = vec ? V : 1;
  const int64_t chunk = ceil_div(ceil_div(n, splits), step) * step;
  const int64_t used = ceil_div(n, chunk);
  at::Tensor part = at::empty({rows * used * 2}, opts.dtype(c10::CppTypeToScalarType<acc_t>::value));
  acc_t* p = part.mutable_data_ptr<acc_t>();
  for (int64_t r0 = 0; r0 < rows; r0 += 65535) {  // grid.y is at most 65535
    const int64_t rs = std::min<int64_t>(65535, rows - r0);
    const dim3 grid{unsigned(used), unsigned(rs)};
    if (vec) {
      split_stats<T, V><<<grid, 256, 0, stream>>>(in + r0 * n, p + r0 * used * 2, n, chunk);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      split_apply<T, LOG, V><<<grid, 256, 0, stream>>>(in + r0 * n, out + r0 * n, p + r0 * used * 2, n, chunk);
    } else {
      split_stats<T, 1><<<grid, 256, 0, stream>>>(in + r0 * n, p + r0 * used * 2, n, chunk);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      split_apply<T, LOG, 1><<<grid, 256, 0, stream>>>(in + r0 * n, out + r0 * n, p + r0 * used * 2, n, chunk);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

template <bool LOG>
at::Tensor forward_cuda(const at::Tensor& x0, int64_t dim, Opt dtype) {
  constexpr const char* op = LOG ? "log_softmax" : "softmax";
  const c10::cuda::CUDAGuard guard(x0.device());
  const at::Tensor xc = checked_input(op, x0, dim, dtype).contiguous();
  at::Tensor y = at::empty(xc.sizes(), xc.options());
  if (xc.numel() == 0) return y;
  const Geometry g = geometry(xc, dim);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(), op, [&] {
    forward<scalar_t, LOG>(xc.const_data_ptr<scalar_t>(), y.mutable_data_ptr<scalar_t>(), g, xc.options(), stream);
  });
  return y;
}

}  // namespace
}  // namespace cuda

at::Tensor softmax_cuda(const at::Tensor& x, int64_t dim, Opt dtype) { return cuda::forward_cuda<false>(x, dim, dtype); }
at::Tensor log_softmax_cuda(const at::Tensor& x, int64_t dim, Opt dtype) { return cuda::forward_cuda<true>(x, dim, dtype); }

}  // namespace jitops_softmax
