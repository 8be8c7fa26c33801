#pragma once
// nn::per_example_gradients: each example's gradient of every parameter, for a loss that is a
// sum over a batch of per-example losses (torch.func's vmap(grad), Opacus's per-sample grads).
//
//   nn::PerExampleGrads g = nn::per_example_gradients(model, tokens, [&](const ag::Tensor& batch) {
//     return per_example_losses(model, batch, targets);  // shape (B): example b's loss
//   });
//   g["blocks.0.attn.W_Q"]  // (B, E, E): row b is d(loss[b]) / d(W_Q)
//
// The function runs the model on the batch (first dimension B) and returns the B losses; it is
// called once. Every parameter that requires grad (named as named_parameters() names it) gets a
// tensor (B, *param.shape).
//
// Two paths, and the result says which one each parameter took:
//   - fast: one forward and one backward for the whole batch. The layers record their input x
//     and their output y while the function runs; the backward gives gy = d(Σ_b loss[b])/dy, and
//     each example's gradient is the outer-product form:
//       Linear (and MultiHeadAttention's W_Q, W_K, W_V, W_O, b_*, packed or not), y = x · W + b:
//         gW[b] = Σ_t x[b,t]ᵀ gy[b,t]  (one batched matmul), gb[b] = Σ_t gy[b,t]
//       Embedding, y = W[idx]:  gW[b] = scatter-add of the rows gy[b,t] into rows idx[b,t]
//       LayerNorm (fused, no hook on it), y = x̂ · w + b:  gw[b] = Σ_t gy[b,t] · x̂[b,t], gb[b] = Σ_t gy[b,t]
//     This is exact when loss[b] depends on the batch's row b alone at every such layer.
//   - fallback: B backwards through the same graph, the b-th seeded with the unit vector e_b
//     (a grad() of loss[b] alone). Right for any model. Taken by a parameter that no layer above
//     recorded (a raw matmul with it, a layer without a fast form, a layer called on a tensor
//     whose first dimension is not B, a LayerNorm with a hook), or that fails a check below.
//
// The checks (PerExampleOptions::verify, on by default; they make the fast path right for any
// model, not only for those it is meant for):
//   - independence: a second backward, seeded with distinct weights c_b, must give c_b · gy[b]
//     at every recorded output; a layer whose output gradient mixes examples (BatchNorm-like
//     layers after it, a loss that couples examples) sends its parameters to the fallback.
//   - completeness, from the graph: every edge into the parameter must be its weight or bias
//     place in one of its recorded layers' ops; a parameter also used outside them (tied
//     weights, e.g. an embedding reused as the unembedding; a weight penalty added to each loss;
//     a layer run on its own weight) is sent to the fallback. A parameter the losses do not reach
//     gets zeros on the fast path.
//   Independence compares to a relative tolerance of the largest magnitude compared, 1e-9 in
//   Float64 and 1e-3 in Float32; it is one projection with fixed weights c_b, so a coupling
//   built to cancel along exactly those weights passes it. Completeness is exact (a walk over
//   the graph's edges).
// A parameter with a gradient hook (Tensor::register_hook) takes the fallback, checks or not:
// the hook sees what reaches the parameter, which the fast path never forms.
//
// Memory: the result holds B × (the model's parameter count) elements. The fast path also keeps,
// until it returns, every recorded layer's input and output and the output's gradient (as a
// training step keeps its activations, plus one gradient per recorded output; with verify, one
// more), and the forward's graph (kept until the fallback, if any, is done).
// Time: forward + one backward to the recorded outputs (+ a second one with verify) + the outer
// products; each
// fallback parameter set adds B backwards of the whole graph.
// Backward hooks (Module::add_backward_hook, Tensor::register_hook) on the model fire in every one
// of those backwards: with verify, once more with the weighted seeds c_b; on the fallback, once per
// example with example b's loss alone. Only the first backward's gradients are d(Σ losses)/dy.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "nn/module.hpp"

namespace nn {

// Called once with the batch; returns the per-example losses, shape (B), Float32 or Float64.
using PerExampleLoss = std::function<ag::Tensor(const ag::Tensor& batch)>;

enum class PerExampleMethod {
  Auto,      // the fast path where it applies, the fallback elsewhere
  Fallback,  // every parameter by B separate backwards (the reference)
};

struct PerExampleOptions {
  PerExampleMethod method = PerExampleMethod::Auto;
  bool verify = true;  // the independence and completeness checks (see above)
};

struct PerExampleGrads {
  struct Fallback {
    std::string name;    // the parameter's dotted name
    std::string reason;  // why it did not take the fast path
  };
  std::int64_t batch_size = 0;
  NamedTensors grads;               // (B, *param.shape) each, in named_parameters() order
  std::vector<std::string> fast;    // the names computed by the fast path
  std::vector<Fallback> fallback;   // the names computed by B separate backwards, with the reason

  // The per-example gradients of one parameter; throws listing the names there are.
  const ag::Tensor& operator[](const std::string& name) const;
  bool took_fallback(const std::string& name) const;
};

// Throws std::invalid_argument naming per_example_gradients and the shapes when the batch is
// undefined or 0-D, the losses are not floating, not of shape (B), or do not require grad, or
// the model has no parameter that requires grad.
PerExampleGrads per_example_gradients(Module& model, const ag::Tensor& batch, const PerExampleLoss& losses,
                                      const PerExampleOptions& options = {});

}  // namespace nn
