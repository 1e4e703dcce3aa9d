// nms for CUDA: the bitmask scheme, with torchvision's CUDA IoU test
// (nms_common.h) for float16, float32 and float64.
//
// Boxes are sorted by decreasing score (stable). The N x N IoU test is cut
// into 64 x 64 tiles; block (row, col) loads 64 column boxes into shared
// memory and each of its threads (one row box) writes one 64-bit word whose
// bit j says "row box suppresses column box j". Only tiles on or above the
// diagonal are computed.
//
// The greedy pass over the words is sequential. Two ways to run it:
//   - small N: copy the mask (N * N / 64 words) to the host and walk it there;
//     one launch and one copy, cheapest while the mask is small;
//   - large N: walk it on the GPU in one block, so the mask never leaves the
//     device. The walk goes chunk by chunk (64 boxes): one warp settles the
//     chunk from its diagonal words (which boxes of the chunk survive, in
//     score order) with a few bit operations per kept box, then the whole
//     block ORs the kept boxes' rows into the "removed" words of the later
//     chunks, many words in flight at once. N / 64 steps with two barriers
//     each, instead of one step per box.
// The result is the same either way: the kept boxes' original indices in
// decreasing score order.
#include <ATen/core/Tensor.h>
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

constexpr int kBlock = 64;                    // boxes per tile: one bit each in a uint64 word
constexpr int64_t kHostPassMaxBoxes = 4096;   // above this, the greedy pass runs on the GPU
constexpr int kWalkThreads = 1024;            // the one block of the device pass
constexpr int kRowsPerLoad = 8;               // mask words one thread loads before combining them
constexpr int64_t kSharedRemovedMax = 6144;   // removed words kept in shared memory (48 KiB)

template <typename T>
__global__ void mask_kernel(const T* __restrict__ boxes, int64_t n, float threshold, uint64_t* __restrict__ mask) {
  using acc_t = typename Acc<T>::type;
  const int64_t row_block = blockIdx.y;
  const int64_t col_block = blockIdx.x;
  if (row_block > col_block) return;  // only boxes after the row box can be suppressed by it
  const int64_t rows_left = n - row_block * kBlock;
  const int64_t cols_left = n - col_block * kBlock;
  const int rows = static_cast<int>(rows_left < kBlock ? rows_left : kBlock);
  const int cols = static_cast<int>(cols_left < kBlock ? cols_left : kBlock);

  __shared__ acc_t tile[kBlock * 4];
  if (threadIdx.x < cols) {
    const T* src = boxes + (col_block * kBlock + threadIdx.x) * 4;
    for (int c = 0; c < 4; ++c) tile[threadIdx.x * 4 + c] = static_cast<acc_t>(src[c]);
  }
  __syncthreads();
  if (threadIdx.x >= rows) return;

  const int64_t i = row_block * kBlock + threadIdx.x;
  acc_t box[4];
  for (int c = 0; c < 4; ++c) box[c] = static_cast<acc_t>(boxes[i * 4 + c]);
  uint64_t bits = 0;
  const int start = row_block == col_block ? threadIdx.x + 1 : 0;
  for (int j = start; j < cols; ++j) {
    // (row box, column box): torchvision's argument order, so the compiler fuses the same products
    if (cuda_suppresses<T>(box, tile + j * 4, threshold)) bits |= uint64_t(1) << j;
  }
  const int64_t col_blocks = (n + kBlock - 1) / kBlock;
  mask[i * col_blocks + col_block] = bits;
}

// The greedy pass on the GPU (one block of kWalkThreads). `removed_global` is
// scratch for the removed words when they do not fit in shared memory, else
// null. Writes the kept boxes' original indices (order[...]) to keep and
// their number to *count.
__global__ void walk_kernel(const uint64_t* __restrict__ mask, int64_t n, int col_blocks,
                            const int64_t* __restrict__ order, int64_t* __restrict__ keep,
                            int64_t* __restrict__ count, uint64_t* removed_global) {
  extern __shared__ uint64_t removed_shared[];
  uint64_t* removed = removed_global != nullptr ? removed_global : removed_shared;
  __shared__ int kept_rows[kBlock];
  __shared__ int kept_count;
  for (int c = threadIdx.x; c < col_blocks; c += blockDim.x) removed[c] = 0;
  __syncthreads();

  int64_t total = 0;  // kept so far (tracked by warp 0)
  for (int b = 0; b < col_blocks; ++b) {
    const int64_t base = static_cast<int64_t>(b) * kBlock;
    if (threadIdx.x < 32) {
      // Warp 0 settles chunk b. Lane l holds the diagonal words of rows l and l + 32.
      const int lane = threadIdx.x;
      const int rows = static_cast<int>(n - base < kBlock ? n - base : kBlock);
      const uint64_t lo = lane < rows ? mask[(base + lane) * col_blocks + b] : 0;
      const uint64_t hi = lane + 32 < rows ? mask[(base + lane + 32) * col_blocks + b] : 0;
      const uint64_t valid = rows == kBlock ? ~uint64_t(0) : (uint64_t(1) << rows) - 1;
      uint64_t gone = removed[b];
      uint64_t kept = 0;
      uint64_t alive = ~gone & valid;
      while (alive != 0) {  // warp-uniform: every lane computes the same words
        const int j = __ffsll(static_cast<long long>(alive)) - 1;
        kept |= uint64_t(1) << j;
        gone |= __shfl_sync(0xffffffffu, j < 32 ? lo : hi, j & 31);  // what box j suppresses in its chunk
        alive = ~gone & valid & ~((uint64_t(2) << j) - 1);          // candidates after j
      }
      for (int half = 0; half < 2; ++half) {
        const int j = lane + 32 * half;
        if ((kept >> j) & 1) {
          const int pos = __popcll(kept & ((uint64_t(1) << j) - 1));
          kept_rows[pos] = j;
          keep[total + pos] = order[base + j];
        }
      }
      const int k = __popcll(kept);
      total += k;
      if (lane == 0) kept_count = k;
    }
    __syncthreads();
    // The whole block: OR the kept rows into the removed words of chunks b+1 ...
    const int k = kept_count;
    const int m = col_blocks - b - 1;
    if (k > 0 && m > 0) {
      const int groups = (k + kRowsPerLoad - 1) / kRowsPerLoad;
      for (int it = threadIdx.x; it < m * groups; it += blockDim.x) {
        const int g = it / m;
        const int c = b + 1 + it % m;  // consecutive threads read consecutive words of a row
        uint64_t acc = 0;
#pragma unroll
        for (int r = 0; r < kRowsPerLoad; ++r) {
          const int q = g * kRowsPerLoad + r;
          if (q < k) acc |= mask[(base + kept_rows[q]) * col_blocks + c];
        }
        if (acc != 0) atomicOr(reinterpret_cast<unsigned long long*>(&removed[c]), acc);
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) *count = total;
}

at::Tensor host_pass(const at::Tensor& mask, const at::Tensor& order, int64_t n, int64_t col_blocks) {
  // Tiles below the diagonal were never written; the pass reads only words
  // (i, c) with c >= i / 64.
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

at::Tensor device_pass(const at::Tensor& mask, const at::Tensor& order, int64_t n, int64_t col_blocks,
                       cudaStream_t stream) {
  at::Tensor keep = at::empty({n}, order.options());
  at::Tensor count = at::empty({1}, order.options());
  at::Tensor scratch;
  size_t shared = 0;
  if (col_blocks <= kSharedRemovedMax) {
    shared = static_cast<size_t>(col_blocks) * sizeof(uint64_t);
  } else {
    scratch = at::empty({col_blocks}, order.options());
  }
  walk_kernel<<<1, kWalkThreads, shared, stream>>>(
      reinterpret_cast<const uint64_t*>(mask.const_data_ptr<int64_t>()), n, static_cast<int>(col_blocks),
      order.const_data_ptr<int64_t>(), keep.mutable_data_ptr<int64_t>(), count.mutable_data_ptr<int64_t>(),
      scratch.defined() ? reinterpret_cast<uint64_t*>(scratch.mutable_data_ptr<int64_t>()) : nullptr);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const int64_t kept = count.cpu().const_data_ptr<int64_t>()[0];  // synchronises with the stream
  return keep.narrow(0, 0, kept);
}

}  // namespace

at::Tensor nms_cuda(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold) {
  check_inputs(boxes, scores);
  const c10::cuda::CUDAGuard guard(boxes.device());
  const int64_t n = boxes.size(0);
  if (n == 0) return at::empty({0}, boxes.options().dtype(at::kLong));
  const int64_t col_blocks = (n + kBlock - 1) / kBlock;
  TORCH_CHECK(col_blocks <= 65535, "nms: at most ", 65535 * kBlock, " boxes on CUDA (the mask grid's limit), got ", n);

  const at::Tensor order = std::get<1>(at::sort(scores, /*stable=*/true, /*dim=*/0, /*descending=*/true));
  const at::Tensor sorted = boxes.index_select(0, order).contiguous();
  at::Tensor mask = at::empty({n * col_blocks}, boxes.options().dtype(at::kLong));

  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(col_blocks));
  const float threshold = static_cast<float>(iou_threshold);  // torchvision's kernel takes a float
  uint64_t* words = reinterpret_cast<uint64_t*>(mask.mutable_data_ptr<int64_t>());
  switch (sorted.scalar_type()) {
    case at::kFloat:
      mask_kernel<float><<<grid, kBlock, 0, stream>>>(sorted.const_data_ptr<float>(), n, threshold, words);
      break;
    case at::kDouble:
      mask_kernel<double><<<grid, kBlock, 0, stream>>>(sorted.const_data_ptr<double>(), n, threshold, words);
      break;
    default:  // float16 (check_inputs allows nothing else)
      mask_kernel<c10::Half><<<grid, kBlock, 0, stream>>>(sorted.const_data_ptr<c10::Half>(), n, threshold, words);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (n <= kHostPassMaxBoxes) return host_pass(mask, order, n, col_blocks);
  return device_pass(mask, order, n, col_blocks, stream);
}

}  // namespace jitops_nms
