// nn::circuits on a whole TransformerLM: the residual stream's stacks (accumulated, decomposed,
// per head), apply_ln_to_stack, the logit lens and logit attributions, path patching and resample
// ablation, each against the model's own forward or the same quantity computed another way.
// (TransformerLens's values for the same functions: tests/study/test_transformer_lens_parity.cpp.)
#define BOOST_TEST_MODULE circuits_model
#include <boost/test/unit_test.hpp>

#include <string>
#include <vector>

#include <nn/nn.hpp>

#include "test_support.hpp"

namespace ag = autograd;
namespace circuits = nn::circuits;
using namespace test_support;

namespace {

nn::TransformerLM make_model(std::int64_t d_mlp, std::uint64_t seed) {
  nn::TransformerLMConfig c{.n_layers = 2, .d_model = 8, .n_heads = 2, .d_mlp = d_mlp, .d_vocab = 7, .n_ctx = 6,
                            .dtype = ag::Dtype::Float64};
  nn::TransformerLM m(c);
  ag::Generator gen(seed);
  ag::NoGradGuard g;
  for (auto& [name, p] : m.named_parameters()) {
    ag::Tensor t = p;
    t.copy_(ag::add(ag::mul(ag::randn(p.shape(), p.dtype(), gen), 0.5), name.find("ln") != std::string::npos ? 1.0 : 0.0));
  }
  return m;
}

const ag::Tensor kClean = ag::tensor(std::vector<std::int64_t>{1, 2, 3, 1, 2, 4, 0, 6, 5, 0, 6, 5}, {2, 6});
const ag::Tensor kCorrupted = ag::tensor(std::vector<std::int64_t>{1, 2, 3, 5, 2, 4, 0, 6, 5, 3, 6, 5}, {2, 6});

nn::ActivationCache cache_of(nn::TransformerLM& m, const ag::Tensor& tokens) {
  return nn::run_with_cache(m, [&] { return m.forward(tokens); });
}

ag::Tensor component(const circuits::ResidualStack& s, std::size_t i) {
  return ag::squeeze(ag::narrow(s.stack, 0, static_cast<std::int64_t>(i), 1), 0);
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_stacks_add_up_to_the_residual_stream) {
  for (std::int64_t d_mlp : {0, 12}) {
    nn::TransformerLM m = make_model(d_mlp, 1);
    const nn::ActivationCache c = cache_of(m, kClean);
    const circuits::ResidualStack acc = circuits::accumulated_resid(m, c, -1, true);
    const std::vector<std::string> want =
        d_mlp ? std::vector<std::string>{"0_pre", "0_mid", "1_pre", "1_mid", "final_post"}
              : std::vector<std::string>{"0_pre", "1_pre", "final_post"};
    BOOST_TEST(acc.labels == want, fmt::format("{}", fmt::join(acc.labels, " ")));
    BOOST_TEST(max_abs_diff(component(acc, acc.labels.size() - 1), c["blocks.1.resid_post"]) == 0.0);
    const circuits::ResidualStack dec = circuits::decompose_resid(m, c);
    BOOST_TEST(dec.labels.front() == "embed");
    BOOST_TEST(dec.labels.back() == (d_mlp ? "1_mlp_out" : "1_attn_out"));
    BOOST_TEST(max_abs_diff(ag::sum(dec.stack, 0), c["blocks.1.resid_post"]) <= 1e-12);
    BOOST_TEST(max_abs_diff(ag::sum(circuits::decompose_resid(m, c, 1).stack, 0), c["blocks.1.resid_pre"]) <= 1e-12);
    // The heads' results add up to the layer's output, less b_O.
    const circuits::ResidualStack heads = circuits::stack_head_results(m, c, 1);
    BOOST_TEST(heads.labels == (std::vector<std::string>{"L0H0", "L0H1"}));
    BOOST_TEST(max_abs_diff(ag::add(ag::sum(heads.stack, 0), m.attn(0).b_O()), c["blocks.0.attn_out"]) <= 1e-12);
  }
}

BOOST_AUTO_TEST_CASE(apply_ln_is_the_layer_norm_the_stream_meets_next) {
  nn::TransformerLM m = make_model(12, 2);
  const nn::ActivationCache c = cache_of(m, kClean);
  const circuits::ResidualStack acc = circuits::accumulated_resid(m, c, -1, false, true);
  const ag::Tensor normalised =
      ag::div(ag::sub(c["ln_final.normalized"], m.ln_final().bias()), m.ln_final().weight());
  // Up to the last layer, apply_ln is the whole ln_final on each stream: its output at the end.
  BOOST_TEST(max_abs_diff(component(acc, acc.labels.size() - 1), c["ln_final.normalized"]) <= 1e-12);
  BOOST_TEST(max_abs_diff(component(circuits::accumulated_resid(m, c, 1, false, true), 1),
                          ag::div(ag::sub(c["blocks.1.resid_pre"], ag::mean(c["blocks.1.resid_pre"], -1, true)),
                                  c["blocks.1.ln_1.scale"])) <= 1e-12);
  // Linear: the normalised components add up to the normalised stream.
  BOOST_TEST(max_abs_diff(ag::sum(circuits::decompose_resid(m, c, -1, true).stack, 0), normalised) <= 1e-12);
  // The logit lens at the end is the model's logits, and a token's logit splits over the components.
  const ag::Tensor lens = circuits::logit_lens(m, circuits::accumulated_resid(m, c));
  BOOST_TEST(max_abs_diff(ag::squeeze(ag::narrow(lens, 0, 2, 1), 0), c.output) <= 1e-12);
  const std::int64_t tok = 4;
  const ag::Tensor dir = ag::squeeze(circuits::logit_directions(m, {tok}), 0);
  const ag::Tensor parts = circuits::residual_stack_to_logit(circuits::decompose_resid(m, c, -1, true).stack, dir);
  const ag::Tensor constant = ag::add(ag::sum(ag::mul(m.ln_final().bias(), ag::squeeze(ag::narrow(m.W_U(), 1, tok, 1), 1))),
                                      ag::narrow(m.b_U(), 0, tok, 1));
  const ag::Tensor logit = ag::squeeze(ag::narrow(c.output, 2, tok, 1), 2);  // (B, T)
  BOOST_TEST(max_abs_diff(ag::add(ag::sum(parts, 0), constant), logit) <= 1e-12);
  // Negative control: without ln_final's weight in the directions the split is wrong.
  const ag::Tensor bare = ag::squeeze(ag::narrow(m.W_U(), 1, tok, 1), 1);
  const ag::Tensor wrong = circuits::residual_stack_to_logit(circuits::decompose_resid(m, c, -1, true).stack, bare);
  BOOST_TEST(max_abs_diff(ag::add(ag::sum(wrong, 0), constant), logit) > 1e-3);
}

BOOST_AUTO_TEST_CASE(the_stacks_name_what_the_cache_lacks) {
  nn::TransformerLM m = make_model(0, 3);
  const nn::ActivationCache c = nn::run_with_cache(m, [&] { return m.forward(kClean); }, {.names = {"blocks.0.resid_pre"}});
  check_message([&] { circuits::accumulated_resid(m, c); }, "the cache has no 'blocks.1.resid_pre'");
  check_message([&] { circuits::accumulated_resid(m, c, 0, false, true); }, "the cache has no 'blocks.0.ln_1.scale'");
  check_message([&] { circuits::decompose_resid(m, c); }, "'embed_out'");
  check_message([&] { circuits::accumulated_resid(m, c, 3); }, "layer 3 is out of range");
  check_message([&] { circuits::stack_head_results(m, c, 0); }, "layer 0 has nothing before it");
  check_message([&] { circuits::logit_directions(m, {7}); }, "token 7 is out of range for d_vocab_out 7");
  check_message([&] { circuits::residual_stack_to_logit(ag::zeros({1, 2, 6, 8}, ag::Dtype::Float64), ag::zeros({7}, ag::Dtype::Float64)); },
                "direction of shape [7]");
}

BOOST_AUTO_TEST_CASE(path_patching_is_the_receiver_heads_keys_from_the_patched_stream) {
  nn::TransformerLM m = make_model(0, 4);
  const auto metric = [](const ag::Tensor& logits) {  // the last position's logit of token 3, summed over the batch
    return ag::sum(ag::narrow(ag::narrow(logits, 1, 5, 1), 2, 3, 1));
  };
  const circuits::PathPatchingResult r =
      circuits::path_patching(m, metric, kClean, kCorrupted, 0, 1, circuits::Composition::K);
  // The runs cache the sender's result point, which sums the heads' shares: equal to rounding.
  BOOST_TEST(std::abs(r.clean_metric - metric(m.forward(kClean)).item()) <= 1e-12 * std::abs(r.clean_metric));
  BOOST_TEST(std::abs(r.corrupted_metric - metric(m.forward(kCorrupted)).item()) <= 1e-12 * std::abs(r.corrupted_metric));
  BOOST_REQUIRE(r.per_pair.size() == 2u);
  // By hand: head j's keys made from ln_1(corrupted resid_pre of layer 1 + sender i's result difference).
  const nn::ActivationCache clean = cache_of(m, kClean), corrupted = cache_of(m, kCorrupted);
  const ag::Tensor delta = ag::sub(clean["blocks.0.attn.result"], corrupted["blocks.0.attn.result"]);
  auto& attn = m.attn(1);
  bool changed = false;
  for (std::int64_t i = 0; i < 2; ++i)
    for (std::int64_t j = 0; j < 2; ++j) {
      const ag::Tensor x = ag::add(corrupted["blocks.1.resid_pre"], ag::squeeze(ag::narrow(delta, 1, i, 1), 1));
      const ag::Tensor k = ag::add(ag::matmul(m.block(1).ln_1().forward(x), ag::narrow(attn.W_K(), 1, 4 * j, 4)),
                                   ag::narrow(attn.b_K(), 0, 4 * j, 4));  // (B, T, d_k)
      nn::HookHandle h = m.add_hook("blocks.1.attn.k", [&](const ag::Tensor& v, const std::string&) {
        std::vector<ag::Tensor> heads;
        for (std::int64_t hh = 0; hh < 2; ++hh) heads.push_back(hh == j ? ag::unsqueeze(k, 1) : ag::narrow(v, 1, hh, 1));
        return ag::cat(heads, 1);
      });
      const double want = metric(m.forward(kCorrupted)).item();
      h.remove();
      BOOST_TEST(std::abs(r.per_pair[i][j] - want) <= 1e-12 * (1 + std::abs(want)), i << " -> " << j);
      changed = changed || std::abs(want - r.corrupted_metric) > 1e-6;
    }
  BOOST_TEST(changed, "no pair changed the metric: the check would not see a wrong patch");
  // The same input twice: every pair is the corrupted run's metric.
  const auto same = circuits::path_patching(m, metric, kCorrupted, kCorrupted, 0, 1, circuits::Composition::Q);
  for (const auto& row : same.per_pair)
    for (double v : row) BOOST_TEST(std::abs(v - same.corrupted_metric) <= 1e-12);
  BOOST_TEST(m.hook_count() == 0u);
  check_message([&] { circuits::path_patching(m, metric, kClean, kCorrupted, 1, 1, circuits::Composition::K); },
                "need 0 <= sender < receiver < n_layers = 2");
  check_message([&] { circuits::path_patching(m, metric, kClean, ag::narrow(kCorrupted, 1, 0, 5), 0, 1, circuits::Composition::K); },
                "differ");
  check_message([&] { circuits::path_patching(m, [](const ag::Tensor& l) { return l; }, kClean, kCorrupted, 0, 1, circuits::Composition::V); },
                "one finite element");
  check_message([&] { circuits::path_patching(m, {}, kClean, kCorrupted, 0, 1, circuits::Composition::V); },
                "path_patching: the metric is an empty function");
  check_message([&] { circuits::path_patching(m, metric, kClean, kCorrupted, 0, 1, static_cast<circuits::Composition>(9)); },
                "path_patching: unknown receiver input 9");
  BOOST_TEST(m.hook_count() == 0u);
}

BOOST_AUTO_TEST_CASE(resample_ablation_takes_each_sequences_z_from_another) {
  nn::TransformerLM m = make_model(0, 5);
  const nn::ActivationCache c = cache_of(m, kCorrupted);
  const ag::Tensor z = c["blocks.0.attn.z"];
  ag::Generator gen(9);
  nn::HookHandle h = m.add_hook("blocks.0.attn.z", circuits::resample_ablate_head(1, z, gen));
  const ag::Tensor got = m.forward(kClean);
  h.remove();
  // With two sequences the only permutation without a fixed point swaps them.
  const ag::Tensor swapped = ag::cat({ag::narrow(z, 0, 1, 1), ag::narrow(z, 0, 0, 1)}, 0);
  h = m.add_hook("blocks.0.attn.z", nn::study::patch_head(1, swapped));
  const ag::Tensor want = m.forward(kClean);
  h.remove();
  BOOST_TEST(max_abs_diff(got, want) == 0.0);
  BOOST_TEST(max_abs_diff(got, m.forward(kClean)) > 1e-6);
  check_message([&] { circuits::resample_ablate_head(0, ag::narrow(z, 0, 0, 1), gen); }, "B >= 2");
  check_message([&] { circuits::resample_ablate_head(-1, z, gen); }, "resample_ablate_head: head -1 is out of range");
  check_message([&] { circuits::resample_ablate_head(z.size(1), z, gen); }, "is out of range for source_z");
}
