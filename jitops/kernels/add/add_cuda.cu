// add kernel for CUDA: TensorIterator's gpu_kernel (broadcasting, strides,
// 32-bit index splitting, vectorized loads, dynamic casting of mixed-dtype
// inputs) on the current stream; float16 and bfloat16 compute in float like
// torch. The entry points in add_cpu.cpp build the iterator and call this for
// CUDA tensors.
//
// Loops.cuh launches __device__ lambdas, so the spec adds --extended-lambda.
// opmath_gpu_kernel_with_scalars takes a CPU 0-dim operand (torch.add(cuda,
// torch.tensor(2.0))), which the dispatcher routes here and gpu_kernel alone
// refuses, and passes it to the kernel by value, as torch's own add does.
#include <ATen/Dispatch.h>
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
  AT_DISPATCH_ALL_TYPES_AND2(at::kHalf, at::kBFloat16, iter.common_dtype(), "add", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    // Launches on at::cuda::getCurrentCUDAStream() and checks each launch.
    at::native::opmath_gpu_kernel_with_scalars<scalar_t>(iter, AddFunctor<opmath_t>{alpha.to<opmath_t>()});
  });
}

}  // namespace jitops_add
