// The nms library of a CPU target, on torch's stable C ABI: it defines the op
// and registers its CPU and QuantizedCPU kernels, and the key holds the ABI's
// target version instead of torch's, so one build (or one bundle entry)
// serves every torch from that version on.
//
// Same algorithms as the ATen build (nms_greedy.h), same checks and messages
// as nms_common.h (and python.py's fake kernel). Two rules live elsewhere:
//   - autocast: a stable kernel cannot redispatch with autocast excluded, so
//     python.py registers torchvision's rule (float16/bfloat16 -> float32,
//     then the op again) when the library has no autocast kernel;
//   - autograd: no kernel; torch's fallback gives int64 indices no grad_fn,
//     as jitops::not_differentiable does in the ATen build.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "nms_greedy.h"

namespace {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

// A dtype as the shim reports it: c10::ScalarType's value. The stable
// conversions refuse the quantized dtypes (Tensor::scalar_type() throws for
// them), so the code is compared with headeronly's enum, which is c10's.
ScalarType dtype_of(const Tensor& t) {
  int32_t code = 0;
  if (aoti_torch_get_dtype(t.get(), &code) != AOTI_TORCH_SUCCESS) throw std::runtime_error("nms: cannot read a dtype");
  return static_cast<ScalarType>(code);
}

bool is_quantized(ScalarType t) {
  return t == ScalarType::QInt8 || t == ScalarType::QUInt8 || t == ScalarType::QInt32;
}

// torch's Python names, as jitops::dtype_name and nms_common.h's dtype_name.
std::string dtype_name(ScalarType t) {
  switch (t) {
    case ScalarType::Half: return "float16";
    case ScalarType::BFloat16: return "bfloat16";
    case ScalarType::Float: return "float32";
    case ScalarType::Double: return "float64";
    case ScalarType::Byte: return "uint8";
    case ScalarType::Char: return "int8";
    case ScalarType::Short: return "int16";
    case ScalarType::Int: return "int32";
    case ScalarType::Long: return "int64";
    case ScalarType::Bool: return "bool";
    case ScalarType::ComplexHalf: return "complex32";
    case ScalarType::ComplexFloat: return "complex64";
    case ScalarType::ComplexDouble: return "complex128";
    case ScalarType::UInt16: return "uint16";
    case ScalarType::UInt32: return "uint32";
    case ScalarType::UInt64: return "uint64";
    case ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case ScalarType::Float8_e5m2: return "float8_e5m2";
    case ScalarType::QInt8: return "qint8";
    case ScalarType::QUInt8: return "quint8";
    case ScalarType::QInt32: return "qint32";
    default: return torch::headeronly::toString(t);
  }
}

std::string shape(const Tensor& t) {
  std::ostringstream s;
  s << '[';
  for (int64_t d = 0; d < t.dim(); ++d) s << (d ? ", " : "") << t.size(d);
  return s.str() + ']';
}

std::string device_name(const Tensor& t) {
  const torch::stable::Device d = t.device();
  std::string name = d.type() == torch::headeronly::DeviceType::CPU    ? "cpu"
                     : d.type() == torch::headeronly::DeviceType::CUDA ? "cuda"
                                                                        : "device type " + std::to_string(static_cast<int>(d.type()));
  return d.index() >= 0 ? name + ":" + std::to_string(d.index()) : name;
}

// TORCH_CHECK's message without STD_TORCH_CHECK's "function, file:line" prefix.
template <typename... Parts>
void check(bool ok, const Parts&... parts) {
  if (ok) return;
  std::ostringstream s;
  (s << ... << parts);
  throw std::runtime_error(s.str());
}

void check_shapes(const Tensor& boxes, const Tensor& scores) {
  check(boxes.dim() == 2 && boxes.size(1) == 4, "nms: boxes must be (N, 4), got ", shape(boxes));
  check(scores.dim() == 1 && scores.size(0) == boxes.size(0), "nms: scores must be (N,) for N = ", boxes.size(0),
        " boxes, got ", shape(scores));
}

void check_same(const Tensor& boxes, const Tensor& scores) {
  check(dtype_of(scores) == dtype_of(boxes), "nms: boxes and scores must have the same dtype, got ",
        dtype_name(dtype_of(boxes)), " and ", dtype_name(dtype_of(scores)));
  const torch::stable::Device b = boxes.device(), s = scores.device();
  check(b.type() == s.type() && b.index() == s.index(), "nms: boxes and scores must be on the same device, got ",
        device_name(boxes), " and ", device_name(scores));
}

void check_inputs(const Tensor& boxes, const Tensor& scores) {
  check_shapes(boxes, scores);
  const ScalarType t = dtype_of(boxes);
  check(t == ScalarType::Float || t == ScalarType::Double || t == ScalarType::Half,
        "nms: expected float16, float32 or float64 boxes, got ", dtype_name(t),
        " (bfloat16 is taken under torch.autocast, which computes it in float32; quantized boxes need "
        "quantized scores)");
  check_same(boxes, scores);
}

// Whether the call of aten::<op> on t succeeds (its result, a float or a
// tensor, is released). The shim has no qscheme accessor.
bool succeeds(const char* op, const Tensor& t, bool tensor_result) {
  std::array<StableIValue, 1> stack{torch::stable::detail::from(t)};
  if (torch_call_dispatcher(op, "", stack.data(), TORCH_ABI_VERSION) != AOTI_TORCH_SUCCESS) return false;
  if (tensor_result) (void)torch::stable::detail::to<Tensor>(stack[0]);  // owns, then frees, the result
  return true;
}

// c10::toString(qscheme) of a quantized tensor that is not per-tensor affine
// (q_scale succeeds only for that one): per-channel zero points are int64,
// those of the float-qparams scheme floating.
std::string per_channel_scheme(const Tensor& t) {
  std::array<StableIValue, 1> stack{torch::stable::detail::from(t)};
  if (torch_call_dispatcher("aten::q_per_channel_zero_points", "", stack.data(), TORCH_ABI_VERSION) != AOTI_TORCH_SUCCESS) {
    return "a scheme other than per_tensor_affine";
  }
  const Tensor zero_points = torch::stable::detail::to<Tensor>(stack[0]);
  return dtype_of(zero_points) == ScalarType::Long ? "per_channel_affine" : "per_channel_affine_float_qparams";
}

void check_quantized_inputs(const Tensor& boxes, const Tensor& scores) {
  check_shapes(boxes, scores);
  check_same(boxes, scores);
  const ScalarType t = dtype_of(boxes);
  check(is_quantized(t), "nms: expected qint8, quint8 or qint32 quantized boxes, got ", dtype_name(t));
  for (const Tensor* q : {&boxes, &scores}) {
    if (succeeds("aten::q_scale", *q, false)) continue;
    check(false, "nms: quantized ", q == &boxes ? "boxes" : "scores",
          " must be quantized per tensor (torch.quantize_per_tensor), got ", per_channel_scheme(*q),
          ": per-channel scales would make the integer values of different boxes incomparable. Fix: "
          "dequantize them first");
  }
}

Tensor indices(const std::vector<int64_t>& keep) {
  const std::vector<int64_t> size{static_cast<int64_t>(keep.size())};
  Tensor result = torch::stable::empty(size, ScalarType::Long, std::nullopt,
                                       torch::stable::Device(torch::headeronly::DeviceType::CPU), false);
  std::copy(keep.begin(), keep.end(), static_cast<int64_t*>(result.mutable_data_ptr()));
  return result;
}

template <typename T>
const T* data(const Tensor& t) {
  return static_cast<const T*>(t.const_data_ptr());
}

// The indices of a checked call: `pass` gets the contiguous boxes and scores
// and their number, when there is any box.
template <typename Pass>
Tensor greedy_indices(const Tensor& boxes, const Tensor& scores, Pass pass) {
  const int64_t n = boxes.size(0);
  return indices(n > 0 ? pass(torch::stable::contiguous(boxes), torch::stable::contiguous(scores), n)
                       : std::vector<int64_t>{});
}

Tensor nms_cpu(Tensor boxes, Tensor scores, double iou_threshold) {
  using namespace jitops_nms;
  check_inputs(boxes, scores);
  return greedy_indices(boxes, scores, [iou_threshold](const Tensor& b, const Tensor& s, int64_t n) {
    switch (dtype_of(b)) {
      case ScalarType::Float: return torchvision_cpu(data<float>(b), data<float>(s), n, iou_threshold);
      case ScalarType::Double: return torchvision_cpu(data<double>(b), data<double>(s), n, iou_threshold);
      default:  // float16 (check_inputs allows nothing else)
        return torchvision_cuda_half(data<c10::Half>(b), data<c10::Half>(s), n, iou_threshold);
    }
  });
}

Tensor nms_quantized_cpu(Tensor boxes, Tensor scores, double iou_threshold) {
  using namespace jitops_nms;
  check_quantized_inputs(boxes, scores);
  return greedy_indices(boxes, scores, [iou_threshold](const Tensor& b, const Tensor& s, int64_t n) {
    switch (dtype_of(b)) {
      case ScalarType::QInt8: return torchvision_quantized(data<c10::qint8>(b), data<c10::qint8>(s), n, iou_threshold);
      case ScalarType::QUInt8:
        return torchvision_quantized(data<c10::quint8>(b), data<c10::quint8>(s), n, iou_threshold);
      default:  // qint32 (check_quantized_inputs allows nothing else)
        return torchvision_quantized(data<c10::qint32>(b), data<c10::qint32>(s), n, iou_threshold);
    }
  });
}

}  // namespace

STABLE_TORCH_LIBRARY(JITOPS_NS, m) {
  m.def("nms(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor");
}

STABLE_TORCH_LIBRARY_IMPL(JITOPS_NS, CPU, m) {
  m.impl("nms", TORCH_BOX(&nms_cpu));
}

STABLE_TORCH_LIBRARY_IMPL(JITOPS_NS, QuantizedCPU, m) {
  m.impl("nms", TORCH_BOX(&nms_quantized_cpu));
}
