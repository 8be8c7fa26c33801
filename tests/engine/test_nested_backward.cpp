// backward() called from inside a hook of another backward(): both walks give their exact
// gradients, whether the inner graph shares a leaf or interior nodes with the outer one, was
// built before or inside the hook, and with grad mode on or off in the hook.
#define BOOST_TEST_MODULE nested_backward
#include <boost/test/unit_test.hpp>

#include <cmath>

#include <autograd/autograd.hpp>

namespace ag = autograd;
using ag::Dtype;
using ag::Tensor;

namespace {

Tensor leaf(std::vector<double> v) {
  const auto n = static_cast<std::int64_t>(v.size());
  return ag::tensor(std::move(v), {n}, Dtype::Float64).requires_grad_();
}

void check_values(const Tensor& t, const std::vector<double>& expected) {
  BOOST_REQUIRE(t.defined());
  const auto got = t.to_vector();
  BOOST_REQUIRE_EQUAL(got.size(), expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) BOOST_CHECK_CLOSE_FRACTION(got[i], expected[i], 1e-12);
}

bool message_contains(const std::exception& e, const std::string& part) {
  return std::string(e.what()).find(part) != std::string::npos;
}

}  // namespace

// Outer: out = sum(3·x²), d/dx = 6x. Inner (run by a hook on x²): sum(x³), d/dx = 3x².
// x = 1.5: 9 + 6.75 = 15.75, where a lost outer gradient would leave 6.75.
BOOST_AUTO_TEST_CASE(a_hook_running_backward_over_a_graph_built_before_shares_the_leaf) {
  Tensor x = leaf({1.5, -2.0});
  Tensor inner = ag::sum(x * x * x * 1.0);  // a graph of another size than the outer one
  Tensor y = x * x;
  y.register_hook([&](const Tensor&) {
    inner.backward();
    return Tensor();
  });
  ag::sum(y * 3.0).backward();
  check_values(x.grad(), {6 * 1.5 + 3 * 1.5 * 1.5, 6 * -2.0 + 3 * 4.0});
}

BOOST_AUTO_TEST_CASE(a_hook_with_grad_mode_on_builds_and_walks_a_graph_sharing_the_leaf) {
  Tensor x = leaf({1.5, -2.0, 0.25});
  Tensor y = x * x;
  int calls = 0;
  y.register_hook([&](const Tensor& g) {
    ++calls;
    ag::EnableGradGuard grad_on;
    ag::sum(ag::exp(x) * g).backward();  // d/dx = exp(x) · g, with g = 3 here
    return Tensor();
  });
  ag::sum(y * 3.0).backward();
  BOOST_CHECK_EQUAL(calls, 1);
  std::vector<double> expected;
  for (double v : {1.5, -2.0, 0.25}) expected.push_back(6 * v + 3 * std::exp(v));
  check_values(x.grad(), expected);
}

BOOST_AUTO_TEST_CASE(a_hook_with_grad_mode_off_cannot_build_a_graph_and_says_so) {
  Tensor x = leaf({1.0});
  Tensor y = x * x;
  y.register_hook([&](const Tensor&) {
    ag::sum(x * 2.0).backward();  // backward rules and hooks run with grad mode off
    return Tensor();
  });
  BOOST_CHECK_EXCEPTION(ag::sum(y).backward(), std::runtime_error,
                        [](const std::runtime_error& e) { return message_contains(e, "does not require grad"); });
}

BOOST_AUTO_TEST_CASE(a_leaf_hook_running_backward_through_the_same_leaf) {
  // The hook on x runs an inner walk that reaches x again (its accumulator re-entered).
  Tensor x = leaf({2.0, 3.0});
  Tensor inner = ag::sum(x * x * x);  // 3x²
  bool nested = false;
  x.register_hook([&](const Tensor& g) {
    if (!nested) {
      nested = true;
      inner.backward();
    }
    return g;
  });
  ag::sum(x * 5.0).backward();
  check_values(x.grad(), {5 + 12.0, 5 + 27.0});
}

BOOST_AUTO_TEST_CASE(nested_walks_sharing_interior_nodes_with_retain_graph) {
  // e = exp(x) feeds both walks. Outer: sum(2e) + sum(x·4); inner, from a hook on 2e: sum(5e).
  Tensor x = leaf({0.5, -1.0});
  Tensor e = ag::exp(x);
  Tensor inner = ag::sum(e * 5.0);
  Tensor a = e * 2.0;
  a.register_hook([&](const Tensor&) {
    inner.backward({.retain_graph = true});
    return Tensor();
  });
  (ag::sum(a) + ag::sum(x * 4.0)).backward();
  check_values(x.grad(), {7 * std::exp(0.5) + 4, 7 * std::exp(-1.0) + 4});
}

BOOST_AUTO_TEST_CASE(an_inner_walk_that_frees_shared_nodes_makes_the_outer_walk_throw) {
  Tensor x = leaf({0.5});
  Tensor e = ag::exp(x);
  Tensor inner = ag::sum(e * 5.0);
  Tensor a = e * 2.0;
  a.register_hook([&](const Tensor&) {
    inner.backward();  // frees exp, which the outer walk has yet to run
    return Tensor();
  });
  BOOST_CHECK_EXCEPTION(ag::sum(a).backward(), std::runtime_error, [](const std::runtime_error& e) {
    return message_contains(e, "'exp'") && message_contains(e, "already freed");
  });
}

BOOST_AUTO_TEST_CASE(walks_nested_three_deep) {
  Tensor x = leaf({1.25});
  Tensor g1 = ag::sum(x * 7.0);
  Tensor y2 = x * 3.0;
  y2.register_hook([&](const Tensor&) {
    g1.backward();
    return Tensor();
  });
  Tensor g2 = ag::sum(y2);
  Tensor y3 = x * x;
  y3.register_hook([&](const Tensor&) {
    g2.backward();
    return Tensor();
  });
  ag::sum(y3).backward();
  check_values(x.grad(), {2 * 1.25 + 3 + 7});
}

BOOST_AUTO_TEST_CASE(a_replacing_hook_and_a_nested_walk_together) {
  // The hook doubles y's gradient and runs an inner walk: x.grad = 2 · 6x + 3x².
  Tensor x = leaf({1.5});
  Tensor inner = ag::sum(x * x * x);
  Tensor y = x * x;
  y.register_hook([&](const Tensor& g) {
    inner.backward();
    return g * 2.0;
  });
  ag::sum(y * 3.0).backward();
  check_values(x.grad(), {2 * 6 * 1.5 + 3 * 1.5 * 1.5});
}

// A leaf hook whose backward reaches the same leaf runs itself again, and again: PyTorch recurses
// until Python's limit. Here the nesting stops at a fixed depth with an error naming the cause,
// instead of running off the end of the stack.
BOOST_AUTO_TEST_CASE(a_hook_whose_backward_reaches_itself_is_an_error_not_a_stack_overflow) {
  Tensor x = leaf({2.0});
  int calls = 0;
  x.register_hook([&x, &calls](const Tensor& g) {  // (x by reference: a copy inside its own hook would keep x alive forever)
    ++calls;
    ag::EnableGradGuard grad_on;
    ag::sum(x * 5.0).backward();  // reaches x's accumulator, so this hook, again
    return g;
  });
  try {
    ag::sum(x * x).backward();
    BOOST_ERROR("an endless nesting of backward() calls did not throw");
  } catch (const std::runtime_error& e) {
    BOOST_TEST(message_contains(e, "backward: 64 backward() calls nested in hooks"), e.what());
  }
  BOOST_TEST(calls == 64);
}
