#include "report_study.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <nn/nn.hpp>

namespace heads {

namespace {

const nn::CrossEntropyOptions kLoss{.ignore_index = kIgnore};

// The model in eval mode for the life of the guard, then back in the mode it was in.
class EvalMode {
 public:
  explicit EvalMode(HeadsModel& model) : model_(model), was_training_(model.is_training()) { model.eval(); }
  ~EvalMode() { model_.train(was_training_); }
  EvalMode(const EvalMode&) = delete;
  EvalMode& operator=(const EvalMode&) = delete;

 private:
  HeadsModel& model_;
  bool was_training_;
};

// The mean over the batch of a (B, H, T, T) tensor, as (H, T, T) row-major values.
std::vector<double> batch_mean_values(const ag::Tensor& t) {
  return ag::mean(t.detach(), {0}).to_vector();
}

// The attention layer's z point, with a hook on it for the life of the guard.
class HookOnZ {
 public:
  HookOnZ(HeadsModel& model, nn::ForwardHook hook) : handle_(model.add_hook(model.attention_point("z"), std::move(hook))) {}
  ~HookOnZ() { handle_.remove(); }
  HookOnZ(const HookOnZ&) = delete;
  HookOnZ& operator=(const HookOnZ&) = delete;

 private:
  nn::HookHandle handle_;
};

double accuracy_with(HeadsModel& model, const Batch& test, nn::ForwardHook hook) {
  HookOnZ on_z(model, std::move(hook));
  return batch_accuracy(model.forward(test.token_tensor), test.targets);
}

// The first n sequences of `test`, and a copy with x_0 replaced by (x_0 + V/2) mod V, which
// changes the target of every position t >= 2.
struct CleanAndCorrupted {
  ag::Tensor clean, corrupted;
  std::vector<std::int64_t> targets;  // the clean sequences' targets
};

CleanAndCorrupted corrupt_first_token(const Task& task, const Batch& test, std::int64_t n) {
  n = std::min(n, test.size);
  const std::int64_t T = task.seq_len;
  std::vector<double> clean(test.tokens.begin(), test.tokens.begin() + n * T), corrupted = clean;
  for (std::int64_t s = 0; s < n; ++s)
    corrupted[static_cast<std::size_t>(s * T)] =
        static_cast<double>((test.tokens[static_cast<std::size_t>(s * T)] + task.vocab / 2) % task.vocab);
  return {ag::tensor(clean, {n, T}), ag::tensor(corrupted, {n, T}),
          {test.targets.begin(), test.targets.begin() + n * T}};
}

}  // namespace

Snapshot take_snapshot(HeadsModel& model, const Batch& test, std::int64_t step) {
  ag::NoGradGuard no_grad;
  EvalMode eval(model);
  const auto out = model.forward_with_weights(test.token_tensor);
  return {.step = step,
          .accuracy = batch_accuracy(out.logits, test.targets),
          .loss = nn::cross_entropy(out.logits, test.targets, kLoss).item(),
          .mean_weights = batch_mean_values(out.weights)};
}

std::vector<double> attention_gradient(HeadsModel& model, const Batch& test) {
  EvalMode eval(model);
  const std::string pattern = model.attention_point("pattern");
  nn::CacheOptions options;
  options.names = {pattern};
  options.backward = true;
  const nn::ActivationCache cache = nn::run_with_cache(
      model, [&] { return nn::cross_entropy(model.forward(test.token_tensor), test.targets, kLoss); },
      options);
  model.zero_grad(true);  // the parameters' gradients from that backward are not wanted
  // The loss is the mean over the B sequences' own losses, so the sum over the batch of its
  // gradient is the mean over sequences of the gradient of each sequence's own loss.
  return ag::sum(cache.grad(pattern), {0}).to_vector();
}

std::vector<HeadAblation> ablate_heads(HeadsModel& model, const Batch& test) {
  ag::NoGradGuard no_grad;
  EvalMode eval(model);
  const std::string z = model.attention_point("z");
  nn::CacheOptions options;
  options.names = {z};
  const nn::ActivationCache cache =
      nn::run_with_cache(model, [&] { return model.forward(test.token_tensor); }, options);
  const ag::Tensor mean_z = nn::study::batch_mean(cache[z]);
  std::vector<HeadAblation> out;
  for (std::int64_t h = 0; h < mean_z.size(0); ++h)
    out.push_back({.zero = accuracy_with(model, test, nn::study::zero_ablate_head(h)),
                   .mean = accuracy_with(model, test, nn::study::mean_ablate_head(h, mean_z))});
  return out;
}

PatchingRecord patch_heads(HeadsModel& model, const Task& task, const Batch& test, std::int64_t sequences) {
  EvalMode eval(model);
  const CleanAndCorrupted in = corrupt_first_token(task, test, sequences);
  const auto metric = [&](const ag::Tensor& input) {  // the mean log-probability of the clean targets
    return ag::neg(nn::cross_entropy(model.forward(input), in.targets, kLoss));
  };
  const nn::study::AttributionPatchingResult a =
      nn::study::attribution_patching(model, model.attention_point("z"), metric, in.clean, in.corrupted);
  PatchingRecord p{.corruption = fmt::format("x_0 replaced by (x_0 + {}) mod {}", task.vocab / 2, task.vocab),
                   .clean_metric = a.actual.clean_metric,
                   .corrupted_metric = a.actual.corrupted_metric,
                   .per_head = a.actual.per_head,
                   .estimate_per_head = a.estimate_per_head,
                   .per_head_position = a.actual.per_head_position,
                   .estimate_per_head_position = a.estimate_per_head_position,
                   .max_abs_error = a.max_abs_error};
  for (auto& v : p.per_head) v -= p.corrupted_metric;  // as changes, like the estimate
  for (auto& row : p.per_head_position)
    for (auto& v : row) v -= p.corrupted_metric;
  return p;
}

}  // namespace heads
