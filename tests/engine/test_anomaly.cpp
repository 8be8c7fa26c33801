// Anomaly detection: the first NaN/Inf in forward or backward throws, naming the op and where
// it was created.
#define BOOST_TEST_MODULE anomaly
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <thread>

#include <autograd/autograd.hpp>

#include "test_support.hpp"

using namespace test_support::prelude;

namespace {

// Runs f, expects an AnomalyError, returns its message.
template <class F>
std::string anomaly_message(F&& f) {
  return test_support::message_of<ag::AnomalyError>(f, "an AnomalyError");
}

ag::Tensor leaf(std::vector<double> values, ag::Shape shape) {
  return ag::tensor(values, shape, Dtype::Float64).requires_grad_(true);
}

// A custom op whose backward is broken: it returns NaN.
struct BrokenBackward : ag::Function<BrokenBackward> {
  static constexpr const char* name = "broken_backward";
  static ag::Tensor forward(ag::FunctionCtx&, const ag::Tensor& x) { return x * 2.0; }
  static ag::TensorList backward(ag::FunctionCtx&, const ag::TensorList& g) { return {g[0] * kNaN}; }
};

}  // namespace

BOOST_AUTO_TEST_CASE(without_the_guard_nan_passes_silently) {
  auto x = leaf({1.0, -1.0}, {2});
  ag::Tensor y;
  BOOST_CHECK_NO_THROW(y = ag::log(x));
  BOOST_TEST(std::isnan(y.to_vector()[1]));
  BOOST_CHECK(!ag::is_anomaly_enabled());
}

BOOST_AUTO_TEST_CASE(forward_nan_names_the_op_its_output_and_element) {
  ag::DetectAnomalyGuard anomaly;
  auto x = leaf({1.0, 2.0, -1.0, 4.0}, {4});
  check_throws<ag::AnomalyError>([&] { ag::log(x); },
                                 {"'log' produced NaN",
                                  "shape [4]",
                                  "element 2",
                                  "from ([4] Float64)"});
}

BOOST_AUTO_TEST_CASE(the_first_anomalous_op_is_named_not_a_later_one) {
  ag::DetectAnomalyGuard anomaly;
  auto x = leaf({1.0, -3.0}, {2});
  auto y = x * 2.0;  // finite
  std::string msg = anomaly_message([&] {
    auto z = ag::sqrt(y);  // NaN here
    auto w = ag::exp(z);   // would spread it
    (void)w;
  });
  BOOST_TEST(contains(msg, "'sqrt'"));
  BOOST_TEST(!contains(msg, "'exp'"));
}

BOOST_AUTO_TEST_CASE(forward_inf_from_division_by_zero_throws) {
  ag::DetectAnomalyGuard anomaly;
  auto x = leaf({1.0, 0.0}, {2});
  auto y = leaf({2.0, 3.0}, {2});
  check_throws<ag::AnomalyError>([&] { ag::div(y, x); }, {"'div' produced +Inf", "element 1"});
}

BOOST_AUTO_TEST_CASE(forward_inf_can_be_allowed_for_masks_while_nan_still_throws) {
  auto scores = leaf({0.5, 1.5, -0.5, 2.0}, {2, 2});
  auto mask = ag::tensor({0.0, -kInf, 0.0, 0.0}, {2, 2}, Dtype::Float64);
  {
    ag::DetectAnomalyGuard strict;  // default: -inf in forward is an anomaly
    BOOST_CHECK_THROW(ag::add(scores, mask), ag::AnomalyError);
  }
  ag::DetectAnomalyGuard lenient(ag::AnomalyOptions{.forward_inf = false});
  ag::Tensor loss;
  BOOST_CHECK_NO_THROW(loss = ag::sum(ag::softmax(ag::add(scores, mask), 1) * ag::tensor({1.0, 2.0, 3.0, 4.0}, {2, 2}, Dtype::Float64)));
  BOOST_CHECK_NO_THROW(loss.backward());
  BOOST_TEST(std::isfinite(scores.grad().to_vector()[0]));
  auto neg = leaf({-1.0}, {1});
  BOOST_CHECK_THROW(ag::log(neg), ag::AnomalyError);
}

BOOST_AUTO_TEST_CASE(backward_inf_names_the_op_and_its_creation_context) {
  // sqrt(0) = 0 is finite, but its gradient 1 / (2·sqrt(0)) is not.
  auto x = leaf({4.0, 0.0, 1.0}, {3});
  ag::DetectAnomalyGuard anomaly;
  ag::Tensor loss;
  {
    ag::AnomalyLabel model("model");
    ag::AnomalyLabel layer("norm");
    loss = ag::sum(ag::sqrt(x));
  }
  check_throws<ag::AnomalyError>([&] { loss.backward(); },
                                 {"backward of 'sqrt' returned +Inf",
                                  "gradient for input 0 of shape [3] (element 1)",
                                  "created as 'sqrt'",
                                  "from ([3] Float64)",
                                  "under 'model/norm'"});
}

BOOST_AUTO_TEST_CASE(backward_nan_from_a_custom_function_is_caught) {
  ag::DetectAnomalyGuard anomaly;
  auto x = leaf({1.0, 2.0}, {2});
  auto loss = ag::sum(BrokenBackward::apply(x));
  check_throws<ag::AnomalyError>([&] { loss.backward(); }, {"backward of 'broken_backward' returned NaN"});
  BOOST_TEST(!x.grad().defined());  // nothing reached the leaf
}

BOOST_AUTO_TEST_CASE(without_the_guard_a_nan_gradient_reaches_the_leaf) {
  auto x = leaf({1.0, 2.0}, {2});
  auto loss = ag::sum(BrokenBackward::apply(x));
  BOOST_CHECK_NO_THROW(loss.backward());
  BOOST_TEST(std::isnan(x.grad().to_vector()[0]));
}

BOOST_AUTO_TEST_CASE(nan_input_data_is_caught_at_the_first_op_that_uses_it) {
  ag::DetectAnomalyGuard anomaly;
  auto x = leaf({1.0, kNaN}, {2});
  auto w = leaf({3.0, 4.0}, {2});
  check_throws<ag::AnomalyError>([&] { ag::mul(x, w); }, {"'mul' produced NaN in output 0 of shape [2] (element 1)"});
}

BOOST_AUTO_TEST_CASE(creation_context_is_kept_only_under_the_guard) {
  auto x = leaf({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}, {2, 3});
  auto w = leaf({1.0, 2.0, 3.0}, {3, 1});
  auto plain = ag::matmul(x, w);
  BOOST_TEST(plain.grad_fn()->creation_context.empty());
  ag::DetectAnomalyGuard anomaly;
  ag::AnomalyLabel label("head 0");
  auto watched = ag::matmul(x, w);
  const auto& ctx = watched.grad_fn()->creation_context;
  BOOST_TEST(contains(ctx, "'matmul' #"));
  BOOST_TEST(contains(ctx, "from ([2, 3] Float64, [3, 1] Float64)"));
  BOOST_TEST(contains(ctx, "under 'head 0'"));
}

BOOST_AUTO_TEST_CASE(node_made_before_the_guard_is_still_reported_in_backward) {
  auto x = leaf({0.0}, {1});
  auto loss = ag::sum(ag::sqrt(x));
  ag::DetectAnomalyGuard anomaly;
  check_throws<ag::AnomalyError>([&] { loss.backward(); },
                                 {"backward of 'sqrt'",
                                  "created before anomaly detection was turned on"});
}

BOOST_AUTO_TEST_CASE(finite_graph_runs_unchanged_under_the_guard) {
  auto x = leaf({0.5, -1.5, 2.0}, {3});
  auto expected = [&] {
    auto loss = ag::sum(ag::tanh(x) * ag::exp(x));
    loss.backward();
    auto g = x.grad().to_vector();
    x.set_grad(ag::Tensor());
    return g;
  };
  const auto plain = expected();
  ag::DetectAnomalyGuard anomaly;
  const auto watched = expected();
  BOOST_TEST(plain == watched, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(guards_nest_and_restore_the_previous_state) {
  BOOST_TEST(!ag::is_anomaly_enabled());
  {
    ag::DetectAnomalyGuard outer;
    BOOST_TEST(ag::is_anomaly_enabled());
    BOOST_TEST(ag::anomaly_options().forward_inf);
    {
      ag::DetectAnomalyGuard inner(ag::AnomalyOptions{.forward_inf = false});
      BOOST_TEST(!ag::anomaly_options().forward_inf);
    }
    BOOST_TEST(ag::anomaly_options().forward_inf);
    BOOST_TEST(ag::is_anomaly_enabled());
  }
  BOOST_TEST(!ag::is_anomaly_enabled());
}

BOOST_AUTO_TEST_CASE(labels_nest_with_slashes) {
  BOOST_TEST(ag::current_anomaly_label() == "");
  ag::AnomalyLabel a("encoder");
  {
    ag::AnomalyLabel b("layer 1");
    BOOST_TEST(ag::current_anomaly_label() == "encoder/layer 1");
  }
  BOOST_TEST(ag::current_anomaly_label() == "encoder");
}

BOOST_AUTO_TEST_CASE(the_guard_belongs_to_its_thread) {
  ag::DetectAnomalyGuard anomaly;
  bool other_thread_enabled = true;
  std::thread t([&] { other_thread_enabled = ag::is_anomaly_enabled(); });
  t.join();
  BOOST_TEST(!other_thread_enabled);
}

BOOST_AUTO_TEST_CASE(error_is_a_runtime_error) {
  ag::DetectAnomalyGuard anomaly;
  auto x = leaf({-1.0}, {1});
  BOOST_CHECK_THROW(ag::log(x), std::runtime_error);
}
