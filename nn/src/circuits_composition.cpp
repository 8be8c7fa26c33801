// Composition scores between attention heads (Elhage et al. 2021, TL's utils.composition_scores and
// HookedTransformer.all_composition_scores) and their random baseline.
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <autograd/autograd.hpp>

#include "nn/circuits.hpp"

namespace nn::circuits {

namespace {

void check_mode(const char* op, Composition mode) {
  if (mode != Composition::Q && mode != Composition::K && mode != Composition::V)
    ag::fail(op, "unknown composition mode {} (Q, K or V)", static_cast<int>(mode));
}

// ‖left·right‖ / (‖left‖ ‖right‖) over broadcast leading dims, from the factors:
// left·right = A1 · C with C = B1·A2·B2 (r1 x p), and ‖A1·C‖ is a FactoredMatrix norm. Computed in
// float64 whatever the factors' dtype (the norms of small float32 weights underflow) and returned
// in it. A circuit of norm 0 (or not finite) has no score: refused, naming `op`.
ag::Tensor score_of(const FactoredMatrix& left, const FactoredMatrix& right, const char* op) {
  if (left.dtype() != right.dtype())
    ag::fail(op, "the circuits have different dtypes: {} and {}", ag::dtype_name(left.dtype()),
             ag::dtype_name(right.dtype()));
  (void)ag::broadcast_shapes(op, left.leading_shape(), right.leading_shape());
  const ag::Dtype f64 = ag::Dtype::Float64;
  const FactoredMatrix l(left.A().to(f64), left.B().to(f64)), r(right.A().to(f64), right.B().to(f64));
  const ag::Tensor ln = l.norm(), rn = r.norm();
  for (const auto& [side, n] : {std::pair{"left", ln}, std::pair{"right", rn}})
    for (double v : n.detach().to_vector())
      if (!(v > 0.0) || !std::isfinite(v))
        ag::fail(op, "the {} circuit {} has norm {}: a composition score needs nonzero finite circuits", side,
                 ag::shape_str(side == std::string("left") ? left.shape() : right.shape()), v);
  const ag::Tensor C = ag::matmul(ag::matmul(l.B(), r.A()), r.B());
  const ag::Tensor product = FactoredMatrix(l.A(), C).norm();
  return (product / (ln * rn)).to(left.dtype());
}

FactoredMatrix right_circuit(const MultiHeadAttention& later, Composition mode) {
  check_mode("circuits::composition_scores", mode);
  if (mode == Composition::Q) return qk_circuit(later);
  if (mode == Composition::K) return qk_circuit(later).T();
  return ov_circuit(later);
}

FactoredMatrix random_like(const FactoredMatrix& f, ag::Generator& gen) {
  const ag::Dtype dt = ag::Dtype::Float64;
  return FactoredMatrix(ag::randn({f.ldim(), f.mdim()}, dt, gen), ag::randn({f.mdim(), f.rdim()}, dt, gen));
}

}  // namespace

std::string composition_name(Composition c) {
  switch (c) {
    case Composition::Q: return "Q";
    case Composition::K: return "K";
    case Composition::V: return "V";
  }
  return "?";
}

ag::Tensor composition_scores(const FactoredMatrix& left, const FactoredMatrix& right, bool broadcast_dims) {
  if (left.rdim() != right.ldim())
    ag::fail("circuits::composition_scores", "needs left's columns to equal right's rows, got left {} and right {}",
             ag::shape_str(left.shape()), ag::shape_str(right.shape()));
  constexpr const char* op = "circuits::composition_scores";
  if (!broadcast_dims) return score_of(left, right, op);
  // left (a..., m, n) -> (a..., 1..., m, n); right (b..., n, p) -> (1..., b..., n, p)
  const std::int64_t l_lead = left.ndim() - 2, r_lead = right.ndim() - 2;
  FactoredMatrix l = left, r = right;
  for (std::int64_t i = 0; i < l_lead; ++i) r = r.unsqueeze(0);
  for (std::int64_t i = 0; i < r_lead; ++i) l = l.unsqueeze(l_lead + i);
  return score_of(l, r, op);
}

ag::Tensor composition_score(const ag::Tensor& W_A, const ag::Tensor& W_B) {
  constexpr const char* op = "circuits::composition_score";
  if (!W_A.defined() || !W_B.defined() || W_A.dim() != 2 || W_B.dim() != 2 || W_A.size(1) != W_B.size(0))
    ag::fail(op, "needs matrices W_A (m x n) and W_B (n x p), got {} and {}",
             W_A.defined() ? ag::shape_str(W_A.shape()) : std::string("an undefined tensor"),
             W_B.defined() ? ag::shape_str(W_B.shape()) : std::string("an undefined tensor"));
  if (!ag::is_floating(W_A.dtype()) || !ag::is_floating(W_B.dtype()))
    ag::fail(op, "needs Float32 or Float64 matrices, got {} and {}", ag::dtype_name(W_A.dtype()),
             ag::dtype_name(W_B.dtype()));
  if (W_A.dtype() != W_B.dtype())
    ag::fail(op, "the matrices have different dtypes: {} and {}", ag::dtype_name(W_A.dtype()),
             ag::dtype_name(W_B.dtype()));
  const ag::Tensor a = W_A.to(ag::Dtype::Float64), b = W_B.to(ag::Dtype::Float64);
  auto fro = [](const ag::Tensor& M) { return ag::sqrt(ag::sum(M * M)); };
  const ag::Tensor na = fro(a), nb = fro(b);
  for (const auto& [name, n] : {std::pair{"W_A", na}, std::pair{"W_B", nb}})
    if (const double v = n.detach().item(); !(v > 0.0) || !std::isfinite(v))
      ag::fail(op, "{} has norm {}: a composition score needs nonzero finite matrices", name, v);
  return (fro(ag::matmul(a, b)) / (na * nb)).to(W_A.dtype());
}

ag::Tensor composition_scores(const MultiHeadAttention& earlier, const MultiHeadAttention& later, Composition mode) {
  const FactoredMatrix left = ov_circuit(earlier);  // (H_e, vdim, E)
  const FactoredMatrix right = right_circuit(later, mode);
  if (left.rdim() != right.ldim())
    ag::fail("circuits::composition_scores",
             "the earlier layer writes {} wide (OV {}) but the later layer's {} circuit reads {} wide ({})",
             left.rdim(), ag::shape_str(left.shape()), composition_name(mode), right.ldim(),
             ag::shape_str(right.shape()));
  return composition_scores(left, right);  // (H_e, H_l)
}

ag::Tensor all_composition_scores(const std::vector<const MultiHeadAttention*>& layers, Composition mode) {
  check_mode("circuits::all_composition_scores", mode);
  for (std::size_t i = 0; i < layers.size(); ++i)
    for (std::size_t j = i + 1; j < layers.size(); ++j)
      if (layers[i] != nullptr && layers[i] == layers[j])
        ag::fail("circuits::all_composition_scores", "layers {} and {} are the same module", i, j);
  const FactoredMatrix ov = ov_circuit(layers);  // (L, H, E, E); checks the layers share one layout
  const FactoredMatrix qk = qk_circuit(layers);
  const FactoredMatrix right = mode == Composition::Q ? qk : mode == Composition::K ? qk.T() : ov;
  if (ov.rdim() != right.ldim())
    ag::fail("circuits::all_composition_scores", "the layers write {} wide but their {} circuits read {} wide",
             ov.rdim(), composition_name(mode), right.ldim());
  const ag::Tensor scores = composition_scores(ov, right);  // (L, H, L, H)
  const std::int64_t L = static_cast<std::int64_t>(layers.size()), H = layers.front()->num_heads();
  std::vector<double> mask(static_cast<std::size_t>(L * H * L * H), 0.0);
  for (std::int64_t l1 = 0; l1 < L; ++l1)
    for (std::int64_t h1 = 0; h1 < H; ++h1)
      for (std::int64_t l2 = l1 + 1; l2 < L; ++l2)
        for (std::int64_t h2 = 0; h2 < H; ++h2) mask[static_cast<std::size_t>(((l1 * H + h1) * L + l2) * H + h2)] = 1.0;
  return ag::where(ag::tensor(mask, {L, H, L, H}, scores.dtype()), scores, ag::zeros_like(scores));
}

CompositionBaseline random_composition_baseline(const FactoredMatrix& left, const FactoredMatrix& right,
                                                ag::Generator& gen, int samples) {
  constexpr const char* op = "circuits::random_composition_baseline";
  if (samples < 2) ag::fail(op, "needs at least 2 samples (its std is over samples), got {}", samples);
  if (left.rdim() != right.ldim())
    ag::fail(op, "needs left's columns to equal right's rows, got left {} and right {}", ag::shape_str(left.shape()),
             ag::shape_str(right.shape()));
  ag::NoGradGuard no_grad;
  std::vector<double> xs;
  xs.reserve(static_cast<std::size_t>(samples));
  for (int s = 0; s < samples; ++s) {
    const FactoredMatrix l = random_like(left, gen);
    const FactoredMatrix r = random_like(right, gen);
    xs.push_back(score_of(l, r, op).item());
  }
  CompositionBaseline b;
  b.samples = samples;
  for (double x : xs) b.mean += x;
  b.mean /= samples;
  double ss = 0;
  for (double x : xs) ss += (x - b.mean) * (x - b.mean);
  b.std = std::sqrt(ss / (samples - 1));
  return b;
}

CompositionBaseline random_composition_baseline(const MultiHeadAttention& earlier, const MultiHeadAttention& later,
                                                Composition mode, ag::Generator& gen, int samples) {
  check_mode("circuits::random_composition_baseline", mode);
  return random_composition_baseline(ov_circuit(earlier, 0), mode == Composition::V   ? ov_circuit(later, 0)
                                                             : mode == Composition::Q ? qk_circuit(later, 0)
                                                                                      : qk_circuit(later, 0).T(),
                                     gen, samples);
}

}  // namespace nn::circuits
