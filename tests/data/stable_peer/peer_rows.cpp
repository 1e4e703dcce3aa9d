// A second file: a FRAGMENT of the same namespace and another CPU IMPL block.
#include "peer.h"

#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>

namespace peer {

// The sum of each row of a 2-D float tensor.
Tensor row_sums(const Tensor& x) {
  check_floats(x, "row_sums");
  STD_TORCH_CHECK(x.dim() == 2, "row_sums: expected a 2-D tensor, got ", x.dim(), " dims");
  const int64_t rows = x.size(0), cols = x.size(1);
  Tensor out = torch::stable::new_empty(x, {rows});
  const float* xp = x.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    float acc = 0.0f;
    for (int64_t c = 0; c < cols; ++c) {
      acc += xp[r * cols + c];
    }
    op[r] = acc;
  }
  return out;
}

}  // namespace peer

STABLE_TORCH_LIBRARY_FRAGMENT(jitops_peer, m) { m.def("row_sums(Tensor x) -> Tensor"); }

STABLE_TORCH_LIBRARY_IMPL(jitops_peer, CPU, m) { m.impl("row_sums", TORCH_BOX(&peer::row_sums)); }
