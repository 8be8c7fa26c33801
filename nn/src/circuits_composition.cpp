// Composition scores between attention heads (Elhage et al. 2021, TL's utils.composition_scores and
// HookedTransformer.all_composition_scores) and their random baseline.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "nn/circuits.hpp"

namespace nn::circuits {

namespace {

// ‖left·right‖ / (‖left‖ ‖right‖) over broadcast leading dims, from the factors:
// left·right = A1 · C with C = B1·A2·B2 (r1 x p), and ‖A1·C‖ is a FactoredMatrix norm.
ag::Tensor score_of(const FactoredMatrix& left, const FactoredMatrix& right) {
  const ag::Tensor C = ag::matmul(ag::matmul(left.B(), right.A()), right.B());
  const ag::Tensor product = FactoredMatrix(left.A(), C).norm();
  return product / (left.norm() * right.norm());
}

FactoredMatrix right_circuit(const MultiHeadAttention& later, Composition mode) {
  switch (mode) {
    case Composition::Q: return qk_circuit(later);
    case Composition::K: return qk_circuit(later).T();
    case Composition::V: return ov_circuit(later);
  }
  ag::fail("circuits::composition_scores", "unknown composition mode {}", static_cast<int>(mode));
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
  if (!broadcast_dims) return score_of(left, right);
  // left (a..., m, n) -> (a..., 1..., m, n); right (b..., n, p) -> (1..., b..., n, p)
  const std::int64_t l_lead = left.ndim() - 2, r_lead = right.ndim() - 2;
  FactoredMatrix l = left, r = right;
  for (std::int64_t i = 0; i < l_lead; ++i) r = r.unsqueeze(0);
  for (std::int64_t i = 0; i < r_lead; ++i) l = l.unsqueeze(l_lead + i);
  return score_of(l, r);
}

ag::Tensor composition_score(const ag::Tensor& W_A, const ag::Tensor& W_B) {
  constexpr const char* op = "circuits::composition_score";
  if (!W_A.defined() || !W_B.defined() || W_A.dim() != 2 || W_B.dim() != 2 || W_A.size(1) != W_B.size(0))
    ag::fail(op, "needs matrices W_A (m x n) and W_B (n x p), got {} and {}",
             W_A.defined() ? ag::shape_str(W_A.shape()) : std::string("an undefined tensor"),
             W_B.defined() ? ag::shape_str(W_B.shape()) : std::string("an undefined tensor"));
  auto fro = [](const ag::Tensor& M) { return ag::sqrt(ag::sum(M * M)); };
  return fro(ag::matmul(W_A, W_B)) / (fro(W_A) * fro(W_B));
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
  if (samples < 1) ag::fail(op, "needs at least one sample, got {}", samples);
  if (left.rdim() != right.ldim())
    ag::fail(op, "needs left's columns to equal right's rows, got left {} and right {}", ag::shape_str(left.shape()),
             ag::shape_str(right.shape()));
  ag::NoGradGuard no_grad;
  std::vector<double> xs;
  xs.reserve(static_cast<std::size_t>(samples));
  for (int s = 0; s < samples; ++s) {
    const FactoredMatrix l = random_like(left, gen);
    const FactoredMatrix r = random_like(right, gen);
    xs.push_back(score_of(l, r).item());
  }
  CompositionBaseline b;
  b.samples = samples;
  for (double x : xs) b.mean += x;
  b.mean /= samples;
  if (samples > 1) {
    double ss = 0;
    for (double x : xs) ss += (x - b.mean) * (x - b.mean);
    b.std = std::sqrt(ss / (samples - 1));
  }
  return b;
}

CompositionBaseline random_composition_baseline(const MultiHeadAttention& earlier, const MultiHeadAttention& later,
                                                Composition mode, ag::Generator& gen, int samples) {
  return random_composition_baseline(ov_circuit(earlier, 0), mode == Composition::V   ? ov_circuit(later, 0)
                                                             : mode == Composition::Q ? qk_circuit(later, 0)
                                                                                      : qk_circuit(later, 0).T(),
                                     gen, samples);
}

}  // namespace nn::circuits
