// add kernel for CUDA: TensorIterator's gpu_kernel (broadcasting, strides,
// 32-bit index splitting, vectorized loads) on the current stream; float16 and
// bfloat16 compute in float like torch. The entry points in add_cpu.cpp build
// the iterator and call this for CUDA tensors.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/TensorIterator.h>
#include <ATen/native/cuda/Loops.cuh>
#include <c10/cuda/CUDAGuard.h>

#include "add_common.h"

namespace jitops_add {

void add_kernel_cuda(at::TensorIteratorBase& iter, const c10::Scalar& alpha) {
  const c10::cuda::CUDAGuard guard(iter.device());
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, iter.common_dtype(), "add", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const opmath_t a = alpha.to<opmath_t>();
    // gpu_kernel launches on at::cuda::getCurrentCUDAStream() and checks the launch.
    at::native::gpu_kernel(iter, [a] GPU_LAMBDA(scalar_t x, scalar_t y) -> scalar_t {
      return static_cast<scalar_t>(static_cast<opmath_t>(x) + a * static_cast<opmath_t>(y));
    });
  });
}

}  // namespace jitops_add
