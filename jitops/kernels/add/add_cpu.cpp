// add / add.out / add_ (Tensor and Scalar overloads) for CPU, and the
// device-agnostic entry points.
//
// The entry points build a TensorIterator (torch.add's broadcasting, type
// promotion, output allocation and out= resizing, memory-overlap checks) and
// run the device kernel. The Scalar overloads wrap the number in a 0-dim
// "wrapped number" tensor, as torch does, so type promotion treats it like a
// Python scalar. The CPU kernel (Add2d below) runs the loop structure of
// torch's cpu_kernel_vec (same chunks, rows, vector body and scalar tails)
// with each of torch's roundings spelled out, so the results are torch's:
//   - vectorised body: fmadd(other, alpha, self), float16 and bfloat16
//     computed in float (Vectorized<Half>::fmadd converts) and rounded once;
//   - scalar loops (tails, strided rows): self + alpha * other in scalar_t,
//     so float16 and bfloat16 round alpha * other to the dtype first and then
//     the sum, as torch's do; float and double as one std::fma;
//   - alpha is converted to the dtype first (alpha.to<scalar_t>());
//   - bool has only the scalar loop.
// The spec builds this file with -ffp-contract=off, so the compiler adds no
// fused multiply-add of its own.
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

#include <cmath>
#include <type_traits>

#include "add_common.h"

namespace jitops_add {

namespace {

// The loop torch's cpu_kernel_vec runs, written out so that each place where
// torch's compiled code rounds differently is explicit rather than left to
// this compiler's choices. Per inner row (TensorIterator gives rows of size0
// elements, split across threads exactly as cpu_kernel_vec splits them):
//   - all contiguous, or one input a broadcast scalar (stride 0): vectorised
//     body over the first floor(n / 2V) * 2V elements, scalar tail after it;
//   - anything else: the scalar loop over the whole row.
// The scalar loop fuses alpha * other + self into one fma for float and
// double (torch's GCC contracts it), except in the tail of a row whose
// `other` is the broadcast scalar: there torch computes alpha * other once,
// rounded, and adds it. float16/bfloat16 round alpha * other to the dtype,
// then the sum.
template <typename scalar_t, bool unit>  // unit: alpha == 1, computed as x + y (the same bits for real types)
struct Add2d {
  using Vec = at::vec::Vectorized<scalar_t>;
  scalar_t alpha;

  static constexpr bool kReal = std::is_same_v<scalar_t, float> || std::is_same_v<scalar_t, double>;
  static constexpr bool kComplex =
      std::is_same_v<scalar_t, c10::complex<float>> || std::is_same_v<scalar_t, c10::complex<double>>;

  // alpha * y. For complex float/double, the products torch's compiled
  // complex multiply fuses: re = fma(ar, c, -(ai * d)), im = fma(ar, d, ai * c).
  scalar_t times_alpha(scalar_t y) const {
    if constexpr (kComplex) {
      const auto ar = alpha.real(), ai = alpha.imag(), c = y.real(), d = y.imag();
      return scalar_t(std::fma(ar, c, -(ai * d)), std::fma(ar, d, ai * c));
    } else {
      return static_cast<scalar_t>(alpha * y);
    }
  }

  scalar_t fused(scalar_t x, scalar_t y) const {
    if constexpr (unit) return x + y;
    if constexpr (kReal) {
      return std::fma(alpha, y, x);
    } else if constexpr (kComplex) {
      return x + times_alpha(y);
    } else {
      return x + alpha * y;
    }
  }

  Vec vfused(Vec x, Vec y) const {
    if constexpr (unit) {
      return x + y;
    } else {
      return at::vec::fmadd(y, Vec(alpha), x);
    }
  }

  void row(char* out, const char* x, const char* y, int64_t n, int scalar_arg) const {
    constexpr int64_t V = Vec::size();
    auto* o = reinterpret_cast<scalar_t*>(out);
    const auto* xs = reinterpret_cast<const scalar_t*>(x);
    const auto* ys = reinterpret_cast<const scalar_t*>(y);
    int64_t i = 0;
    if (scalar_arg == 1) {
      const Vec xv(xs[0]);
      for (; i <= n - 2 * V; i += 2 * V) {
        vfused(xv, Vec::loadu(ys + i)).store(o + i);
        vfused(xv, Vec::loadu(ys + i + V)).store(o + i + V);
      }
      for (; i < n; ++i) o[i] = fused(xs[0], ys[i]);
    } else if (scalar_arg == 2) {
      const Vec yv(ys[0]);
      for (; i <= n - 2 * V; i += 2 * V) {
        vfused(Vec::loadu(xs + i), yv).store(o + i);
        vfused(Vec::loadu(xs + i + V), yv).store(o + i + V);
      }
      if (i < n) {
        scalar_t p = ys[0];
        if constexpr (!unit) p = times_alpha(ys[0]);
        asm volatile("" : "+m"(p));  // rounded once, never fused into the sum
        for (; i < n; ++i) o[i] = xs[i] + p;
      }
    } else {
      for (; i <= n - 2 * V; i += 2 * V) {
        vfused(Vec::loadu(xs + i), Vec::loadu(ys + i)).store(o + i);
        vfused(Vec::loadu(xs + i + V), Vec::loadu(ys + i + V)).store(o + i + V);
      }
      for (; i < n; ++i) o[i] = fused(xs[i], ys[i]);
    }
  }

  void operator()(char** base, const int64_t* strides, int64_t size0, int64_t size1) const {
    char* data[3] = {base[0], base[1], base[2]};
    const int64_t* outer = strides + 3;
    constexpr int64_t s = sizeof(scalar_t);
    int path = -1;  // 0: contiguous, 1/2: that input is a broadcast scalar, -1: strided
    if (strides[0] == s && strides[1] == s && strides[2] == s) path = 0;
    else if (strides[0] == s && strides[1] == 0 && strides[2] == s) path = 1;
    else if (strides[0] == s && strides[1] == s && strides[2] == 0) path = 2;
    for (int64_t j = 0; j < size1; ++j) {
      if (path >= 0) {
        row(data[0], data[1], data[2], size0, path);
      } else {
        for (int64_t i = 0; i < size0; ++i) {
          *reinterpret_cast<scalar_t*>(data[0] + i * strides[0]) =
              fused(*reinterpret_cast<const scalar_t*>(data[1] + i * strides[1]),
                    *reinterpret_cast<const scalar_t*>(data[2] + i * strides[2]));
        }
      }
      for (int k = 0; k < 3; ++k) data[k] += outer[k];
    }
  }
};

}  // namespace

void add_kernel_cpu(at::TensorIteratorBase& iter, const c10::Scalar& alpha) {
  const c10::ScalarType dtype = iter.common_dtype();
  TORCH_INTERNAL_ASSERT(iter.ninputs() == 2 && iter.noutputs() == 1);
  if (dtype == at::kBool) {
    const bool a = alpha.to<bool>();
    at::native::cpu_kernel(iter, [=](bool x, bool y) -> bool { return x + a * y; });
    return;
  }
  AT_DISPATCH_V2(dtype, "add", AT_WRAP([&] {
    const scalar_t a = alpha.to<scalar_t>();
    bool unit = false;
    if constexpr (!c10::is_complex<scalar_t>::value) {
      // 1 * y is exact for real types; complex is left out: (1 + 0i) * y turns an
      // infinite part into NaN, as torch's does.
      unit = a == scalar_t(1);
    }
    if (unit) {
      iter.for_each(Add2d<scalar_t, true>{a}, at::internal::GRAIN_SIZE);
    } else {
      iter.for_each(Add2d<scalar_t, false>{a}, at::internal::GRAIN_SIZE);
    }
    iter.cast_outputs();
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
