// Shared by the CPU and CUDA translation units of the add library: the input
// checks (the Python fake kernel repeats them word for word) and the kernel
// entry points. The computation itself goes through TensorIterator, which
// gives torch.add's broadcasting, type promotion and output layout.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/TensorIterator.h>
#include <ATen/native/TypeProperties.h>
#include <c10/core/Scalar.h>
#include <c10/core/ScalarType.h>
#include <jitops/dtype.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace jitops_add {

using jitops::dtype_name;

// The dtypes torch.add has a kernel for (its add_stub): bool, the integers up
// to int64 (not uint16/32/64), the floating types (not float8) and complex.
inline bool supported(c10::ScalarType t) {
  using c10::ScalarType;
  switch (t) {
    case ScalarType::Bool: case ScalarType::Byte: case ScalarType::Char: case ScalarType::Short:
    case ScalarType::Int: case ScalarType::Long: case ScalarType::Half: case ScalarType::BFloat16:
    case ScalarType::Float: case ScalarType::Double: case ScalarType::ComplexHalf:
    case ScalarType::ComplexFloat: case ScalarType::ComplexDouble:
      return true;
    default:
      return false;
  }
}

inline std::vector<int64_t> broadcast_shape(const char* op, const at::Tensor& self, const at::Tensor& other) {
  const int64_t n = std::max(self.dim(), other.dim());
  std::vector<int64_t> shape(n);
  for (int64_t i = -1; i >= -n; --i) {
    const int64_t a = i >= -self.dim() ? self.size(i) : 1;
    const int64_t b = i >= -other.dim() ? other.size(i) : 1;
    TORCH_CHECK(a == b || a == 1 || b == 1, op, ": self of shape ", self.sizes(), " and other of shape ",
                other.sizes(), " cannot be broadcast together (dim ", i, ": ", a, " vs ", b, ")");
    shape[n + i] = a == 1 ? b : a;
  }
  return shape;
}

// The checks torch.add makes, with messages that name the offending value.
// `other` may be a wrapped number (the Scalar overloads). `out` is the
// in-place target or the out= tensor (undefined for the functional form).
// Returns the computation dtype.
inline c10::ScalarType check_inputs(const char* op, const at::Tensor& self, const at::Tensor& other,
                                    const c10::Scalar& alpha, const at::Tensor* out, const char* out_name) {
  const auto shape = broadcast_shape(op, self, other);
  at::native::ResultTypeState state;
  state = at::native::update_result_type_state(self, state);
  state = at::native::update_result_type_state(other, state);
  const c10::ScalarType dtype = at::native::result_type(state);
  TORCH_CHECK(supported(dtype), op, ": the result dtype ", dtype_name(dtype),
              " is not supported (torch.add has no kernel for it either); supported: bool, uint8, int8, int16, "
              "int32, int64, float16, bfloat16, float32, float64, complex32, complex64, complex128");
  // torch's alpha_check, in its order.
  TORCH_CHECK(!alpha.isBoolean() || dtype == c10::ScalarType::Bool, op,
              ": alpha is a bool, but the result dtype ", dtype_name(dtype), " is not bool");
  if (!c10::isFloatingType(dtype) && !c10::isComplexType(dtype) && !alpha.isIntegral(/*includeBool=*/true)) {
    char text[32];
    if (alpha.isComplex()) {
      std::snprintf(text, sizeof(text), "a complex number");
    } else {
      std::snprintf(text, sizeof(text), "%g", alpha.toDouble());  // Python's f"{alpha:g}" in the fake kernel
    }
    TORCH_CHECK(false, op, ": alpha must be an integer when the result dtype is ", dtype_name(dtype), ", got ", text);
  }
  TORCH_CHECK(c10::isComplexType(dtype) || !alpha.isComplex(), op,
              ": alpha is complex, but the result dtype ", dtype_name(dtype), " is not");
  if (out != nullptr) {
    TORCH_CHECK(c10::canCast(dtype, out->scalar_type()), op, ": result dtype ", dtype_name(dtype),
                " cannot be cast to ", out_name, "'s dtype ", dtype_name(out->scalar_type()));
    if (std::strcmp(out_name, "self") == 0) {
      TORCH_CHECK(out->sizes().equals(shape), op, ": the broadcast shape ", c10::IntArrayRef(shape),
                  " differs from self's shape ", out->sizes());
    }
  }
  return dtype;
}

at::Tensor add(const at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha);
at::Tensor& add_out(const at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha, at::Tensor& out);
at::Tensor& add_(at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha);
at::Tensor add_scalar(const at::Tensor& self, const c10::Scalar& other, const c10::Scalar& alpha);
at::Tensor& add_scalar_out(const at::Tensor& self, const c10::Scalar& other, const c10::Scalar& alpha, at::Tensor& out);
at::Tensor& add_scalar_(at::Tensor& self, const c10::Scalar& other, const c10::Scalar& alpha);

void add_kernel_cpu(at::TensorIteratorBase& iter, const c10::Scalar& alpha);
#ifdef JITOPS_WITH_CUDA
void add_kernel_cuda(at::TensorIteratorBase& iter, const c10::Scalar& alpha);
#endif

}  // namespace jitops_add
