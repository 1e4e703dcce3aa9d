// softmax / log_softmax backward kernels for CPU, each one fused kernel:
//   softmax:     grad_in = out * (grad - sum(grad * out))
//   log_softmax: grad_in = grad - exp(out) * sum(grad)
// Vectorised with at::vec and parallel with at::parallel_for, for the last
// dim (one row per step, the row in L1 between its two passes) and for other
// dims (strips of columns, as the forward). Half and bfloat16 compute in
// float and round once; the reductions and formulas are torch's own
// (ATen/native/cpu/SoftMaxKernel.cpp), in the same order.
//
// This file also holds the library's dispatcher registration (the end of the
// file). <torch/library.h> costs ~5 s to parse on its own, most of it the
// ATen core headers this file parses anyway: in a file of its own it made a
// fourth compile on a first build, ~3 s more CPU time for no code.
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/EmptyTensor.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <jitops/op.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "softmax_common.h"
#include "softmax_cpu_vec.h"

namespace jitops_softmax {
namespace {

using at::Tensor;
namespace vec = at::vec;

// log_softmax over the last dim (softmax's lives in softmax_cpu_backward_lastdim.cpp).
template <typename T>
void log_lastdim_backward(const T* grad, const T* out, T* gin, int64_t rows, int64_t n) {
  using acc_t = at::opmath_type<T>;
  using Vec = vec::Vectorized<acc_t>;
  at::parallel_for(0, rows, std::max<int64_t>(1, kGrain / (16 * n)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const acc_t s = vec::reduce_all<T>([](Vec& a, Vec& b) { return a + b; }, grad + r * n, n);
      vec::map2<T>([s](Vec a, Vec b) { return a - b.exp() * Vec(s); }, gin + r * n, grad + r * n, out + r * n, n);
    }
  });
}

// (outer, n, inner) layout: strips of columns, vectorised over columns.
template <typename T, bool LOG>
void strided_backward(const T* grad, const T* out, T* gin, int64_t outer, int64_t n, int64_t inner) {
  using acc_t = at::opmath_type<T>;
  using Vec = vec::Vectorized<acc_t>;
  constexpr int64_t W = Vec::size();
  const int64_t strip = strip_width<T>(n, W);
  const int64_t strips = (inner + strip - 1) / strip;
  const int64_t grain = std::max<int64_t>(1, kGrain / (16 * n * std::min(strip, inner)));
  at::parallel_for(0, outer * strips, grain, [&](int64_t begin, int64_t end) {
    std::unique_ptr<acc_t[]> sum(new acc_t[strip]);
    for (int64_t t = begin; t < end; ++t) {
      const int64_t o = t / strips;
      const int64_t k0 = (t % strips) * strip;
      const int64_t w = std::min(strip, inner - k0);
      const int64_t wv = w / W * W;
      const int64_t base = o * n * inner + k0;
      std::fill(sum.get(), sum.get() + w, acc_t(0));
      for (int64_t d = 0; d < n; ++d) {
        const T* g = grad + base + d * inner;
        const T* y = out + base + d * inner;
        for (int64_t k = 0; k < wv; k += W) {
          const Vec add = LOG ? load_acc(g + k) : load_acc(g + k) * load_acc(y + k);
          (Vec::loadu(sum.get() + k) + add).store(sum.get() + k);
        }
        for (int64_t k = wv; k < w; ++k) {
          sum[k] += LOG ? static_cast<acc_t>(g[k]) : static_cast<acc_t>(g[k]) * static_cast<acc_t>(y[k]);
        }
      }
      for (int64_t d = 0; d < n; ++d) {
        const T* g = grad + base + d * inner;
        const T* y = out + base + d * inner;
        T* gi = gin + base + d * inner;
        for (int64_t k = 0; k < wv; k += W) {
          const Vec gv = load_acc(g + k), yv = load_acc(y + k), s = Vec::loadu(sum.get() + k);
          store_acc(gi + k, LOG ? gv - yv.exp() * s : yv * (gv - s));
        }
        for (int64_t k = wv; k < w; ++k) {
          const acc_t gv = static_cast<acc_t>(g[k]), yv = static_cast<acc_t>(y[k]);
          gi[k] = static_cast<T>(LOG ? gv - std::exp(yv) * sum[k] : yv * (gv - sum[k]));
        }
      }
    }
  });
}

template <bool LOG>
Tensor backward_cpu(const Tensor& grad, const Tensor& out, int64_t dim) {
  constexpr const char* op = LOG ? "log_softmax_backward" : "softmax_backward";
  check_backward(op, grad, out, dim);
  const Tensor gc = grad.contiguous();
  const Tensor yc = out.contiguous();
  Tensor gin = at::detail::empty_cpu(yc.sizes(), yc.scalar_type(), /*pin_memory=*/false, c10::MemoryFormat::Contiguous);
  if (yc.numel() == 0) return gin;
  const Geometry geo = geometry(yc, dim);
  if (!LOG && geo.inner == 1) {
    softmax_lastdim_backward_cpu(gc, yc, gin, geo.outer, geo.n);
    return gin;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, yc.scalar_type(), op, [&] {
    const scalar_t* g = gc.const_data_ptr<scalar_t>();
    const scalar_t* y = yc.const_data_ptr<scalar_t>();
    scalar_t* gi = gin.mutable_data_ptr<scalar_t>();
    if (geo.inner == 1) {
      log_lastdim_backward<scalar_t>(g, y, gi, geo.outer, geo.n);
    } else {
      strided_backward<scalar_t, LOG>(g, y, gi, geo.outer, geo.n, geo.inner);
    }
  });
  return gin;
}

}  // namespace

Tensor softmax_backward_cpu(const Tensor& grad, const Tensor& out, int64_t dim) {
  return backward_cpu<false>(grad, out, dim);
}
Tensor log_softmax_backward_cpu(const Tensor& grad, const Tensor& out, int64_t dim) {
  return backward_cpu<true>(grad, out, dim);
}

}  // namespace jitops_softmax

// ------------------------------------------------------------ registration

JITOPS_LIBRARY_IMPL(CPU, m) {
  m.impl("softmax", &jitops_softmax::softmax_cpu);
  m.impl("log_softmax", &jitops_softmax::log_softmax_cpu);
  m.impl("softmax_backward", &jitops_softmax::softmax_backward_cpu);
  m.impl("log_softmax_backward", &jitops_softmax::log_softmax_backward_cpu);
}

#ifdef JITOPS_WITH_CUDA
JITOPS_LIBRARY_IMPL(CUDA, m) {
  m.impl("softmax", &jitops_softmax::softmax_cuda);
  m.impl("log_softmax", &jitops_softmax::log_softmax_cuda);
  m.impl("softmax_backward", &jitops_softmax::softmax_backward_cuda);
  m.impl("log_softmax_backward", &jitops_softmax::log_softmax_backward_cuda);
}
#endif

// Autograd: C++ kernels that skip autograd when no input needs grad, and
// otherwise call the twins softmax_autograd / log_softmax_autograd, whose
// derivatives are registered from python.py (see jitops/op.h).
JITOPS_LIBRARY_IMPL(Autograd, m) {
  jitops::differentiable(m, "softmax");
  jitops::differentiable(m, "log_softmax");
}

// The twins' forwards: they call softmax / log_softmax below autograd.
// The backward ops are fused kernels per backend (above).
JITOPS_LIBRARY_IMPL(CompositeExplicitAutograd, m) {
  jitops::twin(m, "softmax");
  jitops::twin(m, "log_softmax");
}
