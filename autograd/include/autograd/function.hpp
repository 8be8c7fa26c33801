#pragma once
// Custom ops with a hand-written backward, as with PyTorch's torch.autograd.Function:
//
//   struct Cube : ag::Function<Cube> {
//     static constexpr const char* name = "cube";
//     static ag::Tensor forward(ag::FunctionCtx& ctx, const ag::Tensor& x) {
//       ctx.save_for_backward({x});
//       return x * x * x;                      // runs with grad mode off
//     }
//     static ag::TensorList backward(ag::FunctionCtx& ctx, const ag::TensorList& grad_out) {
//       ag::Tensor x = ctx.saved_tensors()[0];
//       return {grad_out[0] * 3.0 * x * x};    // one gradient per Tensor argument of forward
//     }
//   };
//   ag::Tensor y = Cube::apply(x);
//
// forward may return a Tensor or a TensorList; backward gets one gradient per output (zeros
// where none arrived) and returns exactly one per Tensor argument (undefined where none is
// needed), as in PyTorch; a list of another length, an empty one included, makes backward()
// throw, naming the function. An Int64 output is not differentiable (as PyTorch marks integer
// outputs): it has no grad_fn and does not require grad, and backward gets zeros for it.
// Check it with gradcheck.
//
// Second order: backward runs with grad mode on when a graph of the backward is being built
// (grad() or backward() with create_graph), and ctx.saved_tensors() then returns tensors that
// are part of the graph. A backward written with ag ops is therefore differentiable again, to
// any order (check it with gradgradcheck). A backward that computes with raw values (to_vector,
// data<T>(), Eigen) cuts the graph: declare it with
//   static constexpr bool once_differentiable = true;
// and create_graph through it throws an error naming the function instead of giving second
// derivatives that are silently wrong.
//
// Forward mode (ag::jvp, gradcheck's forward-mode check): a Function may give its own rule,
//   static ag::TensorList jvp(ag::FunctionCtx& ctx, const ag::TensorList& input_tangents);
// with one tangent per Tensor argument of forward (zeros where the argument does not move) and
// returning one per output (torch.autograd.Function.jvp; undefined for an Int64 output). It runs
// with grad mode off. Without it,
// forward mode through the function takes the double-vjp construction (its backward, differentiated).
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "autograd/grad_mode.hpp"
#include "autograd/graph.hpp"

namespace autograd {

class FunctionCtx {
 public:
  void save_for_backward(const TensorList& tensors);
  // Throws if a saved tensor was changed in place after it was saved.
  TensorList saved_tensors() const;
  bool needs_input_grad(std::size_t i) const { return i < needs_input_grad_.size() && needs_input_grad_[i]; }

  std::map<std::string, double> saved_data;  // scalars the backward needs
  std::string op_name = "custom";
  std::vector<bool> needs_input_grad_;

 private:
  std::vector<SavedTensor> saved_;
};

// Thrown when create_graph reaches a Function declared once_differentiable.
[[noreturn]] void once_differentiable_error(const std::string& name);
// Throws, naming the function, unless `tangents` (what its jvp returned) has one tensor per
// output of the node, each of that output's shape and dtype (undefined for an integer output).
void check_function_tangents(const std::string& name, const Node& node, const TensorList& tangents);

template <class Derived>
struct Function {
  template <class... Args>
  static auto apply(Args&&... args) {
    TensorList inputs;
    (collect(inputs, args), ...);
    auto ctx = std::make_shared<FunctionCtx>();
    if constexpr (requires { Derived::name; }) ctx->op_name = Derived::name;
    using Result = decltype(Derived::forward(*ctx, args...));
    static_assert(std::is_same_v<Result, Tensor> || std::is_same_v<Result, TensorList>,
                  "forward must return Tensor or TensorList");
    Result result;
    {
      NoGradGuard no_grad;
      result = Derived::forward(*ctx, args...);
    }
    if constexpr (std::is_same_v<Result, Tensor>) {
      result = result.detach();
    } else {
      for (auto& r : result) r = r.detach();
    }
    if (needs_grad(inputs)) {
      for (const auto& in : inputs) ctx->needs_input_grad_.push_back(in.requires_grad());
      TensorList outputs;
      if constexpr (std::is_same_v<Result, Tensor>) {
        outputs.push_back(result);
      } else {
        outputs = result;
      }
      record(ctx->op_name, inputs, outputs, Rule{ctx});
    }
    return result;
  }

 private:
  // The node's rules: the backward, and Derived::jvp when it has one.
  struct Rule {
    std::shared_ptr<FunctionCtx> ctx;

    TensorList operator()(const TensorList& grad_outputs, const Node&) const {
      if constexpr (requires { Derived::once_differentiable; }) {
        if (Derived::once_differentiable && is_grad_enabled()) once_differentiable_error(ctx->op_name);
      }
      return Derived::backward(*ctx, grad_outputs);
    }

    TensorList tangents(const TensorList& input_tangents, const Node& node, std::uint64_t) const
      requires requires(FunctionCtx& c, const TensorList& t) { Derived::jvp(c, t); }
    {
      TensorList in(input_tangents.size());
      for (std::size_t i = 0; i < in.size(); ++i)
        in[i] = input_tangents[i].defined() ? input_tangents[i]
                                            : zeros(node.input_meta[i].shape, node.input_meta[i].dtype);
      TensorList out = Derived::jvp(*ctx, in);
      check_function_tangents(ctx->op_name, node, out);
      for (auto& t : out)
        if (t.defined()) t = t.detach();
      return out;
    }
  };

  template <class A>
  static void collect(TensorList& inputs, const A& arg) {
    if constexpr (std::is_same_v<std::decay_t<A>, Tensor>) inputs.push_back(arg);
  }
};

}  // namespace autograd
