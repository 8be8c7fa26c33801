// nn::study's forward hooks on a z point (zero and mean ablation, patching a head), and the
// per-head readings of a cache: attention × gradient, head results and direct logit attribution.
#include <cmath>

#include "nn/module.hpp"
#include "nn/study.hpp"

namespace nn::study {

namespace {

// The value at a z point is (B, H, T, d_k) and head (and position, unless -1) are in range.
void check_z(std::string_view op, const std::string& name, const ag::Tensor& z, std::int64_t head,
             std::int64_t position) {
  if (z.dim() != 4)
    ag::fail(op, "hook point {} holds shape {}; a z point (B, H, T, d_k) is needed, e.g. \"block.attn.z\"",
             quote_name(name), ag::shape_str(z.shape()));
  if (head < 0 || head >= z.size(1))
    ag::fail(op, "head {} is out of range at {}: H = {} (heads 0 .. {})", head, quote_name(name), z.size(1),
             z.size(1) - 1);
  if (position < -1 || position >= z.size(2))
    ag::fail(op, "position {} is out of range at {}: T = {} (positions 0 .. {}, or -1 for all)", position,
             quote_name(name), z.size(2), z.size(2) - 1);
}

// (1, H, T, 1): 1 at head `head` (all positions, or only `position`), 0 elsewhere.
ag::Tensor selection(const ag::Tensor& z, std::int64_t head, std::int64_t position) {
  const std::int64_t H = z.size(1), T = z.size(2);
  std::vector<double> m(static_cast<std::size_t>(H * T), 0.0);
  for (std::int64_t t = 0; t < T; ++t)
    if (position < 0 || t == position) m[static_cast<std::size_t>(head * T + t)] = 1.0;
  return ag::tensor(m, {1, H, T, 1}, z.dtype());
}

// A tensor given to an ablation or patch is defined and finite (a NaN in it would spread silently).
ag::Tensor checked_constant(std::string_view op, std::string_view what, const ag::Tensor& t) {
  if (!t.defined()) ag::fail(op, "{} is undefined", what);
  const ag::Tensor c = t.detach();
  const auto v = c.to_vector();
  for (std::size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i]))
      ag::fail(op, "{} (shape {}) is not finite: element {} is {}", what, ag::shape_str(c.shape()), i, v[i]);
  return c;
}

}  // namespace

ForwardHook zero_ablate_head(std::int64_t head) {
  return [head](const ag::Tensor& z, const std::string& name) {
    check_z("zero_ablate_head", name, z, head, -1);
    return z * (1.0 - selection(z, head, -1));  // head's z times 0, the others' times 1
  };
}

ForwardHook mean_ablate_head(std::int64_t head, const ag::Tensor& mean_z) {
  const ag::Tensor mean = checked_constant("mean_ablate_head", "mean_z", mean_z);
  if (mean.dim() != 3)
    ag::fail("mean_ablate_head", "mean_z of shape {} is not (H, T, d_k): pass batch_mean(z) of a (B, H, T, d_k) z",
             ag::shape_str(mean.shape()));
  return [head, mean](const ag::Tensor& z, const std::string& name) {
    check_z("mean_ablate_head", name, z, head, -1);
    const ag::Shape want{z.size(1), z.size(2), z.size(3)};
    if (mean.shape() != want)
      ag::fail("mean_ablate_head", "mean_z of shape {} does not fit {} of shape {}: (H, T, d_k) = {} is needed",
               ag::shape_str(mean.shape()), quote_name(name), ag::shape_str(z.shape()), ag::shape_str(want));
    const ag::Tensor keep = selection(z, head, -1);
    return z * (1.0 - keep) + ag::unsqueeze(mean.to(z.dtype()), 0) * keep;
  };
}

ag::Tensor batch_mean(const ag::Tensor& z) {
  if (!z.defined() || z.dim() != 4)
    ag::fail("batch_mean", "needs a (B, H, T, d_k) z, got {}", z.defined() ? ag::shape_str(z.shape()) : "undefined");
  ag::NoGradGuard no_grad;
  return ag::mean(z.detach(), 0);  // (H, T, d_k)
}

ForwardHook patch_head(std::int64_t head, const ag::Tensor& source_z, std::int64_t position) {
  const ag::Tensor source = checked_constant("patch_head", "source_z", source_z);
  return [head, source, position](const ag::Tensor& z, const std::string& name) {
    check_z("patch_head", name, z, head, position);
    if (source.shape() != z.shape())
      ag::fail("patch_head", "source_z of shape {} does not fit {} of shape {} (same inputs' shape needed)",
               ag::shape_str(source.shape()), quote_name(name), ag::shape_str(z.shape()));
    const ag::Tensor take = selection(z, head, position);
    return z * (1.0 - take) + source.to(z.dtype()) * take;
  };
}

AttentionGradient attention_times_gradient(const ActivationCache& cache, const std::string& pattern_point) {
  const std::size_t dot = pattern_point.rfind('.');
  if (pattern_point.compare(dot == std::string::npos ? 0 : dot + 1, std::string::npos, "pattern") != 0)
    ag::fail("attention_times_gradient", "{} is not a pattern point: the attention weights are at an attention "
             "layer's \"pattern\" point, e.g. \"block.attn.pattern\"", quote_name(pattern_point));
  const ag::Tensor& A = cache[pattern_point];
  const ag::Tensor& dA = cache.grad(pattern_point);
  if (A.dim() != 4)
    ag::fail("attention_times_gradient", "{} holds shape {}; a pattern point (B, H, T, S') is needed",
             quote_name(pattern_point), ag::shape_str(A.shape()));
  ag::NoGradGuard no_grad;
  AttentionGradient r;
  r.map = ag::mean(A * dA, 0);  // (H, T, S')
  const std::int64_t H = r.map.size(0), per = r.map.size(1) * r.map.size(2);
  const auto m = r.map.to_vector();
  for (std::int64_t h = 0; h < H; ++h) {
    double s = 0;
    for (std::int64_t i = 0; i < per; ++i) s += std::abs(m[static_cast<std::size_t>(h * per + i)]);
    r.per_head.push_back(s);
  }
  return r;
}

ag::Tensor head_results(const MultiHeadAttention& attn, const ag::Tensor& z) {
  const std::int64_t H = attn.num_heads(), d_k = attn.head_dim(), E = attn.embed_dim();
  if (!z.defined()) ag::fail("head_results", "z is undefined: a (B, H, T, d_k) z with H = {}, d_k = {} is needed", H, d_k);
  if (z.dim() != 4 || z.size(1) != H || z.size(3) != d_k)
    ag::fail("head_results", "z of shape {} does not fit the layer: (B, H, T, d_k) with H = {}, d_k = {} is needed",
             ag::shape_str(z.shape()), H, d_k);
  if (z.dtype() != attn.W_O().dtype())
    ag::fail("head_results", "z dtype {} differs from W_O's {}", ag::dtype_name(z.dtype()),
             ag::dtype_name(attn.W_O().dtype()));
  // Rows h·d_k .. (h+1)·d_k - 1 of W_O are head h's: W_O as (1, H, d_k, E).
  const ag::Tensor W = ag::reshape(attn.W_O(), {1, H, d_k, E});
  return ag::matmul(z, W);  // (B, H, T, d_k) · (1, H, d_k, E) = (B, H, T, E)
}

ag::Tensor direct_logit_attribution(const ag::Tensor& head_results, const ag::Tensor& direction) {
  const ag::Tensor& r = head_results;
  if (!direction.defined()) ag::fail("direct_logit_attribution", "direction is undefined");
  if (!r.defined() || r.dim() != 4)
    ag::fail("direct_logit_attribution", "head_results must be (B, H, T, E), got {}",
             r.defined() ? ag::shape_str(r.shape()) : "undefined");
  const std::int64_t B = r.size(0), T = r.size(2), E = r.size(3);
  if (!direction.defined() || (direction.shape() != ag::Shape{E} && direction.shape() != ag::Shape{B, T, E}))
    ag::fail("direct_logit_attribution", "direction of shape {} fits neither (E) = {} nor (B, T, E) = {}",
             ag::shape_str(direction.shape()), ag::shape_str({E}),
             ag::shape_str({B, T, E}));
  const ag::Tensor d = direction.dim() == 1 ? ag::reshape(direction, {1, 1, 1, E}) : ag::reshape(direction, {B, 1, T, E});
  return ag::sum(r * d.to(r.dtype()), -1);  // (B, H, T)
}

}  // namespace nn::study
