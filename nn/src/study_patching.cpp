// nn::study's activation patching and attribution patching between a clean and a corrupted input.
#include <cmath>

#include "nn/module.hpp"
#include "nn/study.hpp"

namespace nn::study {

namespace {

using RunFn = std::function<ag::Tensor(const ag::Tensor&)>;

double metric_value(std::string_view op, const ag::Tensor& m) {
  if (!m.defined() || m.numel() != 1)
    ag::fail(op, "run must return a one-element metric, got {}",
             m.defined() ? ag::shape_str(m.shape()) : std::string("an undefined tensor"));
  return m.item();
}

// The metric of run(input) with `hook` at z_point; the hook is removed afterwards, also on a throw.
double patched_metric(Module& model, const std::string& z_point, ForwardHook hook, const RunFn& run,
                      const ag::Tensor& input) {
  struct Remove {
    HookHandle h;
    ~Remove() { h.remove(); }
  } handle{model.add_hook(z_point, std::move(hook))};
  return metric_value("activation_patching", run(input));
}

// The z point's value on the clean input, and the clean metric.
ActivationCache clean_run(Module& model, const std::string& z_point, const RunFn& run, const ag::Tensor& input) {
  ag::NoGradGuard no_grad;
  ActivationCache cache = run_with_cache(model, [&] { return run(input); }, {.names = {z_point}});
  metric_value("activation_patching", cache.output);
  return cache;
}

// Sets the parameters' gradients aside and puts them back when it ends.
struct KeepGrads {
  std::vector<ag::Tensor> params, grads;
  explicit KeepGrads(const Module& m) : params(m.parameters()) {
    for (auto& p : params) {
      grads.push_back(p.grad());
      p.set_grad(ag::Tensor());
    }
  }
  ~KeepGrads() {
    for (std::size_t i = 0; i < params.size(); ++i) params[i].set_grad(grads[i]);
  }
};

}  // namespace

PatchingResult activation_patching(Module& model, const std::string& z_point, const RunFn& run,
                                   const ag::Tensor& clean_input, const ag::Tensor& corrupted_input) {
  if (!run) ag::fail("activation_patching", "run is empty");
  ag::NoGradGuard no_grad;
  const ActivationCache clean = clean_run(model, z_point, run, clean_input);
  const ag::Tensor& z = clean[z_point];
  if (z.dim() != 4)
    ag::fail("activation_patching", "{} holds shape {}; a z point (B, H, T, d_k) is needed", quote_name(z_point),
             ag::shape_str(z.shape()));
  PatchingResult r;
  r.clean_metric = clean.output.item();
  // Through an identity hook at the point: the same (composed) core as the patched runs, so
  // that a patch that changes nothing gives the corrupted metric exactly.
  r.corrupted_metric = patched_metric(model, z_point, [](const ag::Tensor&, const std::string&) { return ag::Tensor(); },
                                      run, corrupted_input);
  const std::int64_t H = z.size(1), T = z.size(2);
  r.per_head_position.assign(static_cast<std::size_t>(H), std::vector<double>(static_cast<std::size_t>(T)));
  for (std::int64_t h = 0; h < H; ++h) {
    r.per_head.push_back(patched_metric(model, z_point, patch_head(h, z), run, corrupted_input));
    for (std::int64_t t = 0; t < T; ++t)
      r.per_head_position[static_cast<std::size_t>(h)][static_cast<std::size_t>(t)] =
          patched_metric(model, z_point, patch_head(h, z, t), run, corrupted_input);
  }
  return r;
}

AttributionPatchingResult attribution_patching(Module& model, const std::string& z_point, const RunFn& run,
                                               const ag::Tensor& clean_input, const ag::Tensor& corrupted_input) {
  if (!run) ag::fail("attribution_patching", "run is empty");
  const KeepGrads keep(model);
  const ActivationCache clean = clean_run(model, z_point, run, clean_input);
  ActivationCache corrupted;
  {
    ag::EnableGradGuard grad_on;
    corrupted = run_with_cache(model, [&] { return run(corrupted_input); }, {.names = {z_point}, .backward = true});
  }
  const ag::Tensor& zc = clean[z_point];
  const ag::Tensor& zx = corrupted[z_point];
  if (zc.shape() != zx.shape() || zc.dim() != 4)
    ag::fail("attribution_patching", "{} holds shape {} on the clean input and {} on the corrupted one; equal "
             "(B, H, T, d_k) shapes are needed", quote_name(z_point), ag::shape_str(zc.shape()),
             ag::shape_str(zx.shape()));
  const auto diff = (zc - zx).to_vector();
  const auto grad = corrupted.grad(z_point).to_vector();
  const std::int64_t B = zc.size(0), H = zc.size(1), T = zc.size(2), D = zc.size(3);
  AttributionPatchingResult r;
  r.estimate_per_head.assign(static_cast<std::size_t>(H), 0.0);
  r.estimate_per_head_position.assign(static_cast<std::size_t>(H), std::vector<double>(static_cast<std::size_t>(T)));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t t = 0; t < T; ++t)
        for (std::int64_t d = 0; d < D; ++d) {
          const auto i = static_cast<std::size_t>(((b * H + h) * T + t) * D + d);
          r.estimate_per_head[static_cast<std::size_t>(h)] += diff[i] * grad[i];
          r.estimate_per_head_position[static_cast<std::size_t>(h)][static_cast<std::size_t>(t)] += diff[i] * grad[i];
        }
  r.actual = activation_patching(model, z_point, run, clean_input, corrupted_input);
  const double base = r.actual.corrupted_metric;
  for (std::size_t h = 0; h < static_cast<std::size_t>(H); ++h) {
    r.max_abs_error = std::max(r.max_abs_error, std::abs(r.estimate_per_head[h] - (r.actual.per_head[h] - base)));
    for (std::size_t t = 0; t < static_cast<std::size_t>(T); ++t)
      r.max_abs_error = std::max(r.max_abs_error, std::abs(r.estimate_per_head_position[h][t] -
                                                           (r.actual.per_head_position[h][t] - base)));
  }
  return r;
}

}  // namespace nn::study
