// Activation functions that kernels apply in their epilogue (fused) or as
// standalone ops. Kept in core so IR, passes and every backend share them.
#pragma once
#include <cmath>
#include <optional>
#include <string_view>

namespace kiln {

// New kinds go at the end: the numbers are stable (tactic signatures record them).
// Gelu is the exact (erf) form, 0.5 x (1 + erf(x / sqrt 2)), torch's
// nn.GELU(approximate='none'); the tanh approximation is a different function.
enum class Activation { None, Relu, Relu6, Silu, Sigmoid, Gelu };

// Throws kiln::Error naming the value: the default of every switch over
// Activation (out of line so this header needs no error header). A kind the
// switch does not handle is named ("cuda dispatch_act: activation gelu is not
// supported here"), a value outside the enum is given by number.
[[noreturn]] void fail_unknown_activation(Activation a, const char* where);

inline const char* activation_name(Activation a) {
  switch (a) {
    case Activation::None: return "none";
    case Activation::Relu: return "relu";
    case Activation::Relu6: return "relu6";
    case Activation::Silu: return "silu";
    case Activation::Sigmoid: return "sigmoid";
    case Activation::Gelu: return "gelu";
    default: fail_unknown_activation(a, "activation_name");
  }
}

inline std::optional<Activation> activation_from_name(std::string_view s) {
  for (Activation a : {Activation::None, Activation::Relu, Activation::Relu6, Activation::Silu, Activation::Sigmoid,
                       Activation::Gelu})
    if (s == activation_name(a)) return a;
  return std::nullopt;
}

inline float apply_activation(Activation a, float x) {
  switch (a) {
    case Activation::None: return x;
    case Activation::Relu: return x > 0.f ? x : 0.f;
    case Activation::Relu6: return x < 0.f ? 0.f : (x > 6.f ? 6.f : x);
    case Activation::Silu: return x / (1.f + std::exp(-x));
    case Activation::Sigmoid: return 1.f / (1.f + std::exp(-x));
    case Activation::Gelu: return 0.5f * x * (1.f + std::erf(x * 0.70710678118654752f));
    default: fail_unknown_activation(a, "apply_activation");
  }
}

}  // namespace kiln
