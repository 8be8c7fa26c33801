#pragma once
// A bound on the parameters nn's layers allocate while a module is built from a file's config
// (load_module): the file's tensors hold so many elements, and a module that loads from the file
// has no more (each of its parameters is one of the file's tensors, or, in torch's naming, a
// part of one). Each of nn's layers (Linear, Embedding, LayerNorm, MultiHeadAttention) claims
// every parameter before it allocates it, so a config asking for more than its file holds is
// refused before the memory is taken, whatever module type built the layers.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <autograd/autograd.hpp>

namespace nn::detail {

// While one lives, claim_parameter on this thread counts against it.
class ParameterBudget {
 public:
  explicit ParameterBudget(std::int64_t elements);
  ~ParameterBudget();
  ParameterBudget(const ParameterBudget&) = delete;
  ParameterBudget& operator=(const ParameterBudget&) = delete;

  // The config node being built, innermost last: ("", "Sequential"), ("0", "TransformerBlock").
  struct Node {
    std::string name, type;
  };

 private:
  friend void claim_parameter(std::string_view, std::string_view, const autograd::Shape&);
  friend class BuildScope;
  std::int64_t limit_, used_ = 0;
  std::vector<Node> nodes_;
  ParameterBudget* previous_;
};

// Marks the config node build_module is building, for the refusal's message: a child's name
// (type "") or a module's type (name "").
class BuildScope {
 public:
  BuildScope(std::string name, std::string type);
  ~BuildScope();
  BuildScope(const BuildScope&) = delete;
  BuildScope& operator=(const BuildScope&) = delete;

 private:
  ParameterBudget* budget_;  // the one it marked the node in, if any
};

// Called by a layer before it allocates its parameter `name` of `shape` (any dtype): throws
// CheckpointError when a ParameterBudget is active and this parameter would pass it.
void claim_parameter(std::string_view layer, std::string_view name, const autograd::Shape& shape);

}  // namespace nn::detail
