// attribution_patching differentiates the metric at the z point only: it changes no tensor's
// .grad (the model's parameters, an input that requires grad, a tensor run captures), and a metric
// it cannot differentiate (Int64) is refused saying so.
#define BOOST_TEST_MODULE attribution_patching_contract
#include <boost/test/unit_test.hpp>

#include <string>
#include <vector>

#include "study_support.hpp"

using namespace study_support;

namespace {

constexpr ag::Dtype I64 = ag::Dtype::Int64;

// run(input) for the block's residual-stream input: the mean log-prob of kTargets.
auto block_metric(TinyModel& m) {
  return [&m](const ag::Tensor& in) {
    return mean_log_prob(m.readout->forward(m.ln_f->forward(m.block->forward(in))), kTargets);
  };
}

void expect_message(const std::function<void()>& f, std::initializer_list<std::string> parts,
                    std::initializer_list<std::string> absent = {}) {
  try {
    f();
    BOOST_ERROR("no error");
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    BOOST_TEST_MESSAGE(what);
    for (const auto& p : parts) BOOST_TEST(what.find(p) != std::string::npos, "no " << p << " in: " << what);
    for (const auto& p : absent) BOOST_TEST(what.find(p) == std::string::npos, p << " in: " << what);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(attribution_patching_leaves_the_grad_of_an_input_that_requires_grad) {
  TinyModel m;
  ag::Generator g(11);
  ag::Tensor x = ag::randn({2, 4, 4}, F64, g).requires_grad_();
  ag::Tensor y = ag::randn({2, 4, 4}, F64, g).requires_grad_();
  {
    ag::NoGradGuard no_grad;
    x.set_grad(ag::full({2, 4, 4}, 0.5, F64));  // a gradient from before
  }
  const ag::Tensor corrupted = x + 0.01 * y;  // made by an op: requires grad through x and y
  const auto r = nn::study::attribution_patching(m, "block.attn.z", block_metric(m), x, corrupted);
  BOOST_TEST(r.max_abs_error < 1e-3);
  BOOST_TEST(x.grad().to_vector() == std::vector<double>(32, 0.5));
  BOOST_TEST(!y.grad().defined());
  for (const auto& p : m.parameters()) BOOST_TEST(!p.grad().defined());
}

BOOST_AUTO_TEST_CASE(attribution_patching_leaves_the_grad_of_a_tensor_run_captures) {
  TinyModel m;
  ag::Tensor scale = ag::full({1}, 2.0, F64).requires_grad_();
  auto run = [&](const ag::Tensor& x) { return ag::sum(mean_log_prob(m.forward(x), kTargets) * scale); };
  const auto r = nn::study::attribution_patching(m, "block.attn.z", run, kClean, kCorrupted);
  BOOST_TEST(r.estimate_per_head.size() == 2u);
  BOOST_TEST(!scale.grad().defined());
}

BOOST_AUTO_TEST_CASE(attribution_patching_estimates_as_before_without_touching_grads) {
  // The estimate is (clean_z - corrupted_z) · d metric / d z: on the model's own inputs it is
  // the first-order change, so its error against the real patching is small but not zero.
  TinyModel m;
  ag::Generator g(5);
  const ag::Tensor x = ag::randn({2, 4, 4}, F64, g), delta = ag::randn({2, 4, 4}, F64, g);
  const auto near = nn::study::attribution_patching(m, "block.attn.z", block_metric(m), x, x + 1e-3 * delta);
  const auto far = nn::study::attribution_patching(m, "block.attn.z", block_metric(m), x, x + 1e-1 * delta);
  BOOST_TEST(near.max_abs_error > 0.0);
  BOOST_TEST(near.max_abs_error < far.max_abs_error * 1e-2);
  for (const auto& p : m.parameters()) BOOST_TEST(!p.grad().defined());
}

BOOST_AUTO_TEST_CASE(attribution_patching_with_an_int64_metric_says_the_metric_is_int64) {
  TinyModel m;
  int calls = 0;
  auto run = [&](const ag::Tensor& x) {
    ++calls;
    return mean_log_prob(m.forward(x), kTargets).to(I64);
  };
  expect_message([&] { nn::study::attribution_patching(m, "block.attn.z", run, kClean, kCorrupted); },
                 {"attribution_patching", "Int64", "floating"}, {"NoGradGuard"});
  BOOST_TEST(calls == 1);  // refused after the first run, before any gradient is taken
  BOOST_TEST(m.hook_count() == 0u);
}

BOOST_AUTO_TEST_CASE(run_with_cache_with_an_int64_loss_says_the_loss_is_int64) {
  TinyModel m;
  expect_message(
      [&] {
        nn::run_with_cache(m, [&] { return mean_log_prob(m.forward(kClean), kTargets).to(I64); }, {.backward = true});
      },
      {"run_with_cache", "Int64", "floating"}, {"NoGradGuard"});
  BOOST_TEST(m.hook_count() == 0u);
}
