// The code snippets of docs/studying_attention.md, compiled and run on a small model with
// train_heads' layout (tok, pos, block, ln_f, readout) and task (y_t = x_(t-1) - x_0), so the
// page's code cannot rot. Each case holds one snippet, between the lines marked "snippet".
#define BOOST_TEST_MODULE studying_attention
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "study_support.hpp"

namespace ag = autograd;
using study_support::TinyModel;

namespace {

constexpr std::int64_t V = 5, T = 4;

// The page's setting: the model, its logits and metric, a clean batch and a corrupted one
// (the first token changed, so the first-token relationship is what differs).
struct Page {
  TinyModel model{study_support::TinyOptions{.vocab = V, .seq_len = T, .classes = 2 * V - 1}};
  ag::Tensor clean = study_support::tokens({{1, 2, 3, 0}, {4, 1, 1, 2}});
  ag::Tensor corrupted = study_support::tokens({{3, 2, 3, 0}, {0, 1, 1, 2}});
  std::vector<std::int64_t> targets;  // (B, T); -100 at position 0

  Page() {
    const auto x = clean.to_vector();
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t t = 0; t < T; ++t)
        targets.push_back(t == 0 ? -100
                                 : static_cast<std::int64_t>(x[static_cast<std::size_t>(b * T + t - 1)] -
                                                             x[static_cast<std::size_t>(b * T)]) + V - 1);
  }
  ag::Tensor logits(const ag::Tensor& x) const { return model.forward(x); }
  // Mean log-probability of the right answers: higher is better.
  ag::Tensor metric(const ag::Tensor& x) const { return -ag::cross_entropy(logits(x), targets); }
};

}  // namespace

BOOST_AUTO_TEST_CASE(list_hook_points) {
  Page p;
  auto& model = p.model;
  // snippet: list
  for (const std::string& name : model.hook_point_names()) fmt::print("{}\n", name);
  // block.resid_pre, block.resid_mid, block.mlp_hidden, block.resid_post, block.attn.q, ..., block.attn.out
  // snippet end
  BOOST_TEST(model.hook_point_names().size() == 26u);
}

BOOST_AUTO_TEST_CASE(read_the_pattern_and_its_gradient) {
  Page p;
  auto& model = p.model;
  auto metric = [&](const ag::Tensor& x) { return p.metric(x); };
  const ag::Tensor& clean = p.clean;
  // snippet: cache
  nn::CacheOptions options;
  options.names = {"block.attn.pattern", "block.attn.z"};
  options.backward = true;  // metric must return one element; its backward runs inside
  nn::ActivationCache cache = nn::run_with_cache(model, [&] { return metric(clean); }, options);
  const ag::Tensor& A = cache["block.attn.pattern"];        // (B, H, T, T), an owned copy
  const ag::Tensor& dA = cache.grad("block.attn.pattern");  // d metric / dA, same shape
  ag::Tensor head0 = nn::AttentionStudy::head(A, /*h=*/0, /*b=*/0);  // (T, T) of sequence 0
  // snippet end
  BOOST_TEST(ag::shape_str(A.shape()) == "[2, 2, 4, 4]");
  BOOST_TEST(ag::shape_str(dA.shape()) == "[2, 2, 4, 4]");
  BOOST_TEST(ag::shape_str(head0.shape()) == "[4, 4]");
  BOOST_TEST(model.hook_count() == 0u);
}

BOOST_AUTO_TEST_CASE(ablate_a_head) {
  Page p;
  auto& model = p.model;
  auto metric = [&](const ag::Tensor& x) { return p.metric(x); };
  const ag::Tensor& clean = p.clean;
  // snippet: ablate
  ag::NoGradGuard no_grad;
  const double base = metric(clean).item();
  nn::HookHandle h = model.add_hook("block.attn.z", nn::study::zero_ablate_head(1));
  const double without_head_1 = metric(clean).item();
  h.remove();
  // Mean ablation: head 1's z set to its average over a batch (here the same batch).
  nn::ActivationCache cache = nn::run_with_cache(model, [&] { return metric(clean); }, {.names = {"block.attn.z"}});
  h = model.add_hook("block.attn.z", nn::study::mean_ablate_head(1, nn::study::batch_mean(cache["block.attn.z"])));
  const double mean_ablated = metric(clean).item();
  h.remove();
  fmt::print("metric {:.4f}, head 1 zero-ablated {:.4f}, mean-ablated {:.4f}\n", base, without_head_1, mean_ablated);
  // snippet end
  BOOST_TEST(base != without_head_1);
  BOOST_TEST(model.hook_count() == 0u);
}

BOOST_AUTO_TEST_CASE(patch_a_head) {
  Page p;
  auto& model = p.model;
  auto metric = [&](const ag::Tensor& x) { return p.metric(x); };
  const ag::Tensor &clean = p.clean, &corrupted = p.corrupted;
  // snippet: patch
  nn::study::PatchingResult r = nn::study::activation_patching(model, "block.attn.z", metric, clean, corrupted);
  for (std::size_t h = 0; h < r.per_head.size(); ++h)
    fmt::print("head {}: corrupted {:.4f} -> patched {:.4f} (clean {:.4f})\n", h, r.corrupted_metric, r.per_head[h],
               r.clean_metric);
  // By hand, one head at one position: head 0's z at position 2 from the clean run.
  ag::NoGradGuard no_grad;
  nn::ActivationCache cache = nn::run_with_cache(model, [&] { return metric(clean); }, {.names = {"block.attn.z"}});
  nn::HookHandle h = model.add_hook("block.attn.z", nn::study::patch_head(0, cache["block.attn.z"], /*position=*/2));
  const double patched = metric(corrupted).item();
  h.remove();
  // snippet end
  BOOST_TEST(patched == r.per_head_position[0][2]);
  BOOST_TEST(r.per_head.size() == 2u);
}

BOOST_AUTO_TEST_CASE(attribution_patching) {
  Page p;
  auto& model = p.model;
  auto metric = [&](const ag::Tensor& x) { return p.metric(x); };
  const ag::Tensor &clean = p.clean, &corrupted = p.corrupted;
  // snippet: attribution
  nn::study::AttributionPatchingResult r =
      nn::study::attribution_patching(model, "block.attn.z", metric, clean, corrupted);
  for (std::size_t h = 0; h < r.estimate_per_head.size(); ++h)
    fmt::print("head {}: estimated change {:+.4f}, actual {:+.4f}\n", h, r.estimate_per_head[h],
               r.actual.per_head[h] - r.actual.corrupted_metric);
  fmt::print("largest error of the estimate: {:.2e}\n", r.max_abs_error);
  // snippet end
  BOOST_TEST(r.estimate_per_head.size() == 2u);
}

BOOST_AUTO_TEST_CASE(attention_times_gradient) {
  Page p;
  auto& model = p.model;
  auto metric = [&](const ag::Tensor& x) { return p.metric(x); };
  const ag::Tensor& clean = p.clean;
  // snippet: attngrad
  nn::ActivationCache cache =
      nn::run_with_cache(model, [&] { return metric(clean); }, {.names = {"block.attn.pattern"}, .backward = true});
  nn::study::AttentionGradient ag_map = nn::study::attention_times_gradient(cache, "block.attn.pattern");
  // ag_map.map: (H, T, T), A ⊙ dmetric/dA averaged over the batch; ag_map.per_head: Σ |map| per head
  for (std::size_t h = 0; h < ag_map.per_head.size(); ++h) fmt::print("head {}: {:.4f}\n", h, ag_map.per_head[h]);
  // snippet end
  BOOST_TEST(ag::shape_str(ag_map.map.shape()) == "[2, 4, 4]");
}

BOOST_AUTO_TEST_CASE(direct_logit_attribution) {
  Page p;
  auto& model = p.model;
  const ag::Tensor& clean = p.clean;
  const std::int64_t right_class = p.targets[3];  // sequence 0, position 3
  // snippet: dla
  ag::NoGradGuard no_grad;
  nn::ActivationCache cache = nn::run_with_cache(model, [&] { return model.forward(clean); }, {.names = {"block.attn.z"}});
  nn::MultiHeadAttention& attn = model.block->attn();
  ag::Tensor per_head = nn::study::head_results(attn, cache["block.attn.z"]);  // (B, H, T, E)
  // The readout's column for the right class as the direction (ln_f's normalisation ignored).
  ag::Tensor direction = ag::reshape(ag::narrow(model.readout->weight(), 1, right_class, 1), {-1});  // (E)
  ag::Tensor dla = nn::study::direct_logit_attribution(per_head, direction);  // (B, H, T)
  // snippet end
  BOOST_TEST(ag::shape_str(dla.shape()) == "[2, 2, 4]");
}
