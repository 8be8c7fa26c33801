#pragma once
// nn::Linear — the seed's projection y = x · W + b, with W stored (in_features x out_features).
//
// (PyTorch stores its weight as (out x in) and computes x · Wᵀ; headgrad keeps the seed's
// layout, so W's column j is what output feature j reads from the input. save_torch_state_dict
// and load_torch_state_dict, nn/torch_state_dict.hpp, transpose it to and from PyTorch's.)
//
// Parameters, in order: "weight" (in_features x out_features), then "bias" (out_features) when
// bias is on. Initialisation is PyTorch's nn.Linear default written for this layout: both drawn
// from U(-1/√in_features, 1/√in_features) (Kaiming uniform with a = √5), from the generator
// given, or from ag::default_generator() (seed it with ag::manual_seed).
#include <cstdint>
#include <string>

#include <autograd/autograd.hpp>

#include "nn/module.hpp"

namespace nn {

struct LinearOptions {
  std::int64_t in_features = 0;
  std::int64_t out_features = 0;
  bool bias = true;
  ag::Dtype dtype = ag::Dtype::Float32;
};

class Linear : public Module {
 public:
  Linear(std::int64_t in_features, std::int64_t out_features, bool bias = true);
  explicit Linear(const LinearOptions& options);
  Linear(const LinearOptions& options, ag::Generator& gen);

  // x (..., in_features) -> (..., out_features); a 1-D x (in_features) gives (out_features).
  ag::Tensor forward(const ag::Tensor& x) const;
  ag::Tensor operator()(const ag::Tensor& x) const { return forward(x); }

  // Draws weight and bias again from gen (PyTorch's reset_parameters).
  void reset_parameters(ag::Generator& gen);

  const LinearOptions& options() const { return options_; }
  std::int64_t in_features() const { return options_.in_features; }
  std::int64_t out_features() const { return options_.out_features; }
  // The parameters' handles: `{ ag::NoGradGuard g; linear.weight().copy_(w); }` changes the
  // layer (nn::Parameter, nn/module.hpp).
  const ag::Tensor& weight() const { return weight_; }
  const ag::Tensor& bias() const { return bias_; }  // undefined without bias
  Parameter& weight() { return weight_; }
  Parameter& bias() { return bias_; }

  std::string extra_repr() const override;

 private:
  LinearOptions options_;
  Parameter weight_;
  Parameter bias_;
};

}  // namespace nn
