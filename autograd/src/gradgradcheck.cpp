// gradgradcheck and hvp: second derivatives through grad() with create_graph.
#include <string>

#include "autograd/grad_mode.hpp"
#include "autograd/gradcheck.hpp"
#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "autograd/random.hpp"
#include "gradcheck_checks.hpp"

namespace autograd {

namespace {

std::vector<std::size_t> requiring_grad(const std::vector<Tensor>& inputs) {
  std::vector<std::size_t> idx;
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined() && inputs[i].requires_grad()) idx.push_back(i);
  return idx;
}

// fn(inputs), with grad mode on, checked to be a defined float64 tensor.
Tensor evaluate_with_graph(const char* op, const GradcheckFn& fn, const std::vector<Tensor>& inputs) {
  EnableGradGuard grad_on;
  Tensor y = fn(inputs);
  if (!y.defined()) fail(op, "the function returned an undefined tensor");
  if (y.dtype() != Dtype::Float64)
    fail(op, "the function returned a tensor of dtype {}; {} needs Float64 throughout", dtype_name(y.dtype()), op);
  return y;
}

// The gradient of one input, or zeros of its shape when the outputs do not depend on it.
Tensor or_zeros(const Tensor& g, const Tensor& input) {
  return g.defined() ? g : zeros(input.shape(), input.dtype());
}

// "input 2 'w' element 5 [1, 2]": which input's gradient, and which element of it, the flat
// index `flat` into the checked inputs' gradients laid end to end is.
std::string gradient_element(std::int64_t flat, const std::vector<Tensor>& inputs,
                             const std::vector<std::size_t>& checked) {
  for (auto i : checked) {
    const Tensor& t = inputs[i];
    if (flat < t.numel()) {
      Shape idx(t.shape().size());
      std::int64_t rest = flat;
      for (std::size_t d = idx.size(); d-- > 0;) {
        idx[d] = rest % t.shape()[d];
        rest /= t.shape()[d];
      }
      const std::string name = t.name().empty() ? std::string() : fmt::format(" {}", quoted(t.name()));
      return fmt::format("input {}{} element {} {}", i, name, flat, shape_str(idx));
    }
    flat -= t.numel();
  }
  return fmt::format("element {}", flat);
}

}  // namespace

GradcheckResult gradgradcheck(const GradcheckFn& fn, const std::vector<Tensor>& inputs,
                              const GradcheckOptions& options) {
  constexpr std::string_view op = "gradgradcheck";
  // Everything that can be checked before the function runs is checked first, naming this call.
  if (!fn) fail(op, "no function given");
  detail::check_gradcheck_options(op, options);
  const std::vector<std::size_t> checked = detail::checked_gradcheck_inputs(op, inputs);
  // The random grad_outputs u of the first derivative, fixed for every evaluation.
  Generator gen(options.seed ^ 0x9E3779B97F4A7C15ull);
  const Tensor y0 = evaluate_with_graph("gradgradcheck", fn, inputs);
  // With no graph the first derivative is zero everywhere, analytic and numeric alike: nothing
  // would be checked (and a function cut from its inputs would pass).
  if (!y0.requires_grad())
    fail(op, "the function's result does not depend on any input that requires grad (it has no graph), so its "
         "first derivative is zero and nothing would be checked; run gradcheck on it first (a transform called "
         "outside another transform returns a result outside any graph)");
  const Tensor u = randn(y0.shape(), Dtype::Float64, gen);
  // x -> d(u·fn(x))/dx, the checked inputs' gradients laid end to end; a graph of it is built
  // only when the caller (gradcheck's analytic pass) records one.
  const GradcheckFn first_derivative = [&](const std::vector<Tensor>& xs) {
    const bool graph = is_grad_enabled();
    const Tensor y = evaluate_with_graph("gradgradcheck", fn, xs);
    if (y.shape() != u.shape())
      fail("gradgradcheck", "the function's output shape changed between evaluations: {} then {}",
           shape_str(u.shape()), shape_str(y.shape()));
    TensorList wrt;
    for (auto i : checked) wrt.push_back(xs[i]);
    GradOptions o;
    o.grad_outputs = {u};
    o.create_graph = graph;
    o.allow_unused = true;
    TensorList g = y.requires_grad() ? grad({y}, wrt, o) : TensorList(wrt.size());
    TensorList flat;
    for (std::size_t c = 0; c < wrt.size(); ++c) flat.push_back(reshape(or_zeros(g[c], wrt[c]), {-1}));
    return cat(flat, 0);
  };
  GradcheckResult r = detail::gradcheck_as(op, first_derivative, inputs, options);
  r.check = "gradgradcheck";
  if (!r.reverse_ok && !r.projected && r.worst_output >= 0) {
    const std::string name = r.worst_input_name.empty() ? std::string() : fmt::format(" {}", quoted(r.worst_input_name));
    r.message = fmt::format(
        "second derivative of the gradient of {} with respect to input {}{} element {} {}: analytic {:.10g} vs "
        "numeric {:.10g}; {}",
        gradient_element(r.worst_output, inputs, checked), r.worst_input, name, r.worst_element,
        shape_str(r.worst_index), r.analytic, r.numeric, tolerance_text(r));
    if (!r.forward_ok) r.message += "; " + r.forward_message;
  }
  return r;
}

TensorList hvp(const GradcheckFn& fn, const std::vector<Tensor>& inputs, const TensorList& v) {
  if (!fn) fail("hvp", "no function given");
  if (v.size() != inputs.size())
    fail("hvp", "{} inputs but {} vectors in v (give one per input; undefined for inputs that do not require grad)",
         inputs.size(), v.size());
  const std::vector<std::size_t> checked = requiring_grad(inputs);
  if (checked.empty()) fail("hvp", "no input requires grad");
  TensorList wrt, vs;
  for (auto i : checked) {
    if (!v[i].defined()) fail("hvp", "v[{}] is {}", i, undefined_description(v[i]));
    if (v[i].shape() != inputs[i].shape() || v[i].dtype() != inputs[i].dtype())
      fail("hvp", "v[{}] is {} {} but input {} is {} {}", i, shape_str(v[i].shape()), dtype_name(v[i].dtype()), i,
           shape_str(inputs[i].shape()), dtype_name(inputs[i].dtype()));
    wrt.push_back(inputs[i]);
    vs.push_back(v[i].detach());
  }
  EnableGradGuard grad_on;
  const Tensor y = fn(inputs);
  if (!y.defined()) fail("hvp", "the function returned an undefined tensor");
  if (y.numel() != 1) fail("hvp", "the function must return one element, got shape {}", shape_str(y.shape()));
  if (!y.requires_grad())
    fail("hvp", "the function's result does not depend on any input that requires grad (it has no graph: was it "
         "computed from detached tensors or under NoGradGuard?)");
  GradOptions first;
  first.create_graph = true;
  first.allow_unused = true;
  const TensorList g = grad({y}, wrt, first);
  // H·v = d(g·v)/dx, over the gradients that depend on the inputs at all.
  TensorList outs, seeds;
  for (std::size_t c = 0; c < g.size(); ++c)
    if (g[c].defined() && g[c].requires_grad()) outs.push_back(g[c]), seeds.push_back(vs[c]);
  TensorList hv(wrt.size());
  if (!outs.empty()) {
    GradOptions second;
    second.grad_outputs = seeds;
    second.allow_unused = true;
    hv = grad(outs, wrt, second);
  }
  TensorList result(inputs.size());
  for (std::size_t c = 0; c < checked.size(); ++c) result[checked[c]] = or_zeros(hv[c], wrt[c]);
  return result;
}

}  // namespace autograd
