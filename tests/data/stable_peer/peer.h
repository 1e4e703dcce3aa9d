// A stable-ABI extension as the ecosystem writes one (tests/test_stable_peer.py): a fixed namespace,
// registrations spread over two files, FRAGMENTs, several IMPL blocks per dispatch key, a hand-boxed
// kernel beside TORCH_BOX, optional tensors, a device guard, and ops only a CUDA build compiles.
// Built unchanged by torch.utils.cpp_extension.load and by jitops.load, with the same flags.
#pragma once

#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/util/Exception.h>

#include <cstdint>

namespace peer {

using torch::stable::Tensor;

// Both inputs float32, contiguous and of one size: every kernel here loops over raw floats.
inline void check_floats(const Tensor& x, const char* what) {
  STD_TORCH_CHECK(
      x.scalar_type() == torch::headeronly::ScalarType::Float, what, ": expected float32");
  STD_TORCH_CHECK(x.is_contiguous(), what, ": expected a contiguous tensor");
}

Tensor row_sums(const Tensor& x);  // defined in peer_rows.cpp

}  // namespace peer
