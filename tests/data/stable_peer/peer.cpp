#include "peer.h"

#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>

#include <optional>

#ifdef PEER_WITH_CUDA
#include <cuda_runtime.h>
#endif

using peer::Tensor;

// out = a * x + b * y, registered through a boxed function written by hand (no TORCH_BOX).
static Tensor axpby(const Tensor& x, const Tensor& y, double a, double b) {
  peer::check_floats(x, "axpby x");
  peer::check_floats(y, "axpby y");
  STD_TORCH_CHECK(x.numel() == y.numel(), "axpby: sizes differ: ", x.numel(), " vs ", y.numel());
  Tensor out = torch::stable::empty_like(x);
  const float* xp = x.const_data_ptr<float>();
  const float* yp = y.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    op[i] = static_cast<float>(a) * xp[i] + static_cast<float>(b) * yp[i];
  }
  return out;
}

static void axpby_boxed(StableIValue* stack, uint64_t num_args, uint64_t num_outputs) {
  using torch::stable::detail::to;
  Tensor out = axpby(
      to<Tensor>(stack[0]), to<Tensor>(stack[1]), to<double>(stack[2]), to<double>(stack[3]));
  stack[0] = torch::stable::detail::from(out);
}

// x + bias where a bias is given, else a copy of x: a boxed std::optional<Tensor> argument.
static Tensor add_bias(Tensor x, std::optional<Tensor> bias) {
  peer::check_floats(x, "add_bias x");
  Tensor out = torch::stable::clone(x);
  if (!bias.has_value()) {
    return out;
  }
  peer::check_floats(*bias, "add_bias bias");
  STD_TORCH_CHECK(bias->numel() == x.size(x.dim() - 1), "add_bias: bias must match the last dim");
  const float* bp = bias->const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  const int64_t cols = bias->numel();
  for (int64_t i = 0; i < out.numel(); ++i) {
    op[i] += bp[i % cols];
  }
  return out;
}

// In place: x *= s, returned (a mutating schema, Tensor(a!)).
static Tensor scale_(Tensor x, double s) {
  peer::check_floats(x, "scale_");
  float* p = x.mutable_data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    p[i] *= static_cast<float>(s);
  }
  return x;
}

// A copy made on the tensor's own device, under a device guard where that is an accelerator.
static Tensor copy_on_device(const Tensor& x) {
  if (!x.is_cpu()) {
    torch::stable::accelerator::DeviceGuard guard(x.get_device_index());
    return torch::stable::clone(x);
  }
  return torch::stable::clone(x);
}

static bool is_contiguous(Tensor x) { return x.is_contiguous(); }

STABLE_TORCH_LIBRARY(jitops_peer, m) {
  m.def("axpby(Tensor x, Tensor y, float a, float b) -> Tensor");
  m.def("add_bias(Tensor x, Tensor? bias) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(jitops_peer, CPU, m) { m.impl("axpby", &axpby_boxed); }

STABLE_TORCH_LIBRARY_IMPL(jitops_peer, CPU, m) { m.impl("add_bias", TORCH_BOX(&add_bias)); }

STABLE_TORCH_LIBRARY_FRAGMENT(jitops_peer, m) {
  m.def("scale_(Tensor(a!) x, float s) -> Tensor(a!)");
  m.def("copy_on_device(Tensor x) -> Tensor");
  m.def("is_contiguous(Tensor x) -> bool");
}

STABLE_TORCH_LIBRARY_IMPL(jitops_peer, CPU, m) { m.impl("scale_", TORCH_BOX(&scale_)); }

STABLE_TORCH_LIBRARY_IMPL(jitops_peer, CompositeExplicitAutograd, m) {
  m.impl("copy_on_device", TORCH_BOX(&copy_on_device));
  m.impl("is_contiguous", TORCH_BOX(&is_contiguous));
}

#ifdef PEER_WITH_CUDA
// Which device is current under a guard for device_index: only a CUDA build has these ops.
static int64_t guarded_device(int64_t device_index) {
  torch::stable::accelerator::DeviceGuard guard(static_cast<int32_t>(device_index));
  int current = -1;
  STD_TORCH_CHECK(cudaGetDevice(&current) == cudaSuccess, "cudaGetDevice failed");
  return current;
}

static int64_t current_device_index() {
  return torch::stable::accelerator::getCurrentDeviceIndex();
}

STABLE_TORCH_LIBRARY_FRAGMENT(jitops_peer, m) {
  m.def("guarded_device(int device_index) -> int");
  m.def("current_device_index() -> int");
}

STABLE_TORCH_LIBRARY_IMPL(jitops_peer, CompositeExplicitAutograd, m) {
  m.impl("guarded_device", TORCH_BOX(&guarded_device));
  m.impl("current_device_index", TORCH_BOX(&current_device_index));
}
#endif  // PEER_WITH_CUDA
