// add / add.out / add_ for CPU and the device-agnostic entry points.
//
// The entry points build a TensorIterator (torch.add's broadcasting, type
// promotion, output allocation and out= resizing, memory-overlap checks) and
// run the device kernel. The CPU kernel is vectorized with at::vec through
// cpu_kernel_vec, which also parallelises large tensors; float16 and bfloat16
// compute in float like torch. No <torch/library.h> here: registration lives
// in register.cpp.
//
// On AVX512 machines torch still runs its elementwise kernels, add included,
// with 256-bit vectors (DispatchStub uses the AVX512 build only for kernels
// registered with ALSO_REGISTER_AVX512_DISPATCH). This streaming kernel is
// memory-bound, and 512-bit vectors measured ~10 % slower here, so it uses
// the AVX2 flavour of at::vec too. This must precede every ATen include.
#ifdef CPU_CAPABILITY_AVX512
#undef CPU_CAPABILITY_AVX512
#define CPU_CAPABILITY_AVX2
#endif

#include <ATen/Dispatch.h>
#include <ATen/TensorIterator.h>
#include <ATen/cpu/vec/functional.h>  // convert_to_float / convert_from_float
#include <ATen/cpu/vec/vec.h>
#include <ATen/native/cpu/Loops.h>

#include "add_common.h"

namespace jitops_add {

void add_kernel_cpu(at::TensorIteratorBase& iter, const c10::Scalar& alpha) {
  const c10::ScalarType dtype = iter.common_dtype();
  if (dtype == at::kHalf || dtype == at::kBFloat16) {
    AT_DISPATCH_REDUCED_FLOATING_TYPES(dtype, "add", [&] {
      using Vec = at::vec::Vectorized<scalar_t>;
      using fVec = at::vec::Vectorized<float>;
      const float a = static_cast<float>(alpha.to<scalar_t>());  // torch rounds alpha to the dtype first
      const fVec va(a);
      at::native::cpu_kernel_vec(
          iter,
          [=](scalar_t x, scalar_t y) -> scalar_t { return static_cast<float>(x) + a * static_cast<float>(y); },
          [=](Vec x, Vec y) -> Vec {
            auto [x0, x1] = at::vec::convert_to_float<scalar_t>(x);
            auto [y0, y1] = at::vec::convert_to_float<scalar_t>(y);
            return at::vec::convert_from_float<scalar_t>(at::vec::fmadd(y0, va, x0), at::vec::fmadd(y1, va, x1));
          });
    });
    return;
  }
  AT_DISPATCH_ALL_TYPES(dtype, "add", [&] {
    using Vec = at::vec::Vectorized<scalar_t>;
    const scalar_t a = alpha.to<scalar_t>();
    if (a == scalar_t(1)) {
      at::native::cpu_kernel_vec(
          iter, [](scalar_t x, scalar_t y) -> scalar_t { return x + y; }, [](Vec x, Vec y) -> Vec { return x + y; });
    } else {
      const Vec va(a);
      at::native::cpu_kernel_vec(
          iter, [=](scalar_t x, scalar_t y) -> scalar_t { return x + a * y; },
          [=](Vec x, Vec y) -> Vec { return at::vec::fmadd(y, va, x); });
    }
  });
}

namespace {

void run(at::TensorIteratorBase& iter, const c10::Scalar& alpha) {
  if (iter.numel() == 0) return;
#ifdef JITOPS_WITH_CUDA
  if (iter.device_type() == at::kCUDA) {
    add_kernel_cuda(iter, alpha);
    return;
  }
#endif
  add_kernel_cpu(iter, alpha);
}

}  // namespace

at::Tensor add(const at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha) {
  check_inputs("add", self, other, alpha, nullptr, "");
  at::Tensor out;
  auto iter = at::TensorIterator::binary_op(out, self, other);
  run(iter, alpha);
  return iter.output();
}

at::Tensor& add_out(const at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha, at::Tensor& out) {
  check_inputs("add", self, other, alpha, &out, "out");
  auto iter = at::TensorIterator::binary_op(out, self, other);
  run(iter, alpha);
  return out;
}

at::Tensor& add_(at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha) {
  check_inputs("add_", self, other, alpha, &self, "self");
  auto iter = at::TensorIterator::binary_op(self, self, other);
  run(iter, alpha);
  return self;
}

}  // namespace jitops_add
