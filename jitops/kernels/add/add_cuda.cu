// add kernel for CUDA: TensorIterator's gpu_kernel (broadcasting, strides,
// 32-bit index splitting, vectorized loads, dynamic casting of mixed-dtype
// inputs) on the current stream. Like torch's CUDA add, it computes
// self + alpha * other in the opmath type (float for float16 and bfloat16,
// complex<float> for complex32) with alpha converted straight to that type,
// and rounds once; every dtype torch.add takes, bool and complex included.
// The entry points in add_cpu.cpp build the iterator and call this for CUDA
// tensors.
//
// Loops.cuh launches __device__ lambdas, so the spec adds --extended-lambda.
// opmath_gpu_kernel_with_scalars takes a CPU 0-dim operand (torch.add(cuda,
// torch.tensor(2.0))), which the dispatcher routes here and gpu_kernel alone
// refuses, and passes it to the kernel by value, as torch's own add does.
#include <ATen/Dispatch.h>
#include <ATen/Dispatch_v2.h>
#include <ATen/OpMathType.h>
#include <ATen/TensorIterator.h>
#include <ATen/native/cuda/Loops.cuh>
#include <c10/cuda/CUDAGuard.h>

#include "add_common.h"

namespace jitops_add {
namespace {

template <typename opmath_t>
struct AddFunctor {
  opmath_t alpha;
  __device__ __forceinline__ opmath_t operator()(opmath_t x, opmath_t y) const { return x + alpha * y; }
};

}  // namespace

void add_kernel_cuda(at::TensorIteratorBase& iter, const c10::Scalar& alpha) {
  const c10::cuda::CUDAGuard guard(iter.device());
  AT_DISPATCH_V2(iter.common_dtype(), "add", AT_WRAP([&] {
    using opmath_t = at::opmath_type<scalar_t>;
    // Launches on at::cuda::getCurrentCUDAStream() and checks each launch.
    at::native::opmath_gpu_kernel_with_scalars<scalar_t>(iter, AddFunctor<opmath_t>{alpha.to<opmath_t>()});
  }), AT_EXPAND(AT_ALL_TYPES_AND_COMPLEX), at::kHalf, at::kBFloat16, at::kBool, at::kComplexHalf);
}

}  // namespace jitops_add
