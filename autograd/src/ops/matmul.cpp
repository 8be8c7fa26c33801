// matmul with torch.matmul's rules:
//   [K]·[K] -> []                     dot product
//   [M, K]·[K, N] -> [M, N]
//   [K]·[..., K, N] -> [..., N]       the vector is promoted to [1, K], the 1 removed after
//   [..., M, K]·[K] -> [..., M]       the vector is promoted to [K, 1], the 1 removed after
//   [...a, M, K]·[...b, K, N] -> [broadcast(...a, ...b), M, N]
// Each batch slice is one GEMM (gemm.hpp) on the row-major storage (no copies). When B has
// no batch dims, A's batch folds into its rows and the whole product is a single GEMM, forward
// and backward.
#include <memory>

#include "autograd/grad_mode.hpp"
#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "kernels/gemm.hpp"
#include "ops/checks.hpp"

namespace autograd {
namespace {

// Shapes after 1-D promotion, and which matrix of A and B each output batch slice uses.
struct MatmulPlan {
  Shape out_shape;
  std::int64_t m = 0, k = 0, n = 0;
  std::int64_t batch = 1;                // output batch slices
  std::int64_t a_mats = 1, b_mats = 1;   // matrices stored in A and B
  std::vector<std::int64_t> a_index, b_index;  // per output slice

  // A's batch covers the output's, B has none: fold A's batch into rows.
  bool folds() const { return b_mats == 1 && a_mats == batch; }
  bool parallel() const { return batch > 1 && batch * m * k * n >= kParallelFlops; }
};

MatmulPlan make_plan(const Shape& a, const Shape& b) {
  if (a.empty() || b.empty())
    fail("matmul", "both arguments need at least one dimension, got {} x {}", shape_str(a), shape_str(b));
  const Shape a2 = a.size() == 1 ? Shape{1, a[0]} : a;
  const Shape b2 = b.size() == 1 ? Shape{b[0], 1} : b;
  MatmulPlan p;
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

// C = A·B over all slices.
template <class T>
void forward(const MatmulPlan& p, const T* a, const T* b, T* c) {
  const std::int64_t m = p.m, k = p.k, n = p.n;
  if (p.folds()) {
    gemm<T>(false, false, p.batch * m, n, k, T(1), a, k, b, n, T(0), c, n);
    return;
  }
  parallel_for(p.batch, p.parallel(), [&](std::int64_t i) {
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
    parallel_for(p.batch, p.parallel(), [&](std::int64_t i) {
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
    parallel_for(p.batch, p.parallel(), [&](std::int64_t i) {
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

// The same gradients composed of differentiable ops, for a backward that builds a graph: a 1-D
// operand is promoted as in the forward (and dC given the size-1 dim it lost), each gradient is
// one matmul with the other operand transposed, summed back over the batch dims it was
// broadcast along.
GradList composed_grads(const Tensor& dc, const SavedTensor& saved_a, const SavedTensor& saved_b,
                        const Shape& a_shape, const Shape& b_shape, const Node& node) {
  GradList grads(2);
  const bool want_a = node.needs_input_grad(0), want_b = node.needs_input_grad(1);
  const Tensor a = want_b ? saved_a.get("matmul") : Tensor();  // dB needs A, dA needs B
  const Tensor b = want_a ? saved_b.get("matmul") : Tensor();
  if (a_shape.size() == 1 && b_shape.size() == 1) {  // dot product: dc is a scalar
    if (want_a) grads[0] = mul(dc, b);
    if (want_b) grads[1] = mul(dc, a);
    return grads;
  }
  Tensor dc2 = dc;
  if (a_shape.size() == 1) dc2 = unsqueeze(dc2, -2);
  if (b_shape.size() == 1) dc2 = unsqueeze(dc2, -1);
  const Shape a2_shape = a_shape.size() == 1 ? Shape{1, a_shape[0]} : a_shape;
  const Shape b2_shape = b_shape.size() == 1 ? Shape{b_shape[0], 1} : b_shape;
  if (want_a) grads[0] = reshape(sum_to(matmul(dc2, transpose(reshape(b, b2_shape), -1, -2)), a2_shape), a_shape);
  if (want_b) grads[1] = reshape(sum_to(matmul(transpose(reshape(a, a2_shape), -1, -2), dc2), b2_shape), b_shape);
  return grads;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_defined("matmul", a, "the first argument");
  check_defined("matmul", b, "the second argument");
  check_floating("matmul", a, "the first argument");
  check_floating("matmul", b, "the second argument");
  if (a.dtype() != b.dtype())
    fail("matmul", "dtypes differ: {} and {}", dtype_name(a.dtype()), dtype_name(b.dtype()));
  auto plan = std::make_shared<const MatmulPlan>(make_plan(a.shape(), b.shape()));
  Tensor c = Tensor::empty(plan->out_shape, a.dtype(), "matmul");
  dispatch(a.dtype(), [&](auto zero) {
    using T = decltype(zero);
    forward<T>(*plan, a.data<T>(), b.data<T>(), c.data<T>());
  });
  if (needs_grad(a, b)) {
    // C = A·B  =>  dA = dC·Bᵀ, dB = Aᵀ·dC, each summed over the batch dims it was broadcast along
    return record("matmul", {a, b}, c,
                  [plan, a_shape = a.shape(), b_shape = b.shape(), saved_a = SavedTensor(a), saved_b = SavedTensor(b)](
                      const TensorList& g, const Node& node) {
                    if (is_grad_enabled())
                      return composed_grads(g[0], saved_a, saved_b, a_shape, b_shape, node);
                    GradList grads(2);
                    const Tensor& dc = g[0];
                    dispatch(dc.dtype(), [&](auto zero) {
                      using T = decltype(zero);
                      if (node.needs_input_grad(0)) {
                        const Tensor bv = saved_b.get("matmul");
                        grads[0] = Tensor::empty(a_shape, dc.dtype());
                        grad_a<T>(*plan, dc.data<T>(), bv.data<T>(), grads[0].data<T>());
                      }
                      if (node.needs_input_grad(1)) {
                        const Tensor av = saved_a.get("matmul");
                        grads[1] = Tensor::empty(b_shape, dc.dtype());
                        grad_b<T>(*plan, dc.data<T>(), av.data<T>(), grads[1].data<T>());
                      }
                    });
                    return grads;
                  });
  }
  return c;
}

}  // namespace autograd
