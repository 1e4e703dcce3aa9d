// The bindings jitops.load_inline(..., functions=[...]) generates after the user's source.
//
// With pybind11 (<torch/extension.h>), every listed function is bound as torch
// binds it (bind below): module.f holds the GIL, as under torch. Besides, each
// listed function whose C++ signature the dispatcher can take as it is
// (Tensor, int64_t, double, bool, Scalar, optional/ArrayRef/List of those;
// returning one of those, a tuple or a vector of them, or void) becomes a
// real op, torch.ops.<per-build namespace>.<name>, with its schema inferred
// from the signature. It is registered without a dispatch key, so it is
// CompositeImplicitAutograd: autograd flows through the ATen ops it calls, as
// through torch's pybind11 bindings, and torch.compile can trace the op
// (module.ops.f); module.f meets torch.compile as torch's binding does
// (jitops/cpp_ext_style.py).
//
// Any other signature (int, float, std::vector<int>, std::string, py::object,
// ...) is bound with pybind11 as torch does, when pybind11 is included (it is
// by <torch/extension.h>, which load_inline adds unless no_implicit_headers=True).
// Without pybind11 such a function is a compile error that says so.
#pragma once

#include <torch/library.h>

#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

namespace jitops::dropin {

template <class T>
struct in_ok : std::bool_constant<c10::guts::typelist::contains<c10::impl::supported_primitive_arg_types, T>::value> {};
template <class T>
struct in_ok<std::optional<T>> : in_ok<T> {};
template <class T>
struct in_ok<c10::ArrayRef<T>> : std::bool_constant<in_ok<T>::value && !std::is_same_v<T, at::Scalar>> {};
template <class T>
struct in_ok<c10::OptionalArrayRef<T>> : in_ok<c10::ArrayRef<T>> {};
template <class T>
struct in_ok<c10::List<T>> : in_ok<c10::ArrayRef<T>> {};

template <class T>
struct out_ok : in_ok<T> {};
template <>
struct out_ok<void> : std::true_type {};
template <>
struct out_ok<at::Tensor&> : std::true_type {};
template <class... T>
struct out_ok<std::tuple<T...>> : std::bool_constant<(out_ok<T>::value && ...)> {};
template <class T>
struct out_ok<std::vector<T>> : std::bool_constant<out_ok<T>::value && !std::is_same_v<T, at::Scalar>> {};

// Whether a function pointer type can be registered with the dispatcher as it is.
template <class F>
struct dispatchable : std::false_type {};
template <class R, class... A>
struct dispatchable<R (*)(A...)> : std::bool_constant<out_ok<R>::value && (in_ok<std::decay_t<A>>::value && ...)> {};
template <class R, class... A>
struct dispatchable<R (*)(A...) noexcept> : dispatchable<R (*)(A...)> {};

template <auto F>
inline constexpr bool is_op = dispatchable<decltype(F)>::value;

// In TORCH_LIBRARY_FRAGMENT(JITOPS_NS, m): define `name` with the schema inferred from F.
template <auto F>
void def(torch::Library& m, const char* name) {
  if constexpr (is_op<F>) {
    m.def(name, F);
  }
}

}  // namespace jitops::dropin

#if defined(PYBIND11_MODULE)
#include <torch/csrc/utils/pybind.h>

namespace jitops::dropin {

// In PYBIND11_MODULE: bind F with pybind11 exactly as torch's load_inline does (the GIL held during the
// call, the docstring, pybind11's conversions), whether or not it is also a dispatcher op.
template <auto F, bool WrapErrors>
void bind(pybind11::module_& m, const char* name, const char* doc) {
  if constexpr (WrapErrors) {
    m.def(name, torch::wrap_pybind_function(F), doc);
  } else {
    m.def(name, F, doc);
  }
}

}  // namespace jitops::dropin
#endif
