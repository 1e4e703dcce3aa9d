// add / add.out / add_ (Tensor and Scalar overloads) for CPU, and the
// device-agnostic entry points.
//
// The entry points build a TensorIterator (torch.add's broadcasting, type
// promotion, output allocation and out= resizing, memory-overlap checks) and
// run the device kernel. The Scalar overloads wrap the number in a 0-dim
// "wrapped number" tensor, as torch does, so type promotion treats it like a
// Python scalar. The CPU kernel goes through cpu_kernel_vec, which also
// parallelises large tensors, with the very expressions torch's own CPU add
// kernel uses, so the results are bit-identical to torch's:
//   - vectorised body: fmadd(other, alpha, self), float16 and bfloat16
//     computed in float (Vectorized<Half>::fmadd converts) and rounded once;
//   - scalar loop (tails of each chunk, strided inputs): self + alpha * other
//     in scalar_t, so float16 and bfloat16 round alpha * other to the dtype
//     first and then the sum: torch rounds twice there, and so do we;
//   - alpha is converted to the dtype first (alpha.to<scalar_t>());
//   - bool has only the scalar loop.
// No <torch/library.h> here: registration lives in register.cpp.
//
// On AVX512 machines torch still runs its elementwise kernels, add included,
// with 256-bit vectors (DispatchStub uses the AVX512 build only for kernels
// registered with ALSO_REGISTER_AVX512_DISPATCH). This streaming kernel is
// memory-bound, and 512-bit vectors measured ~10 % slower here, so it uses
// the AVX2 flavour of at::vec too (which also keeps torch's chunk and tail
// boundaries, hence its roundings). This must precede every ATen include.
#ifdef CPU_CAPABILITY_AVX512
#undef CPU_CAPABILITY_AVX512
#define CPU_CAPABILITY_AVX2
#endif

#include <ATen/Dispatch.h>
#include <ATen/Dispatch_v2.h>
#include <ATen/EmptyTensor.h>
#include <ATen/TensorIterator.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/native/cpu/Loops.h>
#include <c10/util/complex.h>

#include "add_common.h"

namespace jitops_add {

void add_kernel_cpu(at::TensorIteratorBase& iter, const c10::Scalar& alpha) {
  const c10::ScalarType dtype = iter.common_dtype();
  if (dtype == at::kBool) {
    const bool a = alpha.to<bool>();
    at::native::cpu_kernel(iter, [=](bool x, bool y) -> bool { return x + a * y; });
    return;
  }
  AT_DISPATCH_V2(dtype, "add", AT_WRAP([&] {
    using Vec = at::vec::Vectorized<scalar_t>;
    const scalar_t a = alpha.to<scalar_t>();
    if constexpr (!c10::is_complex<scalar_t>::value) {
      // alpha == 1 gives the same bits through x + y (1 * y is exact); complex
      // is left out: (1 + 0i) * y turns an infinite part into NaN, as torch's does.
      if (a == scalar_t(1)) {
        at::native::cpu_kernel_vec(
            iter, [](scalar_t x, scalar_t y) -> scalar_t { return x + y; },
            [](Vec x, Vec y) -> Vec { return x + y; });
        return;
      }
    }
    const Vec va(a);
    at::native::cpu_kernel_vec(
        iter, [=](scalar_t x, scalar_t y) -> scalar_t { return x + a * y; },
        [=](Vec x, Vec y) -> Vec { return at::vec::fmadd(y, va, x); });
  }), AT_EXPAND(AT_ALL_TYPES_AND_COMPLEX), at::kHalf, at::kBFloat16, at::kComplexHalf);
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

// A 0-dim CPU tensor holding the number, flagged as a wrapped number so that
// type promotion treats it as torch treats a Python scalar (torch's own
// add.Scalar does the same). Works for CUDA `self` too: TensorIterator takes
// CPU scalars.
at::Tensor wrap(const c10::Scalar& s) {
  const c10::ScalarType t = s.type();
  at::Tensor w = at::detail::empty_cpu({}, t, /*pin_memory=*/false, std::nullopt);
  AT_DISPATCH_V2(t, "add", AT_WRAP([&] { *w.mutable_data_ptr<scalar_t>() = s.to<scalar_t>(); }),
                 at::kDouble, at::kLong, at::kBool, at::kComplexDouble, at::kUInt64);
  w.unsafeGetTensorImpl()->set_wrapped_number(true);
  return w;
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

at::Tensor add_scalar(const at::Tensor& self, const c10::Scalar& other, const c10::Scalar& alpha) {
  return add(self, wrap(other), alpha);
}

at::Tensor& add_scalar_out(const at::Tensor& self, const c10::Scalar& other, const c10::Scalar& alpha,
                           at::Tensor& out) {
  return add_out(self, wrap(other), alpha, out);
}

at::Tensor& add_scalar_(at::Tensor& self, const c10::Scalar& other, const c10::Scalar& alpha) {
  return add_(self, wrap(other), alpha);
}

}  // namespace jitops_add
