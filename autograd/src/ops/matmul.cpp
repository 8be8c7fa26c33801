// matmul with torch.matmul's rules:
//   [K]·[K] -> []                     dot product
//   [M, K]·[K, N] -> [M, N]
//   [K]·[..., K, N] -> [..., N]       the vector is promoted to [1, K], the 1 removed after
//   [..., M, K]·[K] -> [..., M]       the vector is promoted to [K, 1], the 1 removed after
//   [...a, M, K]·[...b, K, N] -> [broadcast(...a, ...b), M, N]
// Each batch slice is one GEMM (gemm.hpp) on the row-major storage (no copies). When B has
// no batch dims, A's batch folds into its rows and the whole product is a single GEMM, forward
// and backward. The forward and its two gradients are one differentiable op family, product
// (product.hpp), whose rule is written once below and is used at every order.
#include <array>
#include <memory>

#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "kernels/gemm.hpp"
#include "ops/checks.hpp"
#include "ops/product.hpp"
#include "ops/tangent_rules.hpp"

namespace autograd {
namespace {

bool runs_parallel(const MatmulPlan& p) { return p.batch > 1 && p.batch * p.m * p.k * p.n >= kParallelFlops; }

}  // namespace

MatmulPlan make_plan(const Shape& a, const Shape& b) {
  if (a.empty() || b.empty())
    fail("matmul", "both arguments need at least one dimension, got {} x {}", shape_str(a), shape_str(b));
  const Shape a2 = a.size() == 1 ? Shape{1, a[0]} : a;
  const Shape b2 = b.size() == 1 ? Shape{b[0], 1} : b;
  MatmulPlan p;
  p.a_shape = a;
  p.b_shape = b;
  p.m = a2[a2.size() - 2];
  p.k = a2[a2.size() - 1];
  p.n = b2[b2.size() - 1];
  if (b2[b2.size() - 2] != p.k) fail("matmul", "inner dimensions differ: {} x {}", shape_str(a), shape_str(b));

  // Batch dims, right-aligned and broadcast; each operand's matrix stride per batch dim (0 where broadcast).
  const Shape ba(a2.begin(), a2.end() - 2), bb(b2.begin(), b2.end() - 2);
  const std::size_t rank = std::max(ba.size(), bb.size());
  Shape batch(rank), a_stride(rank, 0), b_stride(rank, 0);
  std::int64_t sa = 1, sb = 1;
  for (std::size_t j = 0; j < rank; ++j) {
    const std::size_t d = rank - 1 - j;
    const std::int64_t da = j < ba.size() ? ba[ba.size() - 1 - j] : 1;
    const std::int64_t db = j < bb.size() ? bb[bb.size() - 1 - j] : 1;
    if (da != db && da != 1 && db != 1)
      fail("matmul", "batch dimensions cannot be broadcast: {} x {}", shape_str(a), shape_str(b));
    batch[d] = std::max(da, db);
    if (da == 0 || db == 0) batch[d] = 0;
    a_stride[d] = da == 1 ? 0 : sa;
    b_stride[d] = db == 1 ? 0 : sb;
    sa *= da;
    sb *= db;
  }
  // The product's shape, checked before any count is formed from it.
  p.out_shape = batch;
  if (a.size() > 1) p.out_shape.push_back(p.m);
  if (b.size() > 1) p.out_shape.push_back(p.n);
  std::int64_t out_numel = 0;
  if (!numel_fits(p.out_shape, out_numel))
    fail("matmul", "{} x {} gives shape {}, more elements than a 64-bit count can hold", shape_str(a), shape_str(b),
         shape_str(p.out_shape));
  p.a_mats = sa;
  p.b_mats = sb;
  p.batch = shape_numel(batch);
  p.a_index.resize(static_cast<std::size_t>(p.batch));
  p.b_index.resize(static_cast<std::size_t>(p.batch));
  std::vector<std::int64_t> idx(rank, 0);
  for (std::int64_t i = 0; i < p.batch; ++i) {
    std::int64_t ia = 0, ib = 0;
    for (std::size_t d = 0; d < rank; ++d) {
      ia += idx[d] * a_stride[d];
      ib += idx[d] * b_stride[d];
    }
    p.a_index[static_cast<std::size_t>(i)] = ia;
    p.b_index[static_cast<std::size_t>(i)] = ib;
    for (std::size_t d = rank; d-- > 0;) {  // odometer
      if (++idx[d] < batch[d]) break;
      idx[d] = 0;
    }
  }

  return p;
}

MatmulPlan folded_plan(const Shape& x_shape, std::int64_t in, std::int64_t out) {
  MatmulPlan p;
  p.a_shape = x_shape;
  p.b_shape = Shape{in, out};
  p.out_shape = x_shape;
  p.out_shape.back() = out;
  p.m = 1;
  for (std::size_t d = 0; d + 1 < x_shape.size(); ++d) p.m *= x_shape[d];
  p.k = in;
  p.n = out;
  return p;
}

namespace {

// C = A·B over all slices.
template <class T>
void forward(const MatmulPlan& p, const T* a, const T* b, T* c) {
  const std::int64_t m = p.m, k = p.k, n = p.n;
  if (p.folds()) {
    gemm<T>(false, false, p.batch * m, n, k, T(1), a, k, b, n, T(0), c, n);
    return;
  }
  parallel_for(p.batch, runs_parallel(p), [&](std::int64_t i) {
    const auto s = static_cast<std::size_t>(i);
    gemm<T>(false, false, m, n, k, T(1), a + p.a_index[s] * m * k, k, b + p.b_index[s] * k * n, n, T(0),
            c + i * m * n, n);
  });
}

// C = A·B  =>  dA = dC·Bᵀ  [M,N]x[N,K], summed over the slices that share a matrix of A.
template <class T>
void grad_a(const MatmulPlan& p, const T* dc, const T* b, T* da) {
  const std::int64_t m = p.m, k = p.k, n = p.n;
  if (p.folds()) {
    gemm<T>(false, true, p.batch * m, k, n, T(1), dc, n, b, n, T(0), da, k);
    return;
  }
  if (p.a_mats == p.batch) {  // one slice per matrix of A: plain assignment, slices independent
    parallel_for(p.batch, runs_parallel(p), [&](std::int64_t i) {
      const auto s = static_cast<std::size_t>(i);
      gemm<T>(false, true, m, k, n, T(1), dc + i * m * n, n, b + p.b_index[s] * k * n, n, T(0),
              da + p.a_index[s] * m * k, k);
    });
    return;
  }
  MatrixView<T>(da, p.a_mats * m, k).setZero();
  for (std::int64_t i = 0; i < p.batch; ++i) {
    const auto s = static_cast<std::size_t>(i);
    gemm<T>(false, true, m, k, n, T(1), dc + i * m * n, n, b + p.b_index[s] * k * n, n, T(1),
            da + p.a_index[s] * m * k, k);
  }
}

// C = A·B  =>  dB = Aᵀ·dC  [K,M]x[M,N], summed over the slices that share a matrix of B.
template <class T>
void grad_b(const MatmulPlan& p, const T* dc, const T* a, T* db) {
  const std::int64_t m = p.m, k = p.k, n = p.n;
  if (p.folds()) {
    gemm<T>(true, false, k, n, p.batch * m, T(1), a, k, dc, n, T(0), db, n);
    return;
  }
  if (p.b_mats == p.batch) {
    parallel_for(p.batch, runs_parallel(p), [&](std::int64_t i) {
      const auto s = static_cast<std::size_t>(i);
      gemm<T>(true, false, k, n, m, T(1), a + p.a_index[s] * m * k, k, dc + i * m * n, n, T(0),
              db + p.b_index[s] * k * n, n);
    });
    return;
  }
  MatrixView<T>(db, p.b_mats * k, n).setZero();
  for (std::int64_t i = 0; i < p.batch; ++i) {
    const auto s = static_cast<std::size_t>(i);
    gemm<T>(true, false, k, n, m, T(1), a + p.a_index[s] * m * k, k, dc + i * m * n, n, T(1),
            db + p.b_index[s] * k * n, n);
  }
}

// T's gradient in slot s from the other two slots v (v[s] unused), on plain tensors.
Tensor compute(Slot s, const MatmulPlan& p, const std::array<const Tensor*, 3>& v) {
  const Shape& shape = s == Slot::A ? p.a_shape : s == Slot::B ? p.b_shape : p.out_shape;
  const Tensor& any = s == Slot::A ? *v[1] : *v[0];
  Tensor z = Tensor::empty(shape, any.dtype(), "matmul");
  dispatch(any.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* a = s == Slot::A ? nullptr : v[0]->data<T>();
    const T* b = s == Slot::B ? nullptr : v[1]->data<T>();
    const T* c = s == Slot::C ? nullptr : v[2]->data<T>();
    switch (s) {
      case Slot::C: forward<T>(p, a, b, z.data<T>()); break;
      case Slot::A: grad_a<T>(p, c, b, z.data<T>()); break;
      case Slot::B: grad_b<T>(p, c, a, z.data<T>()); break;
    }
  });
  return z;
}

constexpr std::size_t idx(Slot s) { return static_cast<std::size_t>(s); }

// The two slots other than s, in the order A, B, C: where product's x and y go.
constexpr std::array<Slot, 2> others(Slot s) {
  return s == Slot::A ? std::array{Slot::B, Slot::C} : s == Slot::B ? std::array{Slot::A, Slot::C}
                                                                      : std::array{Slot::A, Slot::B};
}

std::string_view node_name(Slot s) {
  return s == Slot::C ? "matmul" : s == Slot::A ? "matmul_backward_a" : "matmul_backward_b";
}

Tensor compute(Slot s, const MatmulPlan& p, const Tensor& x, const Tensor& y) {
  std::array<const Tensor*, 3> v{};
  const auto [sx, sy] = others(s);
  v[idx(sx)] = &x;
  v[idx(sy)] = &y;
  return compute(s, p, v);
}

// Z = T's gradient in slot s, from x and y in the slots others(s). T is linear in each slot, so
// with dZ put in slot s, Z's derivative with respect to the input in slot t is T's gradient in
// slot t, from dZ and the other input:
//   Z = A·B  (s = C):  dA = dZ·Bᵀ,  dB = Aᵀ·dZ
//   Z = C·Bᵀ (s = A):  dC = dZ·B,   dB = dZᵀ·C
//   Z = Aᵀ·C (s = B):  dA = C·dZᵀ,  dC = A·dZ
Tensor record_product(Slot s, std::shared_ptr<const MatmulPlan> plan, const Tensor& x, const Tensor& y, Tensor z) {
  const std::string_view name = node_name(s);
  // The gradient of x needs y, and that of y needs x.
  SavedTensor saved_x(y.requires_grad() ? x : Tensor()), saved_y(x.requires_grad() ? y : Tensor());
  // Forward mode: Z is bilinear in x and y, so Ż = T's gradient in slot s from (ẋ, y) plus that
  // from (x, ẏ).
  struct Saved {
    Slot s;
    std::string_view name;
    std::shared_ptr<const MatmulPlan> plan;
    SavedTensor x, y;
  };
  return record(name, {x, y}, std::move(z), with_tangents(Saved{s, name, std::move(plan), std::move(saved_x), std::move(saved_y)},
                [](const Saved& st, const TensorList& g, const Node& n) {
                  const Slot s = st.s;
                  const std::string_view name = st.name;
                  const auto& plan = st.plan;
                  const SavedTensor& saved_x = st.x;
                  const SavedTensor& saved_y = st.y;
                  // (plain variables, not a structured binding: the lambdas below capture them)
                  const std::array<Slot, 2> xy = others(s);
                  const Slot sx = xy[0], sy = xy[1];
                  std::array<Tensor, 3> v;
                  v[idx(s)] = g[0];
                  if (n.needs_input_grad(1)) v[idx(sx)] = saved_x.get(name);
                  if (n.needs_input_grad(0)) v[idx(sy)] = saved_y.get(name);
                  auto slot_grad = [&](Slot t) {
                    const auto [t0, t1] = others(t);
                    return product(t, plan, v[idx(t0)], v[idx(t1)]);
                  };
                  return GradList{grad_if(n, 0, [&] { return slot_grad(sx); }),
                                  grad_if(n, 1, [&] { return slot_grad(sy); })};
                },
                [](const Saved& st, const TensorList& t, const Node& n) {
                  const Tensor a = t[0].defined() ? product(st.s, st.plan, t[0], st.y.get(st.name)) : Tensor();
                  const Tensor b = t[1].defined() ? product(st.s, st.plan, st.x.get(st.name), t[1]) : Tensor();
                  return GradList{tangent_sum(a, b, n)};
                }));
}

}  // namespace

Tensor product(Slot s, const MatmulPlan& plan, const Tensor& x, const Tensor& y) {
  Tensor z = compute(s, plan, x, y);
  if (!needs_grad(x, y)) return z;
  return record_product(s, std::make_shared<const MatmulPlan>(plan), x, y, std::move(z));
}

Tensor product(Slot s, const std::shared_ptr<const MatmulPlan>& plan, const Tensor& x, const Tensor& y) {
  Tensor z = compute(s, *plan, x, y);
  if (!needs_grad(x, y)) return z;
  return record_product(s, plan, x, y, std::move(z));
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_defined("matmul", a, "the first argument");
  check_defined("matmul", b, "the second argument");
  check_floating("matmul", a, "the first argument");
  check_floating("matmul", b, "the second argument");
  if (a.dtype() != b.dtype())
    fail("matmul", "dtypes differ: {} and {}", dtype_name(a.dtype()), dtype_name(b.dtype()));
  // C = A·B  =>  dA = dC·Bᵀ, dB = Aᵀ·dC, each summed over the batch dims it was broadcast along
  // (product's rule)
  return product(Slot::C, std::make_shared<const MatmulPlan>(make_plan(a.shape(), b.shape())), a, b);
}

}  // namespace autograd
