// TransformerBlock::forward_rows (a causal forward of the last rows from cached keys and values)
// against the block's forward, and nn::circuits::z_patching_sweep against study::activation_patching
// on every layer of TransformerLMs of several forms, in float64.
#define BOOST_TEST_MODULE z_patching_sweep
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nn/nn.hpp>

#include "test_support.hpp"

namespace ag = autograd;
namespace circuits = nn::circuits;
using namespace test_support;

namespace {

nn::TransformerLM make_model(std::int64_t n_layers, std::int64_t d_mlp, nn::Normalization norm, std::uint64_t seed) {
  nn::TransformerLMConfig c{.n_layers = n_layers, .d_model = 8, .n_heads = 2, .d_mlp = d_mlp, .d_vocab = 7,
                            .n_ctx = 6, .normalization = norm, .dtype = ag::Dtype::Float64};
  nn::TransformerLM m(c);
  m.eval();
  ag::Generator gen(seed);
  ag::NoGradGuard g;
  for (auto& [name, p] : m.named_parameters()) {
    ag::Tensor t = p;
    t.copy_(ag::add(ag::mul(ag::randn(p.shape(), p.dtype(), gen), 0.5), name.find("ln") != std::string::npos ? 1.0 : 0.0));
  }
  return m;
}

const ag::Tensor kClean = ag::tensor(std::vector<std::int64_t>{1, 2, 3, 1, 2, 4, 0, 6, 5, 0, 6, 5}, {2, 6});
const ag::Tensor kCorrupted = ag::tensor(std::vector<std::int64_t>{4, 2, 3, 5, 2, 4, 0, 1, 5, 3, 6, 2}, {2, 6});

// The largest difference between two sweeps' results, over every metric they hold, relative to
// the largest metric (at least 1).
double max_diff(const std::vector<nn::study::PatchingResult>& a, const std::vector<nn::study::PatchingResult>& b) {
  BOOST_REQUIRE_EQUAL(a.size(), b.size());
  double d = 0, scale = 1;
  for (const auto& l : b) {
    scale = std::max({scale, std::abs(l.clean_metric), std::abs(l.corrupted_metric)});
    for (double v : l.per_head) scale = std::max(scale, std::abs(v));
  }
  for (std::size_t l = 0; l < a.size(); ++l) {
    d = std::max({d, std::abs(a[l].clean_metric - b[l].clean_metric),
                  std::abs(a[l].corrupted_metric - b[l].corrupted_metric)});
    BOOST_REQUIRE_EQUAL(a[l].per_head.size(), b[l].per_head.size());
    BOOST_REQUIRE_EQUAL(a[l].per_head_position.size(), b[l].per_head_position.size());
    for (std::size_t h = 0; h < a[l].per_head.size(); ++h) {
      d = std::max(d, std::abs(a[l].per_head[h] - b[l].per_head[h]));
      BOOST_REQUIRE_EQUAL(a[l].per_head_position[h].size(), b[l].per_head_position[h].size());
      for (std::size_t t = 0; t < a[l].per_head_position[h].size(); ++t)
        d = std::max(d, std::abs(a[l].per_head_position[h][t] - b[l].per_head_position[h][t]));
    }
  }
  return d / scale;
}

// The largest |patched - corrupted| of a sweep: how much the patches move the metric.
double largest_effect(const std::vector<nn::study::PatchingResult>& r) {
  double d = 0;
  for (const auto& l : r)
    for (std::size_t h = 0; h < l.per_head.size(); ++h) {
      d = std::max(d, std::abs(l.per_head[h] - l.corrupted_metric));
      for (double v : l.per_head_position[h]) d = std::max(d, std::abs(v - l.corrupted_metric));
    }
  return d;
}

// A metric that reads every position nonlinearly, and one that reads the last position.
const ag::Tensor kWeights = [] {
  ag::Generator gen(7);
  return ag::randn({2, 6, 7}, ag::Dtype::Float64, gen);
}();
ag::Tensor every_position(const ag::Tensor& logits) { return ag::sum(ag::mul(ag::log_softmax(logits, -1), kWeights)); }
ag::Tensor last_position(const ag::Tensor& logits) {
  const ag::Tensor last = ag::narrow(logits, 1, logits.size(1) - 1, 1);  // (B, 1, V)
  return ag::sum(ag::mul(ag::log_softmax(last, -1), ag::narrow(kWeights, 1, 5, 1)));
}

// study::activation_patching at every layer's z, with run(tokens) = metric(model.forward(tokens)).
std::vector<nn::study::PatchingResult> plain_sweep(nn::TransformerLM& m, ag::Tensor (*metric)(const ag::Tensor&)) {
  std::vector<nn::study::PatchingResult> r;
  for (std::int64_t l = 0; l < m.config().n_layers; ++l)
    r.push_back(nn::study::activation_patching(m, fmt::format("blocks.{}.attn.z", l),
                                               [&](const ag::Tensor& t) { return metric(m.forward(t)); }, kClean,
                                               kCorrupted));
  return r;
}

}  // namespace

BOOST_AUTO_TEST_CASE(forward_rows_is_the_forward_on_the_last_rows) {
  for (const std::int64_t d_mlp : {0, 12})
    for (const auto norm : {nn::Normalization::LayerNorm, nn::Normalization::None}) {
      const nn::TransformerLM m = make_model(1, d_mlp, norm, 3);
      const nn::TransformerBlock& block = m.block(0);
      ag::NoGradGuard g;
      const ag::Tensor x = m.residual_at(kClean, 0), other = m.residual_at(kCorrupted, 0);  // (2, 6, 8)
      nn::AttentionOptions causal;
      causal.is_causal = true;
      const ag::Tensor want = block.forward(x, causal).output;
      const nn::TransformerBlock::Rows all = block.forward_rows(x, {}, {}, 6);
      BOOST_TEST(max_abs_diff(all.output, want) < 1e-13);
      BOOST_TEST(max_abs_diff(block.forward_last(x), ag::narrow(want, 1, 5, 1)) < 1e-13);
      for (std::int64_t before = 1; before < 6; ++before)
        for (std::int64_t queries = 1; queries <= 6 - before; ++queries) {
          const nn::TransformerBlock::Rows r =
              block.forward_rows(ag::narrow(x, 1, before, 6 - before), ag::narrow(all.keys, 1, 0, before),
                                 ag::narrow(all.values, 1, 0, before), queries);
          BOOST_TEST(max_abs_diff(r.output, ag::narrow(want, 1, 6 - queries, queries)) < 1e-13);
          BOOST_TEST(max_abs_diff(r.keys, all.keys) < 1e-13);
          BOOST_TEST(max_abs_diff(r.z, ag::narrow(all.z, 1, 6 - queries, queries)) < 1e-13);
          // Negative control: the keys and values of another input's first rows change the answer.
          const nn::TransformerBlock::Rows o = block.forward_rows(other, {}, {}, 6);
          const nn::TransformerBlock::Rows wrong =
              block.forward_rows(ag::narrow(x, 1, before, 6 - before), ag::narrow(o.keys, 1, 0, before),
                                 ag::narrow(o.values, 1, 0, before), queries);
          BOOST_TEST(max_abs_diff(wrong.output, r.output) > 1e-3);
        }
    }
}

BOOST_AUTO_TEST_CASE(the_sweep_equals_activation_patching_at_every_layer) {
  for (const std::int64_t layers : {1, 3})
    for (const std::int64_t d_mlp : {0, 12})
      for (const auto norm : {nn::Normalization::LayerNorm, nn::Normalization::None}) {
        BOOST_TEST_CONTEXT("layers " << layers << ", d_mlp " << d_mlp << ", norm " << static_cast<int>(norm)) {
          nn::TransformerLM m = make_model(layers, d_mlp, norm, 11 + static_cast<std::uint64_t>(layers + d_mlp));
          const auto plain = plain_sweep(m, every_position);
          const auto fast = circuits::z_patching_sweep(m, every_position, kClean, kCorrupted);
          BOOST_TEST(max_diff(fast, plain) < 1e-12);
          // The patches move the metric, so equal results are not two constants.
          BOOST_TEST(largest_effect(plain) > 1e-2);
          const auto plain_last = plain_sweep(m, last_position);
          const auto fast_last = circuits::z_patching_sweep(m, last_position, kClean, kCorrupted,
                                                            {.reads = circuits::MetricReads::LastPosition});
          BOOST_TEST(max_diff(fast_last, plain_last) < 1e-12);
          BOOST_TEST(largest_effect(plain_last) > 1e-2);
          // Negative control: the same sweep on a model with one weight changed is told apart.
          {
            ag::NoGradGuard g;
            ag::Tensor w = m.attn(0).W_V();
            w.copy_(ag::add(w, 0.1));
          }
          BOOST_TEST(max_diff(circuits::z_patching_sweep(m, every_position, kClean, kCorrupted), plain) > 1e-4);
        }
      }
}

BOOST_AUTO_TEST_CASE(per_position_off_leaves_the_positions_out) {
  nn::TransformerLM m = make_model(2, 12, nn::Normalization::LayerNorm, 5);
  const auto all = circuits::z_patching_sweep(m, every_position, kClean, kCorrupted);
  const auto heads = circuits::z_patching_sweep(m, every_position, kClean, kCorrupted, {.per_position = false});
  for (std::size_t l = 0; l < 2; ++l) {
    BOOST_TEST(heads[l].per_head_position.empty());
    BOOST_TEST(heads[l].per_head == all[l].per_head, boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(bad_input_is_refused_naming_the_call) {
  nn::TransformerLM m = make_model(2, 12, nn::Normalization::LayerNorm, 5);
  const ag::Tensor short_tokens = ag::narrow(kCorrupted, 1, 0, 5);
  check_throws<std::invalid_argument>([&] { (void)circuits::z_patching_sweep(m, every_position, kClean, short_tokens); },
                    {"z_patching_sweep", "[2, 6]", "[2, 5]"});
  check_throws<std::invalid_argument>([&] { (void)circuits::z_patching_sweep(m, {}, kClean, kCorrupted); },
                    {"z_patching_sweep", "empty"});
  check_throws<std::invalid_argument>(
      [&] { (void)circuits::z_patching_sweep(m, [](const ag::Tensor& l) { return l; }, kClean, kCorrupted); },
      {"z_patching_sweep", "one element", "[2, 6, 7]", "the clean run"});
  check_throws<std::invalid_argument>([&] {
    (void)circuits::z_patching_sweep(m, [](const ag::Tensor& l) { return ag::div(ag::sum(l), 0.0); }, kClean,
                                     kCorrupted);
  }, {"z_patching_sweep", "not finite"});
  // A metric that indexes the full logits' last row, given the last position only, throws.
  check_throws<std::invalid_argument>([&] {
    (void)circuits::z_patching_sweep(m, [](const ag::Tensor& l) { return ag::sum(ag::narrow(l, 1, 5, 1)); }, kClean,
                                     kCorrupted, {.reads = circuits::MetricReads::LastPosition});
  }, {"z_patching_sweep", "LastPosition", "[2, 1, 7]", "narrow"});
  {
    nn::HookHandle h = m.add_hook("blocks.1.attn.z", [](const ag::Tensor&, const std::string&) { return ag::Tensor(); });
    check_throws<std::invalid_argument>([&] { (void)circuits::z_patching_sweep(m, every_position, kClean, kCorrupted); },
                      {"z_patching_sweep", "1 hook"});
    h.remove();
  }
  const nn::TransformerBlock& block = m.block(0);
  ag::NoGradGuard g;
  const ag::Tensor x = m.residual_at(kClean, 0);
  const nn::TransformerBlock::Rows all = block.forward_rows(x, {}, {}, 6);
  check_throws<std::invalid_argument>([&] { (void)block.forward_rows(x, {}, {}, 7); }, {"forward_rows", "queries = 7", "1 .. R = 6"});
  check_throws<std::invalid_argument>([&] { (void)block.forward_rows(x, {}, {}, 0); }, {"forward_rows", "queries = 0"});
  check_throws<std::invalid_argument>([&] { (void)block.forward_rows(ag::narrow(x, 2, 0, 4), {}, {}, 1); },
                    {"forward_rows", "d_model = 8", "[2, 6, 4]"});
  check_throws<std::invalid_argument>([&] { (void)block.forward_rows(x, all.keys, {}, 1); }, {"forward_rows", "come together"});
  check_throws<std::invalid_argument>(
      [&] { (void)block.forward_rows(x, ag::narrow(all.keys, 0, 0, 1), ag::narrow(all.values, 0, 0, 1), 1); },
      {"forward_rows", "B = 2", "[1, 6, 8]"});
  nn::TransformerBlock dropping({.d_model = 8, .num_heads = 2, .dropout = 0.1, .dtype = ag::Dtype::Float64});
  check_throws<std::invalid_argument>([&] { (void)dropping.forward_rows(x, {}, {}, 1); }, {"forward_rows", "dropout 0.1", "eval()"});
}
