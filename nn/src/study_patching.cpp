// nn::study's activation patching and attribution patching between a clean and a corrupted input.
#include <cmath>

#include <fmt/format.h>

#include "nn/module.hpp"
#include "nn/study.hpp"

namespace nn::study {

namespace {

using RunFn = std::function<ag::Tensor(const ag::Tensor&)>;

// The one finite number run returned; `what` names the run (e.g. "the clean run").
double metric_value(std::string_view op, const std::string& what, const ag::Tensor& m) {
  if (!m.defined() || m.numel() != 1)
    ag::fail(op, "run must return a one-element metric, got {} from {}",
             m.defined() ? ag::shape_str(m.shape()) : std::string("an undefined tensor"), what);
  const double v = m.item();
  if (!std::isfinite(v)) ag::fail(op, "the metric of {} is not finite: {}", what, v);
  return v;
}

// The metric of run(input) with `hook` at z_point; the hook is removed afterwards, also on a throw.
double patched_metric(Module& model, const std::string& z_point, ForwardHook hook, const RunFn& run,
                      const ag::Tensor& input, const std::string& what) {
  struct Remove {
    HookHandle h;
    ~Remove() { h.remove(); }
  } handle{model.add_hook(z_point, std::move(hook))};
  return metric_value("activation_patching", what, run(input));
}

// The z point's value on the clean input, and the clean metric.
ActivationCache clean_run(std::string_view op, Module& model, const std::string& z_point, const RunFn& run,
                          const ag::Tensor& input) {
  ag::NoGradGuard no_grad;
  ActivationCache cache = run_with_cache(model, [&] { return run(input); }, {.names = {z_point}});
  metric_value(op, "the clean run", cache.output);
  if (!cache.contains(z_point))
    ag::fail(op, "the clean run never reached {}: run does not pass through it", quote_name(z_point));
  return cache;
}

// The corrupted run's z has the clean run's shape (a patch copies one into the other).
void check_same_shape(std::string_view op, const std::string& z_point, const ag::Tensor& clean,
                      const ag::Tensor& corrupted) {
  if (!corrupted.defined())
    ag::fail(op, "the corrupted run never reached {}: run does not pass through it", quote_name(z_point));
  if (clean.shape() != corrupted.shape())
    ag::fail(op, "{} holds shape {} on the clean input and {} on the corrupted one; equal (B, H, T, d_k) shapes are "
             "needed (clean and corrupted inputs of the same shape)", quote_name(z_point),
             ag::shape_str(clean.shape()), ag::shape_str(corrupted.shape()));
}

// Attribution patching differentiates the metric: it must be a floating one-element tensor.
void check_floating_metric(std::string_view op, const std::string& what, const ag::Tensor& m) {
  if (!ag::is_floating(m.dtype()))
    ag::fail(op, "the metric of {} is {} {}: attribution patching differentiates the metric, so run must return a "
             "floating (Float32 or Float64) one-element tensor", what, ag::dtype_name(m.dtype()),
             ag::shape_str(m.shape()));
}

}  // namespace

PatchingResult activation_patching(Module& model, const std::string& z_point, const RunFn& run,
                                   const ag::Tensor& clean_input, const ag::Tensor& corrupted_input) {
  if (!run) ag::fail("activation_patching", "run is empty");
  ag::NoGradGuard no_grad;
  const ActivationCache clean = clean_run("activation_patching", model, z_point, run, clean_input);
  const ag::Tensor& z = clean[z_point];
  if (z.dim() != 4)
    ag::fail("activation_patching", "{} holds shape {}; a z point (B, H, T, d_k) is needed", quote_name(z_point),
             ag::shape_str(z.shape()));
  PatchingResult r;
  r.clean_metric = clean.output.item();
  // Through an identity hook at the point: the same (composed) core as the patched runs, so
  // that a patch that changes nothing gives the corrupted metric exactly.
  ag::Tensor corrupted_z;  // its shape is checked before any patch
  const auto note = [&corrupted_z](const ag::Tensor& v, const std::string&) {
    if (!corrupted_z.defined()) corrupted_z = v.detach();
    return ag::Tensor();
  };
  r.corrupted_metric = patched_metric(model, z_point, note, run, corrupted_input, "the corrupted run");
  check_same_shape("activation_patching", z_point, z, corrupted_z);
  // The same run again must give the same metric, or the differences below would be noise.
  const double again = patched_metric(model, z_point, note, run, corrupted_input, "the corrupted run");
  if (again != r.corrupted_metric)
    ag::fail("activation_patching", "two runs of the corrupted input gave different metrics ({} and {}): run is not "
             "deterministic (dropout in training mode? call model.eval() first)", r.corrupted_metric, again);
  const std::int64_t H = z.size(1), T = z.size(2);
  r.per_head_position.assign(static_cast<std::size_t>(H), std::vector<double>(static_cast<std::size_t>(T)));
  for (std::int64_t h = 0; h < H; ++h) {
    r.per_head.push_back(patched_metric(model, z_point, patch_head(h, z), run, corrupted_input,
                                        fmt::format("the corrupted run with head {} patched", h)));
    for (std::int64_t t = 0; t < T; ++t)
      r.per_head_position[static_cast<std::size_t>(h)][static_cast<std::size_t>(t)] =
          patched_metric(model, z_point, patch_head(h, z, t), run, corrupted_input,
                         fmt::format("the corrupted run with head {} patched at position {}", h, t));
  }
  return r;
}

AttributionPatchingResult attribution_patching(Module& model, const std::string& z_point, const RunFn& run,
                                               const ag::Tensor& clean_input, const ag::Tensor& corrupted_input) {
  constexpr std::string_view op = "attribution_patching";
  if (!run) ag::fail(op, "run is empty");
  const ActivationCache clean = clean_run(op, model, z_point, run, clean_input);
  check_floating_metric(op, "the clean run", clean.output);
  // The corrupted run, with z replaced by a leaf of its own (the same values) that requires grad:
  // ag::grad takes the metric's gradient with respect to that leaf alone and writes no .grad, so
  // every tensor's .grad (the parameters', the inputs', anything run uses) stays as it was.
  ag::Tensor zx, z_leaf, metric;
  {
    ag::EnableGradGuard grad_on;
    struct Remove {
      HookHandle h;
      ~Remove() { h.remove(); }
    } handle{model.add_hook(z_point, [&zx, &z_leaf, op](const ag::Tensor& v, const std::string& name) {
      if (z_leaf.defined())
        ag::fail(op, "hook point {} was reached twice in one run (a module called twice?)", quote_name(name));
      zx = v.detach().clone();
      z_leaf = v.detach().clone().requires_grad_();
      return z_leaf;
    })};
    metric = run(corrupted_input);
  }
  const ag::Tensor& zc = clean[z_point];
  check_same_shape(op, z_point, zc, zx);
  if (zc.dim() != 4)
    ag::fail(op, "{} holds shape {}; a z point (B, H, T, d_k) is needed", quote_name(z_point), ag::shape_str(zc.shape()));
  metric_value(op, "the corrupted run", metric);
  check_floating_metric(op, "the corrupted run", metric);
  if (!metric.requires_grad())
    ag::fail(op, "the metric of the corrupted run does not require grad although z does: run computed it outside the "
             "graph (under NoGradGuard, or from detached values)");
  const ag::TensorList grads = ag::grad({metric}, {z_leaf}, {.allow_unused = true});
  const auto diff = (zc - zx).to_vector();
  // No gradient reached z: the metric does not depend on it, so its derivative there is 0.
  const auto grad = grads[0].defined() ? grads[0].to_vector() : std::vector<double>(diff.size(), 0.0);
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
