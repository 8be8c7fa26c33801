// train_heads' measurements for its report (examples/train_heads/report_study), each against a second route:
// zero ablation of a head against the same model with that head's rows of W_O set to 0, mean
// ablation on identical sequences (no change), dL/dA against study mode, patching against the
// metrics computed directly, per position against per head, and with one head against the whole
// gap between clean and corrupted; and the model left as it was.
#define BOOST_TEST_MODULE report_study
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <nn/nn.hpp>

#include "heads_model.hpp"
#include "heads_task.hpp"
#include "report_study.hpp"

namespace ag = autograd;
using namespace heads;

namespace {

constexpr std::int64_t kHeads = 2;

struct Fixture {
  Task task{.kind = TaskKind::Difference, .vocab = 6, .seq_len = 5};
  ag::Generator init{7}, data{8};
  HeadsModel model{{.vocab = 6, .seq_len = 5, .d_model = 8, .d_ff = 16, .heads = kHeads, .classes = 11, .mlp = true},
                   init};
  Batch test = make_batch(data, task, 40);

  double accuracy() {
    ag::NoGradGuard no_grad;
    return batch_accuracy(model.forward(test.token_tensor), test.targets);
  }
  std::vector<double> logits() {
    ag::NoGradGuard no_grad;
    return model.forward(test.token_tensor).to_vector();
  }
  // W_O's rows of head h (its d_k rows of the concat) set to 0, for the life of the returned copy.
  std::vector<double> zero_head_rows(std::int64_t h) {
    ag::NoGradGuard no_grad;
    ag::Tensor W = model.attention().W_O();
    const std::vector<double> saved = W.to_vector();
    std::vector<double> changed = saved;
    const std::int64_t E = W.size(1), d_k = model.attention().head_dim();
    for (std::int64_t r = h * d_k; r < (h + 1) * d_k; ++r)
      for (std::int64_t c = 0; c < E; ++c) changed[static_cast<std::size_t>(r * E + c)] = 0;
    W.copy_(ag::tensor(changed, W.shape(), W.dtype()));
    return saved;
  }
  void restore_W_O(const std::vector<double>& saved) {
    ag::NoGradGuard no_grad;
    ag::Tensor W = model.attention().W_O();
    W.copy_(ag::tensor(saved, W.shape(), W.dtype()));
  }
};

}  // namespace

// The targets replaced by the model's own predictions: accuracy 1, and an ablation's accuracy is
// the share of predictions it leaves unchanged, which tells the heads apart.
void predictions_as_targets(HeadsModel& model, Batch& test) {
  ag::NoGradGuard no_grad;
  const ag::Tensor logits = model.forward(test.token_tensor);
  const std::int64_t C = logits.size(-1);
  const std::vector<double> v = logits.to_vector();
  for (std::size_t i = 0; i < test.targets.size(); ++i)
    if (test.targets[i] != kIgnore)
      test.targets[i] = std::max_element(v.begin() + static_cast<std::ptrdiff_t>(i) * C,
                                         v.begin() + static_cast<std::ptrdiff_t>(i + 1) * C) -
                        (v.begin() + static_cast<std::ptrdiff_t>(i) * C);
}

BOOST_FIXTURE_TEST_CASE(zero_ablation_equals_removing_the_heads_rows_of_W_O, Fixture) {
  model.eval();
  predictions_as_targets(model, test);
  BOOST_TEST(accuracy() == 1.0);
  const std::vector<HeadAblation> ablation = ablate_heads(model, test);
  BOOST_TEST(ablation[0].zero != ablation[1].zero);  // the heads matter differently
  BOOST_REQUIRE_EQUAL(ablation.size(), static_cast<std::size_t>(kHeads));
  for (std::int64_t h = 0; h < kHeads; ++h) {
    const auto saved = zero_head_rows(h);
    const double expected = accuracy();
    restore_W_O(saved);
    BOOST_TEST(ablation[static_cast<std::size_t>(h)].zero == expected);
  }
}

BOOST_FIXTURE_TEST_CASE(ablation_leaves_no_hook_and_the_mode_as_it_was, Fixture) {
  model.train();
  const std::vector<double> before = logits();
  ablate_heads(model, test);
  BOOST_TEST(model.is_training());
  BOOST_TEST(logits() == before, boost::test_tools::per_element());
  take_snapshot(model, test, 3);
  attention_gradient(model, test);
  patch_heads(model, task, test, 10);
  BOOST_TEST(model.is_training());
  BOOST_TEST(logits() == before, boost::test_tools::per_element());
  for (const auto& p : model.parameters()) BOOST_TEST(!p.grad().defined());  // no gradient left behind
}

BOOST_FIXTURE_TEST_CASE(mean_ablation_with_every_sequence_alike_changes_nothing, Fixture) {
  // With all test sequences the same, each head's mean z is its z: mean ablation is no change.
  Batch same = test;
  const std::int64_t T = task.seq_len;
  for (std::int64_t s = 1; s < same.size; ++s)
    for (std::int64_t t = 0; t < T; ++t) {
      same.tokens[static_cast<std::size_t>(s * T + t)] = same.tokens[static_cast<std::size_t>(t)];
      same.targets[static_cast<std::size_t>(s * T + t)] = same.targets[static_cast<std::size_t>(t)];
    }
  same.token_tensor = ag::tensor(std::vector<double>(same.tokens.begin(), same.tokens.end()), {same.size, T});
  model.eval();
  ag::NoGradGuard no_grad;
  const double plain = batch_accuracy(model.forward(same.token_tensor), same.targets);
  for (const HeadAblation& a : ablate_heads(model, same)) BOOST_TEST(a.mean == plain);
}

BOOST_FIXTURE_TEST_CASE(attention_gradient_matches_study_mode, Fixture) {
  model.eval();
  const std::vector<double> got = attention_gradient(model, test);
  nn::MultiHeadAttention& attn = model.attention();
  attn.set_study(true);
  ag::Tensor loss = nn::cross_entropy(model.forward(test.token_tensor), test.targets,
                                      {.ignore_index = kIgnore});
  loss.backward();
  const std::vector<double> expected = ag::sum(attn.study().pattern.grad(), {0}).to_vector();
  attn.set_study(false);
  BOOST_REQUIRE_EQUAL(got.size(), static_cast<std::size_t>(kHeads * task.seq_len * task.seq_len));
  BOOST_TEST(got == expected, boost::test_tools::per_element());
}

BOOST_FIXTURE_TEST_CASE(patching_changes_and_the_metrics_are_those_of_the_two_inputs, Fixture) {
  model.eval();
  const std::int64_t n = 12, T = task.seq_len;
  const PatchingRecord p = patch_heads(model, task, test, n);
  // The clean metric: the mean log-probability of the clean targets, computed here directly.
  std::vector<double> clean(test.tokens.begin(), test.tokens.begin() + n * T);
  const std::vector<std::int64_t> targets(test.targets.begin(), test.targets.begin() + n * T);
  ag::NoGradGuard no_grad;
  const auto metric = [&](const std::vector<double>& tokens) {
    return -nn::cross_entropy(model.forward(ag::tensor(tokens, {n, T})), targets,
                              {.ignore_index = kIgnore})
                .item();
  };
  BOOST_TEST(p.clean_metric == metric(clean), boost::test_tools::tolerance(1e-12));
  for (std::int64_t s = 0; s < n; ++s) {
    auto& x0 = clean[static_cast<std::size_t>(s * T)];
    x0 = std::fmod(x0 + static_cast<double>(task.vocab / 2), static_cast<double>(task.vocab));
  }
  BOOST_TEST(p.corrupted_metric == metric(clean), boost::test_tools::tolerance(1e-12));
  BOOST_REQUIRE_EQUAL(p.per_head.size(), static_cast<std::size_t>(kHeads));
  BOOST_REQUIRE_EQUAL(p.per_head_position.size(), static_cast<std::size_t>(kHeads));
  BOOST_REQUIRE_EQUAL(p.per_head_position[0].size(), static_cast<std::size_t>(T));
  // One block: position t's z reaches only position t's prediction, and the metric is a mean over
  // positions, so patching a head at every position changes the metric by the sum of patching it
  // at each position alone.
  for (std::size_t h = 0; h < p.per_head.size(); ++h) {
    double sum = 0;
    for (double v : p.per_head_position[h]) sum += v;
    // The model is float32: each change is a difference of metrics of size |metric|, so the two
    // routes agree to a few float32 roundings of |metric|, not relative to the (small) change.
    BOOST_TEST(std::abs(sum - p.per_head[h]) <= 1e-5 * (1 + std::abs(p.corrupted_metric)));
  }
  double worst = 0;
  for (std::size_t h = 0; h < p.per_head.size(); ++h) {
    worst = std::max(worst, std::abs(p.estimate_per_head[h] - p.per_head[h]));
    for (std::size_t t = 0; t < p.per_head_position[h].size(); ++t)
      worst = std::max(worst, std::abs(p.estimate_per_head_position[h][t] - p.per_head_position[h][t]));
  }
  BOOST_TEST(p.max_abs_error == worst, boost::test_tools::tolerance(1e-9));
  BOOST_TEST(p.corruption == "x_0 replaced by (x_0 + 3) mod 6");
}

BOOST_AUTO_TEST_CASE(patching_the_only_head_restores_the_clean_metric) {
  // x_0 reaches positions t >= 1 (the only ones with targets) through attention alone, so with one
  // head, patching its z everywhere gives the clean run's predictions.
  const Task task{.kind = TaskKind::Difference, .vocab = 6, .seq_len = 5};
  ag::Generator init(3), data(4);
  HeadsModel model({.vocab = 6, .seq_len = 5, .d_model = 8, .d_ff = 16, .heads = 1, .classes = 11, .mlp = true}, init);
  const Batch test = make_batch(data, task, 30);
  const PatchingRecord p = patch_heads(model, task, test, 30);
  BOOST_TEST(std::abs(p.clean_metric - p.corrupted_metric) > 1e-3);  // the corruption matters
  const double gap = p.clean_metric - p.corrupted_metric;  // float32: a few roundings of |metric|
  BOOST_TEST(std::abs(p.per_head.at(0) - gap) <= 1e-5 * (1 + std::abs(p.corrupted_metric)));
}
