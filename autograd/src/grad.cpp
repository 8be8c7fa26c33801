// grad(): the functional gradient, as torch.autograd.grad. The walk is backward()'s (walk.cpp),
// told to hand back what arrives at the inputs instead of adding into .grad.
#include <functional>
#include <string>

#include "autograd/grad_mode.hpp"
#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "walk_state.hpp"

namespace autograd {

// GradOptions repeats BackwardOptions' two walk options; their defaults must not drift apart.
static_assert(GradOptions{}.retain_graph == BackwardOptions{}.retain_graph);
static_assert(GradOptions{}.create_graph == BackwardOptions{}.create_graph);

namespace {

std::string tensor_label(const char* what, std::size_t i, const Tensor& t) {
  if (t.defined() && !t.name().empty()) return fmt::format("{} {} {}", what, i, quoted(t.name()));
  return fmt::format("{} {}", what, i);
}

void check_inputs(const TensorList& inputs) {
  if (inputs.empty()) fail("grad", "no inputs given: nothing to differentiate with respect to");
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (!t.defined()) fail("grad", "{} is {}", tensor_label("input", i, t), undefined_description(t));
    if (!t.requires_grad())
      fail("grad", "{} {} does not require grad, so it has no gradient (call requires_grad_() on it before "
           "computing the outputs)", tensor_label("input", i, t), shape_str(t.shape()));
  }
}

// The seed of each output: the given gradient (checked), or ones for a one-element output.
TensorList seeds_for(const TensorList& outputs, const TensorList& given) {
  if (!given.empty() && given.size() != outputs.size())
    fail("grad", "{} outputs but {} grad_outputs (give one per output, or none)", outputs.size(), given.size());
  TensorList seeds;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& y = outputs[i];
    if (!y.defined()) fail("grad", "{} is {}", tensor_label("output", i, y), undefined_description(y));
    if (!y.requires_grad())
      fail("grad", "{} {} does not require grad and has no grad_fn: it does not depend on any tensor that "
           "requires grad", tensor_label("output", i, y), shape_str(y.shape()));
    const Tensor g = given.empty() ? Tensor() : given[i];
    if (!g.defined()) {
      if (y.numel() != 1)
        fail("grad", "{} has shape {}: a gradient can be created implicitly only for a one-element output; pass "
             "grad_outputs", tensor_label("output", i, y), shape_str(y.shape()));
      seeds.push_back(ones(y.shape(), y.dtype()));
    } else {
      if (g.shape() != y.shape() || g.dtype() != y.dtype())
        fail("grad", "grad_outputs[{}] is {} {} but output {} is {} {}", i, shape_str(g.shape()),
             dtype_name(g.dtype()), i, shape_str(y.shape()), dtype_name(y.dtype()));
      seeds.push_back(g);
    }
  }
  return seeds;
}

// A leaf input's hooks, run on its gradient as backward() runs them before adding into .grad
// (once for an input given several times).
void run_leaf_hooks(const TensorList& inputs, TensorList& grads, bool create_graph) {
  // The modes of grad()'s walk: a hook's ops join the graph only under create_graph, and
  // nothing is written into .grad.
  struct Modes {
    bool grad = is_grad_enabled(), accumulates = detail::walk_state().accumulates_grad;
    ~Modes() {
      set_grad_enabled(grad);
      detail::walk_state().accumulates_grad = accumulates;
    }
  } restore;
  set_grad_enabled(create_graph);
  detail::walk_state().accumulates_grad = false;
  for (std::size_t i = 0; i < grads.size(); ++i) {
    const auto& impl = inputs[i].impl();
    if (impl->grad_fn || impl->leaf_hooks.empty() || !grads[i].defined()) continue;
    std::size_t first = 0;
    while (inputs[first].impl() != impl) ++first;
    if (first < i) {
      grads[i] = grads[first];
      continue;
    }
    for (const auto& hook : impl->leaf_hooks) {
      Tensor replaced = hook(grads[i]);
      if (!replaced.defined()) continue;
      if (replaced.shape() != impl->shape || replaced.dtype() != impl->dtype)
        fail("grad", "a hook on {} {} {} returned a gradient {} {}", tensor_label("input", i, inputs[i]),
             shape_str(impl->shape), dtype_name(impl->dtype), shape_str(replaced.shape()), dtype_name(replaced.dtype()));
      grads[i] = std::move(replaced);
    }
  }
}

}  // namespace

TensorList grad(const TensorList& outputs, const TensorList& inputs, const GradOptions& options) {
  if (outputs.empty()) fail("grad", "no outputs given: nothing to differentiate");
  check_inputs(inputs);
  const TensorList seeds = seeds_for(outputs, options.grad_outputs);
  const auto unused = [&](std::size_t i) {
    fail("grad", "{} {} is not used by the outputs: no gradient reaches it (set allow_unused to get an undefined "
         "tensor for it instead)", tensor_label("input", i, inputs[i]), shape_str(inputs[i].shape()));
  };
  // An input the graph does not reach is refused before the walk runs (and frees) anything.
  TensorList grads = detail::capture_gradients(outputs, seeds, inputs, options.retain_graph, options.create_graph,
                                               options.allow_unused ? std::function<void(std::size_t)>() : unused);
  run_leaf_hooks(inputs, grads, options.create_graph);
  for (std::size_t i = 0; i < grads.size(); ++i) {
    if (grads[i].defined()) {
      if (!options.create_graph) grads[i] = grads[i].detach();
      continue;
    }
    // Reached, but every rule on the way returned no gradient for it (known only after the walk).
    if (!options.allow_unused) unused(i);
    grads[i] = Tensor::undefined("grad(): the outputs do not depend on this input (allow_unused)");
  }
  return grads;
}

}  // namespace autograd
