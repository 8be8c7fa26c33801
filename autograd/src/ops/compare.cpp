// Comparisons eq, ne, lt, le, gt, ge: broadcasting like the binary ops, the result Int64 holding
// 1 where the comparison holds and 0 elsewhere (PyTorch returns bool; headgrad has no bool
// dtype, and an Int64 0/1 tensor works as a mask in masked_fill and where, and counts with sum).
// Not differentiable: the result is outside the graph.
//
// Inputs of one dtype compare in it; an Int64 and a float input compare in Float64.
#include <array>
#include <cmath>
#include <string_view>

#include "autograd/ops.hpp"
#include "ops/kernels.hpp"

namespace autograd {
namespace {

enum class Cmp { Eq, Ne, Lt, Le, Gt, Ge };

template <Cmp C, class X, class Z>
auto compare(const X& x, const Z& z) {
  if constexpr (C == Cmp::Eq) return x == z;
  else if constexpr (C == Cmp::Ne) return x != z;
  else if constexpr (C == Cmp::Lt) return x < z;
  else if constexpr (C == Cmp::Le) return x <= z;
  else if constexpr (C == Cmp::Gt) return x > z;
  else return x >= z;
}

template <Cmp C>
Tensor compare_tensors(std::string_view op, const Tensor& a, const Tensor& b) {
  check_defined(op, a, "first argument");
  check_defined(op, b, "second argument");
  const Shape shape = a.shape() == b.shape() ? a.shape() : broadcast_shapes(op, a.shape(), b.shape());
  const Tensor x = a.dtype() == b.dtype() ? a.detach() : a.detach().to(Dtype::Float64);
  const Tensor z = a.dtype() == b.dtype() ? b.detach() : b.detach().to(Dtype::Float64);
  if (x.dtype() == Dtype::Int64) {
    Tensor out = Tensor::empty(shape, Dtype::Int64, op);
    const std::array<const std::int64_t*, 2> in{x.data<std::int64_t>(), z.data<std::int64_t>()};
    kernels::map_into<std::int64_t, 2>(kernels::make_plan<2>(shape, {&x.shape(), &z.shape()}),
                                       out.data<std::int64_t>(), in, [](const auto& p, const auto& q) {
                                         return compare<C>(p, q).template cast<std::int64_t>();
                                       });
    return out;
  }
  // floats: 0/1 in the inputs' dtype (exact), then as Int64
  return kernels::map<2>(shape, {x, z}, [](const auto& p, const auto& q) {
           return compare<C>(p, q).template cast<kernels::scalar_t<decltype(p)>>();
         }).to(Dtype::Int64);
}

// b as a 0-d tensor to compare a with: in a's dtype, except a non-integral b against an Int64 a
// (compared in Float64, so that 2 < 2.5 holds).
Tensor scalar_for(std::string_view op, const Tensor& a, double b) {
  check_defined(op, a, "first argument");
  if (a.dtype() == Dtype::Int64 && !(b == std::trunc(b) && std::fabs(b) < 0x1p63))
    return scalar_tensor(b, Dtype::Float64);  // also NaN and ±inf
  return scalar_tensor(b, a.dtype());
}

}  // namespace

Tensor eq(const Tensor& a, const Tensor& b) { return compare_tensors<Cmp::Eq>("eq", a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare_tensors<Cmp::Ne>("ne", a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare_tensors<Cmp::Lt>("lt", a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return compare_tensors<Cmp::Le>("le", a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare_tensors<Cmp::Gt>("gt", a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare_tensors<Cmp::Ge>("ge", a, b); }
Tensor eq(const Tensor& a, double b) { return compare_tensors<Cmp::Eq>("eq", a, scalar_for("eq", a, b)); }
Tensor ne(const Tensor& a, double b) { return compare_tensors<Cmp::Ne>("ne", a, scalar_for("ne", a, b)); }
Tensor lt(const Tensor& a, double b) { return compare_tensors<Cmp::Lt>("lt", a, scalar_for("lt", a, b)); }
Tensor le(const Tensor& a, double b) { return compare_tensors<Cmp::Le>("le", a, scalar_for("le", a, b)); }
Tensor gt(const Tensor& a, double b) { return compare_tensors<Cmp::Gt>("gt", a, scalar_for("gt", a, b)); }
Tensor ge(const Tensor& a, double b) { return compare_tensors<Cmp::Ge>("ge", a, scalar_for("ge", a, b)); }

}  // namespace autograd
