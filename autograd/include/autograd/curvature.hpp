#pragma once
// Curvature of a scalar loss seen through Hessian-vector products, and arithmetic on vectors over
// a list of parameters (one tensor per parameter, as ag::grad returns them).
//
//   auto loss = [&](const ag::TensorList&) { return model_loss(); };   // reads the parameters
//   auto top = ag::top_hessian_eigenvalues(loss, params, 3, {.tolerance = 1e-6});
//   top.eigenvalues[0];   // the eigenvalue of largest magnitude of d²loss/dθ²
//
// The Hessian is never built: its gradient is taken once with create_graph, and every product H·v
// is one more backward pass through that gradient's graph, d(g·v)/dθ (as ag::hvp computes it).
#include <cstdint>
#include <functional>
#include <vector>

#include "autograd/gradcheck.hpp"
#include "autograd/tensor.hpp"

namespace autograd {

// ---- vectors over parameters ----
// The lists must match tensor by tensor in shape (and be Float32 or Float64); sums run in float64
// over the tensors in order and their elements in row-major order. Not differentiable.
double dot(const TensorList& a, const TensorList& b);
double norm(const TensorList& a);                              // sqrt(dot(a, a))
// y ← y + alpha·x, in place in y's tensors (under NoGradGuard when they are parameters).
void axpy(double alpha, const TensorList& x, const TensorList& y);
TensorList scale(const TensorList& x, double alpha);           // new tensors alpha·x
// The elements of every tensor end to end, as one 1-D tensor of the first tensor's dtype (all the
// tensors must share it); unflatten_list cuts such a vector back into tensors shaped and typed like
// `like` (torch.nn.utils.parameters_to_vector / vector_to_parameters, returning new tensors).
Tensor flatten_list(const TensorList& ts);
TensorList unflatten_list(const Tensor& flat, const TensorList& like);

// ---- Hessian-vector products ----
// H·v at one point: fn is called once here (with params) and its gradient taken with
// create_graph; each call then runs one backward through that gradient's graph, which stays alive
// as long as this object. Parameters that the loss does not depend on, or depends on linearly, have
// zero rows. Every parameter must be a Float32 or Float64 tensor that requires grad, each given once.
class HessianVectorProduct {
 public:
  HessianVectorProduct(const GradcheckFn& fn, const TensorList& params);
  TensorList operator()(const TensorList& v) const;  // v shaped like params
  const TensorList& params() const { return params_; }
  const TensorList& gradient() const { return gradient_; }  // dL/dθ at the point (in the graph)
  double loss() const { return loss_; }
  std::int64_t size() const;  // total elements of the parameters

 private:
  TensorList params_, gradient_;
  std::vector<std::size_t> differentiable_;  // gradients that depend on the parameters
  double loss_ = 0;
};

struct HessianEigenOptions {
  int max_iterations = 200;  // products H·v per eigenvalue at most
  double tolerance = 1e-6;   // stop when ‖P H'v − λv‖ <= tolerance·|λ| for the unit iterate v (see below)
  std::uint64_t seed = 0;    // start vectors: standard normal, from Generator(seed), one per eigenvalue
  // The first eigenvalue's start vector instead (shaped like params; later ones still come from seed).
  TensorList start = {};
};

struct HessianEigenResult {
  std::vector<double> eigenvalues;        // k of them, in the order found: decreasing magnitude
  std::vector<TensorList> eigenvectors;   // unit vectors, shaped like params
  std::vector<double> residuals;          // ‖P H'v − λv‖ / |λ| at the last iterate (P: off the earlier u_i)
  std::vector<int> iterations;            // products H·v each took
  std::vector<bool> converged;            // each reached the tolerance
  std::vector<std::vector<double>> history;  // each one's Rayleigh quotient after every product
};

// The k eigenvalues of largest magnitude of a symmetric operator given by its products (Hv),
// by power iteration with deflation: eigenvalue j iterates v ← H'v / ‖H'v‖ on
// H' = H − Σ_{i<j} λ_i u_i u_iᵀ, each product projected off the u_i found (P), and λ_j is the
// Rayleigh quotient vᵀH'v; it stops when ‖P H'v − λv‖ <= tolerance·|λ|. The first eigenvalue is
// plain power iteration (examples/hessian_power.hpp's, to the bit, from the same start). Each converges at the rate |λ_(j+1) / λ_j| per product; eigenvalues of
// (nearly) equal magnitude and opposite sign converge slowly: raise max_iterations or look at
// `converged`. `like` gives the shapes and dtypes of the vectors.
HessianEigenResult top_eigenvalues(const std::function<TensorList(const TensorList&)>& hv, const TensorList& like,
                                   int k, const HessianEigenOptions& options = {});
// The same on the Hessian of fn (a TensorList -> one-element Tensor, as for ag::hvp and gradcheck)
// at params; a loss that is NaN or ±inf there is refused.
HessianEigenResult top_hessian_eigenvalues(const GradcheckFn& fn, const TensorList& params, int k,
                                           const HessianEigenOptions& options = {});

}  // namespace autograd
