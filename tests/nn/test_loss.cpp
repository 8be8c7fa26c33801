// Losses: values against hand-computed numbers and torch.nn.functional, gradients against
// central differences in float64, and argument errors.
#define BOOST_TEST_MODULE loss
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <string>
#include <vector>

#include <nn/nn.hpp>

#include "test_support.hpp"

using namespace test_support::prelude;

namespace {

// logits from torch's check:  x = [[1, 2, 3], [0.5, -1, 2], [3, 0, -2]], targets [2, 0, 1]
ag::Tensor logits3x3(bool requires_grad = false) {
  ag::Tensor x = ag::tensor({1, 2, 3, 0.5, -1, 2, 3, 0, -2}, {3, 3}, F64);
  if (requires_grad) x.requires_grad_(true);
  return x;
}

}  // namespace

BOOST_AUTO_TEST_CASE(cross_entropy_is_logsumexp_minus_the_target_logit) {
  // row 0: log(e¹ + e² + e³) − 3 = log(1 + e⁻¹ + e⁻²) = 0.40760596444438...
  ag::Tensor x = ag::tensor({1, 2, 3}, {1, 3}, F64);
  const double want = std::log(1.0 + std::exp(-1.0) + std::exp(-2.0));
  BOOST_CHECK_CLOSE(nn::cross_entropy(x, std::vector<std::int64_t>{2}).item(), want, 1e-12);
}

BOOST_AUTO_TEST_CASE(cross_entropy_reductions_match_torch) {
  // F.cross_entropy(x, t), reduction mean / sum / none
  const std::vector<std::int64_t> t = {2, 0, 1};
  BOOST_CHECK_CLOSE(nn::cross_entropy(logits3x3(), t).item(), 1.734634165492895, 1e-12);
  BOOST_CHECK_CLOSE(nn::cross_entropy(logits3x3(), t, {.reduction = nn::Reduction::Sum}).item(), 5.203902496478685, 1e-12);
  const auto none = nn::cross_entropy(logits3x3(), t, {.reduction = nn::Reduction::None});
  BOOST_REQUIRE(none.shape() == ag::Shape{3});
  const auto v = none.to_vector();
  BOOST_CHECK_CLOSE(v[0], 0.4076059644443804, 1e-12);
  BOOST_CHECK_CLOSE(v[1], 1.7413112966571571, 1e-12);
  BOOST_CHECK_CLOSE(v[2], 3.0549852353771474, 1e-12);
}

BOOST_AUTO_TEST_CASE(ignored_targets_leave_the_mean_and_get_no_gradient) {
  // F.cross_entropy(x, [2, -100, 1]) = mean of rows 0 and 2 only
  ag::Tensor x = logits3x3(true);
  ag::Tensor loss = nn::cross_entropy(x, std::vector<std::int64_t>{2, -100, 1});
  BOOST_CHECK_CLOSE(loss.item(), 1.731295599910764, 1e-12);
  loss.backward();
  const auto g = x.grad().to_vector();
  for (int c = 0; c < 3; ++c) BOOST_CHECK_EQUAL(g[3 + c], 0.0);
  BOOST_CHECK_NE(g[0], 0.0);
}

BOOST_AUTO_TEST_CASE(label_smoothing_matches_torch) {
  // F.cross_entropy(x, t, label_smoothing=0.2)
  BOOST_CHECK_CLOSE(nn::cross_entropy(logits3x3(), std::vector<std::int64_t>{2, 0, 1}, {.label_smoothing = 0.2}).item(),
                    1.7790786099373395, 1e-12);
}

BOOST_AUTO_TEST_CASE(cross_entropy_is_stable_for_huge_logits) {
  ag::Tensor x = ag::tensor({1000, 0, -1000, 1000}, {2, 2}, ag::Dtype::Float32).requires_grad_(true);
  ag::Tensor loss = nn::cross_entropy(x, std::vector<std::int64_t>{1, 0}, {.reduction = nn::Reduction::None});
  const auto v = loss.to_vector();
  BOOST_CHECK_CLOSE(v[0], 1000.0, 1e-4);  // log(e¹⁰⁰⁰ + 1) − 0
  BOOST_CHECK_CLOSE(v[1], 2000.0, 1e-4);
  nn::cross_entropy(x, std::vector<std::int64_t>{1, 0}).backward();
  for (double g : x.grad().to_vector()) BOOST_CHECK(std::isfinite(g));
}

BOOST_AUTO_TEST_CASE(cross_entropy_gradient_is_softmax_minus_onehot) {
  ag::Tensor x = ag::tensor({1, 2, 3}, {1, 3}, F64).requires_grad_(true);
  nn::cross_entropy(x, std::vector<std::int64_t>{0}).backward();
  const double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  const auto g = x.grad().to_vector();
  BOOST_CHECK_CLOSE(g[0], std::exp(1.0) / z - 1.0, 1e-10);
  BOOST_CHECK_CLOSE(g[1], std::exp(2.0) / z, 1e-10);
  BOOST_CHECK_CLOSE(g[2], std::exp(3.0) / z, 1e-10);
}

BOOST_AUTO_TEST_CASE(cross_entropy_gradchecks_for_every_reduction) {
  ag::Generator gen(7);
  ag::Tensor x = ag::randn({2, 3, 5}, F64, gen).requires_grad_(true);
  ag::Tensor t = ag::tensor({4, 0, -100, 2, 3, 1}, {2, 3}, F64);
  for (auto red : {nn::Reduction::Mean, nn::Reduction::Sum, nn::Reduction::None}) {
    check_gradients([&](const std::vector<ag::Tensor>& in) { return nn::cross_entropy(in[0], t, {.reduction = red}); }, {x});
  }
  check_gradients(
      [&](const std::vector<ag::Tensor>& in) { return nn::cross_entropy(in[0], t, {.label_smoothing = 0.1}); }, {x});
  // through an upstream op, so that the incoming gradient is not all ones
  ag::Tensor w = ag::randn({2, 3, 5}, F64, gen).requires_grad_(true);
  check_gradients(
      [&](const std::vector<ag::Tensor>& in) {
        return ag::sum(ag::mul(nn::cross_entropy(ag::mul(in[0], in[1]), t, {.reduction = nn::Reduction::None}),
                               ag::tensor({1, -2, 3, 0.5, 4, -1}, {2, 3}, F64)));
      },
      {x, w});
}

BOOST_AUTO_TEST_CASE(cross_entropy_gradcheck_catches_a_wrong_gradient) {
  // Negative control: a loss whose backward is off by a factor must fail the same check.
  ag::Tensor x = ag::tensor({0.3, -0.2, 0.9}, {1, 3}, F64).requires_grad_(true);
  ag::Tensor t = ag::tensor({1}, {1}, F64);
  const auto r = ag::gradcheck(
      [&](const std::vector<ag::Tensor>& in) {
        ag::Tensor loss = nn::cross_entropy(in[0], t);
        ag::Tensor doubled_grad = nn::cross_entropy(ag::mul(in[0], 1.0), t);
        // value of `loss`, gradient of 2·loss (the detached copy contributes value but not gradient)
        return ag::sub(ag::add(loss, doubled_grad), doubled_grad.detach());
      },
      {x});
  BOOST_CHECK(!r.ok);
}

BOOST_AUTO_TEST_CASE(cross_entropy_accepts_float32) {
  ag::Tensor x = ag::tensor({1, 2, 3}, {1, 3}, ag::Dtype::Float32);
  ag::Tensor loss = nn::cross_entropy(x, ag::tensor({2}, {1}));
  BOOST_CHECK(loss.dtype() == ag::Dtype::Float32);
  BOOST_CHECK_CLOSE(loss.item(), 0.4076059644443804, 1e-4);
}

BOOST_AUTO_TEST_CASE(cross_entropy_rejects_bad_targets) {
  check_message([] { nn::cross_entropy(logits3x3(), std::vector<std::int64_t>{2, 3, 0}); },
                "cross_entropy: target 3 at position 1 is out of range for 3 classes");
  check_message([] { nn::cross_entropy(logits3x3(), std::vector<std::int64_t>{2, -1, 0}); }, "target -1");
  check_message([] { nn::cross_entropy(logits3x3(), ag::tensor({0, 1}, {2})); },
                "cross_entropy: targets [2] do not match logits [3, 3]");
  check_message([] { nn::cross_entropy(logits3x3(), ag::tensor({0, 1.5, 2}, {3}, F64)); }, "not an integral class index");
  check_message([] { nn::cross_entropy(logits3x3(), std::vector<std::int64_t>{0, 1}); }, "2 targets for logits [3, 3]");
  check_message([] { nn::cross_entropy(logits3x3(), std::vector<std::int64_t>{0, 1, 2}, {.label_smoothing = 2.0}); },
                "label_smoothing");
}

BOOST_AUTO_TEST_CASE(mse_loss_is_the_mean_squared_difference) {
  ag::Tensor a = ag::tensor({1, 2, 3, 4}, {2, 2}, F64);
  ag::Tensor b = ag::tensor({1, 0, 5, 1}, {2, 2}, F64);
  // differences 0, 2, -2, 3: squares 0, 4, 4, 9
  BOOST_CHECK_CLOSE(nn::mse_loss(a, b).item(), 17.0 / 4.0, 1e-12);
  BOOST_CHECK_CLOSE(nn::mse_loss(a, b, nn::Reduction::Sum).item(), 17.0, 1e-12);
  const auto none = nn::mse_loss(a, b, nn::Reduction::None);
  BOOST_CHECK(none.shape() == (ag::Shape{2, 2}));
  BOOST_CHECK(none.to_vector() == (std::vector<double>{0, 4, 4, 9}));
}

BOOST_AUTO_TEST_CASE(mse_loss_gradchecks_in_both_arguments) {
  ag::Generator gen(3);
  ag::Tensor a = ag::randn({3, 4}, F64, gen).requires_grad_(true);
  ag::Tensor b = ag::randn({3, 4}, F64, gen).requires_grad_(true);
  for (auto red : {nn::Reduction::Mean, nn::Reduction::Sum, nn::Reduction::None})
    check_gradients([&](const std::vector<ag::Tensor>& in) { return nn::mse_loss(in[0], in[1], red); }, {a, b});
}

BOOST_AUTO_TEST_CASE(mse_loss_rejects_mismatched_arguments) {
  check_message([] { nn::mse_loss(ag::zeros({2, 3}), ag::zeros({3, 2})); },
                "mse_loss: input [2, 3] and target [3, 2] must have the same shape");
  check_message([] { nn::mse_loss(ag::zeros({2}), ag::zeros({2}, F64)); }, "mse_loss: dtypes differ: Float32 and Float64");
}
