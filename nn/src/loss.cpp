#include "nn/loss.hpp"

namespace nn {

ag::Tensor mse_loss(const ag::Tensor& input, const ag::Tensor& target, Reduction reduction) {
  constexpr const char* op = "mse_loss";
  if (!input.defined() || !target.defined()) ag::fail(op, "input or target is undefined");
  if (input.shape() != target.shape())
    ag::fail(op, "input {} and target {} must have the same shape", ag::shape_str(input.shape()),
             ag::shape_str(target.shape()));
  if (input.dtype() != target.dtype())
    ag::fail(op, "dtypes differ: {} and {}", ag::dtype_name(input.dtype()), ag::dtype_name(target.dtype()));
  if (!ag::is_floating(input.dtype()))
    ag::fail(op, "needs Float32 or Float64 tensors, got {} (shape {})", ag::dtype_name(input.dtype()),
             ag::shape_str(input.shape()));
  ag::Tensor squared = ag::square(ag::sub(input, target));
  switch (reduction) {
    case Reduction::None:
      return squared;
    case Reduction::Sum:
      return ag::sum(squared);
    case Reduction::Mean:
      break;
  }
  return ag::mean(squared);
}

}  // namespace nn
