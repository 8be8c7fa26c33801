#pragma once
// Function transforms (torch.func's): vector-Jacobian and Jacobian-vector products, full Jacobians
// and Hessians of functions of tensors.
//
//   auto [y, dy] = ag::jvp(f, {x, w}, {v_x, v_w});   // y = f(x, w), dy = J·v (one per output)
//   auto [y2, ct] = ag::vjp(f, {x, w}, {u});          // ct = Jᵀ·u (one per input)
//   ag::TensorList J = ag::jacobian(g, {x, w});        // J[i]: g(x, w).shape ++ inputs[i].shape
//   auto H = ag::hessian(loss, {x, w});                // H[i][j]: inputs[i].shape ++ inputs[j].shape
//
// fn is called once per transform, on fresh leaves that share the inputs' data (each input
// detached and made to require grad), as torch.autograd.functional does: fn must compute from its
// arguments (a function that reads a module's parameters directly is not differentiated through
// them: when its result depends on an input that requires grad itself but not on the argument fn
// was given for it, the transform refuses, naming the input). The inputs need not require grad,
// and no .grad is written anywhere. Every result of a transform called outside another transform
// is outside any graph (as torch.autograd.functional's without create_graph). An output that does not depend on an input gets
// zeros for it.
//
// jvp takes the ops' forward-mode rules (Node::tangents) where every node between the inputs and
// the outputs has one (most built-in ops: docs/double_backward.md §9 lists those without, such as
// cross_entropy and the tiled attention core; custom Functions that give a jvp); the tangents are
// carried through the graph of the one call of fn, at about the cost of one forward more.
// Otherwise, inside another transform (whose results must stay in the graph), and always in
// hessian, it is built from reverse mode (the double-vjp construction): with u a
// cotangent of the outputs that requires grad, g(u) = Jᵀu is computed by a backward with
// create_graph; g is linear in u, and the vjp of g with respect to u against v is J·v. That costs
// one forward, one backward with create_graph and one backward through that backward's graph.
// Every built-in op is differentiable to any order, so this goes through all of them; a custom
// Function declared once_differentiable is refused there (its jvp unused), naming it, and so is one whose
// backward computes with raw values (the engine finds its gradient outside the graph), in the
// construction's jvp, forward-mode jacobian, hessian and nested transforms alike.
//
// Transforms compose: one called inside another's function (jacobian of jacobian, jvp of vjp, to
// any depth) keeps its results in the graph, so the outer one differentiates through it; only the
// outermost transform returns results outside any graph.
//
// Bad arguments are std::invalid_argument naming the transform and the shapes or dtypes at fault.
#include <functional>
#include <vector>

#include "autograd/gradcheck.hpp"
#include "autograd/tensor.hpp"

namespace autograd {

// A function of several tensors to several tensors (jvp's and vjp's).
using TensorListFn = std::function<TensorList(const TensorList&)>;

struct JvpResult {
  TensorList outputs;   // fn(inputs)
  TensorList tangents;  // J·v: one per output, of its shape and dtype
};

// The outputs of fn at inputs and their directional derivatives along tangents (one per input, of
// its shape and dtype; Float32 or Float64): torch.func.jvp.
JvpResult jvp(const std::function<TensorList(const TensorList&)>& fn, const TensorList& inputs,
              const TensorList& tangents);

struct VjpResult {
  TensorList outputs;     // fn(inputs)
  TensorList cotangents;  // Jᵀ·u: one per input, of its shape and dtype
};

// The outputs of fn at inputs and the cotangents of the inputs for the output cotangents given (one
// per output, of its shape and dtype): torch.func.vjp, applied at once.
VjpResult vjp(const TensorListFn& fn, const TensorList& inputs, const TensorList& cotangents);

// Reverse: the Jacobian row by row, one backward per output element with a unit cotangent, all
// through the one graph of a single call of fn (cheaper when the output is smaller than the inputs).
// Forward: column by column, one jvp per input element with a unit tangent: by the ops'
// forward-mode rules through the graph of the one call of fn where they cover it, else all
// through the one graph of the backward g(u) = Jᵀu (cheaper when the inputs are smaller than the
// output).
// The two agree to rounding.
enum class JacobianMode { Reverse, Forward };
struct JacobianOptions {
  JacobianMode mode = JacobianMode::Reverse;
};

// One Jacobian per input, of shape output.shape ++ input.shape (torch.autograd.functional.jacobian):
// J[i][o..., k...] = d output[o...] / d inputs[i][k...]. Each is Float64 when the output or that
// input is, else Float32.
TensorList jacobian(const GradcheckFn& fn, const TensorList& inputs, const JacobianOptions& options = {});

// The Hessian of a function with one output element (shape [] or any shape of one element):
// H[i][j] of shape output.shape ++ inputs[i].shape ++ inputs[j].shape holds
// d² output / d inputs[i][k...] d inputs[j][l...] (torch.func.hessian). The gradient is taken once
// with create_graph, and each row is one backward through its graph. Symmetric to rounding.
std::vector<TensorList> hessian(const GradcheckFn& fn, const TensorList& inputs);

}  // namespace autograd
