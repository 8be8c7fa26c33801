#pragma once
// The curvature of a scalar loss seen only through Hessian-vector products: the Hessian of a loss
// with respect to a list of parameter tensors, kept as the graph of its gradient (built once with
// create_graph), applied to a vector by one more backward pass through that graph; and power
// iteration for its eigenvalue of largest magnitude. Vectors over the parameters are flat
// std::vector<double>s, the tensors' elements laid end to end in the parameters' order.
// Header-only, public API only, so the example and its tests share it.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

namespace curvature {

namespace ag = autograd;

using Vector = std::vector<double>;

inline double dot(const Vector& a, const Vector& b) {
  if (a.size() != b.size())
    throw std::invalid_argument("curvature::dot: vectors of " + std::to_string(a.size()) + " and " +
                                std::to_string(b.size()) + " elements");
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

inline double norm(const Vector& a) { return std::sqrt(dot(a, a)); }

// The tensors' elements end to end.
inline Vector flatten(const ag::TensorList& ts) {
  Vector out;
  for (const auto& t : ts) {
    const auto v = t.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

// A flat vector cut back into tensors shaped (and typed) like `like`.
inline ag::TensorList unflatten(const Vector& flat, const std::vector<ag::Tensor>& like) {
  ag::TensorList out;
  std::size_t at = 0;
  for (const auto& t : like) {
    const auto n = static_cast<std::size_t>(t.numel());
    if (at + n > flat.size())
      throw std::invalid_argument("curvature::unflatten: " + std::to_string(flat.size()) +
                                  " values are too few for the tensors given");
    out.push_back(ag::tensor(Vector(flat.begin() + static_cast<std::ptrdiff_t>(at),
                                    flat.begin() + static_cast<std::ptrdiff_t>(at + n)),
                             t.shape(), t.dtype()));
    at += n;
  }
  if (at != flat.size())
    throw std::invalid_argument("curvature::unflatten: " + std::to_string(flat.size()) + " values for tensors of " +
                                std::to_string(at) + " elements");
  return out;
}

inline std::int64_t total_elements(const std::vector<ag::Tensor>& ts) {
  std::int64_t n = 0;
  for (const auto& t : ts) n += t.numel();
  return n;
}

// The Hessian of `loss` with respect to `params` (every one a tensor that requires grad) at the
// point where the loss was computed. The gradient is taken once with create_graph; every
// product H·v is then one backward pass through the gradient's graph (retained), d(g·v)/dθ.
class Hessian {
 public:
  Hessian(const ag::Tensor& loss, std::vector<ag::Tensor> params) : params_(std::move(params)) {
    if (!loss.defined() || loss.numel() != 1)
      throw std::invalid_argument("curvature::Hessian: the loss must be a one-element tensor");
    gradient_ = ag::grad({loss}, params_, {.create_graph = true, .allow_unused = true});
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (!gradient_[i].defined()) gradient_[i] = ag::zeros(params_[i].shape(), params_[i].dtype());
      // A gradient that is constant in the parameters (or zero) has no rows in H·v.
      if (gradient_[i].requires_grad()) differentiable_.push_back(i);
    }
  }

  const std::vector<ag::Tensor>& params() const { return params_; }
  std::int64_t size() const { return total_elements(params_); }
  Vector gradient() const { return flatten(gradient_); }
  const ag::TensorList& gradient_tensors() const { return gradient_; }

  // H·v for a flat v over the parameters.
  Vector apply(const Vector& v) const {
    const ag::TensorList vs = unflatten(v, params_);
    ag::TensorList outs, seeds;
    for (auto i : differentiable_) outs.push_back(gradient_[i]), seeds.push_back(vs[i]);
    if (outs.empty()) return Vector(v.size(), 0.0);
    ag::TensorList hv = ag::grad(outs, params_, {.grad_outputs = seeds, .retain_graph = true, .allow_unused = true});
    for (std::size_t i = 0; i < params_.size(); ++i)
      if (!hv[i].defined()) hv[i] = ag::zeros(params_[i].shape(), params_[i].dtype());
    return flatten(hv);
  }

 private:
  std::vector<ag::Tensor> params_;
  ag::TensorList gradient_;
  std::vector<std::size_t> differentiable_;
};

struct PowerOptions {
  int max_iterations = 100;
  double tolerance = 1e-4;  // stop when ‖Hv − λv‖ <= tolerance · |λ| for the unit v
};

struct PowerResult {
  double eigenvalue = 0.0;     // the Rayleigh quotient vᵀHv of the last unit iterate v
  double residual = 0.0;       // ‖Hv − λv‖ / |λ| for that v
  int iterations = 0;          // products H·v computed
  bool converged = false;      // the residual reached the tolerance
  Vector vector;               // the last unit iterate
  std::vector<double> history; // the Rayleigh quotient after each product
};

// Power iteration from `start` (any nonzero vector): v ← Hv / ‖Hv‖, converging to an eigenvector
// of the eigenvalue of largest magnitude at the rate |λ₂/λ₁| per step, while the Rayleigh
// quotient converges at the square of that rate.
inline PowerResult power_iteration(const std::function<Vector(const Vector&)>& hv, Vector start,
                                   const PowerOptions& options = {}) {
  if (options.max_iterations < 1 || !(options.tolerance > 0))
    throw std::invalid_argument("curvature::power_iteration: wants max_iterations >= 1 and tolerance > 0, got " +
                                std::to_string(options.max_iterations) + " and " + std::to_string(options.tolerance));
  double n = norm(start);
  if (!(n > 0) || !std::isfinite(n))
    throw std::invalid_argument("curvature::power_iteration: the start vector must be nonzero and finite");
  PowerResult r;
  for (auto& x : start) x /= n;
  r.vector = std::move(start);
  for (int k = 0; k < options.max_iterations; ++k) {
    const Vector w = hv(r.vector);
    r.iterations = k + 1;
    n = norm(w);
    if (!std::isfinite(n))
      throw std::runtime_error("curvature::power_iteration: H·v is not finite at iteration " + std::to_string(k + 1));
    if (n == 0) {  // H·v = 0: v is an eigenvector of the eigenvalue 0, exactly
      r.eigenvalue = r.residual = 0.0;
      r.history.push_back(0.0);
      r.converged = true;
      break;
    }
    r.eigenvalue = dot(r.vector, w);
    double res = 0.0;
    for (std::size_t i = 0; i < w.size(); ++i) res += (w[i] - r.eigenvalue * r.vector[i]) * (w[i] - r.eigenvalue * r.vector[i]);
    r.residual = std::sqrt(res) / std::abs(r.eigenvalue);
    r.history.push_back(r.eigenvalue);
    if (r.residual <= options.tolerance) {
      r.converged = true;
      break;
    }
    for (std::size_t i = 0; i < w.size(); ++i) r.vector[i] = w[i] / n;
  }
  return r;
}

// A unit-variance normal vector of n elements from `gen` (the power iteration's start).
inline Vector random_vector(std::int64_t n, ag::Generator& gen) {
  return ag::randn({n}, ag::Dtype::Float64, gen).to_vector();
}

}  // namespace curvature
