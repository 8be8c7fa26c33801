// The backward walk: accumulation, release, errors, grad mode, hooks, retain_grad, printing.
#define BOOST_TEST_MODULE graph
#include <boost/test/unit_test.hpp>

#include <autograd/autograd.hpp>

namespace ag = autograd;
using ag::Dtype;
using ag::Tensor;

namespace {
Tensor leaf(std::vector<double> v, ag::Shape s) { return ag::tensor(std::move(v), s, Dtype::Float64).requires_grad_(); }

void check_values(const Tensor& t, const std::vector<double>& expected, double tol = 1e-12) {
  const auto got = t.to_vector();
  BOOST_REQUIRE_EQUAL(got.size(), expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) BOOST_CHECK_CLOSE_FRACTION(got[i] + 1.0, expected[i] + 1.0, tol);
}

bool message_contains(const std::exception& e, const std::string& part) {
  return std::string(e.what()).find(part) != std::string::npos;
}
}  // namespace

BOOST_AUTO_TEST_CASE(x_times_x_gets_two_x) {
  Tensor x = leaf({1.5, -2.0}, {2});
  ag::sum(x * x).backward();
  check_values(x.grad(), {3.0, -4.0});
}

BOOST_AUTO_TEST_CASE(gradients_accumulate_across_backward_calls) {
  Tensor x = leaf({1.0, 2.0}, {2});
  ag::sum(x * 3.0).backward();
  ag::sum(x * 3.0).backward();
  check_values(x.grad(), {6.0, 6.0});
}

BOOST_AUTO_TEST_CASE(shared_subexpression_sums_both_paths) {
  Tensor x = leaf({0.5}, {1});
  Tensor y = ag::exp(x);
  Tensor z = ag::sum(y * y + y);  // dz/dx = (2y + 1)·y
  z.backward();
  const double e = std::exp(0.5);
  check_values(x.grad(), {(2 * e + 1) * e});
}

BOOST_AUTO_TEST_CASE(second_backward_over_freed_graph_throws) {
  Tensor x = leaf({1.0, 2.0}, {2});
  Tensor z = ag::sum(ag::exp(x));
  z.backward();
  BOOST_CHECK_EXCEPTION(z.backward(), std::runtime_error,
                        [](const std::runtime_error& e) { return message_contains(e, "retain_graph"); });
}

BOOST_AUTO_TEST_CASE(retain_graph_allows_a_second_walk) {
  Tensor x = leaf({1.0, 2.0}, {2});
  Tensor z = ag::sum(x * x);
  z.backward({.retain_graph = true});
  z.backward();
  check_values(x.grad(), {4.0, 8.0});
}

BOOST_AUTO_TEST_CASE(backward_without_grad_throws) {
  Tensor x = leaf({1.0}, {1});
  Tensor y;
  {
    ag::NoGradGuard no_grad;
    y = ag::sum(x * 2.0);
  }
  BOOST_CHECK(!y.requires_grad());
  BOOST_CHECK_EXCEPTION(y.backward(), std::runtime_error,
                        [](const std::runtime_error& e) { return message_contains(e, "does not require grad"); });
}

BOOST_AUTO_TEST_CASE(no_grad_guard_restores_previous_mode) {
  BOOST_CHECK(ag::is_grad_enabled());
  {
    ag::NoGradGuard outer;
    BOOST_CHECK(!ag::is_grad_enabled());
    {
      ag::EnableGradGuard inner;
      BOOST_CHECK(ag::is_grad_enabled());
    }
    BOOST_CHECK(!ag::is_grad_enabled());
  }
  BOOST_CHECK(ag::is_grad_enabled());
}

BOOST_AUTO_TEST_CASE(backward_on_non_scalar_needs_a_gradient) {
  Tensor x = leaf({1.0, 2.0}, {2});
  Tensor y = x * x;
  BOOST_CHECK_THROW(y.backward(), std::runtime_error);
  y.backward(ag::tensor({1.0, 10.0}, {2}, Dtype::Float64));
  check_values(x.grad(), {2.0, 40.0});
}

BOOST_AUTO_TEST_CASE(backward_gradient_of_wrong_shape_throws) {
  Tensor x = leaf({1.0, 2.0}, {2});
  Tensor y = x * x;
  BOOST_CHECK_THROW(y.backward(ag::ones({3}, Dtype::Float64)), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(retain_grad_keeps_an_intermediate_gradient) {
  Tensor x = leaf({1.0, 2.0}, {2});
  Tensor h = x * 3.0;
  h.retain_grad();
  ag::sum(h * h).backward();
  check_values(h.grad(), {6.0, 12.0});   // d(h²)/dh = 2h
  check_values(x.grad(), {18.0, 36.0});  // · 3
}

BOOST_AUTO_TEST_CASE(hook_sees_and_can_replace_the_gradient) {
  Tensor x = leaf({1.0, 2.0}, {2});
  Tensor h = x * 2.0;
  std::vector<double> seen;
  h.register_hook([&](const Tensor& g) {
    seen = g.to_vector();
    return g * 10.0;
  });
  ag::sum(h).backward();
  BOOST_CHECK_EQUAL(seen.size(), 2u);
  BOOST_CHECK_EQUAL(seen[0], 1.0);
  check_values(x.grad(), {20.0, 20.0});
}

BOOST_AUTO_TEST_CASE(hook_on_a_leaf_runs_before_accumulation) {
  Tensor x = leaf({1.0}, {1});
  x.register_hook([](const Tensor& g) { return g * 0.5; });
  ag::sum(x * 4.0).backward();
  check_values(x.grad(), {2.0});
}

BOOST_AUTO_TEST_CASE(deep_chain_needs_no_recursion) {
  Tensor x = leaf({1.0}, {1});
  Tensor y = x;
  for (int i = 0; i < 100000; ++i) y = y * 1.0;
  ag::sum(y).backward();
  check_values(x.grad(), {1.0});
}

BOOST_AUTO_TEST_CASE(saved_tensors_are_freed_after_backward) {
  Tensor x = leaf({1.0, 2.0, 3.0}, {3});
  Tensor loss;
  std::weak_ptr<ag::Storage> saved;
  {
    Tensor y = ag::exp(x);  // exp saves its output for backward
    saved = y.impl()->storage;
    loss = ag::sum(y);
  }
  BOOST_CHECK(!saved.expired());  // the graph still holds it
  loss.backward();
  BOOST_CHECK(saved.expired());   // released with the graph
}

BOOST_AUTO_TEST_CASE(in_place_change_of_a_saved_tensor_is_caught) {
  Tensor x = leaf({1.0, 2.0}, {2});
  Tensor y = ag::exp(x);
  Tensor loss = ag::sum(y);
  {
    ag::NoGradGuard no_grad;
    y.detach().add_(ag::ones({2}, Dtype::Float64));
  }
  BOOST_CHECK_EXCEPTION(loss.backward(), std::runtime_error,
                        [](const std::runtime_error& e) { return message_contains(e, "exp"); });
}

BOOST_AUTO_TEST_CASE(in_place_on_a_leaf_that_requires_grad_needs_no_grad_mode) {
  Tensor x = leaf({1.0}, {1});
  BOOST_CHECK_THROW(x.fill_(2.0), std::invalid_argument);
  ag::NoGradGuard no_grad;
  x.fill_(2.0);
  BOOST_CHECK_EQUAL(x.item(), 2.0);
}

BOOST_AUTO_TEST_CASE(requires_grad_on_a_non_leaf_throws) {
  Tensor x = leaf({1.0}, {1});
  Tensor y = x * 2.0;
  BOOST_CHECK_THROW(y.requires_grad_(false), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(dtype_conversion_is_differentiable) {
  Tensor x = leaf({1.0, 2.0}, {2});
  Tensor y = x.to(Dtype::Float32);
  BOOST_CHECK(y.dtype() == Dtype::Float32);
  ag::sum(y * y).backward();
  BOOST_CHECK(x.grad().dtype() == Dtype::Float64);
  check_values(x.grad(), {2.0, 4.0});
}

BOOST_AUTO_TEST_CASE(eigen_map_views_without_copy_and_from_eigen_copies) {
  Tensor t = ag::tensor({1, 2, 3, 4, 5, 6}, {2, 3}, Dtype::Float64);
  auto m = t.as_matrix<double>();
  BOOST_CHECK_EQUAL(m(1, 2), 6.0);
  m(0, 0) = 10.0;  // writes through
  BOOST_CHECK_EQUAL(t.to_vector()[0], 10.0);
  Eigen::MatrixXf col_major(2, 2);
  col_major << 1, 2, 3, 4;
  Tensor u = ag::from_eigen(col_major);
  BOOST_CHECK(u.dtype() == Dtype::Float32);
  check_values(u, {1, 2, 3, 4});
}

BOOST_AUTO_TEST_CASE(tensor_factory_checks_sizes) {
  BOOST_CHECK_EXCEPTION(ag::tensor({1, 2, 3}, {2, 2}), std::invalid_argument, [](const std::invalid_argument& e) {
    return message_contains(e, "tensor: 3 values given for shape [2, 2]");
  });
  BOOST_CHECK_THROW(Tensor().shape(), std::invalid_argument);
  BOOST_CHECK_THROW(ag::tensor({1, 2}, {2}).item(), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(random_factories_repeat_for_a_seed) {
  ag::Generator a(42), b(42);
  auto ra = ag::randn({5}, Dtype::Float64, a).to_vector();
  auto rb = ag::randn({5}, Dtype::Float64, b).to_vector();
  BOOST_CHECK(ra == rb);
  ag::Generator c(43);
  BOOST_CHECK(ag::randn({5}, Dtype::Float64, c).to_vector() != ra);
  auto u = ag::rand({1000}, Dtype::Float64, a).to_vector();
  double mean = 0;
  for (double v : u) {
    BOOST_CHECK(v >= 0.0 && v < 1.0);
    mean += v / 1000;
  }
  BOOST_CHECK_CLOSE_FRACTION(mean, 0.5, 0.05);
}

BOOST_AUTO_TEST_CASE(factories_fill_expected_values) {
  check_values(ag::arange(3, Dtype::Float64), {0, 1, 2});
  check_values(ag::arange(1, 2, 0.25, Dtype::Float64), {1, 1.25, 1.5, 1.75});
  check_values(ag::full({2}, 7, Dtype::Float64), {7, 7});
  check_values(ag::zeros({2}), {0, 0});
  check_values(ag::ones({1, 2}), {1, 1});
  BOOST_CHECK(ag::scalar_tensor(3.0).shape().empty());
}

BOOST_AUTO_TEST_CASE(printing_looks_like_pytorch) {
  Tensor t = ag::tensor({1, 2, 3, 4}, {2, 2}, Dtype::Float64);
  BOOST_CHECK_EQUAL(fmt::format("{}", t),
                    "tensor([[1.0000, 2.0000],\n        [3.0000, 4.0000]], dtype=Float64, shape=[2, 2])");
  Tensor x = leaf({1.0}, {1});
  BOOST_CHECK_EQUAL(fmt::format("{}", x * 2.0), "tensor([2.0000], dtype=Float64, shape=[1], grad_fn=<mul>)");
  BOOST_CHECK_EQUAL(fmt::format("{}", ag::scalar_tensor(0.5)), "tensor(0.5000, dtype=Float32, shape=[])");
  const std::string big = fmt::format("{}", ag::zeros({2000}));
  BOOST_CHECK(big.find("...") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(to_dot_names_ops_and_leaves) {
  Tensor x = leaf({1.0, 2.0}, {2});
  x.set_name("x");
  Tensor z = ag::sum(ag::exp(x) * x);
  z.backward({.retain_graph = true});
  const std::string dot = ag::to_dot(z);
  BOOST_CHECK(dot.find("digraph") != std::string::npos);
  BOOST_CHECK(dot.find("exp") != std::string::npos);
  BOOST_CHECK(dot.find("mul") != std::string::npos);
  BOOST_CHECK(dot.find("x\\n[2]") != std::string::npos);
  BOOST_CHECK(dot.find("|grad|") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(thread_count_can_be_set) {
  const int before = ag::get_num_threads();
  ag::set_num_threads(1);
  BOOST_CHECK_EQUAL(ag::get_num_threads(), 1);
  ag::set_num_threads(before);
  BOOST_CHECK_EQUAL(ag::get_num_threads(), before);
}

namespace {
// A custom backward that returns no gradient at all (PyTorch requires one per input).
struct ReturnsNothing : ag::Function<ReturnsNothing> {
  static constexpr const char* name = "returns_nothing";
  static Tensor forward(ag::FunctionCtx&, const Tensor& x) { return x * 2.0; }
  static ag::TensorList backward(ag::FunctionCtx&, const ag::TensorList&) { return {}; }
};

class EmptyNode : public ag::Node {
 public:
  EmptyNode() : ag::Node("empty_rule") {}
  void apply(const ag::TensorList&, ag::TensorList&) override {}
};
}  // namespace

BOOST_AUTO_TEST_CASE(a_custom_backward_returning_no_gradients_is_an_error) {
  Tensor x = leaf({1.0, 2.0}, {2});
  BOOST_CHECK_EXCEPTION(ag::sum(ReturnsNothing::apply(x)).backward(), std::runtime_error,
                        [](const std::runtime_error& e) {
                          return message_contains(e, "'returns_nothing'") && message_contains(e, "0 gradients for 1 input");
                        });
  BOOST_CHECK(!x.grad().defined());

  Tensor y = ag::tensor({3.0}, {1}, Dtype::Float64);  // a custom node built by hand
  auto node = std::make_shared<EmptyNode>();
  ag::connect(node, ag::TensorList{x}, ag::TensorList{y});
  BOOST_CHECK_EXCEPTION(ag::sum(y).backward(), std::runtime_error, [](const std::runtime_error& e) {
    return message_contains(e, "'empty_rule'") && message_contains(e, "undefined tensor");
  });
}

BOOST_AUTO_TEST_CASE(undefined_gradients_say_that_an_input_needs_none) {
  struct FirstOnly : ag::Function<FirstOnly> {
    static Tensor forward(ag::FunctionCtx&, const Tensor& a, const Tensor& b) { return a * b; }
    static ag::TensorList backward(ag::FunctionCtx&, const ag::TensorList& g) { return {g[0] * 4.0, Tensor()}; }
  };
  Tensor a = leaf({1.0}, {1}), b = leaf({2.0}, {1});
  ag::sum(FirstOnly::apply(a, b)).backward();
  check_values(a.grad(), {4.0});
  BOOST_CHECK(!b.grad().defined());
}
