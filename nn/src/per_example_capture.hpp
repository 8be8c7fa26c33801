#pragma once
// The capture behind nn::per_example_gradients (per_example.cpp). While that function runs the
// user's forward on this thread, each layer with a fast per-example form records here the tensors
// the outer-product form needs (its input and its output in the graph). With no capture running a
// layer pays one thread-local load and compare: its forward is otherwise unchanged.
#include <cstdint>
#include <vector>

#include <autograd/autograd.hpp>

namespace nn::detail {

namespace ag = autograd;

enum class UseKind { Linear, Embedding, LayerNorm };

// One use of a parameter (or a weight and its bias) by a layer, in one forward.
struct ParameterUse {
  UseKind kind = UseKind::Linear;
  ag::Tensor x;               // Linear, LayerNorm: the input (B, ..., in); Embedding: the indices (B, ...)
  ag::Tensor y;               // the op's output, in the graph: (B, ..., out)
  ag::Tensor weight, bias;    // the parameters' handles; bias may be undefined
  std::int64_t column = 0;    // Linear: the first column of y that weight makes (linear_cat)
  std::int64_t normalized_dims = 0;  // LayerNorm: how many trailing dims are normalised
  double eps = 0.0;                  // LayerNorm
};

struct PerExampleCapture {
  std::vector<ParameterUse> uses;
};

extern thread_local PerExampleCapture* per_example_capture;

// y = x · weight + bias (y's columns column .. column + weight.size(1) - 1).
void record_linear(const ag::Tensor& x, const ag::Tensor& y, const ag::Tensor& weight, const ag::Tensor& bias,
                   std::int64_t column = 0);
// y = weight[indices].
void record_embedding(const ag::Tensor& indices, const ag::Tensor& y, const ag::Tensor& weight);
// y = layer_norm(x) · weight + bias over the last normalized_dims dims.
void record_layer_norm(const ag::Tensor& x, const ag::Tensor& y, const ag::Tensor& weight, const ag::Tensor& bias,
                       std::int64_t normalized_dims, double eps);

}  // namespace nn::detail
