// softmax_backward over the last dim on CPU: grad_in = out * (grad - sum(grad * out)),
// one row per step (the row stays in L1 between its two passes).
//
// A translation unit of its own for one reason: torch's build of this kernel
// rounds grad * out before adding it to the running sum (no fused
// multiply-add), while its other softmax kernels are contracted. Matching that
// here keeps the result bit-identical to torch's; the pragma must precede the
// at::vec headers, whose inlined code it governs.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#elif defined(__clang__)
#pragma clang fp contract(off)
#endif

#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>

#include "softmax_common.h"

namespace jitops_softmax {
namespace {

namespace vec = at::vec;

template <typename T>
void lastdim_backward(const T* grad, const T* out, T* gin, int64_t rows, int64_t n) {
  using acc_t = at::opmath_type<T>;
  using Vec = vec::Vectorized<acc_t>;
  at::parallel_for(0, rows, std::max<int64_t>(1, 32768 / (16 * n)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* g = grad + r * n;
      const T* y = out + r * n;
      const acc_t s = vec::map2_reduce_all<T>([](Vec a, Vec b) { return a * b; },
                                              [](Vec a, Vec b) { return a + b; }, g, y, n);
      vec::map2<T>([s](Vec a, Vec b) { return (a - Vec(s)) * b; }, gin + r * n, g, y, n);
    }
  });
}

}  // namespace

void softmax_lastdim_backward_cpu(const at::Tensor& grad, const at::Tensor& out, at::Tensor& gin, int64_t rows,
                                  int64_t n) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, out.scalar_type(), "softmax_backward", [&] {
    lastdim_backward<scalar_t>(grad.const_data_ptr<scalar_t>(), out.const_data_ptr<scalar_t>(),
                               gin.mutable_data_ptr<scalar_t>(), rows, n);
  });
}

}  // namespace jitops_softmax
