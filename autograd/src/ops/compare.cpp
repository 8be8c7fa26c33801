// Comparisons eq, ne, lt, le, gt, ge: broadcasting like the binary ops, the result Int64 holding
// 1 where the comparison holds and 0 elsewhere (PyTorch returns bool; headgrad has no bool
// dtype, and an Int64 0/1 tensor works as a mask in masked_fill and where, and counts with sum).
// Not differentiable: the result is outside the graph.
//
// Inputs of one dtype compare in it; an Int64 and a float input compare in Float64.
#include <algorithm>
#include <array>
#include <cmath>
#include <string_view>

#include "autograd/ops.hpp"
#include "kernels/broadcast.hpp"
#include "ops/checks.hpp"

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
    broadcast::map_into<std::int64_t, 2>(broadcast::make_plan<2>(shape, {&x.shape(), &z.shape()}),
                                       out.data<std::int64_t>(), in, [](const auto& p, const auto& q) {
                                         return compare<C>(p, q).template cast<std::int64_t>();
                                       });
    return out;
  }
  // floats: 0/1 in the inputs' dtype (exact), then as Int64
  return broadcast::map<2>(shape, {x, z}, [](const auto& p, const auto& q) {
           return compare<C>(p, q).template cast<broadcast::scalar_t<decltype(p)>>();
         }).to(Dtype::Int64);
}

// b as a 0-d tensor to compare a with: in a's dtype, except a non-integral b against an Int64 a
// (compared in Float64, so that 2 < 2.5 holds). -2^63 is INT64_MIN and compares exactly.
Tensor scalar_for(const Tensor& a, double b) {
  if (a.dtype() == Dtype::Int64 && !(b == std::trunc(b) && b >= -0x1p63 && b < 0x1p63))
    return scalar_tensor(b, Dtype::Float64);  // also NaN (and ±inf, |b| >= 2^63: see compare_scalar)
  return scalar_tensor(b, a.dtype());
}

// a compared with the number b. Against an Int64 a, a b at or beyond 2^63 (or below -2^63) has
// its answer known without rounding a to Float64: every Int64 is < 2^63 and >= -2^63.
template <Cmp C>
Tensor compare_scalar(std::string_view op, const Tensor& a, double b) {
  check_defined(op, a, "first argument");
  if (a.dtype() == Dtype::Int64 && (b >= 0x1p63 || b < -0x1p63)) {
    const bool below = b > 0;  // every element of a is below b (else above it)
    const bool holds = C == Cmp::Ne || (below && (C == Cmp::Lt || C == Cmp::Le)) ||
                       (!below && (C == Cmp::Gt || C == Cmp::Ge));
    Tensor out = Tensor::empty(a.shape(), Dtype::Int64, op);
    std::fill(out.data<std::int64_t>(), out.data<std::int64_t>() + out.numel(), holds ? 1 : 0);
    return out;
  }
  return compare_tensors<C>(op, a, scalar_for(a, b));
}

}  // namespace

Tensor eq(const Tensor& a, const Tensor& b) { return compare_tensors<Cmp::Eq>("eq", a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare_tensors<Cmp::Ne>("ne", a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare_tensors<Cmp::Lt>("lt", a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return compare_tensors<Cmp::Le>("le", a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare_tensors<Cmp::Gt>("gt", a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare_tensors<Cmp::Ge>("ge", a, b); }
Tensor eq(const Tensor& a, double b) { return compare_scalar<Cmp::Eq>("eq", a, b); }
Tensor ne(const Tensor& a, double b) { return compare_scalar<Cmp::Ne>("ne", a, b); }
Tensor lt(const Tensor& a, double b) { return compare_scalar<Cmp::Lt>("lt", a, b); }
Tensor le(const Tensor& a, double b) { return compare_scalar<Cmp::Le>("le", a, b); }
Tensor gt(const Tensor& a, double b) { return compare_scalar<Cmp::Gt>("gt", a, b); }
Tensor ge(const Tensor& a, double b) { return compare_scalar<Cmp::Ge>("ge", a, b); }

}  // namespace autograd
