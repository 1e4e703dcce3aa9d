// jitops registration helpers.
//
// Every build of a kernel library registers its ops in a namespace derived
// from the cache key, so that a rebuilt library can be loaded next to an older
// one in the same process. Kernel sources never spell a namespace themselves;
// they register through these macros:
//
//   JITOPS_LIBRARY(m) { m.def("my_relu(Tensor x) -> Tensor", &my_relu); }
//   JITOPS_LIBRARY_IMPL(CPU, m) { m.impl("softmax", &softmax_cpu); }
//
// Builtin ops declare their schemas once, in their Python spec, and only use
// JITOPS_LIBRARY_IMPL. User kernels (jitops.load / load_inline) may define
// their schemas in C++ with JITOPS_LIBRARY.
//
// Autograd without a Python frame per call
// ----------------------------------------
// A derivative registered from Python (torch.library.register_autograd) is a
// Python kernel on the Autograd key: every call pays for it (~4 us), even
// under no_grad. Instead, a differentiable op `f` gets a C++ Autograd kernel:
//
//   JITOPS_LIBRARY_IMPL(Autograd, m) { jitops::differentiable(m, "f"); }
//   JITOPS_LIBRARY_IMPL(CompositeExplicitAutograd, m) { jitops::twin(m, "f"); }
//
// When no input requires grad (or grad mode is off) it drops the autograd
// keys and goes straight to the backend kernel. Otherwise it calls the twin
// op `f_autograd` (same schema, defined from Python by
// jitops.kernels._autograd), whose derivative is registered from Python and
// whose forward (`jitops::twin`) calls `f` again below autograd.
// `jitops::not_differentiable` does the same for ops with no derivative; for
// ops that mutate an argument (in-place, out=) it refuses inputs that need
// grad, as torch does for out=.
//
// Only dispatcher headers are used here: torch/csrc/autograd headers take
// seconds to parse.
#pragma once

#include <torch/library.h>

#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <string>

// The namespace is a string that jitops defines in one small generated
// translation unit per build (jitops::detail::library_namespace), not a macro:
// so a kernel file's object does not depend on the build's key, and a library
// whose one file was edited recompiles that file only (the per-file object
// cache). -DJITOPS_NS=<namespace> is still passed to a file that names
// JITOPS_NS itself (and to every file of a build without that cache); the
// macros then use it, which registers under the same namespace.
#ifdef JITOPS_NS
#define JITOPS_LIBRARY_EXPAND_(ns, m) TORCH_LIBRARY(ns, m)
#define JITOPS_LIBRARY_IMPL_EXPAND_(ns, k, m) TORCH_LIBRARY_IMPL(ns, k, m)
#define JITOPS_LIBRARY(m) JITOPS_LIBRARY_EXPAND_(JITOPS_NS, m)
#define JITOPS_LIBRARY_IMPL(k, m) JITOPS_LIBRARY_IMPL_EXPAND_(JITOPS_NS, k, m)
#else
namespace jitops {
namespace detail {
__attribute__((visibility("hidden"))) extern const char library_namespace[];
} // namespace detail
} // namespace jitops

#define JITOPS_LIBRARY_UID_(m, uid)                                                            \
  static void C10_CONCATENATE(jitops_library_init_, uid)(torch::Library&);                    \
  static const torch::detail::TorchLibraryInit C10_CONCATENATE(jitops_library_static_init_, uid)( \
      torch::Library::DEF, &C10_CONCATENATE(jitops_library_init_, uid),                        \
      ::jitops::detail::library_namespace, std::nullopt, __FILE__, __LINE__);                  \
  void C10_CONCATENATE(jitops_library_init_, uid)(torch::Library & m)
#define JITOPS_LIBRARY_IMPL_UID_(k, m, uid)                                                    \
  static void C10_CONCATENATE(jitops_library_impl_init_##k##_, uid)(torch::Library&);        \
  static const torch::detail::TorchLibraryInit C10_CONCATENATE(                              \
      jitops_library_impl_static_init_##k##_, uid)(                                           \
      torch::Library::IMPL, &C10_CONCATENATE(jitops_library_impl_init_##k##_, uid),          \
      ::jitops::detail::library_namespace, std::make_optional(c10::DispatchKey::k), __FILE__, \
      __LINE__);                                                                              \
  void C10_CONCATENATE(jitops_library_impl_init_##k##_, uid)(torch::Library & m)
#define JITOPS_LIBRARY(m) JITOPS_LIBRARY_UID_(m, C10_UID)
#define JITOPS_LIBRARY_IMPL(k, m) JITOPS_LIBRARY_IMPL_UID_(k, m, C10_UID)
#endif

namespace jitops {

// Suffix of the twin op that carries a differentiable op's derivative.
constexpr const char* kTwinSuffix = "_autograd";

namespace detail {

inline bool needs_grad(const c10::OperatorHandle& op, const torch::jit::Stack* stack) {
  if (!c10::GradMode::is_enabled()) return false;
  const size_t n = op.schema().arguments().size();
  for (auto it = stack->end() - static_cast<std::ptrdiff_t>(n); it != stack->end(); ++it) {
    if (it->isTensor()) {
      if (it->toTensor().requires_grad()) return true;
    } else if (it->isTensorList()) {
      for (const at::Tensor& t : it->toTensorList()) {
        if (t.defined() && t.requires_grad()) return true;
      }
    }
  }
  return false;
}

inline void below_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset);
  op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
}

inline void via_twin(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  if (!needs_grad(op, stack)) {
    below_autograd(op, ks, stack);
    return;
  }
  const c10::OperatorName& name = op.schema().operator_name();
  const auto twin = c10::Dispatcher::singleton().findSchema({name.name + kTwinSuffix, name.overload_name});
  TORCH_CHECK(twin.has_value(), name.name, ": an input requires grad but the twin op ", name.name, kTwinSuffix,
              " that carries its derivative is not defined. Fix: load the library through jitops.get, which "
              "defines it (jitops.kernels._autograd.define_twin)");
  twin->callBoxed(stack);
}

inline void without_grad(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  if (!schema.is_mutable()) {
    below_autograd(op, ks, stack);
    return;
  }
  TORCH_CHECK(!needs_grad(op, stack), schema.operator_name(),
              ": the in-place and out= variants do not support autograd, but an input requires grad. "
              "Fix: use the functional op, or call it under torch.no_grad()");
  // Custom ops get a fallthrough ADInplaceOrView kernel, so the version
  // counters of mutated tensors are bumped here, as torch's own in-place ops do.
  const size_t n = schema.arguments().size();
  c10::SmallVector<at::Tensor, 2> written;
  for (size_t i = 0; i < n; ++i) {
    const c10::AliasInfo* alias = schema.arguments()[i].alias_info();
    const c10::IValue& v = (*stack)[stack->size() - n + i];
    if (alias != nullptr && alias->isWrite() && v.isTensor()) written.push_back(v.toTensor());
  }
  below_autograd(op, ks, stack);
  for (const at::Tensor& t : written) t.unsafeGetTensorImpl()->bump_version();
}

inline void call_primal(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  const c10::OperatorName& name = op.schema().operator_name();
  const std::string primal = name.name.substr(0, name.name.size() - std::char_traits<char>::length(kTwinSuffix));
  // The twin's autograd kernel already ran; never re-enter it through `name`.
  const c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset);
  c10::Dispatcher::singleton().findSchemaOrThrow(primal.c_str(), name.overload_name.c_str()).callBoxed(stack);
}

}  // namespace detail

// Autograd-key kernel of a differentiable op (use in JITOPS_LIBRARY_IMPL(Autograd, m)).
inline void differentiable(torch::Library& m, const char* name) {
  m.impl(name, torch::CppFunction::makeFromBoxedFunction<&detail::via_twin>());
}

// Autograd-key kernel of an op without a derivative (use in JITOPS_LIBRARY_IMPL(Autograd, m)).
inline void not_differentiable(torch::Library& m, const char* name) {
  m.impl(name, torch::CppFunction::makeFromBoxedFunction<&detail::without_grad>());
}

// Forward of the twin `<name>_autograd`: calls `name` (use in
// JITOPS_LIBRARY_IMPL(CompositeExplicitAutograd, m)). An overload keeps its
// name: the twin of "add.Scalar" is "add_autograd.Scalar".
inline void twin(torch::Library& m, const char* name) {
  const std::string full(name);
  const size_t dot = full.find('.');
  const std::string twin_name = dot == std::string::npos
                                    ? full + kTwinSuffix
                                    : full.substr(0, dot) + kTwinSuffix + full.substr(dot);
  m.impl(twin_name.c_str(), torch::CppFunction::makeFromBoxedFunction<&detail::call_primal>());
}

}  // namespace jitops
