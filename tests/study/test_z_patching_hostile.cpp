// nn::circuits::z_patching_sweep and TransformerBlock::forward_rows / after_attention /
// forward_last under odd but legal configurations and hostile input: every sweep result is
// compared with study::activation_patching at each layer's z, and every refusal must name the
// call and the shapes or values at fault.
#define BOOST_TEST_MODULE z_patching_hostile
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nn/nn.hpp>

#include "test_support.hpp"

namespace ag = autograd;
namespace circuits = nn::circuits;
using namespace test_support;

namespace {

using Metric = std::function<ag::Tensor(const ag::Tensor&)>;
using Results = std::vector<nn::study::PatchingResult>;

nn::TransformerLMConfig base_config() {
  nn::TransformerLMConfig c;
  c.n_layers = 2;
  c.d_model = 8;
  c.n_heads = 2;
  c.d_mlp = 12;
  c.d_vocab = 7;
  c.n_ctx = 6;
  c.dtype = ag::Dtype::Float64;
  return c;
}

// A model with every parameter drawn at scale 0.5 (LayerNorm gains around 1), so that patches
// move the metric well above rounding.
nn::TransformerLM make_model(const nn::TransformerLMConfig& c, std::uint64_t seed = 3, double scale = 0.5) {
  nn::TransformerLM m(c);
  m.eval();
  ag::Generator gen(seed);
  ag::NoGradGuard g;
  for (auto& [name, p] : m.named_parameters()) {
    ag::Tensor t = p;
    t.copy_(ag::add(ag::mul(ag::randn(p.shape(), p.dtype(), gen), scale),
                    name.find("ln") != std::string::npos ? 1.0 : 0.0));
  }
  return m;
}

// Tokens (B, T) in [0, V) from a small linear congruential sequence.
ag::Tensor tokens(std::int64_t B, std::int64_t T, std::int64_t V, std::uint64_t seed) {
  std::vector<std::int64_t> v;
  std::uint64_t s = seed * 2654435761u + 12345u;
  for (std::int64_t i = 0; i < B * T; ++i) {
    s = s * 6364136223846793005u + 1442695040888963407u;
    v.push_back(static_cast<std::int64_t>((s >> 33) % static_cast<std::uint64_t>(V)));
  }
  return ag::tensor(v, {B, T});
}

// Weights of logits' shape drawn from a fixed seed: the same for every call on one shape.
ag::Tensor weights_like(const ag::Tensor& logits) {
  ag::Generator gen(7);
  return ag::randn(logits.shape(), ag::Dtype::Float64, gen).to(logits.dtype());
}
// Reads every position nonlinearly.
ag::Tensor every_position(const ag::Tensor& logits) {
  return ag::sum(ag::mul(ag::log_softmax(logits, -1), weights_like(logits)));
}
// Reads the last position alone (logits[:, -1]).
ag::Tensor last_position(const ag::Tensor& logits) {
  const ag::Tensor last = ag::narrow(logits, 1, logits.size(1) - 1, 1);
  return ag::sum(ag::mul(ag::log_softmax(last, -1), weights_like(last)));
}

Results reference(nn::TransformerLM& m, const Metric& metric, const ag::Tensor& clean, const ag::Tensor& corrupted) {
  Results r;
  for (std::int64_t l = 0; l < m.config().n_layers; ++l)
    r.push_back(nn::study::activation_patching(m, fmt::format("blocks.{}.attn.z", l),
                                               [&](const ag::Tensor& t) { return metric(m.forward(t)); }, clean,
                                               corrupted));
  return r;
}

// The largest difference over every metric two sweeps hold, relative to the largest |metric| (at
// least 1).
double max_diff(const Results& a, const Results& b) {
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

// The largest |patched - corrupted|: how much the patches move the metric.
double largest_effect(const Results& r) {
  double d = 0;
  for (const auto& l : r)
    for (std::size_t h = 0; h < l.per_head.size(); ++h) {
      d = std::max(d, std::abs(l.per_head[h] - l.corrupted_metric));
      for (double v : l.per_head_position[h]) d = std::max(d, std::abs(v - l.corrupted_metric));
    }
  return d;
}

// The sweep in both metric modes against the reference, with a negative control on the effect.
void check_against_reference(const nn::TransformerLMConfig& c, std::int64_t B, std::int64_t T, double tol = 1e-12) {
  nn::TransformerLM m = make_model(c);
  const ag::Tensor clean = tokens(B, T, c.d_vocab, 1);
  // the corrupted tokens differ from the clean ones everywhere
  std::vector<std::int64_t> shifted;
  for (double t : clean.to_vector()) shifted.push_back((static_cast<std::int64_t>(t) + 1 + (B * T) % 3) % c.d_vocab);
  const ag::Tensor corrupted = ag::tensor(shifted, {B, T});
  const Results plain = reference(m, every_position, clean, corrupted);
  BOOST_TEST(max_diff(circuits::z_patching_sweep(m, every_position, clean, corrupted), plain) < tol);
  BOOST_TEST(largest_effect(plain) > 1e-3);
  const Results plain_last = reference(m, last_position, clean, corrupted);
  BOOST_TEST(max_diff(circuits::z_patching_sweep(m, last_position, clean, corrupted,
                                                 {.reads = circuits::MetricReads::LastPosition}),
                      plain_last) < tol);
  BOOST_TEST(largest_effect(plain_last) > 1e-3);
}

struct Fixture {
  nn::TransformerLMConfig c = base_config();
  nn::TransformerLM m = make_model(c);
  ag::Tensor clean = tokens(2, 6, 7, 1), corrupted = tokens(2, 6, 7, 2);
};

// Every parameter's values, to see that nothing changed.
std::vector<std::vector<double>> snapshot(const nn::TransformerLM& m) {
  std::vector<std::vector<double>> s;
  for (const auto& [name, p] : m.named_parameters()) s.push_back(ag::Tensor(p).to_vector());
  return s;
}

}  // namespace

// ---- odd but legal configurations: the sweep equals activation_patching ----

BOOST_AUTO_TEST_CASE(one_position_one_sequence) {
  check_against_reference(base_config(), 1, 1);
  nn::TransformerLMConfig c = base_config();
  c.n_layers = 1;
  check_against_reference(c, 1, 1);
  check_against_reference(c, 3, 1);
}

BOOST_AUTO_TEST_CASE(sequence_of_n_ctx_and_batch_of_one) {
  check_against_reference(base_config(), 1, 6);
  check_against_reference(base_config(), 3, 6);
  check_against_reference(base_config(), 2, 2);
}

BOOST_AUTO_TEST_CASE(one_head_and_heads_of_width_one) {
  for (const std::int64_t heads : {1, 8}) {
    BOOST_TEST_CONTEXT("n_heads " << heads) {
      nn::TransformerLMConfig c = base_config();
      c.n_heads = heads;
      check_against_reference(c, 2, 5);
    }
  }
}

BOOST_AUTO_TEST_CASE(tied_embeddings_no_positions_no_norm) {
  nn::TransformerLMConfig c = base_config();
  c.tied_embeddings = true;
  c.positional_embedding = nn::PositionalEmbedding::None;
  check_against_reference(c, 2, 6);
  c.normalization = nn::Normalization::None;
  check_against_reference(c, 2, 6);
}

BOOST_AUTO_TEST_CASE(d_vocab_out_differs_from_d_vocab) {
  nn::TransformerLMConfig c = base_config();
  c.d_vocab_out = 3;
  check_against_reference(c, 2, 6);
  c.d_vocab_out = 1;  // one logit: log_softmax is 0, so read the logits themselves
  nn::TransformerLM m = make_model(c);
  const ag::Tensor clean = tokens(2, 6, 7, 1), corrupted = tokens(2, 6, 7, 2);
  const Metric raw = [](const ag::Tensor& l) { return ag::sum(ag::mul(l, weights_like(l))); };
  const Results plain = reference(m, raw, clean, corrupted);
  BOOST_TEST(max_diff(circuits::z_patching_sweep(m, raw, clean, corrupted), plain) < 1e-12);
  BOOST_TEST(largest_effect(plain) > 1e-3);
}

BOOST_AUTO_TEST_CASE(activations_and_attention_only) {
  for (const auto act : {nn::Activation::Gelu, nn::Activation::GeluTanh, nn::Activation::Relu}) {
    BOOST_TEST_CONTEXT("activation " << static_cast<int>(act)) {
      nn::TransformerLMConfig c = base_config();
      c.activation = act;
      c.n_layers = 3;
      check_against_reference(c, 2, 6);
    }
  }
  nn::TransformerLMConfig c = base_config();
  c.d_mlp = 0;
  c.n_layers = 3;
  check_against_reference(c, 2, 4);
}

BOOST_AUTO_TEST_CASE(float32_model) {
  nn::TransformerLMConfig c = base_config();
  c.dtype = ag::Dtype::Float32;
  check_against_reference(c, 2, 6, 1e-5);
}

BOOST_AUTO_TEST_CASE(training_mode_without_dropout) {
  Fixture f;
  f.m.train();
  const Results plain = reference(f.m, every_position, f.clean, f.corrupted);
  BOOST_TEST(max_diff(circuits::z_patching_sweep(f.m, every_position, f.clean, f.corrupted), plain) < 1e-12);
}

BOOST_AUTO_TEST_CASE(float_tokens_holding_integers) {
  Fixture f;
  const Results want = circuits::z_patching_sweep(f.m, every_position, f.clean, f.corrupted);
  const Results got = circuits::z_patching_sweep(f.m, every_position, f.clean.to(ag::Dtype::Float64),
                                                 f.corrupted.to(ag::Dtype::Float32));
  BOOST_TEST(max_diff(got, want) == 0.0);
}

BOOST_AUTO_TEST_CASE(the_model_changed_between_calls) {
  Fixture f;
  const Results before = circuits::z_patching_sweep(f.m, every_position, f.clean, f.corrupted);
  {
    ag::NoGradGuard g;
    ag::Tensor w = f.m.block(1).fc_2().weight();
    w.copy_(ag::mul(w, 1.5));
  }
  const Results plain = reference(f.m, every_position, f.clean, f.corrupted);
  const Results after = circuits::z_patching_sweep(f.m, every_position, f.clean, f.corrupted);
  BOOST_TEST(max_diff(after, plain) < 1e-12);
  BOOST_TEST(max_diff(after, before) > 1e-4);
}

// ---- metrics of odd kinds ----

BOOST_AUTO_TEST_CASE(metrics_of_odd_dtype_and_shape) {
  Fixture f;
  const std::vector<std::pair<std::string, Metric>> metrics = {
      {"Int64", [](const ag::Tensor& l) { return ag::mul(every_position(l), 1000.0).to(ag::Dtype::Int64); }},
      {"(1, 1, 1)", [](const ag::Tensor& l) { return ag::reshape(every_position(l), {1, 1, 1}); }},
      {"Float32 from a Float64 model", [](const ag::Tensor& l) { return every_position(l).to(ag::Dtype::Float32); }},
  };
  for (const auto& [what, metric] : metrics) {
    BOOST_TEST_CONTEXT("metric " << what) {
      const Results plain = reference(f.m, metric, f.clean, f.corrupted);
      BOOST_TEST(max_diff(circuits::z_patching_sweep(f.m, metric, f.clean, f.corrupted), plain) < 1e-12);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_metric_that_requires_grad) {
  Fixture f;
  ag::Tensor knob = ag::tensor(std::vector<double>{0.25}, {1}, ag::Dtype::Float64);
  knob.requires_grad_();
  const Metric metric = [&](const ag::Tensor& l) { return ag::add(every_position(l), ag::sum(knob)); };
  const Results plain = reference(f.m, metric, f.clean, f.corrupted);
  BOOST_TEST(max_diff(circuits::z_patching_sweep(f.m, metric, f.clean, f.corrupted), plain) < 1e-12);
  BOOST_TEST(ag::is_grad_enabled());
}

// A metric that rescales its logits in place before reading them (a temperature) is a legal
// function of the logits it is given: each run's logits are its own.
BOOST_AUTO_TEST_CASE(a_metric_that_scales_its_logits_in_place) {
  Fixture f;
  const Metric metric = [](const ag::Tensor& logits) {
    ag::Tensor l = logits;
    l.mul_(0.5);
    return every_position(l);
  };
  const Results plain = reference(f.m, metric, f.clean, f.corrupted);
  BOOST_TEST(max_diff(circuits::z_patching_sweep(f.m, metric, f.clean, f.corrupted), plain) < 1e-12);
}

BOOST_AUTO_TEST_CASE(a_metric_that_throws_propagates_and_leaves_nothing_changed) {
  Fixture f;
  const auto params = snapshot(f.m);
  int calls = 0;
  const Metric metric = [&](const ag::Tensor& l) {
    if (++calls == 5) throw std::runtime_error("metric gave up");
    return every_position(l);
  };
  BOOST_CHECK_THROW((void)circuits::z_patching_sweep(f.m, metric, f.clean, f.corrupted), std::runtime_error);
  BOOST_TEST(calls == 5);
  BOOST_TEST(ag::is_grad_enabled());
  BOOST_TEST(f.m.hook_count() == 0u);
  BOOST_TEST(snapshot(f.m) == params);
  // and the next sweep is the reference's
  const Results plain = reference(f.m, every_position, f.clean, f.corrupted);
  BOOST_TEST(max_diff(circuits::z_patching_sweep(f.m, every_position, f.clean, f.corrupted), plain) < 1e-12);
}

BOOST_AUTO_TEST_CASE(bad_metric_values_are_refused_naming_the_run) {
  Fixture f;
  check_throws<std::invalid_argument>(
      [&] { (void)circuits::z_patching_sweep(f.m, [](const ag::Tensor&) { return ag::zeros({0}); }, f.clean, f.corrupted); },
      {"z_patching_sweep", "one element", "[0]"});
  // NaN only once a patch is made: the message names the layer and head.
  int calls = 0;
  const Metric late_nan = [&](const ag::Tensor& l) {
    return ++calls > 2 ? ag::mul(every_position(l), std::nan("")) : every_position(l);
  };
  check_throws<std::invalid_argument>([&] { (void)circuits::z_patching_sweep(f.m, late_nan, f.clean, f.corrupted); },
                                      {"z_patching_sweep", "not finite", "layer 0", "head 0"});
}

// ---- hostile tokens ----

BOOST_AUTO_TEST_CASE(tokens_out_of_vocabulary_are_refused) {
  Fixture f;
  const ag::Tensor big = ag::tensor(std::vector<std::int64_t>{1, 2, 3, 7, 2, 4, 0, 6, 5, 0, 6, 5}, {2, 6});
  const ag::Tensor negative = ag::tensor(std::vector<std::int64_t>{1, 2, 3, -1, 2, 4, 0, 6, 5, 0, 6, 5}, {2, 6});
  const ag::Tensor fractional = ag::tensor(std::vector<double>{1, 2, 3, 1.5, 2, 4, 0, 6, 5, 0, 6, 5}, {2, 6});
  for (const ag::Tensor* t : {&big, &negative, &fractional}) {
    const std::string msg = error_of([&] { (void)circuits::z_patching_sweep(f.m, every_position, *t, f.corrupted); },
                                     "no exception");
    BOOST_TEST_MESSAGE("  -> " << msg);
    BOOST_TEST(msg != "no exception");
    BOOST_TEST(msg.find("embedding") != std::string::npos, msg);
    // as the corrupted tokens too
    BOOST_TEST(error_of([&] { (void)circuits::z_patching_sweep(f.m, every_position, f.clean, *t); }, "no exception") !=
               "no exception");
  }
}

BOOST_AUTO_TEST_CASE(tokens_of_bad_shape_are_refused_naming_the_shapes) {
  Fixture f;
  check_throws<std::invalid_argument>(
      [&] { (void)circuits::z_patching_sweep(f.m, every_position, ag::reshape(f.clean, {12}), ag::reshape(f.corrupted, {12})); },
      {"z_patching_sweep", "[12]"});
  check_throws<std::invalid_argument>(
      [&] { (void)circuits::z_patching_sweep(f.m, every_position, f.clean, ag::reshape(f.corrupted, {3, 4})); },
      {"z_patching_sweep", "[2, 6]", "[3, 4]"});
  check_throws<std::invalid_argument>(
      [&] { (void)circuits::z_patching_sweep(f.m, every_position, f.clean, ag::reshape(f.corrupted, {1, 2, 6})); },
      {"z_patching_sweep", "[1, 2, 6]"});
  const ag::Tensor long_clean = tokens(1, 7, 7, 1), long_corrupted = tokens(1, 7, 7, 2);
  check_throws<std::invalid_argument>(
      [&] { (void)circuits::z_patching_sweep(f.m, every_position, long_clean, long_corrupted); },
      {"[1, 7]", "n_ctx = 6"});
  const ag::Tensor none = ag::zeros({2, 0}, ag::Dtype::Int64);
  check_throws<std::invalid_argument>([&] { (void)circuits::z_patching_sweep(f.m, every_position, none, none); },
                                      {"[2, 0]"});
}

// The sweep checks the tokens' shapes itself; the tokens it cannot run are refused naming the
// sweep and which input is at fault, not only the op deep inside that failed.
BOOST_AUTO_TEST_CASE(unrunnable_tokens_are_refused_naming_the_sweep_and_the_input) {
  Fixture f;
  const ag::Tensor big = ag::tensor(std::vector<std::int64_t>{1, 2, 3, 7, 2, 4, 0, 6, 5, 0, 6, 5}, {2, 6});
  check_throws<std::invalid_argument>([&] { (void)circuits::z_patching_sweep(f.m, every_position, f.clean, big); },
                                      {"z_patching_sweep", "corrupted", "7"});
  check_throws<std::invalid_argument>([&] { (void)circuits::z_patching_sweep(f.m, every_position, big, f.corrupted); },
                                      {"z_patching_sweep", "clean", "7"});
  const ag::Tensor long_clean = tokens(1, 7, 7, 1), long_corrupted = tokens(1, 7, 7, 2);
  check_throws<std::invalid_argument>(
      [&] { (void)circuits::z_patching_sweep(f.m, every_position, long_clean, long_corrupted); },
      {"z_patching_sweep", "[1, 7]", "n_ctx = 6"});
}

BOOST_AUTO_TEST_CASE(an_empty_batch_as_the_reference_treats_it) {
  Fixture f;
  const ag::Tensor none = ag::zeros({0, 6}, ag::Dtype::Int64);
  const Metric sum = [](const ag::Tensor& l) { return ag::add(ag::sum(l), 1.0); };
  const std::string want = error_of([&] { (void)reference(f.m, sum, none, none); }, "no exception");
  const std::string got = error_of([&] { (void)circuits::z_patching_sweep(f.m, sum, none, none); }, "no exception");
  BOOST_TEST_MESSAGE("  reference -> " << want << "; sweep -> " << got);
  if (want == "no exception" && got == "no exception")
    BOOST_TEST(max_diff(circuits::z_patching_sweep(f.m, sum, none, none), reference(f.m, sum, none, none)) == 0.0);
  else
    BOOST_TEST(got.find("z_patching_sweep") != std::string::npos, got);
}

// ---- hooks ----

BOOST_AUTO_TEST_CASE(hooks_anywhere_in_the_model_are_refused) {
  Fixture f;
  const nn::ForwardHook identity = [](const ag::Tensor&, const std::string&) { return ag::Tensor(); };
  for (const std::string point : {"blocks.0.attn.z", "blocks.1.ln_1.scale", "logits", "embed_out", "blocks.0.mlp_out"}) {
    BOOST_TEST_CONTEXT("hook at " << point) {
      nn::HookHandle h = f.m.add_hook(point, identity);
      check_throws<std::invalid_argument>(
          [&] { (void)circuits::z_patching_sweep(f.m, every_position, f.clean, f.corrupted); },
          {"z_patching_sweep", "hook"});
      h.remove();
    }
  }
  // a hook added on the submodule itself, not through the model
  nn::HookHandle h = f.m.block(0).attn().add_hook("z", identity);
  check_throws<std::invalid_argument>([&] { (void)circuits::z_patching_sweep(f.m, every_position, f.clean, f.corrupted); },
                                      {"z_patching_sweep", "1 hook"});
  h.remove();
  BOOST_TEST(max_diff(circuits::z_patching_sweep(f.m, every_position, f.clean, f.corrupted),
                      reference(f.m, every_position, f.clean, f.corrupted)) < 1e-12);
}

// ---- TransformerBlock::forward_rows ----

BOOST_AUTO_TEST_CASE(forward_rows_with_zero_rows_before) {
  Fixture f;
  const nn::TransformerBlock& block = f.m.block(0);
  ag::NoGradGuard g;
  const ag::Tensor x = f.m.residual_at(f.clean, 0);
  const nn::TransformerBlock::Rows all = block.forward_rows(x, {}, {}, 6);
  const ag::Tensor empty = ag::narrow(all.keys, 1, 0, 0);
  const nn::TransformerBlock::Rows r = block.forward_rows(x, empty, ag::narrow(all.values, 1, 0, 0), 6);
  BOOST_TEST(max_abs_diff(r.output, all.output) == 0.0);
  BOOST_TEST(max_abs_diff(r.keys, all.keys) == 0.0);
}

BOOST_AUTO_TEST_CASE(forward_rows_refuses_bad_input_naming_itself) {
  Fixture f;
  const nn::TransformerBlock& block = f.m.block(0);
  ag::NoGradGuard g;
  const ag::Tensor x = f.m.residual_at(f.clean, 0);
  const nn::TransformerBlock::Rows all = block.forward_rows(x, {}, {}, 6);
  const ag::Tensor k3 = ag::narrow(all.keys, 1, 0, 3), v3 = ag::narrow(all.values, 1, 0, 3);
  const ag::Tensor rows = ag::narrow(x, 1, 3, 3);
  // R = 0
  check_throws<std::invalid_argument>([&] { (void)block.forward_rows(ag::narrow(x, 1, 0, 0), {}, {}, 1); },
                                      {"forward_rows", "R = 0"});
  // 2-D rows
  check_throws<std::invalid_argument>([&] { (void)block.forward_rows(ag::reshape(x, {12, 8}), {}, {}, 1); },
                                      {"forward_rows", "[12, 8]"});
  // k_prev of another dtype
  check_throws<std::invalid_argument>(
      [&] { (void)block.forward_rows(rows, k3.to(ag::Dtype::Float32), v3, 1); }, {"forward_rows", "Float32"});
  // k_prev and v_prev of different row counts
  check_throws<std::invalid_argument>(
      [&] { (void)block.forward_rows(rows, k3, ag::narrow(all.values, 1, 0, 2), 1); }, {"forward_rows", "[2, 2, 8]"});
  // k_prev of the wrong width
  check_throws<std::invalid_argument>(
      [&] { (void)block.forward_rows(rows, ag::narrow(k3, 2, 0, 4), ag::narrow(v3, 2, 0, 4), 1); },
      {"forward_rows", "[2, 3, 4]"});
  // k_prev 1-D and 0-d: refused by forward_rows itself, naming the shape
  const ag::Tensor flat = ag::reshape(k3, {48});
  check_throws<std::invalid_argument>([&] { (void)block.forward_rows(rows, flat, flat, 1); },
                                      {"forward_rows", "[48]"});
  const ag::Tensor scalar = ag::tensor(std::vector<double>{1.0}, {});
  check_throws<std::invalid_argument>([&] { (void)block.forward_rows(rows, scalar, scalar, 1); },
                                      {"forward_rows", "k_prev"});
  // queries out of range
  check_throws<std::invalid_argument>([&] { (void)block.forward_rows(rows, k3, v3, 4); }, {"forward_rows", "queries = 4"});
  check_throws<std::invalid_argument>([&] { (void)block.forward_rows(rows, k3, v3, -1); }, {"forward_rows", "queries = -1"});
}

BOOST_AUTO_TEST_CASE(forward_rows_refuses_rows_of_another_dtype) {
  Fixture f;  // a Float64 block
  const nn::TransformerBlock& block = f.m.block(0);
  ag::NoGradGuard g;
  const ag::Tensor x = f.m.residual_at(f.clean, 0);
  check_throws<std::invalid_argument>([&] { (void)block.forward_rows(x.to(ag::Dtype::Float32), {}, {}, 6); },
                                      {"forward_rows", "Float32"});
  check_throws<std::invalid_argument>([&] { (void)block.forward_rows(x.to(ag::Dtype::Int64), {}, {}, 6); },
                                      {"forward_rows", "Int64"});
}

BOOST_AUTO_TEST_CASE(forward_last_refuses_bad_input_naming_itself) {
  Fixture f;
  const nn::TransformerBlock& block = f.m.block(0);
  ag::NoGradGuard g;
  const ag::Tensor x = f.m.residual_at(f.clean, 0);
  check_throws<std::invalid_argument>([&] { (void)block.forward_last(ag::narrow(x, 1, 0, 0)); },
                                      {"forward_last", "[2, 0, 8]"});
  check_throws<std::invalid_argument>([&] { (void)block.forward_last(ag::reshape(x, {1, 2, 6, 8})); },
                                      {"forward_last", "[1, 2, 6, 8]"});
  check_throws<std::invalid_argument>([&] { (void)block.forward_last(ag::narrow(x, 2, 0, 5)); },
                                      {"forward_last", "[2, 6, 5]"});
  // 2-D input: the last row of the unbatched forward
  nn::AttentionOptions causal;
  causal.is_causal = true;
  const ag::Tensor one = ag::narrow(x, 0, 0, 1);
  const ag::Tensor want = ag::narrow(block.forward(one, causal).output, 1, 5, 1);
  BOOST_TEST(max_abs_diff(block.forward_last(ag::reshape(one, {6, 8})), ag::reshape(want, {1, 8})) < 1e-13);
}

// ---- TransformerBlock::after_attention ----

BOOST_AUTO_TEST_CASE(after_attention_refuses_mismatched_shapes) {
  Fixture f;
  const nn::TransformerBlock& block = f.m.block(0);
  ag::NoGradGuard g;
  const ag::Tensor x = f.m.residual_at(f.clean, 0);  // (2, 6, 8)
  // attn_out of one row would be broadcast over the six
  check_throws<std::invalid_argument>([&] { (void)block.after_attention(x, ag::narrow(x, 1, 0, 1)); },
                                      {"after_attention", "[2, 6, 8]", "[2, 1, 8]"});
  // attn_out of one sequence would be broadcast over the batch
  check_throws<std::invalid_argument>([&] { (void)block.after_attention(x, ag::narrow(x, 0, 0, 1)); },
                                      {"after_attention", "[2, 6, 8]", "[1, 6, 8]"});
  // x of one row would be broadcast
  check_throws<std::invalid_argument>([&] { (void)block.after_attention(ag::narrow(x, 1, 0, 1), x); },
                                      {"after_attention", "[2, 1, 8]", "[2, 6, 8]"});
  // the wrong width
  check_throws<std::invalid_argument>(
      [&] { (void)block.after_attention(ag::narrow(x, 2, 0, 4), ag::narrow(x, 2, 0, 4)); },
      {"after_attention", "[2, 6, 4]", "d_model = 8"});
}

BOOST_AUTO_TEST_CASE(after_attention_of_an_attention_only_block_refuses_the_wrong_width) {
  nn::TransformerBlock block({.d_model = 8, .num_heads = 2, .mlp = false, .dtype = ag::Dtype::Float64});
  block.eval();
  ag::NoGradGuard g;
  const ag::Tensor x = input({2, 6, 5}, 1);
  check_throws<std::invalid_argument>([&] { (void)block.after_attention(x, x); }, {"after_attention", "[2, 6, 5]"});
}

BOOST_AUTO_TEST_CASE(after_attention_refuses_another_dtype) {
  Fixture f;
  const nn::TransformerBlock& block = f.m.block(0);
  ag::NoGradGuard g;
  const ag::Tensor x = f.m.residual_at(f.clean, 0);
  check_throws<std::invalid_argument>([&] { (void)block.after_attention(x, x.to(ag::Dtype::Float32)); },
                                      {"after_attention", "Float32"});
}

BOOST_AUTO_TEST_CASE(saturated_attention_and_large_logits) {
  const nn::TransformerLMConfig c = base_config();
  nn::TransformerLM m = make_model(c, 5, 2.0);
  const ag::Tensor clean = tokens(2, 6, 7, 1), corrupted = tokens(2, 6, 7, 2);
  const Results plain = reference(m, every_position, clean, corrupted);
  BOOST_TEST(max_diff(circuits::z_patching_sweep(m, every_position, clean, corrupted), plain) < 1e-12);
  BOOST_TEST(largest_effect(plain) > 1e-3);
  const Results plain_last = reference(m, last_position, clean, corrupted);
  BOOST_TEST(max_diff(circuits::z_patching_sweep(m, last_position, clean, corrupted,
                                                 {.reads = circuits::MetricReads::LastPosition}),
                      plain_last) < 1e-12);
}

BOOST_AUTO_TEST_CASE(clean_equal_to_corrupted_moves_nothing) {
  Fixture f;
  for (const auto reads : {circuits::MetricReads::AllPositions, circuits::MetricReads::LastPosition}) {
    const Results r = circuits::z_patching_sweep(f.m, every_position, f.corrupted, f.corrupted, {.reads = reads});
    BOOST_TEST(largest_effect(r) < 1e-12 * std::max(1.0, std::abs(r[0].corrupted_metric)));
    BOOST_TEST(r[0].clean_metric == r[0].corrupted_metric);
  }
}

BOOST_AUTO_TEST_CASE(a_float32_model_converted_to_float64) {
  nn::TransformerLMConfig c = base_config();
  c.dtype = ag::Dtype::Float32;
  nn::TransformerLM m = make_model(c);
  m.to(ag::Dtype::Float64);
  const ag::Tensor clean = tokens(2, 6, 7, 1), corrupted = tokens(2, 6, 7, 2);
  const Results plain = reference(m, every_position, clean, corrupted);
  BOOST_TEST(max_diff(circuits::z_patching_sweep(m, every_position, clean, corrupted), plain) < 1e-12);
  const Results plain_last = reference(m, last_position, clean, corrupted);
  BOOST_TEST(max_diff(circuits::z_patching_sweep(m, last_position, clean, corrupted,
                                                 {.reads = circuits::MetricReads::LastPosition}),
                      plain_last) < 1e-12);
}

BOOST_AUTO_TEST_CASE(composed_attention_core_and_study_mode) {
  Fixture f;
  for (std::int64_t l = 0; l < 2; ++l) f.m.attn(l).set_core(nn::AttentionCore::Composed);
  f.m.attn(1).set_study(true);
  const Results plain = reference(f.m, every_position, f.clean, f.corrupted);
  BOOST_TEST(max_diff(circuits::z_patching_sweep(f.m, every_position, f.clean, f.corrupted), plain) < 1e-12);
  BOOST_TEST(f.m.hook_count() == 0u);
}

// ---- more of the sweep's options ----

BOOST_AUTO_TEST_CASE(an_unknown_metric_mode_is_refused_naming_it) {
  Fixture f;
  check_throws<std::invalid_argument>([&] {
    (void)circuits::z_patching_sweep(f.m, every_position, f.clean, f.corrupted,
                                     {.reads = static_cast<circuits::MetricReads>(7)});
  }, {"z_patching_sweep", "MetricReads 7"});
}

BOOST_AUTO_TEST_CASE(last_position_without_positions_equals_the_reference_per_head) {
  Fixture f;
  const Results plain = reference(f.m, last_position, f.clean, f.corrupted);
  const Results fast = circuits::z_patching_sweep(f.m, last_position, f.clean, f.corrupted,
                                                  {.reads = circuits::MetricReads::LastPosition, .per_position = false});
  BOOST_REQUIRE_EQUAL(fast.size(), plain.size());
  for (std::size_t l = 0; l < fast.size(); ++l) {
    BOOST_TEST(fast[l].per_head_position.empty());
    BOOST_REQUIRE_EQUAL(fast[l].per_head.size(), plain[l].per_head.size());
    for (std::size_t h = 0; h < fast[l].per_head.size(); ++h)
      BOOST_TEST(std::abs(fast[l].per_head[h] - plain[l].per_head[h]) < 1e-12 * std::max(1.0, std::abs(plain[l].per_head[h])));
    BOOST_TEST(std::abs(fast[l].clean_metric - plain[l].clean_metric) < 1e-12 * std::max(1.0, std::abs(plain[l].clean_metric)));
  }
}

// ---- forward_rows: an empty batch, and its gradients ----

BOOST_AUTO_TEST_CASE(forward_rows_of_an_empty_batch) {
  nn::TransformerBlock block({.d_model = 4, .num_heads = 2, .d_ff = 6, .dtype = ag::Dtype::Float64});
  block.eval();
  ag::NoGradGuard g;
  const ag::Tensor x = ag::zeros({0, 3, 4}, ag::Dtype::Float64);
  const nn::TransformerBlock::Rows r = block.forward_rows(x, {}, {}, 2);
  BOOST_TEST(r.output.shape() == (ag::Shape{0, 2, 4}));
  BOOST_TEST(r.keys.shape() == (ag::Shape{0, 3, 4}));
}

BOOST_AUTO_TEST_CASE(forward_rows_gradients_match_central_differences) {
  nn::TransformerBlock block({.d_model = 4, .num_heads = 2, .d_ff = 6, .dtype = ag::Dtype::Float64});
  block.eval();
  const ag::Tensor x = input({2, 3, 4}, 11), k = input({2, 2, 4}, 12), v = input({2, 2, 4}, 13);
  for (const std::int64_t queries : {1, 2, 3}) {
    check_gradients(fmt::format("forward_rows, 2 rows before, queries {}", queries),
                    [&](const ag::TensorList& in) {
                      const nn::TransformerBlock::Rows r = block.forward_rows(in[0], in[1], in[2], queries);
                      return ag::add(ag::sum(ag::mul(r.output, r.output)), ag::sum(ag::mul(r.keys, r.values)));
                    },
                    {x, k, v});
    check_gradients(fmt::format("forward_rows, no rows before, queries {}", queries),
                    [&](const ag::TensorList& in) {
                      const ag::Tensor out = block.forward_rows(in[0], {}, {}, queries).output;
                      return ag::sum(ag::mul(out, out));
                    },
                    {x});
  }
}

BOOST_AUTO_TEST_CASE(forward_rows_of_a_block_with_dropout_in_eval_mode) {
  nn::TransformerBlock block({.d_model = 4, .num_heads = 2, .d_ff = 6, .dropout = 0.3, .dtype = ag::Dtype::Float64});
  ag::NoGradGuard g;
  const ag::Tensor x = input({2, 5, 4}, 21).detach();
  check_throws<std::invalid_argument>([&] { (void)block.forward_rows(x, {}, {}, 5); }, {"forward_rows", "dropout 0.3"});
  check_throws<std::invalid_argument>([&] { (void)block.forward_last(x); }, {"dropout 0.3"});
  block.eval();
  nn::AttentionOptions causal;
  causal.is_causal = true;
  const ag::Tensor want = block.forward(x, causal).output;
  const nn::TransformerBlock::Rows all = block.forward_rows(x, {}, {}, 5);
  BOOST_TEST(max_abs_diff(all.output, want) < 1e-13);
  const nn::TransformerBlock::Rows tail =
      block.forward_rows(ag::narrow(x, 1, 2, 3), ag::narrow(all.keys, 1, 0, 2), ag::narrow(all.values, 1, 0, 2), 2);
  BOOST_TEST(max_abs_diff(tail.output, ag::narrow(want, 1, 3, 2)) < 1e-13);
}
