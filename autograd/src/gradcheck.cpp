// gradcheck: analytic gradients (from backward) against central differences, in float64.
#include "autograd/gradcheck.hpp"

#include <cmath>
#include <limits>
#include <optional>

#include "autograd/grad_mode.hpp"
#include "autograd/graph.hpp"
#include "autograd/random.hpp"
#include "forward_mode.hpp"
#include "gradcheck_checks.hpp"

namespace autograd {

namespace {

// Restores the checked inputs' values and .grad when gradcheck ends, also on an exception. Only
// the checked inputs (Float64, requiring grad) are perturbed, so only they are saved; the others
// (Int64 targets, constants) pass through untouched. Indexed by input position.
class InputState {
 public:
  InputState(const std::vector<Tensor>& inputs, const std::vector<std::size_t>& checked)
      : inputs_(inputs), checked_(checked), values_(inputs.size()), grads_(inputs.size()) {
    for (auto i : checked) {
      values_[i] = inputs[i].to_vector();
      grads_[i] = inputs[i].grad();
    }
  }
  ~InputState() {
    for (auto i : checked_) {
      try {
        restore_values(i);
        inputs_[i].set_grad(grads_[i]);
      } catch (...) {  // a destructor must not throw; the checked inputs are Float64, so this cannot happen
      }
    }
  }
  InputState(const InputState&) = delete;
  InputState& operator=(const InputState&) = delete;

  void restore_values(std::size_t i) const {
    double* d = inputs_[i].data<double>();
    for (std::size_t k = 0; k < values_[i].size(); ++k) d[k] = values_[i][k];
    inputs_[i].mark_modified();
  }
  double original(std::size_t i, std::size_t k) const { return values_[i][k]; }

 private:
  std::vector<Tensor> inputs_;
  std::vector<std::size_t> checked_;
  std::vector<std::vector<double>> values_;
  std::vector<Tensor> grads_;
};

Tensor evaluate(std::string_view op, const GradcheckFn& fn, const std::vector<Tensor>& inputs) {
  Tensor y = fn(inputs);
  if (!y.defined()) fail(op, "the function returned an undefined tensor");
  if (y.dtype() != Dtype::Float64)
    fail(op, "the function returned a tensor of dtype {}; {} needs Float64 throughout", dtype_name(y.dtype()), op);
  return y;
}

Shape unravel(std::int64_t flat, const Shape& shape) {
  Shape idx(shape.size());
  for (std::int64_t d = static_cast<std::int64_t>(shape.size()) - 1; d >= 0; --d) {
    idx[d] = shape[d] == 0 ? 0 : flat % shape[d];
    flat = shape[d] == 0 ? 0 : flat / shape[d];
  }
  return idx;
}

// Compares one analytic/numeric pair and keeps the worst one (largest tolerance ratio).
struct Tally {
  const GradcheckOptions& opt;
  GradcheckResult& r;
  double worst_ratio = -1.0;

  void add(double analytic, double numeric, std::int64_t input, std::int64_t element, std::int64_t output) {
    ++r.elements_checked;
    const double err = std::abs(analytic - numeric);
    const double scale = std::max(std::abs(analytic), std::abs(numeric));
    // Relative error only where the derivative is larger than atol: at a derivative that is zero,
    // a 1e-17 rounding residue would be "100 % off" and say nothing.
    const double rel = scale > opt.atol ? err / scale : 0.0;
    const double allowed = opt.atol + opt.rtol * std::abs(numeric);
    const double ratio = std::isfinite(err) ? err / allowed : std::numeric_limits<double>::infinity();
    r.max_abs_error = std::max(r.max_abs_error, std::isnan(err) ? std::numeric_limits<double>::infinity() : err);
    r.max_rel_error = std::max(r.max_rel_error, std::isnan(rel) ? std::numeric_limits<double>::infinity() : rel);
    if (!(err <= allowed)) r.ok = false;
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      r.worst_input = input;
      r.worst_element = element;
      r.worst_output = output;
      r.analytic = analytic;
      r.numeric = numeric;
    }
  }
};

}  // namespace

namespace {

// "input 3", or "input 3 'attn.W_O'" when the tensor has a name.
std::string input_label(std::int64_t i, const Tensor& t) {
  if (!t.defined() || t.name().empty()) return fmt::format("input {}", i);
  return fmt::format("input {} {}", i, quoted(t.name()));
}

}  // namespace

namespace detail {

std::vector<std::size_t> checked_gradcheck_inputs(std::string_view op, const std::vector<Tensor>& inputs) {
  std::vector<std::size_t> checked;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    const std::string label = input_label(static_cast<std::int64_t>(i), t);
    if (!t.defined()) fail(op, "{} is {}", label, undefined_description(t));
    if (!t.requires_grad()) continue;
    if (t.dtype() != Dtype::Float64)
      fail(op, "{} {} is {}; {} needs Float64 inputs", label, shape_str(t.shape()), dtype_name(t.dtype()), op);
    if (!t.is_leaf()) fail(op, "{} is not a leaf (it was made by '{}')", label, printable(t.grad_fn()->name()));
    checked.push_back(i);
  }
  if (checked.empty()) fail(op, "no input requires grad, so there is nothing to check");
  return checked;
}

void check_gradcheck_options(std::string_view op, const GradcheckOptions& opt) {
  if (!(opt.eps > 0) || !std::isfinite(opt.eps)) fail(op, "eps must be positive and finite, got {}", opt.eps);
  if (opt.max_full_jacobian < 0) fail(op, "max_full_jacobian must not be negative, got {}", opt.max_full_jacobian);
  if (!(opt.atol >= 0) || !(opt.rtol >= 0) || !std::isfinite(opt.atol) || !std::isfinite(opt.rtol))
    fail(op, "atol and rtol must be finite and >= 0, got atol = {}, rtol = {}", opt.atol, opt.rtol);
  if (opt.num_projections < 0) fail(op, "num_projections must not be negative, got {}", opt.num_projections);
  if (opt.check_forward_ad && opt.forward_directions < 1)
    fail(op, "forward_directions must be at least 1 when check_forward_ad is on, got {}", opt.forward_directions);
  if (!(opt.forward_dot_rtol >= 0) || !std::isfinite(opt.forward_dot_rtol))
    fail(op, "forward_dot_rtol must be finite and >= 0, got {}", opt.forward_dot_rtol);
}

}  // namespace detail

namespace {

// One gradcheck run: the function, its inputs (restored at the end) and the tally so far.
struct Check {
  std::string_view op;
  const GradcheckFn& fn;
  const std::vector<Tensor>& inputs;
  const GradcheckOptions& opt;
  std::vector<std::size_t> checked;
  InputState& state;
  Tally& tally;
  Tensor y;  // the output, with its graph, at the original inputs

  // Analytic vector-Jacobian product vᵀJ for every checked input (zeros where unconnected).
  std::vector<std::vector<double>> vjp(const Tensor& v) const {
    for (auto i : checked) inputs[i].set_grad(Tensor());
    if (y.requires_grad()) y.backward(v, {.retain_graph = true});
    std::vector<std::vector<double>> out;
    for (auto i : checked) {
      Tensor g = inputs[i].grad();
      out.push_back(g.defined() ? g.to_vector() : std::vector<double>(static_cast<std::size_t>(inputs[i].numel()), 0.0));
    }
    return out;
  }

  // Full Jacobian: m backward passes for the analytic rows, 2n forward passes for the numeric columns.
  void full_jacobian() {
    const std::int64_t m = y.numel();
    std::vector<std::vector<std::vector<double>>> analytic;  // [output][checked input][element]
    for (std::int64_t j = 0; j < m; ++j) {
      Tensor onehot = zeros(y.shape(), Dtype::Float64);
      onehot.data<double>()[j] = 1.0;
      analytic.push_back(vjp(onehot));
    }
    y = Tensor();  // free the graph before perturbing its inputs
    NoGradGuard no_grad;
    for (std::size_t c = 0; c < checked.size(); ++c) {
      const std::size_t i = checked[c];
      double* x = inputs[i].data<double>();
      for (std::int64_t k = 0; k < inputs[i].numel(); ++k) {
        const double x0 = state.original(i, static_cast<std::size_t>(k));
        x[k] = x0 + opt.eps;
        inputs[i].mark_modified();
        const auto plus = evaluate(op, fn, inputs).to_vector();
        x[k] = x0 - opt.eps;
        inputs[i].mark_modified();
        const auto minus = evaluate(op, fn, inputs).to_vector();
        x[k] = x0;
        inputs[i].mark_modified();
        if (static_cast<std::int64_t>(plus.size()) != m || static_cast<std::int64_t>(minus.size()) != m)
          fail(op, "the function's output size changed between evaluations: {} elements at first, then {} and {} "
               "with input {} element {} moved by -/+eps", m, plus.size(), minus.size(), i, k);
        for (std::int64_t j = 0; j < m; ++j) {
          const double numeric = (plus[j] - minus[j]) / (2.0 * opt.eps);
          tally.add(analytic[j][c][k], numeric, static_cast<std::int64_t>(i), k, j);
        }
      }
    }
  }

  // vᵀ·f(x + step·u), inputs set to the original values plus step·u.
  // Sets the checked inputs to their original values plus step·u. The steps are added one input
  // after another, so an input given twice (one tensor at two positions) moves by both.
  void perturb(const std::vector<std::vector<double>>& u, double step) const {
    for (auto i : checked) state.restore_values(i);
    for (std::size_t c = 0; c < checked.size(); ++c) {
      double* x = inputs[checked[c]].data<double>();
      for (std::size_t k = 0; k < u[c].size(); ++k) x[k] += step * u[c][k];
      inputs[checked[c]].mark_modified();
    }
  }

  double directional(const std::vector<double>& v, const std::vector<std::vector<double>>& u, double step) const {
    NoGradGuard no_grad;
    perturb(u, step);
    const auto out = evaluate(op, fn, inputs).to_vector();
    double dot = 0.0;
    for (std::size_t j = 0; j < out.size(); ++j) dot += v[j] * out[j];
    return dot;
  }

  // Random projections: compare vᵀJu, analytic (one backward) against numeric (two forwards).
  void projections() {
    Generator gen(opt.seed);
    for (int p = 0; p < opt.num_projections; ++p) {
      if (p > 0) y = evaluate(op, fn, inputs);  // a fresh graph: the last one saw perturbed inputs
      Tensor v = randn(y.shape(), Dtype::Float64, gen);
      const auto g = vjp(v);
      std::vector<std::vector<double>> u;
      double analytic = 0.0;
      for (std::size_t c = 0; c < checked.size(); ++c) {
        u.push_back(randn({inputs[checked[c]].numel()}, Dtype::Float64, gen).to_vector());
        for (std::size_t k = 0; k < u[c].size(); ++k) analytic += g[c][k] * u[c][k];
      }
      const auto vv = v.to_vector();
      y = Tensor();
      const double numeric = (directional(vv, u, opt.eps) - directional(vv, u, -opt.eps)) / (2.0 * opt.eps);
      for (auto i : checked) state.restore_values(i);
      tally.add(analytic, numeric, -1, p, -1);
    }
  }

  // The output at the original inputs plus step·v, v one vector per checked input.
  std::vector<double> shifted(const std::vector<std::vector<double>>& v, double step) const {
    NoGradGuard no_grad;
    perturb(v, step);
    auto out = evaluate(op, fn, inputs).to_vector();
    for (auto i : checked) state.restore_values(i);
    return out;
  }

  // Forward mode along random directions (GradcheckOptions::check_forward_ad). J·v comes from
  // the ops' forward-mode rules where every node on the way has one; otherwise it is the
  // derivative, with respect to w, of ⟨Jᵀw, v⟩: a backward with create_graph at a cotangent w
  // that requires grad, then a backward of that through its graph against v.
  void forward_mode(GradcheckResult& r) {
    Generator gen(opt.seed ^ 0xD1B54A32D192ED03ull);
    for (int p = 0; p < opt.forward_directions; ++p) {
      Tensor out = evaluate(op, fn, inputs);
      const Tensor u = randn(out.shape(), Dtype::Float64, gen);
      std::vector<std::vector<double>> v;
      TensorList wrt, vs;
      for (auto i : checked) {
        const Tensor vi = randn(inputs[i].shape(), Dtype::Float64, gen);
        v.push_back(vi.to_vector());
        vs.push_back(vi);
        wrt.push_back(inputs[i]);
      }
      std::vector<double> jv(static_cast<std::size_t>(out.numel()), 0.0);
      std::optional<TensorList> by_rules;
      if (out.requires_grad()) {
        TensorList typed;  // each direction in its input's dtype
        for (std::size_t c = 0; c < vs.size(); ++c) typed.push_back(vs[c].to(wrt[c].dtype()));
        by_rules = detail::tangents_by_rules({out}, wrt, typed, &r.forward_rule_missing);
      }
      if (by_rules) {
        r.forward_by_rules = true;
        if ((*by_rules)[0].defined()) jv = (*by_rules)[0].to(Dtype::Float64).to_vector();
      } else if (out.requires_grad()) {
        const Tensor w = zeros(out.shape(), Dtype::Float64).requires_grad_();
        GradOptions first;
        first.grad_outputs = {w};
        first.create_graph = true;
        first.allow_unused = true;
        TensorList g;
        try {
          g = grad({out}, wrt, first);
        } catch (const std::runtime_error& e) {
          r.forward_skipped = fmt::format("the backward cannot be differentiated: {}", e.what());
          return;
        }
        TensorList gs, ds;
        for (std::size_t c = 0; c < g.size(); ++c)
          if (g[c].defined() && g[c].requires_grad()) gs.push_back(g[c]), ds.push_back(vs[c]);
        if (!gs.empty()) {
          GradOptions second;
          second.grad_outputs = ds;
          second.allow_unused = true;
          const Tensor t = grad(gs, {w}, second)[0];
          if (t.defined()) jv = t.to_vector();
        }
      }
      // Reverse mode from a plain backward on the same graph: Jᵀu.
      y = out;
      const auto ju = vjp(u);
      y = Tensor();
      out = Tensor();
      const auto uv = u.to_vector();
      double fwd = 0.0, rev = 0.0, scale = 0.0;
      for (std::size_t j = 0; j < jv.size(); ++j) fwd += uv[j] * jv[j], scale += std::abs(uv[j] * jv[j]);
      for (std::size_t c = 0; c < v.size(); ++c)
        for (std::size_t k = 0; k < v[c].size(); ++k) rev += ju[c][k] * v[c][k], scale += std::abs(ju[c][k] * v[c][k]);
      // Rounding bound: relative to the sums of the products' magnitudes, with atol·‖u‖‖v‖ as the
      // floor where the derivative is zero and both sides are rounding residue.
      double uu = 0.0, vv = 0.0;
      for (double e : uv) uu += e * e;
      for (const auto& vc : v)
        for (double e : vc) vv += e * e;
      const double err = std::abs(fwd - rev);
      const double allowed = opt.forward_dot_rtol * scale + opt.atol * std::sqrt(uu * vv);
      const double dot = scale > 0 ? err / scale : err;
      r.forward_dot_error = std::max(r.forward_dot_error, std::isnan(dot) ? std::numeric_limits<double>::infinity() : dot);
      if (!(err <= allowed) && r.forward_ok) {
        r.forward_ok = false;
        r.forward_message = fmt::format(
            "forward mode, direction {}: <u, J·v> = {:.17g} but <Jᵀu, v> = {:.17g} (difference {:.3e} > allowed "
            "{:.3e} = forward_dot_rtol {:g} * {:.3e} + atol {:g} * |u||v| {:.3e}): forward mode ({}) disagrees with "
            "reverse mode",
            p, fwd, rev, err, allowed, opt.forward_dot_rtol, scale, opt.atol, std::sqrt(uu * vv),
            r.forward_by_rules ? "the ops' forward-mode rules" : "the backward's own derivative");
      }
      // J·v against central differences along v.
      const auto plus = shifted(v, opt.eps), minus = shifted(v, -opt.eps);
      if (plus.size() != jv.size() || minus.size() != jv.size())
        fail(op, "the function's output size changed between evaluations: {} elements at first, then {} and {} "
             "(forward-mode check, direction {})", jv.size(), plus.size(), minus.size(), p);
      for (std::size_t j = 0; j < jv.size(); ++j) {
        const double numeric = (plus[j] - minus[j]) / (2.0 * opt.eps);
        const double err = std::abs(jv[j] - numeric);
        r.forward_max_abs_error =
            std::max(r.forward_max_abs_error, std::isnan(err) ? std::numeric_limits<double>::infinity() : err);
        const double allowed = opt.atol + opt.rtol * std::abs(numeric);
        if (!(err <= allowed) && r.forward_ok) {
          r.forward_ok = false;
          r.forward_message = fmt::format(
              "forward mode, direction {}, output element {}: J·v = {:.10g} vs numeric {:.10g}; |J·v - numeric| = "
              "{:.3e} > allowed {:.3e} = atol {:g} + rtol {:g} * |numeric| (eps {:g})",
              p, j, jv[j], numeric, err, allowed, opt.atol, opt.rtol, opt.eps);
        }
      }
    }
    r.forward_checked = true;
  }
};

}  // namespace

GradcheckResult gradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs, const GradcheckOptions& opt) {
  return detail::gradcheck_as("gradcheck", fn, inputs, opt);
}

GradcheckResult detail::gradcheck_as(std::string_view op, const GradcheckFn& fn, const std::vector<Tensor>& inputs,
                                     const GradcheckOptions& opt) {
  if (!fn) fail(op, "no function given");
  check_gradcheck_options(op, opt);
  std::vector<std::size_t> checked = checked_gradcheck_inputs(op, inputs);
  std::int64_t n_total = 0;
  for (auto i : checked) n_total += inputs[i].numel();

  GradcheckResult r;
  r.atol = opt.atol;
  r.rtol = opt.rtol;
  r.eps = opt.eps;
  Tally tally{opt, r};
  InputState state(inputs, checked);
  EnableGradGuard grad_on;
  Check check{op, fn, inputs, opt, std::move(checked), state, tally, evaluate(op, fn, inputs)};
  const std::int64_t m = check.y.numel();
  if (m == 0 || n_total == 0)
    fail(op, "the output has {} elements and the checked inputs {}: nothing to compare", m, n_total);
  r.projected = m * n_total > opt.max_full_jacobian;
  if (r.projected && opt.num_projections == 0)
    fail(op,
         "nothing would be checked: the Jacobian ({} x {}) is above max_full_jacobian = {} and num_projections = 0",
         m, n_total, opt.max_full_jacobian);
  if (r.projected) {
    check.projections();
  } else {
    check.full_jacobian();
  }
  r.reverse_ok = r.ok;
  if (opt.check_forward_ad) check.forward_mode(r);
  r.ok = r.reverse_ok && r.forward_ok;

  if (r.worst_input >= 0) {
    const Tensor& worst = inputs[static_cast<std::size_t>(r.worst_input)];
    r.worst_index = unravel(r.worst_element, worst.shape());
    r.worst_input_name = worst.name();
  }
  if (!r.reverse_ok) {
    r.message = r.projected
        ? fmt::format("projection {}: analytic {:.10g} vs numeric {:.10g}", r.worst_element, r.analytic, r.numeric)
        : fmt::format("{}: analytic {:.10g} vs numeric {:.10g}", worst_element_text(r), r.analytic, r.numeric);
    r.message += "; " + tolerance_text(r);
  }
  if (!r.forward_ok) r.message += (r.message.empty() ? "" : "; ") + r.forward_message;
  return r;
}

std::string worst_element_text(const GradcheckResult& r) {
  const std::string input = r.worst_input_name.empty() ? fmt::format("input {}", r.worst_input)
                                                       : fmt::format("input {} {}", r.worst_input,
                                                                     quoted(r.worst_input_name));
  return fmt::format("{} element {} {} (output element {})", input, r.worst_element, shape_str(r.worst_index),
                     r.worst_output);
}

std::string tolerance_text(const GradcheckResult& r) {
  const double err = std::abs(r.analytic - r.numeric);
  return fmt::format("|analytic - numeric| = {:.3e} > allowed {:.3e} = atol {:g} + rtol {:g} * |numeric| {:.3e} (eps {:g})",
                     err, r.atol + r.rtol * std::abs(r.numeric), r.atol, r.rtol, std::abs(r.numeric), r.eps);
}

}  // namespace autograd

fmt::format_context::iterator fmt::formatter<autograd::GradcheckResult>::format(const autograd::GradcheckResult& r,
                                                                              fmt::format_context& ctx) const {
  std::string text = fmt::format(
      "{} {}: {} {} checked, max abs error {:.3e}, max rel error {:.3e}", r.check, r.ok ? "ok" : "FAILED",
      r.elements_checked, r.projected ? "random projections" : "Jacobian elements", r.max_abs_error, r.max_rel_error);
  if (r.worst_input >= 0 || r.projected) {
    text += r.projected
        ? fmt::format("; worst: projection {}, analytic {:.10g}, numeric {:.10g}", r.worst_element, r.analytic,
                      r.numeric)
        : fmt::format("; worst: {}, analytic {:.10g}, numeric {:.10g}", autograd::worst_element_text(r),
                      r.analytic, r.numeric);
  }
  if (!r.reverse_ok && (r.worst_input >= 0 || r.projected)) text += "; " + autograd::tolerance_text(r);
  if (r.forward_checked)
    text += fmt::format("; forward mode {}: dot-product error {:.1e}, max abs error {:.3e}",
                        r.forward_ok ? "ok" : "FAILED", r.forward_dot_error, r.forward_max_abs_error);
  else if (!r.forward_skipped.empty())
    text += "; forward mode not checked: " + r.forward_skipped;
  if (!r.forward_ok) text += "; " + r.forward_message;
  return fmt::formatter<std::string_view>::format(text, ctx);
}
