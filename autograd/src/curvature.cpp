// Vectors over parameter lists, Hessian-vector products at a point, and power iteration with
// deflation for the Hessian's eigenvalues of largest magnitude.
#include "autograd/curvature.hpp"

#include <cmath>
#include <cstdint>
#include <string_view>

#include "autograd/grad_mode.hpp"
#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "autograd/random.hpp"
#include "autograd/shape.hpp"

namespace autograd {

namespace {

// The elements of t as float64 (a copy only for Float32).
std::vector<double> values_of(const Tensor& t) { return t.to_vector(); }

void check_float(std::string_view op, const char* what, std::size_t i, const Tensor& t) {
  if (!t.defined()) fail(op, "{}[{}] is {}", what, i, undefined_description(t));
  if (t.dtype() == Dtype::Int64) fail(op, "{}[{}] is Int64; vectors over parameters are Float32 or Float64", what, i);
}

void check_matching(std::string_view op, const TensorList& a, const TensorList& b) {
  if (a.size() != b.size()) fail(op, "lists of {} and {} tensors", a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    check_float(op, "a", i, a[i]);
    check_float(op, "b", i, b[i]);
    if (a[i].shape() != b[i].shape())
      fail(op, "tensor {} is {} in one list and {} in the other", i, shape_str(a[i].shape()), shape_str(b[i].shape()));
  }
}

TensorList zeros_list(const TensorList& like) {
  TensorList out;
  for (const auto& t : like) out.push_back(zeros(t.shape(), t.dtype()));
  return out;
}

// x / d, element by element (a division, not a product with 1/d, so that the rounding is that of
// dividing each element).
TensorList divided(const TensorList& x, double d) {
  TensorList out;
  for (const auto& t : x) out.push_back(div(t.detach(), d));
  return out;
}

// ‖w − λv‖, summed in float64 in the lists' order.
double residual_norm(const TensorList& w, double lambda, const TensorList& v) {
  double s = 0.0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    const std::vector<double> a = w[i].to_vector(), b = v[i].to_vector();
    for (std::size_t j = 0; j < a.size(); ++j) s += (a[j] - lambda * b[j]) * (a[j] - lambda * b[j]);
  }
  return std::sqrt(s);
}

TensorList random_list(const TensorList& like, Generator& gen) {
  TensorList out;
  for (const auto& t : like) out.push_back(randn(t.shape(), Dtype::Float64, gen).to(t.dtype()));
  return out;
}

}  // namespace

double dot(const TensorList& a, const TensorList& b) {
  check_matching("dot", a, b);
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const std::vector<double> x = values_of(a[i]), y = values_of(b[i]);
    for (std::size_t j = 0; j < x.size(); ++j) s += x[j] * y[j];
  }
  return s;
}

double norm(const TensorList& a) { return std::sqrt(dot(a, a)); }

void axpy(double alpha, const TensorList& x, const TensorList& y) {
  check_matching("axpy", x, y);
  for (std::size_t i = 0; i < x.size(); ++i) {
    Tensor yi = y[i];
    yi.add_(x[i].dtype() == yi.dtype() ? x[i].detach() : x[i].detach().to(yi.dtype()), alpha);
  }
}

TensorList scale(const TensorList& x, double alpha) {
  TensorList out;
  NoGradGuard no_grad;
  for (std::size_t i = 0; i < x.size(); ++i) {
    check_float("scale", "x", i, x[i]);
    out.push_back(mul(x[i].detach(), alpha));
  }
  return out;
}

Tensor flatten_list(const TensorList& ts) {
  if (ts.empty()) fail("flatten_list", "needs at least one tensor (the result's dtype is the first one's)");
  NoGradGuard no_grad;
  TensorList flat;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    if (!ts[i].defined()) fail("flatten_list", "tensor {} is {}", i, undefined_description(ts[i]));
    if (ts[i].dtype() != ts[0].dtype())
      fail("flatten_list", "tensor {} is {} but tensor 0 is {}", i, dtype_name(ts[i].dtype()), dtype_name(ts[0].dtype()));
    flat.push_back(reshape(ts[i].detach(), {ts[i].numel()}));
  }
  return cat(flat, 0);
}

TensorList unflatten_list(const Tensor& flat, const TensorList& like) {
  if (!flat.defined() || flat.dim() != 1)
    fail("unflatten_list", "needs a 1-D tensor, got {}",
         flat.defined() ? shape_str(flat.shape()) : undefined_description(flat));
  std::int64_t total = 0;
  for (std::size_t i = 0; i < like.size(); ++i) {
    if (!like[i].defined()) fail("unflatten_list", "like[{}] is {}", i, undefined_description(like[i]));
    total += like[i].numel();
  }
  if (total != flat.numel())
    fail("unflatten_list", "{} values for tensors of {} elements in all", flat.numel(), total);
  NoGradGuard no_grad;
  TensorList out;
  std::int64_t at = 0;
  for (const auto& t : like) {
    Tensor piece = reshape(narrow(flat.detach(), 0, at, t.numel()), t.shape()).clone();
    out.push_back(piece.dtype() == t.dtype() ? piece : piece.to(t.dtype()));
    at += t.numel();
  }
  return out;
}

HessianVectorProduct::HessianVectorProduct(const GradcheckFn& fn, const TensorList& params) : params_(params) {
  constexpr std::string_view op = "HessianVectorProduct";
  if (!fn) fail(op, "no function given");
  if (params.empty()) fail(op, "no parameters given");
  for (std::size_t i = 0; i < params.size(); ++i) {
    check_float(op, "params", i, params[i]);
    if (!params[i].requires_grad()) fail(op, "params[{}] does not require grad", i);
    // The same tensor twice would count its coordinates twice (a Hessian of repeated blocks).
    for (std::size_t j = 0; j < i; ++j)
      if (params[i].is_same(params[j])) fail(op, "params[{}] and params[{}] are the same tensor", j, i);
  }
  EnableGradGuard grad_on;
  const Tensor y = fn(params_);
  if (!y.defined()) fail(op, "the function returned an undefined tensor");
  if (y.numel() != 1) fail(op, "the function must return one element, got shape {}", shape_str(y.shape()));
  if (!y.requires_grad())
    fail(op, "the function's result does not depend on the parameters (it has no graph: was it computed from "
         "detached tensors or under NoGradGuard?)");
  loss_ = y.item<double>() ;
  gradient_ = grad({y}, params_, {.create_graph = true, .allow_unused = true});
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!gradient_[i].defined()) gradient_[i] = zeros(params_[i].shape(), params_[i].dtype());
    if (gradient_[i].requires_grad()) differentiable_.push_back(i);
  }
}

std::int64_t HessianVectorProduct::size() const {
  std::int64_t n = 0;
  for (const auto& p : params_) n += p.numel();
  return n;
}

TensorList HessianVectorProduct::operator()(const TensorList& v) const {
  check_matching("HessianVectorProduct", params_, v);
  TensorList outs, seeds;
  for (auto i : differentiable_) {
    outs.push_back(gradient_[i]);
    seeds.push_back(v[i].dtype() == params_[i].dtype() ? v[i].detach() : v[i].detach().to(params_[i].dtype()));
  }
  if (outs.empty()) return zeros_list(params_);
  TensorList hv = grad(outs, params_, {.grad_outputs = seeds, .retain_graph = true, .allow_unused = true});
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (!hv[i].defined()) hv[i] = zeros(params_[i].shape(), params_[i].dtype());
    else hv[i] = hv[i].detach();
  return hv;
}

HessianEigenResult top_eigenvalues(const std::function<TensorList(const TensorList&)>& hv, const TensorList& like,
                                   int k, const HessianEigenOptions& options) {
  constexpr std::string_view op = "top_eigenvalues";
  if (!hv) fail(op, "no product function given");
  if (like.empty()) fail(op, "no tensors to shape the vectors by");
  for (std::size_t i = 0; i < like.size(); ++i) check_float(op, "like", i, like[i]);
  std::int64_t n = 0;
  for (const auto& t : like) n += t.numel();
  if (k < 1 || k > n) fail(op, "k = {} must be between 1 and the vectors' {} elements", k, n);
  if (options.max_iterations < 1 || !(options.tolerance > 0))
    fail(op, "wants max_iterations >= 1 and tolerance > 0, got {} and {}", options.max_iterations, options.tolerance);
  if (!options.start.empty()) check_matching(op, like, options.start);

  NoGradGuard no_grad;
  Generator gen(options.seed);
  HessianEigenResult r;
  // v minus its components along the eigenvectors found so far.
  auto orthogonalize = [&](TensorList& v) {
    for (const auto& u : r.eigenvectors) axpy(-dot(u, v), u, v);
  };
  // H'·v = H·v − Σ λ_i (u_iᵀv) u_i
  auto deflated = [&](const TensorList& v) {
    TensorList w = hv(v);
    check_matching(op, like, w);
    for (auto& t : w) t = t.clone();  // owned: axpy writes into it
    for (std::size_t i = 0; i < r.eigenvectors.size(); ++i)
      axpy(-r.eigenvalues[i] * dot(r.eigenvectors[i], v), r.eigenvectors[i], w);
    return w;
  };

  for (int j = 0; j < k; ++j) {
    TensorList v;
    if (j == 0 && !options.start.empty()) {
      for (std::size_t i = 0; i < like.size(); ++i) v.push_back(options.start[i].detach().to(like[i].dtype()).clone());
    } else {
      v = random_list(like, gen);
    }
    orthogonalize(v);
    double nv = norm(v);
    if (!(nv > 0) || !std::isfinite(nv)) fail(op, "start vector {} is zero or not finite (norm {})", j, nv);
    v = divided(v, nv);
    double lambda = 0, residual = 0;
    int it = 0;
    bool converged = false;
    std::vector<double> history;
    for (; it < options.max_iterations;) {
      TensorList w = deflated(v);
      ++it;
      // Projected off the eigenvectors found (a no-op for the first eigenvalue): what is left of
      // their directions in H'v is their own error, which the iteration cannot reduce.
      orthogonalize(w);
      const double nw = norm(w);
      if (!std::isfinite(nw)) fail(op, "H·v is not finite at iteration {} of eigenvalue {}", it, j);
      if (nw == 0) {  // H'v = 0: v is an eigenvector of the eigenvalue 0
        lambda = residual = 0;
        history.push_back(0);
        converged = true;
        break;
      }
      lambda = dot(v, w);
      residual = residual_norm(w, lambda, v) / std::abs(lambda);
      history.push_back(lambda);
      if (residual <= options.tolerance) {
        converged = true;
        break;
      }
      v = divided(w, nw);
    }
    r.eigenvalues.push_back(lambda);
    r.eigenvectors.push_back(v);
    r.residuals.push_back(residual);
    r.iterations.push_back(it);
    r.converged.push_back(converged);
    r.history.push_back(std::move(history));
  }
  return r;
}

HessianEigenResult top_hessian_eigenvalues(const GradcheckFn& fn, const TensorList& params, int k,
                                           const HessianEigenOptions& options) {
  const HessianVectorProduct H(fn, params);
  if (!std::isfinite(H.loss()))
    fail("top_hessian_eigenvalues", "the loss is {} at these parameters: its curvature there is not defined", H.loss());
  return top_eigenvalues([&H](const TensorList& v) { return H(v); }, params, k, options);
}

}  // namespace autograd
