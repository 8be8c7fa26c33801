#pragma once
// Anomaly detection (PyTorch's torch.autograd.detect_anomaly): while a DetectAnomalyGuard lives
// on this thread, the first NaN or Inf that an op produces throws an AnomalyError instead of
// spreading silently through the rest of the forward pass, the loss and the parameters.
//
//   ag::DetectAnomalyGuard anomaly;                 // on for this scope, this thread
//   ag::AnomalyLabel label("encoder/layer 3");      // optional: where we are, for the messages
//   ag::Tensor y = ag::log(x);                      // x has a -1: throws
//     -> anomaly detection: 'log' produced NaN in output 0 of shape [4] (element 2)
//        [created as 'log' #17 from ([4] Float64) under 'encoder/layer 3']
//
// Forward: the outputs of every op that records a graph node are checked (ops run on tensors
// that need no gradient record nothing and are not checked). Backward: every gradient a node's
// backward returns is checked. Each node made under the guard remembers how it was created
// (Node::creation_context: op name, creation number, input shapes and dtypes, active labels),
// and the backward error quotes it, so a NaN gradient points at the forward op it came from.
//
// -inf is a legitimate forward value in masked attention written with separate ops
// (scores + mask, masked_fill(..., -inf)); pass AnomalyOptions{.forward_inf = false} to let
// forward Inf through and still catch forward NaN and any non-finite gradient.
//
// Checking costs one pass over each output and gradient; with no guard alive it costs one
// thread-local flag test per op.
#include <stdexcept>
#include <string>

#include "autograd/graph.hpp"

namespace autograd {

// What a DetectAnomalyGuard watches.
struct AnomalyOptions {
  bool forward = true;      // outputs of recorded ops
  bool backward = true;     // gradients returned by backward rules
  bool forward_inf = true;  // forward ±Inf counts as an anomaly (NaN always does)
};

class AnomalyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// RAII: anomaly detection is on while one lives (per thread, nests; the previous state comes
// back after).
class DetectAnomalyGuard {
 public:
  explicit DetectAnomalyGuard(const AnomalyOptions& options = {});
  ~DetectAnomalyGuard();
  DetectAnomalyGuard(const DetectAnomalyGuard&) = delete;
  DetectAnomalyGuard& operator=(const DetectAnomalyGuard&) = delete;

 private:
  bool prev_enabled_;
  AnomalyOptions prev_options_;
};

bool is_anomaly_enabled();
const AnomalyOptions& anomaly_options();  // of the innermost guard (meaningless when off)

// RAII: names the region of code that creates nodes, for creation contexts ("model/attention").
// Labels nest, joined by '/'. Cheap; only read while anomaly detection is on.
class AnomalyLabel {
 public:
  explicit AnomalyLabel(std::string label);
  ~AnomalyLabel();
  AnomalyLabel(const AnomalyLabel&) = delete;
  AnomalyLabel& operator=(const AnomalyLabel&) = delete;
};
std::string current_anomaly_label();  // "" when none

namespace detail {
// Hooks called by the engine (forward: graph.cpp; backward: walk_bookkeeping.hpp) only while is_anomaly_enabled().
// A node was just connected: fills node.creation_context and checks the outputs.
void anomaly_check_forward(Node& node, const TensorList& inputs, const TensorList& outputs);
// node.apply returned grad_inputs: checks each defined gradient.
void anomaly_check_backward(const Node& node, const TensorList& grad_inputs);
}  // namespace detail

}  // namespace autograd
