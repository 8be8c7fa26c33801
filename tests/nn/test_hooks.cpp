// Hook points (nn/hooks.hpp): their dotted names, forward hooks that read and replace, backward
// hooks, run_with_cache's owned snapshots and gradients, and the errors of each.
#define BOOST_TEST_MODULE hooks
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "study_support.hpp"

namespace ag = autograd;
using namespace study_support;

namespace {

const ag::Tensor kTokens = tokens({{1, 2, 3, 0}, {4, 1, 1, 2}});

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// The model's attention layer run by hand on the block's input: per-head weights (B, H, T, T).
ag::Tensor pattern_by_hand(const TinyModel& m) {
  const ag::Tensor x = ag::add(m.tok->forward(kTokens), m.pos->forward(m.positions));
  const ag::Tensor h = m.block->ln_1().forward(x);
  nn::AttentionOptions opt;
  opt.is_causal = true;
  opt.average_attn_weights = false;
  return m.block->attn().forward(h, h, h, opt).weights;
}

}  // namespace

BOOST_AUTO_TEST_CASE(hook_points_have_dotted_names_in_the_model_tree) {
  TinyModel m;
  const auto names = m.hook_point_names();
  for (const char* n : {"block.resid_pre", "block.resid_mid", "block.mlp_hidden", "block.resid_post", "block.attn.q",
                        "block.attn.k", "block.attn.v", "block.attn.raw_scores", "block.attn.attn_scores",
                        "block.attn.pattern", "block.attn.z", "block.attn.concat", "block.attn.out",
                        "block.q_input", "block.k_input", "block.v_input", "block.attn_out", "block.mlp_pre",
                        "block.mlp_out", "block.attn.result", "block.ln_1.scale", "block.ln_1.normalized",
                        "block.ln_2.scale", "block.ln_2.normalized", "ln_f.scale", "ln_f.normalized"})
    BOOST_TEST(contains(names, n), n);
  BOOST_TEST(names.size() == 26u);  // the 13 above the list's first line, and 13 more
  TinyModel bare(TinyOptions{.mlp = false});
  BOOST_TEST(contains(bare.hook_point_names(), "attn.pattern"));
  BOOST_TEST(bare.hook_point_names().size() == 14u);  // attention's 10, and LayerNorms' scale and normalized
  // A layer on its own names its points without a prefix.
  BOOST_TEST(contains(m.block->attn().hook_point_names(), "pattern"));
}

BOOST_AUTO_TEST_CASE(unknown_hook_name_throws_listing_the_names) {
  TinyModel m;
  auto none = [](const ag::Tensor&, const std::string&) { return ag::Tensor(); };
  try {
    m.add_hook("block.attn.weights", none);
    BOOST_FAIL("no throw");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(message_has(e, {"add_hook", "'block.attn.weights'", "block.attn.pattern", "block.resid_mid"}));
  }
  BOOST_CHECK_THROW(m.add_backward_hook("attn.pattern", [](const ag::Tensor&, const std::string&) {}),
                    std::invalid_argument);  // the attention is under "block"
  BOOST_CHECK_THROW(m.add_hook("block.attn.pattern", nn::ForwardHook()), std::invalid_argument);
  BOOST_TEST(m.hook_count() == 0u);
}

BOOST_AUTO_TEST_CASE(forward_hook_sees_the_value_and_its_dotted_name) {
  TinyModel m;
  const ag::Tensor want = pattern_by_hand(m);
  ag::Tensor seen;
  std::string seen_name;
  auto handle = m.add_hook("block.attn.pattern", [&](const ag::Tensor& v, const std::string& n) {
    seen = v.detach().clone();
    seen_name = n;
    return ag::Tensor();
  });
  BOOST_TEST(handle.active());
  m.forward(kTokens);
  BOOST_TEST(seen_name == "block.attn.pattern");
  BOOST_TEST(ag::shape_str(seen.shape()) == "[2, 2, 4, 4]");
  BOOST_TEST(max_abs_diff(seen, want) <= 1e-12);
  handle.remove();
  BOOST_TEST(!handle.active());
  BOOST_TEST(m.hook_count() == 0u);
  handle.remove();  // twice is harmless
}

BOOST_AUTO_TEST_CASE(an_unbatched_input_gives_batched_points) {
  nn::MultiHeadAttentionOptions o;
  o.embed_dim = 4;
  o.num_heads = 2;
  o.dtype = F64;
  nn::MultiHeadAttention mha(o);
  ag::Shape q_shape, out_shape;
  mha.add_hook("q", [&](const ag::Tensor& v, const std::string&) { q_shape = v.shape(); return ag::Tensor(); });
  mha.add_hook("out", [&](const ag::Tensor& v, const std::string&) { out_shape = v.shape(); return v * 2.0; });
  const ag::Tensor x = ag::randn({3, 4}, F64);
  const ag::Tensor out = mha.forward(x);
  BOOST_TEST(ag::shape_str(q_shape) == "[1, 2, 3, 2]");
  BOOST_TEST(ag::shape_str(out_shape) == "[1, 3, 4]");
  BOOST_TEST(ag::shape_str(out.shape()) == "[3, 4]");
  mha.remove_hooks();
  BOOST_TEST(max_abs_diff(out, mha.forward(x) * 2.0) <= 1e-12);
}

BOOST_AUTO_TEST_CASE(replacing_z_with_zeros_leaves_b_O_as_the_attention_output) {
  TinyModel m;
  {
    ag::NoGradGuard no_grad;
    ag::Tensor b_O = m.block->attn().b_O();
    b_O.copy_(ag::randn({4}, F64));  // biases start at zero: make them tell
  }
  ag::Tensor attn_out;
  m.add_hook("block.attn.z", [](const ag::Tensor& v, const std::string&) { return ag::zeros_like(v); });
  m.add_hook("block.attn.out", [&](const ag::Tensor& v, const std::string&) {
    attn_out = v.detach().clone();
    return ag::Tensor();
  });
  m.forward(kTokens);
  // out = concat · W_O + b_O with concat = 0: every row is b_O.
  const auto b_O = m.block->attn().b_O().to_vector();
  const auto got = attn_out.to_vector();
  for (std::size_t i = 0; i < got.size(); ++i) BOOST_TEST(got[i] == b_O[i % b_O.size()]);
}

BOOST_AUTO_TEST_CASE(hooks_on_one_point_run_in_order_each_on_the_previous_result) {
  TinyModel m;
  m.add_hook("block.resid_post", [](const ag::Tensor& v, const std::string&) { return v + 1.0; });
  m.add_hook("block.resid_post", [](const ag::Tensor& v, const std::string&) { return v * 3.0; });
  ag::Tensor post;
  m.add_hook("block.resid_post", [&](const ag::Tensor& v, const std::string&) { post = v.detach().clone(); return ag::Tensor(); });
  m.forward(kTokens);
  const ag::Tensor plain = nn::run_with_cache(m, [&] { return m.forward(kTokens); },
                                              {.names = {"block.resid_post"}})["block.resid_post"];
  BOOST_TEST(max_abs_diff(post, plain) <= 1e-12);  // the cache sees the value after the hooks
  m.remove_hooks();
  const ag::Tensor raw = nn::run_with_cache(m, [&] { return m.forward(kTokens); },
                                            {.names = {"block.resid_post"}})["block.resid_post"];
  BOOST_TEST(max_abs_diff(post, (raw + 1.0) * 3.0) <= 1e-12);
}

BOOST_AUTO_TEST_CASE(replacement_of_the_wrong_shape_or_dtype_throws_naming_the_point_and_both_shapes) {
  TinyModel m;
  m.add_hook("block.attn.pattern", [](const ag::Tensor&, const std::string&) { return ag::zeros({2, 4, 4}, F64); });
  try {
    m.forward(kTokens);
    BOOST_FAIL("no throw");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(message_has(e, {"'block.attn.pattern'", "[2, 4, 4]", "[2, 2, 4, 4]"}));
  }
  m.remove_hooks();
  m.add_hook("block.mlp_hidden", [](const ag::Tensor& v, const std::string&) { return v.detach().to(ag::Dtype::Float32); });
  try {
    m.forward(kTokens);
    BOOST_FAIL("no throw");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(message_has(e, {"'block.mlp_hidden'", "Float32", "Float64", "[2, 4, 8]"}));
  }
}

BOOST_AUTO_TEST_CASE(a_replacement_that_requires_grad_flows_into_the_graph) {
  TinyModel m;
  ag::Tensor s = ag::tensor({0.5, 2.0}, {1, 2, 1, 1}, F64).requires_grad_();  // one factor per head
  m.add_hook("block.attn.pattern", [&](const ag::Tensor& v, const std::string&) { return v * s; });
  auto loss = [&] { return ag::sum(ag::square(m.forward(kTokens))); };
  loss().backward();
  BOOST_REQUIRE(s.grad().defined());
  const auto g = s.grad().to_vector();
  const double eps = 1e-6;
  for (std::size_t i = 0; i < 2; ++i) {  // central differences through the hook
    ag::NoGradGuard no_grad;
    const double v = s.to_vector()[i];
    auto at = [&](double x) {
      auto vals = s.to_vector();
      vals[i] = x;
      s.copy_(ag::tensor(vals, s.shape(), F64));
      return loss().item();
    };
    const double numeric = (at(v + eps) - at(v - eps)) / (2 * eps);
    at(v);
    BOOST_TEST(std::abs(g[i] - numeric) <= 1e-6 * (1 + std::abs(numeric)));
  }
}

BOOST_AUTO_TEST_CASE(backward_hook_gets_the_gradient_at_the_point) {
  TinyModel m;
  // Route two: study mode's retained gradient of the scores.
  m.block->attn().set_study(true);
  ag::sum(ag::square(m.forward(kTokens))).backward();
  const ag::Tensor want = m.block->attn().study().grad("attn_scores").detach().clone();
  m.block->attn().set_study(false);
  ag::Tensor got;
  std::string name;
  m.add_backward_hook("block.attn.attn_scores", [&](const ag::Tensor& g, const std::string& n) {
    got = g.detach().clone();
    name = n;
  });
  ag::sum(ag::square(m.forward(kTokens))).backward();
  BOOST_TEST(name == "block.attn.attn_scores");
  BOOST_REQUIRE(got.defined());
  BOOST_TEST(max_abs_diff(got, want) <= 1e-12);
}

BOOST_AUTO_TEST_CASE(a_backward_hook_removed_before_backward_does_not_fire) {
  TinyModel m;
  int calls = 0;
  auto h = m.add_backward_hook("block.resid_mid", [&](const ag::Tensor&, const std::string&) { ++calls; });
  const ag::Tensor loss = ag::sum(m.forward(kTokens));
  h.remove();
  loss.backward();
  BOOST_TEST(calls == 0);
  m.add_backward_hook("block.resid_mid", [&](const ag::Tensor&, const std::string&) { ++calls; });
  ag::sum(m.forward(kTokens)).backward();
  BOOST_TEST(calls == 1);
}

BOOST_AUTO_TEST_CASE(resid_pre_gradient_is_the_blocks_input_gradient) {
  // The block alone on a leaf input: dL/d(resid_pre) is dL/dx (the input is used only by the block).
  TinyModel m;
  ag::Tensor x = ag::randn({2, 4, 4}, F64).requires_grad_();
  nn::ActivationCache cache = nn::run_with_cache(
      *m.block, [&] { return ag::sum(ag::square(m.block->forward(x))); }, {.names = {"resid_pre"}, .backward = true});
  BOOST_REQUIRE(x.grad().defined());
  BOOST_TEST(max_abs_diff(cache.grad("resid_pre"), x.grad()) <= 1e-12);
  BOOST_TEST(max_abs_diff(cache["resid_pre"], x) == 0.0);
}

BOOST_AUTO_TEST_CASE(run_with_cache_caches_every_point_with_gradients) {
  TinyModel m;
  const ag::Tensor want_pattern = pattern_by_hand(m);
  const std::vector<std::int64_t> targets{0, 1, 2, 3, 4, 0, 1, 2};
  nn::ActivationCache cache =
      nn::run_with_cache(m, [&] { return mean_log_prob(m.forward(kTokens), targets); }, {.backward = true});
  BOOST_TEST(cache.names().size() == 26u);
  BOOST_TEST(max_abs_diff(cache["block.attn.pattern"], want_pattern) <= 1e-12);
  for (const auto& n : cache.names()) {
    BOOST_TEST(cache.has_grad(n), n);
    BOOST_TEST(ag::shape_str(cache.grad(n).shape()) == ag::shape_str(cache[n].shape()), n);
    BOOST_TEST(!cache[n].requires_grad(), n);
  }
  BOOST_TEST(cache.output.numel() == 1);
  BOOST_TEST(m.hook_count() == 0u);
  // concat = merge(z) and out = concat · W_O + b_O: the gradients agree by hand.
  const ag::Tensor dconcat = cache.grad("block.attn.concat"), dout = cache.grad("block.attn.out");
  BOOST_TEST(max_abs_diff(dconcat, ag::matmul(dout, ag::transpose(m.block->attn().W_O(), 0, 1))) <= 1e-12);
  try {
    (void)cache["block.attn.weights"];
    BOOST_FAIL("no throw");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(message_has(e, {"'block.attn.weights'", "block.attn.pattern"}));
  }
}

BOOST_AUTO_TEST_CASE(cache_without_backward_says_gradients_were_not_cached) {
  TinyModel m;
  nn::ActivationCache cache = nn::run_with_cache(m, [&] { return m.forward(kTokens); }, {.names = {"block.attn.z"}});
  BOOST_TEST(cache.contains("block.attn.z"));
  BOOST_TEST(!cache.contains("block.attn.q"));
  try {
    (void)cache.grad("block.attn.z");
    BOOST_FAIL("no throw");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(message_has(e, {"backward = true", "'block.attn.z'"}));
  }
  BOOST_CHECK_THROW((void)cache.live("block.attn.z"), std::invalid_argument);  // keep_graph was off
  // backward asked for, but forward returns no one-element loss, or one without a graph.
  BOOST_CHECK_THROW(nn::run_with_cache(m, [&] { return m.forward(kTokens); }, {.backward = true}), std::invalid_argument);
  BOOST_CHECK_THROW(nn::run_with_cache(m, [&] { ag::NoGradGuard g; return ag::sum(m.forward(kTokens)); },
                                       {.backward = true}),
                    std::invalid_argument);
  BOOST_TEST(m.hook_count() == 0u);
}

BOOST_AUTO_TEST_CASE(run_with_cache_removes_its_hooks_when_forward_throws) {
  TinyModel m;
  auto user = m.add_hook("block.resid_mid", [](const ag::Tensor&, const std::string&) { return ag::Tensor(); });
  BOOST_CHECK_THROW(nn::run_with_cache(m,
                                       [&]() -> ag::Tensor {
                                         m.forward(kTokens);
                                         throw std::runtime_error("forward failed");
                                       },
                                       {.backward = true}),
                    std::runtime_error);
  BOOST_TEST(m.hook_count() == 1u);  // the user's hook stays, the cache's are gone
  BOOST_TEST(user.active());
  // A point reached twice in one forward throws, and leaves no hook either.
  try {
    nn::run_with_cache(m, [&] { m.forward(kTokens); return m.forward(kTokens); });
    BOOST_FAIL("no throw");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(message_has(e, {"reached twice"}));
  }
  BOOST_TEST(m.hook_count() == 1u);
}

BOOST_AUTO_TEST_CASE(cached_values_are_owned_snapshots_no_later_forward_changes) {
  TinyModel m;
  nn::ActivationCache cache = nn::run_with_cache(m, [&] { return ag::sum(m.forward(kTokens)); },
                                                 {.backward = true, .keep_graph = true});
  std::vector<std::pair<std::string, std::vector<double>>> before;
  for (const auto& n : cache.names()) before.emplace_back(n, cache[n].to_vector());
  const auto grad_before = cache.grad("block.attn.pattern").to_vector();
  const ag::Tensor other = tokens({{0, 0, 1, 1}, {2, 2, 3, 3}});
  ag::sum(m.forward(other)).backward();  // with a graph
  {
    ag::NoGradGuard no_grad;
    m.forward(other);
    for (auto& p : m.parameters()) p.add_(ag::ones_like(p));  // and the weights change in place
    for (const auto& n : cache.names()) {  // and so do the tensors of the first forward's graph
      ag::Tensor live = cache.live(n).detach();
      live.add_(ag::ones_like(live));
    }
  }
  for (const auto& [n, v] : before) BOOST_TEST(cache[n].to_vector() == v, n);
  BOOST_TEST(cache.grad("block.attn.pattern").to_vector() == grad_before);
  // The live tensor is the one in the forward's graph.
  BOOST_TEST(cache.live("block.attn.pattern").requires_grad());
  BOOST_TEST(cache.live("block.attn.pattern").grad_fn() != nullptr);
}

BOOST_AUTO_TEST_CASE(no_hook_and_removed_hooks_give_the_hook_free_result_exactly) {
  // Float32 on the fused core: a composed run differs in the last bits, so equality shows the
  // hook-free path ran again once the hook was removed.
  nn::MultiHeadAttentionOptions o;
  o.embed_dim = 8;
  o.num_heads = 2;
  nn::MultiHeadAttention mha(o);
  const ag::Tensor x = ag::randn({2, 5, 8});
  const auto plain = mha.forward(x).to_vector();
  auto h = mha.add_hook("pattern", [](const ag::Tensor&, const std::string&) { return ag::Tensor(); });
  const auto hooked = mha.forward(x).to_vector();
  h.remove();
  BOOST_TEST(mha.forward(x).to_vector() == plain);
  for (std::size_t i = 0; i < plain.size(); ++i) BOOST_TEST(std::abs(hooked[i] - plain[i]) <= 1e-5);
}

BOOST_AUTO_TEST_CASE(gradcheck_through_a_replacing_hook_passes) {
  TinyModel m;
  m.add_hook("block.attn.pattern", [](const ag::Tensor& v, const std::string&) { return 2.0 * v; });
  m.add_hook("block.mlp_hidden", [](const ag::Tensor& v, const std::string&) { return ag::tanh(v); });
  const std::vector<std::int64_t> targets{0, 1, 2, 3, 4, 0, 1, 2};
  auto r = ag::gradcheck([&](const std::vector<ag::Tensor>&) { return mean_log_prob(m.forward(kTokens), targets); },
                         m.parameters());
  BOOST_TEST(r.ok, fmt::format("{}", r));
}

namespace {

// y = 2·x whose backward wrongly returns 3·dy: a hook built on it must fail gradcheck.
struct WrongDouble : ag::Function<WrongDouble> {
  static constexpr const char* name = "wrong_double";
  static ag::Tensor forward(ag::FunctionCtx&, const ag::Tensor& x) { return x * 2.0; }
  static ag::TensorList backward(ag::FunctionCtx&, const ag::TensorList& g) { return {g[0] * 3.0}; }
};

}  // namespace

BOOST_AUTO_TEST_CASE(gradcheck_through_a_hook_with_a_wrong_gradient_fails) {
  TinyModel m;
  m.add_hook("block.attn.pattern", [](const ag::Tensor& v, const std::string&) { return WrongDouble::apply(v); });
  const std::vector<std::int64_t> targets{0, 1, 2, 3, 4, 0, 1, 2};
  auto r = ag::gradcheck([&](const std::vector<ag::Tensor>&) { return mean_log_prob(m.forward(kTokens), targets); },
                         {m.block->attn().W_Q()});
  BOOST_TEST(!r.ok);
}

BOOST_AUTO_TEST_CASE(study_mode_after_a_forward_without_a_graph_says_why_there_is_no_gradient) {
  TinyModel m;
  nn::MultiHeadAttention& attn = m.block->attn();
  attn.set_study(true);
  BOOST_CHECK_THROW(attn.study(), std::invalid_argument);  // no forward yet
  ag::sum(m.forward(kTokens)).backward();
  BOOST_TEST(attn.study().has_graph);
  const auto pattern_grad = attn.study().grad("pattern").to_vector();  // the fields have the hook points' names
  for (const char* wrong : {"attention", "weights", "scores", "context"}) {  // the fields' one name each
    try {
      (void)attn.study().grad(wrong);
      BOOST_FAIL("no throw");
    } catch (const std::invalid_argument& e) {
      BOOST_TEST(message_has(e, {fmt::format("'{}'", wrong), "attn_scores", "pattern", "z"}));
    }
  }
  {
    ag::NoGradGuard no_grad;
    m.forward(tokens({{3, 2, 0, 0}, {4, 4, 1, 3}}));  // replaces the study: live tensors of this forward, without a graph
  }
  BOOST_TEST(!attn.study().has_graph);
  BOOST_TEST(attn.study().pattern.defined());  // the values are there
  try {
    (void)attn.study().grad("attn_scores");
    BOOST_FAIL("no throw");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(message_has(e, {"AttentionStudy::grad", "'attn_scores'", "no graph", "NoGradGuard", "run_with_cache"}));
  }
  try {
    (void)nn::AttentionStudy::head(attn.study().attn_scores.grad(), 0);
    BOOST_FAIL("no throw");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(message_has(e, {"AttentionStudy::head", ".grad() not computed yet", "NoGradGuard"}));
  }
  // A forward with a graph but no backward yet.
  m.forward(kTokens);
  try {
    (void)attn.study().grad("z");
    BOOST_FAIL("no throw");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(message_has(e, {"'z'", "no backward"}));
  }
  BOOST_TEST(!pattern_grad.empty());
}
