// Hostile input to hook points, run_with_cache and nn::study: every misuse either works as
// documented or throws naming the function and what is at fault; no hook is left behind and no
// parameter gradient is lost.
#define BOOST_TEST_MODULE study_hostile
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "study_support.hpp"

namespace ag = autograd;
using namespace study_support;

namespace {

auto metric_of(TinyModel& m) {
  return [&m](const ag::Tensor& x) { return mean_log_prob(m.forward(x), kTargets); };
}

ag::Tensor loss_of(TinyModel& m, const ag::Tensor& x) { return mean_log_prob(m.forward(x), kTargets); }

template <class F>
void check_throws(F&& f, const std::vector<std::string>& parts) {
  bool thrown = false;
  try {
    f();
  } catch (const std::exception& e) {
    thrown = true;
    BOOST_TEST_MESSAGE("thrown: " << e.what());
    BOOST_TEST(message_has(e, parts), "message: " << e.what());
  }
  BOOST_TEST(thrown, "no exception; expected one mentioning " << parts.front());
}

const nn::ForwardHook keep = [](const ag::Tensor&, const std::string&) { return ag::Tensor(); };

}  // namespace

BOOST_AUTO_TEST_SUITE(handles)

BOOST_AUTO_TEST_CASE(remove_twice_copies_and_after_the_module_is_gone_are_no_ops) {
  nn::HookHandle copy;
  {
    TinyModel m;
    nn::HookHandle h = m.add_hook("block.attn.z", keep);
    copy = h;
    nn::HookHandle moved = std::move(h);
    BOOST_TEST(copy.active());
    BOOST_TEST(moved.active());
    moved.remove();
    BOOST_TEST(!copy.active());
    copy.remove();
    moved.remove();
    BOOST_TEST(m.hook_count() == 0u);
    copy = m.add_hook("block.attn.q", keep);
  }
  BOOST_TEST(!copy.active());
  copy.remove();
  nn::HookHandle empty;
  BOOST_TEST(!empty.active());
  empty.remove();
}

BOOST_AUTO_TEST_CASE(remove_hooks_then_handle_remove_keeps_the_count_right) {
  TinyModel m;
  auto a = m.add_hook("block.attn.z", keep);
  m.remove_hooks();
  a.remove();
  BOOST_TEST(m.hook_count() == 0u);
  auto b = m.add_hook("block.attn.z", keep);
  a.remove();  // a's id is not b's
  BOOST_TEST(b.active());
  BOOST_TEST(m.hook_count() == 1u);
}

BOOST_AUTO_TEST_CASE(bad_names_throw_listing_the_points) {
  TinyModel m;
  for (const std::string& name : std::vector<std::string>{"", ".", "block.", "block.attn", "attn.z", "block.attn.z.", "block..attn.z",
                                 std::string("block.attn.z\n\x01", 15)})
    check_throws([&] { m.add_hook(name, keep); }, {"add_hook", "block.attn.z"});
  check_throws([&] { m.add_backward_hook("nope", [](const ag::Tensor&, const std::string&) {}); },
               {"add_backward_hook", "block.attn.z"});
  check_throws([&] { m.add_hook("block.attn.z", nn::ForwardHook()); }, {"add_hook", "empty"});
  BOOST_TEST(m.hook_count() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(hooks_while_running)

BOOST_AUTO_TEST_CASE(a_hook_removed_by_an_earlier_hook_in_the_same_pass_does_not_fire) {
  TinyModel m;
  int second_calls = 0;
  nn::HookHandle second;
  m.add_hook("block.attn.z", [&](const ag::Tensor&, const std::string&) {
    second.remove();
    return ag::Tensor();
  });
  second = m.add_hook("block.attn.z", [&](const ag::Tensor&, const std::string&) {
    ++second_calls;
    return ag::Tensor();
  });
  m.forward(kClean);
  BOOST_TEST(second_calls == 0);
}

BOOST_AUTO_TEST_CASE(remove_hooks_from_inside_a_hook_stops_the_rest) {
  TinyModel m;
  int later = 0;
  m.add_hook("block.attn.z", [&](const ag::Tensor&, const std::string&) {
    m.remove_hooks();
    return ag::Tensor();
  });
  m.add_hook("block.attn.z", [&](const ag::Tensor& v, const std::string&) {
    ++later;
    return ag::zeros_like(v);
  });
  m.add_hook("block.resid_post", [&](const ag::Tensor&, const std::string&) {
    ++later;
    return ag::Tensor();
  });
  m.forward(kClean);
  BOOST_TEST(later == 0);
  BOOST_TEST(m.hook_count() == 0u);
}

BOOST_AUTO_TEST_CASE(a_hook_added_while_running_fires_from_the_next_forward) {
  TinyModel m;
  int added_calls = 0;
  bool once = false;
  m.add_hook("block.attn.z", [&](const ag::Tensor&, const std::string&) {
    if (!once) {
      once = true;
      m.add_hook("block.attn.z", [&](const ag::Tensor&, const std::string&) {
        ++added_calls;
        return ag::Tensor();
      });
    }
    return ag::Tensor();
  });
  m.forward(kClean);
  BOOST_TEST(added_calls == 0);
  m.forward(kClean);
  BOOST_TEST(added_calls == 1);
}

BOOST_AUTO_TEST_CASE(a_hook_that_calls_forward_once_works) {
  TinyModel m;
  const ag::Tensor plain = m.forward(kClean).detach().clone();
  bool inside = false;
  m.add_hook("block.attn.z", [&](const ag::Tensor&, const std::string&) {
    if (!inside) {
      inside = true;
      m.forward(kCorrupted);
      inside = false;
    }
    return ag::Tensor();
  });
  BOOST_TEST(max_abs_diff(m.forward(kClean), plain) <= 1e-12);
}

BOOST_AUTO_TEST_CASE(a_hook_that_recurses_without_end_throws_instead_of_overflowing_the_stack) {
  TinyModel m;
  m.add_hook("block.attn.z", [&](const ag::Tensor&, const std::string&) {
    m.forward(kClean);
    return ag::Tensor();
  });
  check_throws([&] { m.forward(kClean); }, {"block.attn.z", "forward"});
  m.remove_hooks();
  BOOST_CHECK_NO_THROW(m.forward(kClean));
  auto h = m.add_hook("block.attn.z", keep);  // the depth was reset by the throw
  BOOST_CHECK_NO_THROW(m.forward(kClean));
  h.remove();
}

BOOST_AUTO_TEST_CASE(a_throwing_hook_propagates_and_the_model_keeps_working) {
  TinyModel m;
  auto h = m.add_hook("block.attn.pattern", [](const ag::Tensor&, const std::string&) -> ag::Tensor {
    throw std::runtime_error("hook failed");
  });
  check_throws([&] { m.forward(kClean); }, {"hook failed"});
  h.remove();
  BOOST_CHECK_NO_THROW(m.forward(kClean));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(replacements)

BOOST_AUTO_TEST_CASE(wrong_rank_shape_dtype_throw_naming_the_dotted_point) {
  TinyModel m;
  for (const std::string point : {"block.attn.q", "block.attn.pattern", "block.attn.z", "block.attn.concat",
                                  "block.attn.out", "block.resid_mid", "block.mlp_hidden"}) {
    for (int kind = 0; kind < 3; ++kind) {
      auto h = m.add_hook(point, [kind](const ag::Tensor& v, const std::string&) {
        if (kind == 0) return ag::zeros({1}, v.dtype());
        if (kind == 1) return ag::unsqueeze(v, 0).detach();
        return v.to(ag::Dtype::Float32);
      });
      check_throws([&] { m.forward(kClean); }, {"forward hook", point});
      h.remove();
    }
  }
  BOOST_TEST(m.hook_count() == 0u);
}

BOOST_AUTO_TEST_CASE(a_replacement_from_another_graph_passes_gradients_to_it) {
  TinyModel m;
  ag::Tensor other = ag::zeros({2, 2, 4, 2}, F64).requires_grad_(true);
  auto h = m.add_hook("block.attn.z", [&](const ag::Tensor& v, const std::string&) { return v + other; });
  loss_of(m, kClean).backward();
  BOOST_TEST(other.grad().defined());
  h.remove();
}

BOOST_AUTO_TEST_CASE(a_module_called_twice_in_one_forward_is_refused_by_run_with_cache) {
  TinyModel m;
  check_throws([&] {
    nn::run_with_cache(m, [&] { return ag::add(m.forward(kClean), m.forward(kClean)); },
                       {.names = {"block.attn.z"}});
  }, {"run_with_cache", "block.attn.z", "twice"});
  BOOST_TEST(m.hook_count() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(cache)

BOOST_AUTO_TEST_CASE(duplicate_names_throw_naming_the_duplicate_before_forward) {
  TinyModel m;
  int runs = 0;
  check_throws([&] {
    nn::run_with_cache(m, [&] { ++runs; return m.forward(kClean); }, {.names = {"block.attn.z", "block.attn.z"}});
  }, {"run_with_cache", "block.attn.z", "more than once"});
  BOOST_TEST(runs == 0);
  BOOST_TEST(m.hook_count() == 0u);
}

BOOST_AUTO_TEST_CASE(an_unknown_name_throws_and_adds_no_hook) {
  TinyModel m;
  check_throws([&] { nn::run_with_cache(m, [&] { return m.forward(kClean); }, {.names = {"block.attn.z", "zz"}}); },
               {"zz", "block.attn.z"});
  BOOST_TEST(m.hook_count() == 0u);
}

BOOST_AUTO_TEST_CASE(a_point_the_forward_never_reached_says_so) {
  TinyModel m;
  const auto cache = nn::run_with_cache(m, [&] { return m.tok->forward(kClean); }, {.names = {"block.attn.z"}});
  check_throws([&] { (void)cache["block.attn.z"]; }, {"block.attn.z", "never reached"});
}

BOOST_AUTO_TEST_CASE(backward_with_a_bad_output_throws_and_leaves_no_hook) {
  TinyModel m;
  check_throws([&] { nn::run_with_cache(m, [&] { return m.forward(kClean); }, {.backward = true}); },
               {"run_with_cache", "one-element", "[2, 4, 5]"});
  check_throws([&] { nn::run_with_cache(m, [&] { return ag::Tensor(); }, {.backward = true}); },
               {"run_with_cache", "undefined"});
  check_throws([&] {
    nn::run_with_cache(m, [&] {
      ag::NoGradGuard g;
      return loss_of(m, kClean);
    }, {.backward = true});
  }, {"run_with_cache", "NoGradGuard"});
  check_throws([&] { nn::run_with_cache(m, [&] { return loss_of(m, kClean).detach(); }, {.backward = true}); },
               {"run_with_cache", "require grad"});
  check_throws([&] { nn::run_with_cache(m, std::function<ag::Tensor()>()); }, {"run_with_cache", "empty"});
  BOOST_TEST(m.hook_count() == 0u);
}

BOOST_AUTO_TEST_CASE(every_grad_is_there_for_dropout_masks_unbatched_and_float32) {
  TinyModel m;
  m.train();
  const auto all = nn::run_with_cache(m, [&] { return loss_of(m, kClean); }, {.backward = true});
  for (const auto& n : all.names()) BOOST_TEST(all.has_grad(n), n);
  BOOST_TEST(all.names().size() == m.hook_point_names().size());
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(study_hooks)

BOOST_AUTO_TEST_CASE(head_out_of_range_throws_naming_H) {
  TinyModel m;
  for (std::int64_t head : {std::int64_t{-1}, std::int64_t{2}, std::numeric_limits<std::int64_t>::max(),
                            std::numeric_limits<std::int64_t>::min()}) {
    auto h = m.add_hook("block.attn.z", nn::study::zero_ablate_head(head));
    check_throws([&] { m.forward(kClean); }, {"zero_ablate_head", "H = 2"});
    h.remove();
  }
  auto z = nn::run_with_cache(m, [&] { return m.forward(kClean); }, {.names = {"block.attn.z"}})["block.attn.z"];
  for (std::int64_t pos : {std::int64_t{-2}, std::int64_t{4}, std::numeric_limits<std::int64_t>::max()}) {
    auto h = m.add_hook("block.attn.z", nn::study::patch_head(0, z, pos));
    check_throws([&] { m.forward(kClean); }, {"patch_head", "T = 4"});
    h.remove();
  }
}

BOOST_AUTO_TEST_CASE(mean_and_source_of_the_wrong_shape_or_undefined_throw) {
  TinyModel m;
  auto z = nn::run_with_cache(m, [&] { return m.forward(kClean); }, {.names = {"block.attn.z"}})["block.attn.z"];
  check_throws([&] { nn::study::mean_ablate_head(0, ag::Tensor()); }, {"mean_ablate_head", "undefined"});
  check_throws([&] { nn::study::patch_head(0, ag::Tensor()); }, {"patch_head", "undefined"});
  check_throws([&] { nn::study::batch_mean(ag::zeros({2, 2}, F64)); }, {"batch_mean", "[2, 2]"});
  // (B, H, T, d_k), not (H, T, d_k): refused when the hook is made, pointing to batch_mean.
  check_throws([&] { nn::study::mean_ablate_head(0, z); }, {"mean_ablate_head", "[2, 2, 4, 2]", "batch_mean"});
  auto h = m.add_hook("block.attn.z", nn::study::mean_ablate_head(0, ag::zeros({2, 3, 2}, F64)));  // T = 3, not 4
  check_throws([&] { m.forward(kClean); }, {"mean_ablate_head", "[2, 3, 2]", "[2, 4, 2]"});
  h.remove();
  h = m.add_hook("block.attn.z", nn::study::patch_head(0, ag::narrow(z, 0, 0, 1)));
  check_throws([&] { m.forward(kClean); }, {"patch_head", "[1, 2, 4, 2]"});
  h.remove();
  h = m.add_hook("block.resid_mid", nn::study::zero_ablate_head(0));
  check_throws([&] { m.forward(kClean); }, {"zero_ablate_head", "block.resid_mid"});
  h.remove();
}

BOOST_AUTO_TEST_CASE(non_finite_mean_or_source_throws) {
  TinyModel m;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  ag::Tensor bad_mean = ag::full({2, 4, 2}, nan, F64);
  check_throws([&] { nn::study::mean_ablate_head(0, bad_mean); }, {"mean_ablate_head", "not finite"});
  check_throws([&] { nn::study::patch_head(0, ag::full({2, 2, 4, 2}, nan, F64)); }, {"patch_head", "not finite"});
}

BOOST_AUTO_TEST_CASE(float32_z_is_ablated_in_float32) {
  ag::Generator gen(1);
  nn::MultiHeadAttentionOptions o;
  o.embed_dim = 4;
  o.num_heads = 2;
  o.dtype = ag::Dtype::Float32;
  nn::MultiHeadAttention attn(o, gen);
  const ag::Tensor x = ag::randn({2, 3, 4}, ag::Dtype::Float32, gen);
  auto h = attn.add_hook("z", nn::study::zero_ablate_head(1));
  const ag::Tensor y = attn.forward(x, x, x).output;
  BOOST_TEST((y.dtype() == ag::Dtype::Float32));
  const auto z = nn::run_with_cache(attn, [&] { return attn.forward(x, x, x).output; }, {.names = {"z"}})["z"];
  const auto v = ag::narrow(z, 1, 1, 1).to_vector();
  for (double e : v) BOOST_TEST(e == 0.0);
  h.remove();
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(patching)

BOOST_AUTO_TEST_CASE(bad_metrics_throw_and_leave_no_hook) {
  TinyModel m;
  const std::vector<std::function<ag::Tensor(const ag::Tensor&)>> runs = {
      [&](const ag::Tensor& x) { return m.forward(x); },
      [&](const ag::Tensor&) { return ag::Tensor(); },
  };
  for (const auto& run : runs) {
    check_throws([&] { nn::study::activation_patching(m, "block.attn.z", run, kClean, kCorrupted); },
                 {"activation_patching", "one-element"});
    BOOST_TEST(m.hook_count() == 0u);
  }
}

BOOST_AUTO_TEST_CASE(a_nan_metric_throws_naming_the_run) {
  TinyModel m;
  int calls = 0;
  auto run = [&](const ag::Tensor& x) {
    ++calls;
    const ag::Tensor metric = mean_log_prob(m.forward(x), kTargets);
    return calls == 5 ? metric * std::numeric_limits<double>::quiet_NaN() : metric;
  };
  check_throws([&] { nn::study::activation_patching(m, "block.attn.z", run, kClean, kCorrupted); },
               {"activation_patching", "not finite"});
  BOOST_TEST(m.hook_count() == 0u);
}

BOOST_AUTO_TEST_CASE(a_run_that_throws_midway_leaves_no_hook_and_keeps_the_grads) {
  TinyModel m;
  loss_of(m, kClean).backward();
  std::vector<std::vector<double>> before;
  for (const auto& p : m.parameters()) before.push_back(p.grad().to_vector());
  auto user = m.add_hook("block.resid_pre", keep);
  for (int fail_at : {1, 2, 3, 7}) {
    int calls = 0;
    auto run = [&](const ag::Tensor& x) {
      if (++calls == fail_at) throw std::runtime_error("run failed");
      return mean_log_prob(m.forward(x), kTargets);
    };
    check_throws([&] { nn::study::attribution_patching(m, "block.attn.z", run, kClean, kCorrupted); },
                 {"run failed"});
    calls = 0;
    check_throws([&] { nn::study::activation_patching(m, "block.attn.z", run, kClean, kCorrupted); },
                 {"run failed"});
    BOOST_TEST(m.hook_count() == 1u);
    BOOST_TEST(user.active());
    const auto params = m.parameters();
    for (std::size_t i = 0; i < params.size(); ++i) BOOST_TEST(params[i].grad().to_vector() == before[i]);
  }
}

BOOST_AUTO_TEST_CASE(clean_and_corrupted_inputs_of_different_shapes_throw_naming_both) {
  TinyModel m;
  const ag::Tensor shorter = tokens({{3, 2, 0}, {4, 4, 1}});
  const ag::Tensor one = tokens({{3, 2, 0, 0}});
  (void)shorter;  // the model's positions fix T = 4: a shorter input fails in the model itself
  auto run = [&](const ag::Tensor& x) { return ag::mean(ag::log_softmax(m.forward(x), -1)); };
  for (const ag::Tensor& other : {one}) {
    check_throws([&] { nn::study::activation_patching(m, "block.attn.z", run, kClean, other); },
                 {"activation_patching", "block.attn.z", "[2, 2, 4, 2]", "[1, 2, 4, 2]"});
    check_throws([&] { nn::study::attribution_patching(m, "block.attn.z", run, kClean, other); },
                 {"attribution_patching", "block.attn.z", "[2, 2, 4, 2]", "[1, 2, 4, 2]"});
    BOOST_TEST(m.hook_count() == 0u);
  }
}

BOOST_AUTO_TEST_CASE(a_non_z_or_unknown_point_throws) {
  TinyModel m;
  check_throws([&] { nn::study::activation_patching(m, "block.resid_mid", metric_of(m), kClean, kCorrupted); },
               {"activation_patching", "block.resid_mid"});
  check_throws([&] { nn::study::activation_patching(m, "block.attn.zz", metric_of(m), kClean, kCorrupted); },
               {"block.attn.zz", "block.attn.z"});
  BOOST_TEST(m.hook_count() == 0u);
}

BOOST_AUTO_TEST_CASE(attribution_patching_when_the_metric_does_not_depend_on_z_estimates_zero) {
  TinyModel m;
  // The metric reads only the token embedding: z has no influence on it.
  auto run = [&](const ag::Tensor& x) {
    m.forward(x);
    return ag::mean(m.tok->forward(x));
  };
  const auto r = nn::study::attribution_patching(m, "block.attn.z", run, kClean, kCorrupted);
  for (double e : r.estimate_per_head) BOOST_TEST(e == 0.0);
  BOOST_TEST(r.max_abs_error == 0.0);
  BOOST_TEST(m.hook_count() == 0u);
}

BOOST_AUTO_TEST_CASE(attribution_patching_keeps_the_inputs_grads) {
  TinyModel m;
  const auto r = nn::study::attribution_patching(m, "block.attn.z", metric_of(m), kClean, kCorrupted);
  BOOST_TEST(std::isfinite(r.max_abs_error));
  for (const auto& p : m.parameters()) BOOST_TEST(!p.grad().defined());
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(readings)

BOOST_AUTO_TEST_CASE(attention_times_gradient_refuses_caches_without_grads_or_of_another_point) {
  TinyModel m;
  const auto no_grad = nn::run_with_cache(m, [&] { return loss_of(m, kClean); }, {.names = {"block.attn.pattern"}});
  check_throws([&] { nn::study::attention_times_gradient(no_grad, "block.attn.pattern"); }, {"backward = true"});
  const auto with = nn::run_with_cache(m, [&] { return loss_of(m, kClean); }, {.backward = true});
  check_throws([&] { nn::study::attention_times_gradient(with, "block.attn.z"); },
               {"attention_times_gradient", "block.attn.z", "pattern"});
  check_throws([&] { nn::study::attention_times_gradient(with, "block.resid_mid"); },
               {"attention_times_gradient", "block.resid_mid"});
  check_throws([&] { nn::study::attention_times_gradient(with, "nope"); }, {"nope", "block.attn.pattern"});
  BOOST_CHECK_NO_THROW(nn::study::attention_times_gradient(with, "block.attn.pattern"));
}

BOOST_AUTO_TEST_CASE(head_results_and_dla_refuse_wrong_shapes) {
  TinyModel m;
  auto& attn = m.attention();
  check_throws([&] { nn::study::head_results(attn, ag::zeros({2, 3, 4, 2}, F64)); }, {"head_results", "[2, 3, 4, 2]"});
  check_throws([&] { nn::study::head_results(attn, ag::zeros({2, 2, 4, 3}, F64)); }, {"head_results", "[2, 2, 4, 3]"});
  check_throws([&] { nn::study::head_results(attn, ag::zeros({2, 4, 2}, F64)); }, {"head_results", "[2, 4, 2]"});
  check_throws([&] { nn::study::head_results(attn, ag::Tensor()); }, {"head_results", "z is undefined"});
  check_throws([&] { nn::study::head_results(attn, ag::zeros({2, 2, 4, 2}, ag::Dtype::Float32)); },
               {"head_results", "Float32"});
  const ag::Tensor r = nn::study::head_results(attn, ag::zeros({2, 2, 4, 2}, F64));
  check_throws([&] { nn::study::direct_logit_attribution(r, ag::zeros({5}, F64)); },
               {"direct_logit_attribution", "[5]", "[4]"});
  check_throws([&] { nn::study::direct_logit_attribution(r, ag::zeros({1, 4, 4}, F64)); },
               {"direct_logit_attribution", "[1, 4, 4]"});
  check_throws([&] { nn::study::direct_logit_attribution(r, ag::Tensor()); }, {"direct_logit_attribution", "direction is undefined"});
  check_throws([&] { nn::study::direct_logit_attribution(ag::zeros({2, 2}, F64), ag::zeros({2}, F64)); },
               {"direct_logit_attribution", "[2, 2]"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(layer_variants)

namespace {

struct Variant {
  std::string label;
  bool bias_kv = false, zero_attn = false, masks = false, unbatched = false;
  std::int64_t kdim = 0;
  double dropout = 0;
  nn::AttentionCore core = nn::AttentionCore::Fused;
  bool study = false;
};

// Every point's gradient from run_with_cache equals the gradient with respect to a copy of the
// value fed back in through a replacing hook (a second route to dL/d value).
void check_variant(const Variant& c) {
  ag::Generator gen(11);
  nn::MultiHeadAttentionOptions o;
  o.embed_dim = 4;
  o.num_heads = 2;
  o.dtype = F64;
  o.add_bias_kv = c.bias_kv;
  o.add_zero_attn = c.zero_attn;
  o.kdim = c.kdim;
  o.vdim = c.kdim;
  o.dropout = c.dropout;
  o.core = c.core;
  o.study = c.study;
  nn::MultiHeadAttention attn(o, gen);
  if (c.dropout > 0) attn.train(); else attn.eval();
  const std::int64_t kd = c.kdim == 0 ? 4 : c.kdim;
  ag::Tensor q = c.unbatched ? ag::randn({3, 4}, F64, gen) : ag::randn({2, 3, 4}, F64, gen);
  ag::Tensor kv = c.unbatched ? ag::randn({5, kd}, F64, gen) : ag::randn({2, 5, kd}, F64, gen);
  nn::AttentionOptions ao;
  if (c.masks) {
    ao.key_padding_mask = c.unbatched ? ag::tensor({0, 0, 0, 0, 1}, {5}, F64)
                                      : ag::tensor({0, 0, 0, 0, 1, 0, 1, 0, 0, 0}, {2, 5}, F64);
    ao.attn_mask = ag::zeros({3, 5}, F64);
  }
  const ag::Tensor w = ag::randn(c.unbatched ? ag::Shape{3, 4} : ag::Shape{2, 3, 4}, F64, gen);
  auto loss = [&] { return ag::sum(attn.forward(q, kv, kv, ao).output * w); };
  const auto cache = nn::run_with_cache(attn, loss, {.backward = true});
  for (const std::string& name : attn.hook_point_names()) {
    BOOST_TEST_CONTEXT(c.label << " at " << name) {
      BOOST_REQUIRE(cache.contains(name));
      BOOST_REQUIRE(cache.has_grad(name));
      if (c.dropout > 0) continue;  // a second forward draws another mask
      // Second route: the value as a leaf, put in place by a hook; its .grad is dL/d value.
      ag::Tensor leaf = cache[name].clone().requires_grad_(true);
      auto h = attn.add_hook(name, [&](const ag::Tensor&, const std::string&) { return leaf; });
      loss().backward();
      h.remove();
      BOOST_TEST(max_abs_diff(leaf.grad(), cache.grad(name)) <= 1e-12);
      const bool before_pattern = name == "q" || name == "k" || name == "v" || name == "raw_scores" ||
                                  name == "attn_scores" || name == "pattern";
      if (c.study && before_pattern) BOOST_CHECK_NO_THROW(attn.study().grad("pattern"));
    }
  }
  BOOST_TEST(attn.hook_count() == 0u);
}

}  // namespace

BOOST_AUTO_TEST_CASE(cache_gradients_match_a_second_route_on_every_layer_variant) {
  const std::vector<Variant> variants = {
      {.label = "plain"},
      {.label = "bias_kv", .bias_kv = true},
      {.label = "zero_attn", .zero_attn = true},
      {.label = "masks", .masks = true},
      {.label = "unbatched", .unbatched = true},
      {.label = "unbatched masks", .masks = true, .unbatched = true},
      {.label = "kdim 3", .kdim = 3},
      {.label = "all", .bias_kv = true, .zero_attn = true, .masks = true, .kdim = 3},
      {.label = "composed", .core = nn::AttentionCore::Composed},
      {.label = "study", .study = true},
      {.label = "dropout", .dropout = 0.5},
  };
  for (const auto& v : variants) check_variant(v);
}

BOOST_AUTO_TEST_CASE(study_mode_reads_the_hooked_values) {
  ag::Generator gen(2);
  nn::MultiHeadAttentionOptions o;
  o.embed_dim = 4;
  o.num_heads = 2;
  o.dtype = F64;
  o.study = true;
  nn::MultiHeadAttention attn(o, gen);
  const ag::Tensor x = ag::randn({2, 3, 4}, F64, gen);
  auto h = attn.add_hook("z", nn::study::zero_ablate_head(0));
  ag::sum(attn.forward(x, x, x).output).backward();
  const auto z0 = nn::AttentionStudy::head(attn.study().value("z"), 0, 1).to_vector();
  for (double e : z0) BOOST_TEST(e == 0.0);
  BOOST_CHECK_NO_THROW(attn.study().grad("pattern"));
  h.remove();
  // A hook that replaces concat with a constant: no gradient reaches the points before it.
  auto c = attn.add_hook("concat", [](const ag::Tensor& v, const std::string&) { return ag::zeros_like(v.detach()); });
  const ag::Tensor y = attn.forward(x, x, x).output;
  if (y.requires_grad()) ag::sum(y).backward();
  check_throws([&] { (void)attn.study().grad("pattern"); }, {"AttentionStudy::grad", "pattern"});
  c.remove();
  check_throws([&] { (void)nn::AttentionStudy::head(attn.study().value("z"), 2, 0); }, {"AttentionStudy::head", "head 2"});
  check_throws([&] { (void)nn::AttentionStudy::head(attn.study().value("z"), 0, -1); }, {"AttentionStudy::head"});
  check_throws([&] { (void)attn.study().value("zz"); }, {"AttentionStudy", "zz"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(messages)

BOOST_AUTO_TEST_CASE(undefined_tensors_say_which_and_why) {
  ag::Tensor t;
  check_throws([&] { (void)t.to_vector(); }, {"undefined"});
  ag::Tensor x = ag::ones({2}, F64).requires_grad_(true);
  x.set_name("x");
  check_throws([&] { (void)x.grad().to_vector(); }, {"undefined"});
  check_throws([&] { (void)t.grad(); }, {"undefined"});
}

BOOST_AUTO_TEST_CASE(to_dot_with_awkward_marks_does_not_throw_or_leak_control_bytes) {
  ag::Tensor a = ag::ones({2}, F64).requires_grad_(true);
  a.set_name(std::string("a\n\"}\x01", 5));
  const ag::Tensor y = ag::sum(a * 2.0);
  const ag::Tensor outside = ag::ones({3}, F64);
  ag::DotOptions opt;
  opt.marked = {{std::string("m\n\x02\"<>", 6), a}, {"undef", ag::Tensor()}, {"outside", outside}, {"y", y}};
  std::string dot;
  BOOST_CHECK_NO_THROW(dot = ag::to_dot(y, opt));
  for (char ch : dot) BOOST_TEST((static_cast<unsigned char>(ch) >= 0x20 || ch == '\n' || ch == '\t'));
  BOOST_TEST(dot.find("outside") != std::string::npos);
  BOOST_TEST(dot.find("undef") != std::string::npos);
  check_throws([&] { ag::to_dot(ag::Tensor(), opt); }, {"to_dot", "undefined"});
}

BOOST_AUTO_TEST_CASE(gradcheck_names_a_named_input_with_a_wrong_gradient) {
  TinyModel m;
  auto h = m.add_hook("block.attn.z", [](const ag::Tensor& v, const std::string&) {
    return v.detach() + (v - v.detach()) * 2.0;  // value unchanged, gradient doubled
  });
  const auto r = ag::gradcheck([&](const std::vector<ag::Tensor>&) { return loss_of(m, kClean); }, {m.block->attn().W_V()});
  BOOST_TEST(!r.ok);
  BOOST_TEST(r.message.find("block.attn.W_V") != std::string::npos, r.message);
  h.remove();
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(odd_replacements)

BOOST_AUTO_TEST_CASE(a_non_contiguous_replacement_gives_the_contiguous_ones_result_and_gradient) {
  TinyModel m;
  auto run = [&](bool contiguous) {
    auto h = m.add_hook("block.attn.pattern", [contiguous](const ag::Tensor& v, const std::string&) {
      const ag::Tensor t = ag::transpose(v, -2, -1);  // (B, H, T, T): same shape, strided
      return contiguous ? t.clone() : t;
    });
    for (auto& p : m.parameters()) p.set_grad(ag::Tensor());
    const ag::Tensor loss = loss_of(m, kClean);
    loss.backward();
    h.remove();
    return std::make_pair(loss.item(), m.attention().W_Q().grad().to_vector());
  };
  const auto [l1, g1] = run(false);
  const auto [l2, g2] = run(true);
  BOOST_TEST(l1 == l2);
  BOOST_TEST(g1 == g2);
}

BOOST_AUTO_TEST_CASE(a_hook_that_changes_a_saved_value_in_place_is_caught_at_backward) {
  TinyModel m;
  auto h = m.add_hook("block.attn.pattern", [](const ag::Tensor& v, const std::string&) {
    ag::Tensor t = v;
    t.copy_(ag::zeros_like(v.detach()));
    return ag::Tensor();
  });
  bool threw = false;
  try {
    loss_of(m, kClean).backward();
  } catch (const std::exception& e) {
    threw = true;
    BOOST_TEST_MESSAGE("thrown: " << e.what());
  }
  BOOST_TEST(threw, "an in-place change to a value saved for backward went unnoticed");
  h.remove();
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(backward_hooks)

BOOST_AUTO_TEST_CASE(a_throwing_backward_hook_propagates_and_the_next_pass_works) {
  TinyModel m;
  auto h = m.add_backward_hook("block.attn.z", [](const ag::Tensor&, const std::string&) {
    throw std::runtime_error("backward hook failed");
  });
  check_throws([&] { loss_of(m, kClean).backward(); }, {"backward hook failed"});
  h.remove();
  for (auto& p : m.parameters()) p.set_grad(ag::Tensor());
  BOOST_CHECK_NO_THROW(loss_of(m, kClean).backward());
  const auto cache = nn::run_with_cache(m, [&] { return loss_of(m, kClean); }, {.names = {"block.attn.z"}, .backward = true});
  BOOST_TEST(cache.has_grad("block.attn.z"));
}

BOOST_AUTO_TEST_CASE(backward_hooks_that_remove_themselves_or_are_added_late) {
  TinyModel m;
  int fired = 0, late = 0;
  nn::HookHandle self;
  self = m.add_backward_hook("block.attn.z", [&](const ag::Tensor&, const std::string&) {
    ++fired;
    self.remove();
  });
  const ag::Tensor loss = loss_of(m, kClean);
  m.add_backward_hook("block.attn.z", [&](const ag::Tensor&, const std::string&) { ++late; });
  loss.backward();
  BOOST_TEST(fired == 1);
  BOOST_TEST(late == 0);  // added after the forward that made the graph
  BOOST_TEST(m.hook_count() == 1u);
  m.remove_hooks();
}

BOOST_AUTO_TEST_CASE(run_with_cache_inside_a_hook_of_another_cache_refuses_the_second_visit) {
  TinyModel m;
  bool inner = false;
  auto h = m.add_hook("block.resid_post", [&](const ag::Tensor&, const std::string&) {
    if (!inner) {
      inner = true;
      nn::run_with_cache(m, [&] { return m.forward(kCorrupted); }, {.names = {"block.attn.q"}});
    }
    return ag::Tensor();
  });
  check_throws([&] { nn::run_with_cache(m, [&] { return m.forward(kClean); }, {.names = {"block.attn.q"}}); },
               {"run_with_cache", "block.attn.q", "twice"});
  h.remove();
  BOOST_TEST(m.hook_count() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(nondeterminism)

BOOST_AUTO_TEST_CASE(patching_a_model_with_dropout_in_training_mode_throws_saying_so) {
  ag::Generator gen(4);
  nn::TransformerBlockOptions o{.d_model = 4, .num_heads = 2, .d_ff = 8, .dtype = F64};
  o.dropout = 0.5;
  nn::TransformerBlock block(o, gen);
  const ag::Tensor clean = ag::randn({2, 3, 4}, F64, gen), corrupted = ag::randn({2, 3, 4}, F64, gen);
  auto run = [&](const ag::Tensor& x) { return ag::mean(block.forward(x)); };
  block.train();
  check_throws([&] { nn::study::activation_patching(block, "attn.z", run, clean, corrupted); },
               {"activation_patching", "not deterministic", "eval()"});
  check_throws([&] { nn::study::attribution_patching(block, "attn.z", run, clean, corrupted); },
               {"activation_patching", "not deterministic"});
  BOOST_TEST(block.hook_count() == 0u);
  block.eval();
  const auto r = nn::study::activation_patching(block, "attn.z", run, clean, corrupted);
  BOOST_TEST(std::isfinite(r.corrupted_metric));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(float32_and_blocked_rows)

BOOST_AUTO_TEST_CASE(float32_cache_with_backward_and_all_blocked_scores_stay_finite) {
  ag::Generator gen(8);
  nn::MultiHeadAttentionOptions o;
  o.embed_dim = 4;
  o.num_heads = 2;
  o.dtype = ag::Dtype::Float32;
  nn::MultiHeadAttention attn(o, gen);
  const ag::Tensor x = ag::randn({2, 3, 4}, ag::Dtype::Float32, gen);
  // Every key blocked through the attn_scores point: zero weights and zero gradients, not NaN.
  auto h = attn.add_hook("attn_scores", [](const ag::Tensor& v, const std::string&) {
    return ag::full(v.shape(), -std::numeric_limits<double>::infinity(), v.dtype());
  });
  const auto cache = nn::run_with_cache(attn, [&] { return ag::sum(attn.forward(x, x, x).output); }, {.backward = true});
  h.remove();
  for (const auto& n : cache.names()) {
    BOOST_TEST((cache[n].dtype() == ag::Dtype::Float32), n);
    if (n == "attn_scores" || n == "raw_scores") continue;  // -inf by the hook
    for (double e : cache[n].to_vector()) BOOST_TEST(std::isfinite(e), n);
    if (cache.has_grad(n))
      for (double e : cache.grad(n).to_vector()) BOOST_TEST(std::isfinite(e), n << " grad");
  }
  for (double e : cache["pattern"].to_vector()) BOOST_TEST(e == 0.0);
  BOOST_TEST(!attn.W_Q().grad().defined());  // the scores are a constant from the hook
  for (double e : attn.W_V().grad().to_vector()) BOOST_TEST(e == 0.0);  // zero weights on every v
}

BOOST_AUTO_TEST_SUITE_END()
