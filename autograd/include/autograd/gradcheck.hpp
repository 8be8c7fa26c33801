#pragma once
// Numerical gradient checking: the analytic gradients that backward() computes against
// central differences (f(x + eps) - f(x - eps)) / 2eps, in float64.
//
// gradcheck perturbs the given input tensors in place (and restores them exactly), so a
// function that reads a module's parameters directly is checked through those parameters when
// they are passed as inputs. Only inputs that require grad are checked. Messages and the result
// name an input by its index and, when it has one, its tensor name (a module's parameters carry
// their dotted names): "input 3 'attn.W_O' element 5 [1, 2] (output element 0)".
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "autograd/tensor.hpp"

namespace autograd {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-8;   // an element passes when |analytic - numeric| <= atol + rtol * |numeric|
  double rtol = 1e-6;
  // Full Jacobian while outputs x inputs stays below this; above, random projections.
  std::int64_t max_full_jacobian = 1 << 18;
  int num_projections = 16;
  std::uint64_t seed = 0;
  // Forward mode as well (PyTorch's check_forward_ad): along forward_directions random directions
  // v, J·v (from the ops' forward-mode rules where every op on the way has one, as in jvp; else
  // from the derivative of the backward's graph, create_graph) is compared with reverse mode by the dot-product test ⟨u, J·v⟩ = ⟨Jᵀu, v⟩ (Jᵀu from a plain
  // backward, exact to rounding: the difference at most forward_dot_rtol times the sums of the
  // products' magnitudes, plus atol·‖u‖‖v‖ for derivatives that are zero) and with central
  // differences (f(x + eps·v) - f(x - eps·v)) / 2eps element by element (atol, rtol). It costs
  // about 2 forwards and 3 backwards per direction. A function whose backward cannot be
  // differentiated (a custom Function declared once_differentiable, or one whose backward
  // computes from raw values) skips it, saying why (forward_skipped). It catches a backward whose
  // create_graph form disagrees with its plain form (a backward op whose own rule has drifted).
  bool check_forward_ad = true;
  int forward_directions = 2;
  double forward_dot_rtol = 1e-10;
};

struct GradcheckResult {
  bool ok = true;
  bool projected = false;        // random projections were used instead of the full Jacobian
  double max_abs_error = 0.0;
  double max_rel_error = 0.0;    // |a - n| / max(|a|, |n|), over elements where that max exceeds atol
  std::int64_t elements_checked = 0;
  // The worst element (largest violation of the tolerance), or the worst projection.
  std::int64_t worst_input = -1;
  std::string worst_input_name;     // that input's tensor name ("attn.W_O"), empty when it has none
  std::int64_t worst_element = -1;  // flat index into that input (projection index if projected)
  std::int64_t worst_output = -1;   // flat index into the output
  Shape worst_index;                // multi-index of worst_element in its input
  double analytic = 0.0;
  double numeric = 0.0;
  std::string message;              // why it failed, when it did, with the tolerance it broke
  double atol = 0.0, rtol = 0.0, eps = 0.0;  // the options the check ran with
  // ok = reverse_ok && forward_ok: the backward's gradients against central differences, and
  // forward mode (check_forward_ad) against reverse mode and central differences.
  bool reverse_ok = true;
  bool forward_ok = true;
  bool forward_checked = false;      // the forward-mode check ran
  // J·v came from the ops' forward-mode rules (Node::tangents), independent of the backward;
  // false: from the double-vjp construction, where some op on the way has no such rule.
  bool forward_by_rules = false;
  std::string forward_rule_missing;  // else the first op on the way without one ("'cross_entropy'")
  std::string forward_skipped;       // why it did not, when check_forward_ad asked for it
  double forward_dot_error = 0.0;    // worst |⟨u, J·v⟩ - ⟨Jᵀu, v⟩| / (Σ|u||J·v| + Σ|Jᵀu||v|)
  double forward_max_abs_error = 0.0;  // worst |J·v - central difference| over output elements
  std::string forward_message;       // why the forward-mode check failed, when it did
  const char* check = "gradcheck";   // which check made it: "gradcheck" or "gradgradcheck" (its printout starts so)
};

using GradcheckFn = std::function<Tensor(const std::vector<Tensor>&)>;

GradcheckResult gradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& options = {});

// Second derivatives (PyTorch's gradgradcheck): the gradient of fn at random grad_outputs u,
// g(x) = d(u·fn(x))/dx (computed with create_graph), is itself checked with gradcheck: its
// Jacobian from a second backward against central differences of first-order gradients. The
// result names the worst element as gradcheck's does; its output element counts through the
// checked inputs' gradients laid end to end, and a failure's `message` says which input's
// gradient, and which element of it, that is. Printed, the result says "gradgradcheck".
// u comes from options.seed. Inputs must be float64 leaves, as for gradcheck.
GradcheckResult gradgradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs,
                              const GradcheckOptions& options = {});

// The Hessian-vector product of a scalar function: H·v, where H is the matrix of second
// derivatives of fn with respect to the inputs that require grad, and v holds one tensor per
// input, of its shape (ignored, and may be undefined, for inputs that do not require grad). fn is
// a GradcheckFn (TensorList -> one-element Tensor). One entry per input (undefined for inputs
// that do not require grad). Leaves no .grad. As for gradcheck, fn may read a module's parameters
// directly when they are passed as inputs. A gradient with no graph behind it (fn linear in the
// inputs) contributes zeros, which is right for ag ops; a custom Function whose backward computes
// with raw values and is not declared once_differentiable would also give zeros there, silently:
// check such functions with gradgradcheck.
std::vector<Tensor> hvp(const GradcheckFn& fn, const std::vector<Tensor>& inputs, const std::vector<Tensor>& v);

// Where the worst element of a full-Jacobian check is, as the messages say it:
// "input 3 'attn.W_O' element 5 [1, 2] (output element 0)" (the name only when the input has one).
std::string worst_element_text(const GradcheckResult& r);

// The test the worst element failed, with its numbers: "|analytic - numeric| = 0.1 > allowed
// 1.1e-05 = atol 1e-08 + rtol 1e-05 * |numeric| 1.1 (eps 1e-06)".
std::string tolerance_text(const GradcheckResult& r);

}  // namespace autograd

template <>
struct fmt::formatter<autograd::GradcheckResult> : fmt::formatter<std::string_view> {
  fmt::format_context::iterator format(const autograd::GradcheckResult& r, fmt::format_context& ctx) const;
};
