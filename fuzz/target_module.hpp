#pragma once
// The small module the checkpoint fuzzer loads into (fuzz_checkpoint.cpp) and its seed corpus is
// written from (make_seeds.cpp): a 3 -> 2 Linear layer "layer" and a parameter "scale" of shape
// [2], so that the names and shapes of both agree. The values come from the caller, so that a
// seed file holds values other than the ones the fuzzer's module starts with.
#include <cstdint>
#include <memory>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

namespace fuzz {

struct Target : nn::Module {
  std::shared_ptr<nn::Linear> layer;
  autograd::Tensor scale;
  Target(std::uint64_t seed, double scale0, double scale1) : nn::Module("Target") {
    autograd::Generator gen(seed);
    layer = register_module("layer", std::make_shared<nn::Linear>(nn::LinearOptions{3, 2}, gen));
    scale = register_parameter("scale", autograd::tensor({scale0, scale1}, {2}, autograd::Dtype::Float64));
  }
};

}  // namespace fuzz
