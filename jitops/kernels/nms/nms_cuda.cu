// nms for CUDA: the bitmask scheme.
//
// Boxes are sorted by decreasing score (stable). The N x N IoU test is cut
// into 64 x 64 tiles; block (row, col) loads 64 column boxes into shared
// memory and each of its threads (one row box) writes one 64-bit word whose
// bit j says "row box suppresses column box j". The greedy pass over the
// words is sequential and cheap; it runs on the host over the copied mask.
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/sort.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <vector>

#include "nms_common.h"

namespace jitops_nms {
namespace {

constexpr int kBlock = 64;  // boxes per tile: one bit each in a uint64 word

template <typename T>
__device__ __forceinline__ bool suppresses(const T* a, const T* b, T threshold) {
  const T w = max(T(0), min(a[2], b[2]) - max(a[0], b[0]));
  const T h = max(T(0), min(a[3], b[3]) - max(a[1], b[1]));
  const T inter = w * h;
  const T uni = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter;
  return inter / uni > threshold;
}

template <typename T>
__global__ void mask_kernel(const T* __restrict__ boxes, int64_t n, T threshold, uint64_t* __restrict__ mask) {
  const int64_t row_block = blockIdx.y;
  const int64_t col_block = blockIdx.x;
  if (row_block > col_block) return;  // only boxes after the row box can be suppressed by it
  const int64_t rows_left = n - row_block * kBlock;
  const int64_t cols_left = n - col_block * kBlock;
  const int rows = static_cast<int>(rows_left < kBlock ? rows_left : kBlock);
  const int cols = static_cast<int>(cols_left < kBlock ? cols_left : kBlock);

  __shared__ T tile[kBlock * 4];
  if (threadIdx.x < cols) {
    const T* src = boxes + (col_block * kBlock + threadIdx.x) * 4;
    for (int c = 0; c < 4; ++c) tile[threadIdx.x * 4 + c] = src[c];
  }
  __syncthreads();
  if (threadIdx.x >= rows) return;

  const int64_t i = row_block * kBlock + threadIdx.x;
  const T* box = boxes + i * 4;
  uint64_t bits = 0;
  const int start = row_block == col_block ? threadIdx.x + 1 : 0;
  for (int j = start; j < cols; ++j) {
    if (suppresses(box, tile + j * 4, threshold)) bits |= uint64_t(1) << j;
  }
  const int64_t col_blocks = (n + kBlock - 1) / kBlock;
  mask[i * col_blocks + col_block] = bits;
}

}  // namespace

at::Tensor nms_cuda(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold) {
  check_inputs(boxes, scores);
  const c10::cuda::CUDAGuard guard(boxes.device());
  const int64_t n = boxes.size(0);
  if (n == 0) return at::empty({0}, boxes.options().dtype(at::kLong));

  const at::Tensor order = std::get<1>(at::sort(scores, /*stable=*/true, /*dim=*/0, /*descending=*/true));
  const at::Tensor sorted = boxes.index_select(0, order).contiguous();
  const int64_t col_blocks = (n + kBlock - 1) / kBlock;
  at::Tensor mask = at::empty({n * col_blocks}, boxes.options().dtype(at::kLong));

  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(col_blocks));
  AT_DISPATCH_FLOATING_TYPES(sorted.scalar_type(), "nms", [&] {
    mask_kernel<scalar_t><<<grid, kBlock, 0, stream>>>(
        sorted.const_data_ptr<scalar_t>(), n, static_cast<scalar_t>(iou_threshold),
        reinterpret_cast<uint64_t*>(mask.mutable_data_ptr<int64_t>()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });

  // Tiles below the diagonal were never written; the greedy pass reads only
  // words (i, b) with b >= i / 64.
  const at::Tensor mask_cpu = mask.cpu();  // synchronises with the stream
  const uint64_t* words = reinterpret_cast<const uint64_t*>(mask_cpu.const_data_ptr<int64_t>());
  std::vector<uint64_t> removed(col_blocks, 0);
  std::vector<int64_t> keep;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = i / kBlock;
    if (removed[b] & (uint64_t(1) << (i % kBlock))) continue;
    keep.push_back(i);
    const uint64_t* row = words + i * col_blocks;
    for (int64_t c = b; c < col_blocks; ++c) removed[c] |= row[c];
  }
  const at::Tensor keep_cpu =
      at::from_blob(keep.data(), {static_cast<int64_t>(keep.size())}, at::TensorOptions().dtype(at::kLong)).clone();
  return order.index_select(0, keep_cpu.to(order.device()));
}

}  // namespace jitops_nms
