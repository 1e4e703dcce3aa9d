// softmax / log_softmax backward kernels for CUDA, one fused kernel per
// shape class (the classes of softmax_cuda_common.cuh):
//   softmax:     t = grad * out, rounded to the tensor's type; grad_in = t - out * sum(t)
//   log_softmax: grad_in = grad - exp(out) * sum(grad)
// in the order torch's CUDA kernels compute them (SoftMax.cu: softmax_backward_cuda_out
// multiplies grad by out as a tensor op, in the tensor's type, before its kernels sum;
// their epilogue is t - out * sum). Everything else in float for half and bfloat16,
// rounded once. Current stream, device guard, every launch checked.
#include <type_traits>

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

constexpr int kWarpBlock = 128;

// A product rounded on its own, never fused into a following add (nvcc contracts a*b+c by default): torch's
// `grad * output` is a separate tensor op, so its products reach the sum and the epilogue rounded.
template <typename acc_t>
__device__ __forceinline__ acc_t mul_rn(acc_t a, acc_t b) {
  if constexpr (std::is_same_v<acc_t, double>) return __dmul_rn(a, b); else return __fmul_rn(a, b);
}

// The summed term: grad (log_softmax) or grad * out rounded to T, as torch's `grad * output` tensor is.
template <typename T, bool LOG, typename acc_t>
__device__ __forceinline__ acc_t term(acc_t g, acc_t y) {
  return LOG ? g : static_cast<acc_t>(static_cast<T>(mul_rn(g, y)));
}

// From the term t of this element and the row's sum s of terms (torch's epilogues, written the same way).
template <bool LOG, typename acc_t>
__device__ __forceinline__ acc_t grad_in(acc_t t, acc_t y, acc_t s) {
  return LOG ? t - exp(y) * s : t - y * s;
}

template <typename T, int VEC>
__device__ __forceinline__ void load(const T* p, T (&t)[VEC]) {
  if constexpr (VEC > 1) load_pack<T, VEC>(p, t); else t[0] = *p;
}

template <typename T, int VEC>
__device__ __forceinline__ void store(T* p, const T (&t)[VEC]) {
  if constexpr (VEC > 1) store_pack<T, VEC>(p, t); else *p = t[0];
}

// ------------------------------------------------ short rows: a (sub-)warp per row, rows in registers
template <typename T, bool LOG, int VEC, int ITERS>
__global__ void warp_backward(const T* __restrict__ grad, const T* __restrict__ out, T* __restrict__ gin, int64_t rows,
                              int n, int width) {
  using acc_t = at::opmath_type<T>;
  const int lane = threadIdx.x % width;
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / width;
  const bool valid = row < rows;
  const int64_t base = (valid ? row : 0) * n;
  acc_t g[ITERS][VEC], y[ITERS][VEC];
  acc_t s = 0;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = (it * width + lane) * VEC;
    if (valid && j < n) {
      T tg[VEC], ty[VEC];
      load<T, VEC>(grad + base + j, tg);
      load<T, VEC>(out + base + j, ty);
#pragma unroll
      for (int v = 0; v < VEC; ++v) {
        y[it][v] = static_cast<acc_t>(ty[v]);
        g[it][v] = term<T, LOG>(static_cast<acc_t>(tg[v]), y[it][v]);  // from here on, the term
        s += g[it][v];
      }
    }
  }
  s = warp_sum(s, width);
  if (!valid) return;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const int j = (it * width + lane) * VEC;
    if (j < n) {
      T t[VEC];
#pragma unroll
      for (int v = 0; v < VEC; ++v) t[v] = static_cast<T>(grad_in<LOG>(g[it][v], y[it][v], s));
      store<T, VEC>(gin + base + j, t);
    }
  }
}

template <typename T, bool LOG, int VEC, int ITERS>
void launch_warp_backward(const T* g, const T* y, T* gi, int64_t rows, int n, int width, cudaStream_t stream) {
  if constexpr (ITERS * VEC <= 32) {
    warp_backward<T, LOG, VEC, ITERS><<<ceil_div(rows * width, kWarpBlock), kWarpBlock, 0, stream>>>(g, y, gi, rows, n, width);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  } else {
    TORCH_INTERNAL_ASSERT(false, "softmax_backward: no warp kernel for ", ITERS, " x ", VEC, " elements per lane");
  }
}

template <typename T, bool LOG, int VEC>
void warp_backward_dispatch(const T* g, const T* y, T* gi, int64_t rows, int n, cudaStream_t stream) {
  const int packs = int(ceil_div(n, VEC));
  const int width = std::min(kWarp, next_pow2(packs));
  switch (next_pow2(ceil_div(packs, width))) {
    case 1: return launch_warp_backward<T, LOG, VEC, 1>(g, y, gi, rows, n, width, stream);
    case 2: return launch_warp_backward<T, LOG, VEC, 2>(g, y, gi, rows, n, width, stream);
    case 4: return launch_warp_backward<T, LOG, VEC, 4>(g, y, gi, rows, n, width, stream);
    case 8: return launch_warp_backward<T, LOG, VEC, 8>(g, y, gi, rows, n, width, stream);
    case 16: return launch_warp_backward<T, LOG, VEC, 16>(g, y, gi, rows, n, width, stream);
    case 32: return launch_warp_backward<T, LOG, VEC, 32>(g, y, gi, rows, n, width, stream);
    default: TORCH_INTERNAL_ASSERT(false, "softmax_backward: row of ", n, " is too long for the warp kernel");
  }
}

// ------------------------------------------------ long rows: slices of a row over blocks (one slice when rows are many)
template <typename T, bool LOG, int VEC>
__global__ void split_sum(const T* __restrict__ grad, const T* __restrict__ out, at::opmath_type<T>* __restrict__ part,
                          int64_t n, int64_t chunk) {
  using acc_t = at::opmath_type<T>;
  __shared__ acc_t red[kWarp];
  const int64_t row = blockIdx.y, lo = int64_t(blockIdx.x) * chunk, hi = min(n, lo + chunk);
  acc_t s = 0;
  for (int64_t j = lo + threadIdx.x * VEC; j < hi; j += int64_t(blockDim.x) * VEC) {
    T tg[VEC], ty[VEC];
    load<T, VEC>(grad + row * n + j, tg);
    if constexpr (!LOG) load<T, VEC>(out + row * n + j, ty);
#pragma unroll
    for (int v = 0; v < VEC; ++v) s += term<T, LOG>(static_cast<acc_t>(tg[v]), LOG ? acc_t(0) : static_cast<acc_t>(ty[v]));
  }
  s = block_sum(s, red);
  if (threadIdx.x == 0) part[row * gridDim.x + blockIdx.x] = s;
}

template <typename T, bool LOG, int VEC>
__global__ void split_apply(const T* __restrict__ grad, const T* __restrict__ out, T* __restrict__ gin,
                            const at::opmath_type<T>* __restrict__ part, int64_t n, int64_t chunk) {
  using acc_t = at::opmath_type<T>;
  __shared__ acc_t total;
  const int64_t row = blockIdx.y, lo = int64_t(blockIdx.x) * chunk, hi = min(n, lo + chunk);
  if (threadIdx.x < kWarp) {
    acc_t s = 0;
    for (int p = threadIdx.x; p < gridDim.x; p += kWarp) s += part[row * gridDim.x + p];
    s = warp_sum(s);
    if (threadIdx.x == 0) total = s;
  }
  __syncthreads();
  const acc_t s = total;
  for (int64_t j = lo + threadIdx.x * VEC; j < hi; j += int64_t(blockDim.x) * VEC) {
    T tg[VEC], ty[VEC], t[VEC];
    load<T, VEC>(grad + row * n + j, tg);
    load<T, VEC>(out + row * n + j, ty);
#pragma unroll
    for (int v = 0; v < VEC; ++v) {
      const acc_t yv = static_cast<acc_t>(ty[v]);
      t[v] = static_cast<T>(grad_in<LOG>(term<T, LOG>(static_cast<acc_t>(tg[v]), yv), yv, s));
    }
    store<T, VEC>(gin + row * n + j, t);
  }
}

// ------------------------------------------------ other dims: tiles over the inner dim
template <typename T, bool LOG>  // blocks of up to 1024 threads: see strided_forward
__global__ void __launch_bounds__(1024)
    strided_backward(const T* __restrict__ grad, const T* __restrict__ out, T* __restrict__ gin, int64_t outer, int64_t n,
                     int64_t inner) {
  using acc_t = at::opmath_type<T>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  acc_t* sm = reinterpret_cast<acc_t*>(smem_raw);  // [blockDim.y][blockDim.x]
  const int ty = blockDim.y;
  const int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool live = k < inner;
  for (int64_t o = blockIdx.y; o < outer; o += gridDim.y) {
    const int64_t base = o * n * inner + k;
    acc_t s = 0;
    if (live) {
#pragma unroll 4
      for (int64_t d = threadIdx.y; d < n; d += ty) {
        s += term<T, LOG>(static_cast<acc_t>(grad[base + d * inner]), static_cast<acc_t>(out[base + d * inner]));
      }
    }
    s = column_reduce(s, sm, AddOp{});
    if (live) {
#pragma unroll 4
      for (int64_t d = threadIdx.y; d < n; d += ty) {
        const int64_t i = base + d * inner;
        const acc_t yv = static_cast<acc_t>(out[i]);
        gin[i] = static_cast<T>(grad_in<LOG>(term<T, LOG>(static_cast<acc_t>(grad[i]), yv), yv, s));
      }
    }
  }
}

template <typename T, bool LOG>
void backward(const T* g, const T* y, T* gi, const Geometry& geo, const at::TensorOptions& opts, cudaStream_t stream) {
  using acc_t = at::opmath_type<T>;
  constexpr int V = vec16<T>();
  const int64_t rows = geo.outer, n = geo.n;
  if (geo.inner > 1) {
    const StridedLaunch l = strided_launch(geo.outer, n, geo.inner);
    const size_t smem = l.block.y > 1 ? l.block.x * l.block.y * sizeof(acc_t) : 0;
    strided_backward<T, LOG><<<l.grid, l.block, smem, stream>>>(g, y, gi, geo.outer, n, geo.inner);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  const bool vec = n % V == 0 && aligned16(g) && aligned16(y) && aligned16(gi);
  if (n <= 1024) {
    if (vec) return warp_backward_dispatch<T, LOG, V>(g, y, gi, rows, int(n), stream);
    return warp_backward_dispatch<T, LOG, 1>(g, y, gi, rows, int(n), stream);
  }
  const int sms = sm_count();
  const int64_t splits = std::max<int64_t>(1, std::min(ceil_div(4 * sms, rows), ceil_div(n, 2048)));
  const int64_t step = vec ? V : 1;
  const int64_t chunk = ceil_div(ceil_div(n, splits), step) * step;
  const int64_t used = ceil_div(n, chunk);
  at::Tensor part = at::empty({rows * used}, opts.dtype(c10::CppTypeToScalarType<acc_t>::value));
  acc_t* p = part.mutable_data_ptr<acc_t>();
  for (int64_t r0 = 0; r0 < rows; r0 += 65535) {
    const int64_t off = r0 * n;
    const dim3 grid{unsigned(used), unsigned(std::min<int64_t>(65535, rows - r0))};
    if (vec) {
      split_sum<T, LOG, V><<<grid, 256, 0, stream>>>(g + off, y + off, p + r0 * used, n, chunk);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      split_apply<T, LOG, V><<<grid, 256, 0, stream>>>(g + off, y + off, gi + off, p + r0 * used, n, chunk);
    } else {
      split_sum<T, LOG, 1><<<grid, 256, 0, stream>>>(g + off, y + off, p + r0 * used, n, chunk);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      split_apply<T, LOG, 1><<<grid, 256, 0, stream>>>(g + off, y + off, gi + off, p + r0 * used, n, chunk);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

template <bool LOG>
at::Tensor backward_cuda(const at::Tensor& grad, const at::Tensor& out, int64_t dim) {
  constexpr const char* op = LOG ? "log_softmax_backward" : "softmax_backward";
  check_backward(op, grad, out, dim);
  TORCH_CHECK(grad.device() == out.device(), op, ": grad and out must be on the same device, got ", grad.device(),
              " and ", out.device());
  const c10::cuda::CUDAGuard guard(out.device());
  const at::Tensor gc = grad.contiguous(), yc = out.contiguous();
  at::Tensor gin = at::empty(yc.sizes(), yc.options());
  if (yc.numel() == 0) return gin;
  const Geometry geo = geometry(yc, dim);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, yc.scalar_type(), op, [&] {
    backward<scalar_t, LOG>(gc.const_data_ptr<scalar_t>(), yc.const_data_ptr<scalar_t>(),
                            gin.mutable_data_ptr<scalar_t>(), geo, yc.options(), stream);
  });
  return gin;
}

}  // namespace
}  // namespace cuda

at::Tensor softmax_backward_cuda(const at::Tensor& grad, const at::Tensor& out, int64_t dim) {
  return cuda::backward_cuda<false>(grad, out, dim);
}
at::Tensor log_softmax_backward_cuda(const at::Tensor& grad, const at::Tensor& out, int64_t dim) {
  return cuda::backward_cuda<true>(grad, out, dim);
}

}  // namespace jitops_softmax
