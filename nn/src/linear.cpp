#include "nn/linear.hpp"

#include <cmath>
#include <limits>

#include "nn/init.hpp"
#include "parameter_budget.hpp"
#include "per_example_capture.hpp"

namespace nn {

Linear::Linear(std::int64_t in_features, std::int64_t out_features, bool bias)
    : Linear(LinearOptions{in_features, out_features, bias}) {}

Linear::Linear(const LinearOptions& options) : Linear(options, ag::default_generator()) {}

Linear::Linear(const LinearOptions& options, ag::Generator& gen) : Module("Linear"), options_(options) {
  if (options.in_features <= 0 || options.out_features <= 0)
    ag::fail("Linear", "in_features and out_features must be positive, got {} and {}", options.in_features,
             options.out_features);
  if (!ag::is_floating(options.dtype))
    ag::fail("Linear", "dtype must be Float32 or Float64, got {}", ag::dtype_name(options.dtype));
  const std::int64_t bytes = static_cast<std::int64_t>(ag::dtype_size(options.dtype));
  if (options.in_features > std::numeric_limits<std::int64_t>::max() / bytes / options.out_features)
    ag::fail("Linear", "weight of shape [{}, {}] is too large: its size does not fit in 64 bits", options.in_features,
             options.out_features);
  detail::claim_parameter("Linear", "weight", {options.in_features, options.out_features});
  weight_.bind(register_parameter("weight", ag::zeros({options.in_features, options.out_features}, options.dtype)));
  if (options.bias) {
    detail::claim_parameter("Linear", "bias", {options.out_features});
    bias_.bind(register_parameter("bias", ag::zeros({options.out_features}, options.dtype)));
  }
  reset_parameters(gen);
}

void Linear::reset_parameters(ag::Generator& gen) {
  // Kaiming uniform with a = √5 on a fan_in of in_features: bound = √(2/6)·√(3/fan_in) = 1/√fan_in.
  init::kaiming_uniform_(weight_, gen, std::sqrt(5.0));
  if (bias_.defined()) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(options_.in_features));
    init::uniform_(bias_, -bound, bound, gen);
  }
}

ag::Tensor Linear::forward(const ag::Tensor& x) const {
  if (!x.defined()) ag::fail("Linear", "input is undefined");
  if (x.dim() < 1 || x.size(-1) != options_.in_features)
    ag::fail("Linear", "input of shape {} does not end in in_features = {}", ag::shape_str(x.shape()),
             options_.in_features);
  if (x.dtype() != weight_.dtype())
    ag::fail("Linear", "input dtype {} differs from the weight's {} (convert with .to())",
             ag::dtype_name(x.dtype()), ag::dtype_name(weight_.dtype()));
  // Every leading dim folds into rows: one (N, in) · (in, out) product plus the bias, one op.
  ag::Tensor y = ag::linear(x, weight_, bias_);  // (..., out)
  if (detail::per_example_capture != nullptr) [[unlikely]]
    detail::record_linear(x, y, weight_, bias_);
  return y;
}

std::string Linear::extra_repr() const {
  return fmt::format("in_features={}, out_features={}, bias={}", options_.in_features, options_.out_features,
                     bias_.defined());
}

}  // namespace nn
