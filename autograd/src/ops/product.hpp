#pragma once
// The matrix products behind matmul and linear, and their gradients, as one differentiable op
// family (internal, not installed; defined in matmul.cpp).
//
// A product C = A·B (sliced into batches by a MatmulPlan) is the gradient of the trilinear form
//   T(A, B, C) = Σ_slices tr(Cᵀ·A·B)
// in its slot C; its gradients in the slots A and B are dA = C·Bᵀ and dB = Aᵀ·C, each summed over
// the slices that share a matrix. `product(s, plan, x, y)` is T's gradient in slot s, given the
// two other slots x, y in the order A, B, C:
//   product(Slot::C, plan, A, B) = A·B      (matmul's and linear's forward)
//   product(Slot::A, plan, B, C) = C·Bᵀ     (dA of a product C = A·B)
//   product(Slot::B, plan, A, C) = Aᵀ·C     (dB of a product C = A·B)
// Each runs one GEMM per slice (one GEMM in all when A's batch folds into its rows), with the
// transposes as GEMM flags, not copies. Its derivative is stated once, in product's rule: the
// derivative of T's gradient in slot s with respect to slot t is T's gradient in slot t.
#include <cstdint>
#include <memory>
#include <vector>

#include "autograd/shape.hpp"
#include "autograd/tensor.hpp"

namespace autograd {

// A product's shapes and its batch slices: the shapes of A, B and C as given (before a 1-D
// operand is promoted to a matrix), the matrix sizes after that promotion, and which matrix of A
// and B each output slice uses.
struct MatmulPlan {
  Shape a_shape, b_shape, out_shape;
  std::int64_t m = 0, k = 0, n = 0;
  std::int64_t batch = 1;                      // output batch slices
  std::int64_t a_mats = 1, b_mats = 1;         // matrices stored in A and B
  std::vector<std::int64_t> a_index, b_index;  // per output slice (unused when the product folds)

  // A's batch covers the output's, B has none: fold A's batch into rows.
  bool folds() const { return b_mats == 1 && a_mats == batch; }
};

// matmul's plan for a [...] x b [...] (torch.matmul's rules); throws naming matmul.
MatmulPlan make_plan(const Shape& a, const Shape& b);

// linear's plan: x (..., in) times W (in, out), x's leading dims folded into the rows of one GEMM.
// Allocates nothing.
MatmulPlan folded_plan(const Shape& x_shape, std::int64_t in, std::int64_t out);

enum class Slot : unsigned char { A, B, C };

// T's gradient in slot s from the two other slots (see above). Records a node when x or y needs
// a gradient; the plan is copied into it (the shared form shares it instead).
Tensor product(Slot s, const MatmulPlan& plan, const Tensor& x, const Tensor& y);
Tensor product(Slot s, const std::shared_ptr<const MatmulPlan>& plan, const Tensor& x, const Tensor& y);

}  // namespace autograd
