// torch's Python spelling of a dtype ("float32"), so that TORCH_CHECK messages
// from C++ read exactly like the Python fake kernels' (str(dtype) without
// "torch."). Lean: only <c10/core/ScalarType.h>.
#pragma once

#include <c10/core/ScalarType.h>

namespace jitops {

inline const char* dtype_name(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Half: return "float16";
    case c10::ScalarType::BFloat16: return "bfloat16";
    case c10::ScalarType::Float: return "float32";
    case c10::ScalarType::Double: return "float64";
    case c10::ScalarType::Byte: return "uint8";
    case c10::ScalarType::Char: return "int8";
    case c10::ScalarType::Short: return "int16";
    case c10::ScalarType::Int: return "int32";
    case c10::ScalarType::Long: return "int64";
    case c10::ScalarType::Bool: return "bool";
    case c10::ScalarType::ComplexHalf: return "complex32";
    case c10::ScalarType::ComplexFloat: return "complex64";
    case c10::ScalarType::ComplexDouble: return "complex128";
    case c10::ScalarType::UInt16: return "uint16";
    case c10::ScalarType::UInt32: return "uint32";
    case c10::ScalarType::UInt64: return "uint64";
    case c10::ScalarType::Float8_e4m3fn: return "float8_e4m3fn";
    case c10::ScalarType::Float8_e5m2: return "float8_e5m2";
    default: return c10::toString(t);
  }
}

}  // namespace jitops
