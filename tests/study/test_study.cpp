// nn::study (nn/study.hpp): ablation, patching, attribution patching, attention × gradient and
// direct logit attribution, each against a hand-computed case or a second route.
#define BOOST_TEST_MODULE study
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "study_support.hpp"

namespace ag = autograd;
using namespace study_support;

namespace {

// An attention layer alone, float64, with random biases (so b_O tells).
struct Layer : nn::MultiHeadAttention {
  Layer() : nn::MultiHeadAttention(options(), gen()) {
    ag::NoGradGuard no_grad;
    ag::Generator g(3);
    for (const ag::Tensor* b : {&b_Q(), &b_K(), &b_V(), &b_O()}) {
      ag::Tensor t = *b;
      t.copy_(ag::randn(t.shape(), F64, g));
    }
  }
  static nn::MultiHeadAttentionOptions options() {
    nn::MultiHeadAttentionOptions o;
    o.embed_dim = 6;
    o.num_heads = 3;
    o.dtype = F64;
    return o;
  }
  static ag::Generator& gen() {
    static ag::Generator g(5);
    return g;
  }
};

ag::Tensor random_input(std::uint64_t seed) {
  ag::Generator g(seed);
  return ag::randn({2, 4, 6}, F64, g);
}

}  // namespace

BOOST_AUTO_TEST_CASE(zero_ablation_of_a_head_equals_zeroing_its_rows_of_W_O) {
  TinyModel m;
  const std::int64_t h = 1, d_k = 2;
  ag::Tensor ablated;
  {
    auto handle = m.add_hook("block.attn.z", nn::study::zero_ablate_head(h));
    ablated = m.forward(kClean).detach().clone();
    handle.remove();
  }
  // Second route: no hook, rows h·d_k .. (h+1)·d_k - 1 of W_O set to zero.
  ag::NoGradGuard no_grad;
  ag::Tensor W_O = m.block->attn().W_O();
  auto w = W_O.to_vector();
  const std::int64_t E = W_O.size(1);
  for (std::int64_t r = h * d_k; r < (h + 1) * d_k; ++r)
    for (std::int64_t c = 0; c < E; ++c) w[static_cast<std::size_t>(r * E + c)] = 0.0;
  const ag::Tensor plain = m.forward(kClean).detach().clone();
  W_O.copy_(ag::tensor(w, W_O.shape(), F64));
  const ag::Tensor second = m.forward(kClean);
  BOOST_TEST(max_abs_diff(ablated, second) <= 1e-12);
  BOOST_TEST(max_abs_diff(ablated, plain) > 1e-3);  // the head mattered
}

BOOST_AUTO_TEST_CASE(mean_ablation_equals_replacing_z_h_by_its_mean_over_the_batch) {
  TinyModel m;
  const nn::ActivationCache cache =
      nn::run_with_cache(m, [&] { return m.forward(kClean); }, {.names = {"block.attn.z"}});
  const ag::Tensor& z = cache["block.attn.z"];  // (2, 2, 4, 2)
  const auto zv = z.to_vector();
  const std::int64_t B = 2, H = 2, T = 4, D = 2, h = 0;
  // The mean by hand, and z with head h's rows replaced by it.
  std::vector<double> mean(static_cast<std::size_t>(H * T * D), 0.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < H * T * D; ++i) mean[static_cast<std::size_t>(i)] += zv[static_cast<std::size_t>(b * H * T * D + i)] / B;
  check_values_near(nn::study::batch_mean(z), mean);
  auto hand = [&](const ag::Tensor& v, const std::string&) {
    auto x = v.to_vector();
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t i = 0; i < T * D; ++i)
        x[static_cast<std::size_t>((b * H + h) * T * D + i)] = mean[static_cast<std::size_t>(h * T * D + i)];
    return ag::tensor(x, v.shape(), F64);
  };
  auto a = m.add_hook("block.attn.z", hand);
  const ag::Tensor want = m.forward(kClean).detach().clone();
  a.remove();
  m.add_hook("block.attn.z", nn::study::mean_ablate_head(h, nn::study::batch_mean(z)));
  BOOST_TEST(max_abs_diff(m.forward(kClean), want) <= 1e-12);
}

BOOST_AUTO_TEST_CASE(ablation_hooks_name_the_head_and_H_when_out_of_range) {
  TinyModel m;
  m.add_hook("block.attn.z", nn::study::zero_ablate_head(2));
  try {
    m.forward(kClean);
    BOOST_FAIL("no throw");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(message_has(e, {"zero_ablate_head", "head 2", "H = 2", "'block.attn.z'"}));
  }
  m.remove_hooks();
  try {  // not (H, T, d_k): refused when the hook is made
    m.add_hook("block.attn.z", nn::study::mean_ablate_head(0, ag::zeros({2, 4}, F64)));
    BOOST_FAIL("no throw");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(message_has(e, {"mean_z of shape [2, 4]", "(H, T, d_k)"}));
  }
  m.add_hook("block.attn.z", nn::study::mean_ablate_head(0, ag::zeros({2, 3, 2}, F64)));
  try {  // (H, T, d_k) of another layer or length: refused at forward, naming both shapes
    m.forward(kClean);
    BOOST_FAIL("no throw");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(message_has(e, {"mean_z of shape [2, 3, 2]", "[2, 4, 2]"}));
  }
  m.remove_hooks();
  m.add_hook("block.attn.z", nn::study::patch_head(0, ag::zeros({2, 2, 4, 2}, F64), 4));
  try {
    m.forward(kClean);
    BOOST_FAIL("no throw");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(message_has(e, {"position 4", "T = 4"}));
  }
  m.remove_hooks();
  m.add_hook("block.attn.pattern", nn::study::zero_ablate_head(0));  // works on any 4-D point
  BOOST_CHECK_NO_THROW(m.forward(kClean));
  m.remove_hooks();
  m.add_hook("block.resid_mid", nn::study::zero_ablate_head(0));  // 3-D: not a z point
  BOOST_CHECK_THROW(m.forward(kClean), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(patching_every_head_from_the_clean_run_gives_the_clean_metric_exactly) {
  // The layer's output depends on its input only through z: patching all of z restores it all.
  Layer layer;
  const ag::Tensor clean = random_input(1), corrupted = random_input(2);
  auto run = [&](const ag::Tensor& x) { return ag::sum(ag::tanh(layer.forward(x))); };
  const nn::ActivationCache cache = nn::run_with_cache(layer, [&] { return run(clean); }, {.names = {"z"}});
  for (std::int64_t h = 0; h < 3; ++h) layer.add_hook("z", nn::study::patch_head(h, cache["z"]));
  BOOST_TEST(run(corrupted).item() == cache.output.item());
  layer.remove_hooks();
  // One head at a time: activation_patching's numbers are the metric with that hook.
  const nn::study::PatchingResult r = nn::study::activation_patching(layer, "z", run, clean, corrupted);
  BOOST_TEST(r.clean_metric == cache.output.item());
  BOOST_TEST(std::abs(r.corrupted_metric - run(corrupted).item()) <= 1e-12);  // hook-free run: the fused core
  BOOST_REQUIRE(r.per_head.size() == 3u);
  BOOST_REQUIRE(r.per_head_position.size() == 3u);
  for (std::int64_t h = 0; h < 3; ++h) {
    auto handle = layer.add_hook("z", nn::study::patch_head(h, cache["z"]));
    BOOST_TEST(r.per_head[static_cast<std::size_t>(h)] == run(corrupted).item());
    handle.remove();
    auto at = layer.add_hook("z", nn::study::patch_head(h, cache["z"], 2));
    BOOST_TEST(r.per_head_position[static_cast<std::size_t>(h)][2] == run(corrupted).item());
    at.remove();
  }
  BOOST_TEST(layer.hook_count() == 0u);
}

BOOST_AUTO_TEST_CASE(patching_a_head_on_identical_inputs_changes_nothing) {
  TinyModel m;
  auto run = [&](const ag::Tensor& x) { return mean_log_prob(m.forward(x), kTargets); };
  const nn::study::PatchingResult r = nn::study::activation_patching(m, "block.attn.z", run, kClean, kClean);
  BOOST_TEST(r.clean_metric == r.corrupted_metric);
  for (double v : r.per_head) BOOST_TEST(v == r.clean_metric);
  for (const auto& row : r.per_head_position)
    for (double v : row) BOOST_TEST(v == r.clean_metric);
  BOOST_TEST(m.hook_count() == 0u);
}

BOOST_AUTO_TEST_CASE(attribution_patching_is_exact_on_a_metric_linear_in_z) {
  Layer layer;
  const ag::Tensor clean = random_input(1), corrupted = random_input(2);
  const ag::Tensor G = random_input(9);
  auto run = [&](const ag::Tensor& x) { return ag::sum(layer.forward(x) * G); };  // linear in concat = z
  const auto r = nn::study::attribution_patching(layer, "z", run, clean, corrupted);
  BOOST_TEST(r.max_abs_error <= 1e-12);
  double largest = 0;
  for (std::size_t h = 0; h < 3; ++h) {
    largest = std::max(largest, std::abs(r.estimate_per_head[h]));
    BOOST_TEST(std::abs(r.estimate_per_head[h] - (r.actual.per_head[h] - r.actual.corrupted_metric)) <= 1e-12);
  }
  BOOST_TEST(largest > 1e-2);  // not trivially zero
}

BOOST_AUTO_TEST_CASE(attribution_patching_error_shrinks_like_epsilon_squared) {
  // Continuous inputs to the block: the residual stream x; corrupted = clean + ε·δ.
  TinyModel m;
  ag::Generator g(11);
  const ag::Tensor x = ag::randn({2, 4, 4}, F64, g), delta = ag::randn({2, 4, 4}, F64, g);
  auto run = [&](const ag::Tensor& in) {
    return mean_log_prob(m.readout->forward(m.ln_f->forward(m.block->forward(in))), kTargets);
  };
  ag::Tensor w0 = m.parameters()[0];
  {
    ag::NoGradGuard no_grad;
    w0.set_grad(ag::ones_like(w0));  // a gradient from before: attribution patching leaves it
  }
  std::vector<double> errors;
  for (double eps : {1e-2, 5e-3, 2.5e-3}) {
    const auto r = nn::study::attribution_patching(m, "block.attn.z", run, x, x + eps * delta);
    errors.push_back(r.max_abs_error);
    BOOST_TEST_MESSAGE("eps " << eps << ": max abs error " << r.max_abs_error);
  }
  BOOST_TEST(errors[0] > 0.0);
  for (std::size_t i = 1; i < errors.size(); ++i) {
    const double ratio = errors[i] / errors[i - 1];  // halving ε: a quarter of the error
    BOOST_TEST(ratio > 0.2);
    BOOST_TEST(ratio < 0.3);
  }
  BOOST_TEST(w0.grad().to_vector() == ag::ones_like(w0).to_vector());
  for (std::size_t i = 1; i < m.parameters().size(); ++i) BOOST_TEST(!m.parameters()[i].grad().defined());
}

BOOST_AUTO_TEST_CASE(attention_times_gradient_equals_A_times_dL_dA_from_study_mode) {
  TinyModel m;
  auto loss = [&] { return mean_log_prob(m.forward(kClean), kTargets); };
  const nn::ActivationCache cache = nn::run_with_cache(m, loss, {.names = {"block.attn.pattern"}, .backward = true});
  const nn::study::AttentionGradient ag_map = nn::study::attention_times_gradient(cache, "block.attn.pattern");
  // Second route: study mode's live weights and their retained gradient.
  m.zero_grad();
  m.block->attn().set_study(true);
  loss().backward();
  const nn::AttentionStudy& st = m.block->attn().study();
  const auto A = st.pattern.to_vector(), dA = st.grad("pattern").to_vector();
  const std::int64_t B = 2, H = 2, TS = 16;
  std::vector<double> want(static_cast<std::size_t>(H * TS), 0.0);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < H * TS; ++i) {
      const auto k = static_cast<std::size_t>(b * H * TS + i);
      want[static_cast<std::size_t>(i)] += A[k] * dA[k] / B;
    }
  BOOST_TEST(ag::shape_str(ag_map.map.shape()) == "[2, 4, 4]");
  check_values_near(ag_map.map, want);
  for (std::int64_t h = 0; h < H; ++h) {
    double s = 0;
    for (std::int64_t i = 0; i < TS; ++i) s += std::abs(want[static_cast<std::size_t>(h * TS + i)]);
    BOOST_TEST(std::abs(ag_map.per_head[static_cast<std::size_t>(h)] - s) <= 1e-12);
  }
}

BOOST_AUTO_TEST_CASE(head_results_sum_with_b_O_to_the_attention_output_and_dla_is_their_dot_product) {
  TinyModel m;
  {
    ag::NoGradGuard no_grad;
    ag::Tensor b_O = m.block->attn().b_O();
    b_O.copy_(ag::randn({4}, F64));
  }
  const nn::ActivationCache cache =
      nn::run_with_cache(m, [&] { return m.forward(kClean); }, {.names = {"block.attn.z", "block.attn.out"}});
  const ag::Tensor r = nn::study::head_results(m.block->attn(), cache["block.attn.z"]);  // (2, 2, 4, 4)
  BOOST_TEST(ag::shape_str(r.shape()) == "[2, 2, 4, 4]");
  const ag::Tensor total = ag::sum(r, 1) + m.block->attn().b_O();
  BOOST_TEST(max_abs_diff(total, cache["block.attn.out"]) <= 1e-12);
  // DLA: Σ_e result[b, h, t, e] · direction[e], by hand.
  const ag::Tensor dir = ag::tensor({0.5, -1.0, 2.0, 0.25}, {4}, F64);
  const ag::Tensor dla = nn::study::direct_logit_attribution(r, dir);
  BOOST_TEST(ag::shape_str(dla.shape()) == "[2, 2, 4]");
  const auto rv = r.to_vector(), dv = dir.to_vector(), got = dla.to_vector();
  for (std::size_t i = 0; i < got.size(); ++i) {
    double s = 0;
    for (std::size_t e = 0; e < 4; ++e) s += rv[i * 4 + e] * dv[e];
    BOOST_TEST(std::abs(got[i] - s) <= 1e-12);
  }
  // A per-position direction (B, T, E) gives the same as the broadcast one when all rows are equal.
  const ag::Tensor dirs = ag::expand(ag::reshape(dir, {1, 1, 4}), {2, 4, 4});
  BOOST_TEST(max_abs_diff(nn::study::direct_logit_attribution(r, dirs), dla) <= 1e-15);
  BOOST_CHECK_THROW(nn::study::direct_logit_attribution(r, ag::zeros({3}, F64)), std::invalid_argument);
  BOOST_CHECK_THROW(nn::study::head_results(m.block->attn(), ag::zeros({2, 3, 4, 2}, F64)), std::invalid_argument);
}
