#pragma once
// Parameter initialisation (PyTorch's torch.nn.init), drawing from a seedable ag::Generator so
// that the same seed gives the same parameters on every platform.
//
// Layout: headgrad stores a weight as (in_features x out_features) — the seed's y = x · W — so
// for a 2-D tensor fan_in = shape[0] and fan_out = shape[1] (the transpose of PyTorch's
// (out x in) layout; the formulas are the same). For more dims, fan_in = shape[0] * r and
// fan_out = shape[1] * r with r the product of the remaining dims; a 1-D tensor of n has
// fan_in = fan_out = n.
//
// Every function fills the tensor in place (its handle, and so the module's parameter, keeps
// its identity), records no graph, and returns the same handle.
#include <cstdint>
#include <utility>

#include <autograd/autograd.hpp>

namespace nn::init {

namespace ag = autograd;

enum class Nonlinearity { Linear, Sigmoid, Tanh, Relu, LeakyRelu };
enum class FanMode { FanIn, FanOut };

// {fan_in, fan_out} of a weight of this shape (see above); throws for a 0-D shape.
std::pair<std::int64_t, std::int64_t> fans(const ag::Shape& shape);

// The recommended gain for a nonlinearity (PyTorch's calculate_gain): 1, 1, 5/3, √2, and
// √(2 / (1 + slope²)) for leaky ReLU with negative slope `param`.
double calculate_gain(Nonlinearity nonlinearity, double param = 0.01);

ag::Tensor uniform_(ag::Tensor t, double low, double high, ag::Generator& gen);
ag::Tensor normal_(ag::Tensor t, double mean, double std, ag::Generator& gen);
ag::Tensor constant_(ag::Tensor t, double value);
ag::Tensor zeros_(ag::Tensor t);
ag::Tensor ones_(ag::Tensor t);

// Glorot & Bengio (2010): U(-a, a), a = gain · √(6 / (fan_in + fan_out)).
ag::Tensor xavier_uniform_(ag::Tensor t, ag::Generator& gen, double gain = 1.0);
// N(0, σ²), σ = gain · √(2 / (fan_in + fan_out)).
ag::Tensor xavier_normal_(ag::Tensor t, ag::Generator& gen, double gain = 1.0);
// He et al. (2015): U(-b, b), b = gain · √(3 / fan), gain = calculate_gain(nonlinearity, a).
// PyTorch's nn.Linear uses a = √5 with LeakyRelu, which gives b = 1/√fan_in.
ag::Tensor kaiming_uniform_(ag::Tensor t, ag::Generator& gen, double a = 0.0, FanMode mode = FanMode::FanIn,
                            Nonlinearity nonlinearity = Nonlinearity::LeakyRelu);
// N(0, σ²), σ = gain / √fan.
ag::Tensor kaiming_normal_(ag::Tensor t, ag::Generator& gen, double a = 0.0, FanMode mode = FanMode::FanIn,
                           Nonlinearity nonlinearity = Nonlinearity::LeakyRelu);

}  // namespace nn::init
