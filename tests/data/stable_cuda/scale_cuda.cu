// A small CUDA kernel on torch's stable ABI: y = x * s for float32, on the tensor's device and its
// current stream. Built by tests/test_stable_cuda.py and by the CUDA CI leg (.ci/cuda_leg.py).
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/Exception.h>

#include <cuda_runtime.h>

using torch::stable::Tensor;

__global__ void scale_kernel(const float* x, float* y, float s, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) y[i] = x[i] * s;
}

Tensor scale(Tensor x, double s) {
  STD_TORCH_CHECK(x.is_cuda(), "scale: x must be a CUDA tensor");
  STD_TORCH_CHECK(x.scalar_type() == torch::headeronly::ScalarType::Float,
                  "scale: x must be float32");
  Tensor xc = torch::stable::contiguous(x);
  torch::stable::accelerator::DeviceGuard guard(xc.get_device_index());
  Tensor out = torch::stable::empty_like(xc);
  int64_t n = xc.numel();
  if (n > 0) {
    auto stream = static_cast<cudaStream_t>(
        torch::stable::accelerator::getCurrentStream(xc.get_device_index()).nativeHandle());
    unsigned blocks = static_cast<unsigned>((n + 255) / 256);
    scale_kernel<<<blocks, 256, 0, stream>>>(xc.const_data_ptr<float>(),
                                             out.mutable_data_ptr<float>(),
                                             static_cast<float>(s), n);
    cudaError_t err = cudaGetLastError();
    STD_TORCH_CHECK(err == cudaSuccess, "scale: launch failed: ", cudaGetErrorString(err));
  }
  return out;
}

STABLE_TORCH_LIBRARY(JITOPS_NS, m) { m.def("scale(Tensor x, float s) -> Tensor"); }
STABLE_TORCH_LIBRARY_IMPL(JITOPS_NS, CUDA, m) { m.impl("scale", TORCH_BOX(&scale)); }
