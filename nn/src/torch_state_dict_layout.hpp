#pragma once
// How a module tree's parameters sit in a PyTorch state_dict (nn/torch_state_dict.hpp): one
// TorchTensor per key of the equivalent torch.nn modules, saying which headgrad parameters make
// up its values and how. Shared by saving, loading and the messages that tell a file of one
// naming from the other.
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "nn/module.hpp"

namespace nn::detail {

// One part of a torch tensor: a headgrad parameter whose values fill the next rows of the
// tensor, transposed (a headgrad (in, out) weight is torch's (out, in)) or as they are.
struct TorchPart {
  ag::Tensor param;
  std::string name;  // the parameter's dotted headgrad name, for messages
  bool transpose = false;
};

// One key of the torch state_dict: its name and shape, and its parts in row order (in_proj_weight
// is W_Q, W_K and W_V, each transposed, stacked; bias_k is the (E) parameter as (1, 1, E)).
struct TorchTensor {
  std::string key;
  ag::Shape shape;
  std::vector<TorchPart> parts;
};

// Every key of the module tree's torch state_dict, in the order PyTorch lists them; tied modules
// and parameters appear under each of their names, as in PyTorch's state_dict(). Throws
// CheckpointError(`op`: ...) naming the module's path and type when a module (or an option of
// one) has no torch.nn equivalent.
std::vector<TorchTensor> torch_layout(const Module& module, const std::string& op);

// The tensor for one key: the parts' values laid out as torch holds them (the parts' dtype).
ag::Tensor torch_value(const TorchTensor& entry);

// The value each part takes from `stored` (laid out as `entry.shape`), in the part's dtype.
std::vector<ag::Tensor> split_torch_value(const TorchTensor& entry, const ag::Tensor& stored);

// True when `tensors` have exactly the names and shapes of the module's torch state_dict (false
// when the module has no torch layout or no parameters).
bool matches_torch_layout(const Module& module, const NamedTensors& tensors);

}  // namespace nn::detail
