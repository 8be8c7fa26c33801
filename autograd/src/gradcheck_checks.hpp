#pragma once
// What gradcheck and gradgradcheck share (internal): the checks of their options and inputs, and
// gradcheck itself, each naming the function the caller called (`op`).
#include <cstddef>
#include <string_view>
#include <vector>

#include "autograd/gradcheck.hpp"

namespace autograd::detail {

// Throws "op: eps must be positive, ..." and the like for options no check can run with.
void check_gradcheck_options(std::string_view op, const GradcheckOptions& options);

// The indices of the inputs to check (those that require grad), after checking each one: defined,
// Float64, a leaf; and at least one.
std::vector<std::size_t> checked_gradcheck_inputs(std::string_view op, const std::vector<Tensor>& inputs);

// gradcheck, its messages starting with `op`.
GradcheckResult gradcheck_as(std::string_view op, const GradcheckFn& fn, const std::vector<Tensor>& inputs,
                             const GradcheckOptions& options);

}  // namespace autograd::detail
