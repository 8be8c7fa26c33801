#include "nn/init.hpp"

#include <cmath>
#include <vector>

namespace nn::init {

namespace {

// Draws numel values in row-major order and copies them into t without recording a graph.
template <class Draw>
ag::Tensor fill_(ag::Tensor t, std::string_view op, Draw draw) {
  if (!t.defined()) ag::fail(op, "tensor is undefined");
  std::vector<double> values(static_cast<std::size_t>(t.numel()));
  for (auto& v : values) v = draw();
  ag::NoGradGuard no_grad;
  t.copy_(ag::tensor(values, t.shape(), ag::Dtype::Float64));
  return t;
}

double fan(const ag::Shape& shape, FanMode mode) {
  auto [fan_in, fan_out] = fans(shape);
  return static_cast<double>(mode == FanMode::FanIn ? fan_in : fan_out);
}

}  // namespace

std::pair<std::int64_t, std::int64_t> fans(const ag::Shape& shape) {
  if (shape.empty()) ag::fail("init", "fan in and fan out are undefined for a 0-D tensor");
  if (shape.size() == 1) return {shape[0], shape[0]};
  std::int64_t receptive = 1;
  for (std::size_t i = 2; i < shape.size(); ++i) receptive *= shape[i];
  return {shape[0] * receptive, shape[1] * receptive};
}

double calculate_gain(Nonlinearity nonlinearity, double param) {
  switch (nonlinearity) {
    case Nonlinearity::Linear:
    case Nonlinearity::Sigmoid: return 1.0;
    case Nonlinearity::Tanh: return 5.0 / 3.0;
    case Nonlinearity::Relu: return std::sqrt(2.0);
    case Nonlinearity::LeakyRelu: return std::sqrt(2.0 / (1.0 + param * param));
  }
  return 1.0;
}

ag::Tensor uniform_(ag::Tensor t, double low, double high, ag::Generator& gen) {
  if (!(low <= high)) ag::fail("uniform_", "low {} is greater than high {}", low, high);
  return fill_(std::move(t), "uniform_", [&] { return low + (high - low) * gen.uniform(); });
}

ag::Tensor normal_(ag::Tensor t, double mean, double std, ag::Generator& gen) {
  if (!(std >= 0.0)) ag::fail("normal_", "standard deviation {} is negative", std);
  return fill_(std::move(t), "normal_", [&] { return mean + std * gen.normal(); });
}

ag::Tensor constant_(ag::Tensor t, double value) {
  return fill_(std::move(t), "constant_", [&] { return value; });
}
ag::Tensor zeros_(ag::Tensor t) { return constant_(std::move(t), 0.0); }
ag::Tensor ones_(ag::Tensor t) { return constant_(std::move(t), 1.0); }

ag::Tensor xavier_uniform_(ag::Tensor t, ag::Generator& gen, double gain) {
  if (!t.defined()) ag::fail("xavier_uniform_", "tensor is undefined");
  auto [fan_in, fan_out] = fans(t.shape());
  const double a = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return uniform_(std::move(t), -a, a, gen);
}

ag::Tensor xavier_normal_(ag::Tensor t, ag::Generator& gen, double gain) {
  if (!t.defined()) ag::fail("xavier_normal_", "tensor is undefined");
  auto [fan_in, fan_out] = fans(t.shape());
  return normal_(std::move(t), 0.0, gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out)), gen);
}

ag::Tensor kaiming_uniform_(ag::Tensor t, ag::Generator& gen, double a, FanMode mode, Nonlinearity nonlinearity) {
  if (!t.defined()) ag::fail("kaiming_uniform_", "tensor is undefined");
  const double bound = calculate_gain(nonlinearity, a) * std::sqrt(3.0 / fan(t.shape(), mode));
  return uniform_(std::move(t), -bound, bound, gen);
}

ag::Tensor kaiming_normal_(ag::Tensor t, ag::Generator& gen, double a, FanMode mode, Nonlinearity nonlinearity) {
  if (!t.defined()) ag::fail("kaiming_normal_", "tensor is undefined");
  return normal_(std::move(t), 0.0, calculate_gain(nonlinearity, a) / std::sqrt(fan(t.shape(), mode)), gen);
}

}  // namespace nn::init
