// docs/guide.md, "Modules": a Module subclass with children and a parameter of its own, options
// structs, Sequential, the module tree and its parameters, handles, dtype conversion and printing.
// The guide shows this program's code and output; CI runs it.
#include <cstdint>
#include <memory>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

namespace ag = autograd;

struct Classifier : nn::Module {
  std::shared_ptr<nn::Sequential> mlp;
  ag::Tensor log_temperature;  // a parameter of the module itself

  Classifier(std::int64_t in, std::int64_t hidden, std::int64_t classes) : nn::Module("Classifier") {
    mlp = register_module("mlp", std::make_shared<nn::Sequential>(
                                     std::make_shared<nn::Linear>(in, hidden), std::make_shared<nn::GELU>(),
                                     std::make_shared<nn::Linear>(nn::LinearOptions{
                                         .in_features = hidden, .out_features = classes, .bias = false})));
    log_temperature = register_parameter("log_temperature", ag::zeros({1}));
  }
  // x (..., in) -> logits (..., classes)
  ag::Tensor forward(const ag::Tensor& x) const { return (*mlp)(x) / ag::exp(log_temperature); }
};

int main() {
  ag::manual_seed(0);
  Classifier model(4, 8, 3);
  fmt::print("{}\n\n", model);

  for (const auto& [name, p] : model.named_parameters())
    fmt::print("{:<16} {}\n", name, ag::shape_str(p.shape()));
  fmt::print("{} parameters\n\n", model.num_parameters());

  const ag::Tensor x = ag::randn({2, 4});
  fmt::print("{}\n\n", model.forward(x));

  // Parameters are handles: a copy of one is the module's tensor. Change values under NoGradGuard.
  ag::Tensor w = model.parameter("mlp.0.weight");  // (in, out) = (4, 8): y = x · W + b
  {
    ag::NoGradGuard no_grad;
    w.copy_(ag::full({4, 8}, 0.125));
  }
  fmt::print("{}\n\n", model.parameter("mlp.0.weight"));

  model.to(ag::Dtype::Float64);  // in place: w and every other handle see Float64 now
  fmt::print("{} {}\n\n", ag::dtype_name(w.dtype()), ag::dtype_name(model.forward(x.to(ag::Dtype::Float64)).dtype()));

  // Printing follows PyTorch: aligned columns, wrapped rows, "..." beyond 1000 elements.
  fmt::print("{}\n\n", ag::arange(-3.0, 3.0, 0.375, ag::Dtype::Float64));
  fmt::print("{}\n\n", ag::reshape(ag::arange(2000.0), {40, 50}) / 7.0 + 1.0);
  fmt::print("{}\n", ag::to_string(ag::randn({2, 3}), {.precision = 2, .sci_mode = true}));
}
