#include "report_study.hpp"

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

}  // namespace

Snapshot take_snapshot(HeadsModel& model, const Batch& test, std::int64_t step) {
  ag::NoGradGuard no_grad;
  EvalMode eval(model);
  const auto out = model.forward(test.token_tensor, true);
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
      model, [&] { return nn::cross_entropy(model.forward(test.token_tensor, false).logits, test.targets, kLoss); },
      options);
  model.zero_grad(true);  // the parameters' gradients from that backward are not wanted
  // The loss is the mean over the B sequences' own losses, so the sum over the batch of its
  // gradient is the mean over sequences of the gradient of each sequence's own loss.
  return ag::sum(cache.grad(pattern), {0}).to_vector();
}

}  // namespace heads
