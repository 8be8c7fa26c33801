// Adversarial checks of ag::jvp, ag::vjp, ag::jacobian and ag::hessian, and of grad()'s pruning of
// input gradients nobody asked for (Node::needs_input_grad during a grad() walk): each pruned
// gradient is compared with the one a plain backward() computes, or with float64 central
// differences; odd arguments (0-d, empty, Int64, views, repeated inputs, throwing functions) must
// give right numbers or a message naming the transform and the shapes or dtypes at fault.
#define BOOST_TEST_MODULE transforms_hostile
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <stdexcept>
#include <thread>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

#include "../autograd/src/kernels/attention_flash_tiles.hpp"
#include "test_support.hpp"

using namespace test_support::prelude;

namespace {

Tensor randn64(const Shape& shape, std::uint64_t seed) {
  ag::Generator gen(seed);
  return ag::randn(shape, Dtype::Float64, gen);
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  BOOST_REQUIRE(a.defined());
  BOOST_REQUIRE(b.defined());
  BOOST_REQUIRE_MESSAGE(a.shape() == b.shape(), "shapes " << ag::shape_str(a.shape()) << " vs " << ag::shape_str(b.shape()));
  const auto x = a.to_vector(), y = b.to_vector();
  double m = 0;
  for (std::size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

void check_close(const Tensor& a, const Tensor& b, double tol, const std::string& what) {
  const double d = max_abs_diff(a, b);
  BOOST_CHECK_MESSAGE(d <= tol, what << ": max |diff| " << d << " > " << tol);
}

// The message of the exception f throws (any std::exception), or "" with an error when none.
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  BOOST_ERROR("no exception thrown");
  return "";
}

void check_mentions(const std::string& msg, const std::vector<std::string>& parts) {
  for (const auto& p : parts) BOOST_CHECK_MESSAGE(msg.find(p) != std::string::npos, "message lacks '" << p << "': " << msg);
}

// Full backward() of sum(fn(xs)·seed) into fresh copies, then grad() for each input alone, with
// and without create_graph: the pruned walks must give backward()'s numbers.
void check_pruned_against_backward(const std::string& what, const std::function<Tensor(const TensorList&)>& fn,
                                   const TensorList& values) {
  TensorList xs;
  for (const auto& v : values) xs.push_back(v.detach().clone().requires_grad_());
  const Tensor y = fn(xs);
  const Tensor seed = randn64(y.shape(), 99);
  ag::sum(ag::mul(y, seed)).backward();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    for (bool create : {false, true}) {
      TensorList fresh;
      for (const auto& v : values) fresh.push_back(v.detach().clone().requires_grad_());
      const Tensor y2 = fn(fresh);
      ag::GradOptions o;
      o.grad_outputs = {seed};
      o.create_graph = create;
      const TensorList g = ag::grad({y2}, {fresh[i]}, o);
      check_close(g[0], xs[i].grad(), 1e-12,
                  what + ": grad() for input " + std::to_string(i) + (create ? " (create_graph)" : ""));
    }
  }
}

// Central differences of scalar fn along every element of xs[i], float64.
Tensor numeric_gradient(const std::function<double(const TensorList&)>& fn, const TensorList& xs, std::size_t i) {
  const double h = 1e-6;
  Tensor g = ag::zeros(xs[i].shape(), Dtype::Float64);
  for (std::int64_t k = 0; k < xs[i].numel(); ++k) {
    TensorList p, m;
    for (const auto& x : xs) p.push_back(x.detach().clone()), m.push_back(x.detach().clone());
    p[i].data<double>()[k] += h;
    m[i].data<double>()[k] -= h;
    g.data<double>()[k] = (fn(p) - fn(m)) / (2 * h);
  }
  return g;
}

}  // namespace

// ---------------- grad()'s pruning of unwanted input gradients ----------------

BOOST_AUTO_TEST_CASE(pruned_grad_matches_backward_through_multi_input_ops) {
  check_pruned_against_backward("matmul", [](const TensorList& x) { return ag::matmul(x[0], x[1]); },
                                {randn64({3, 4}, 1), randn64({4, 2}, 2)});
  check_pruned_against_backward("batched matmul broadcast",
                                [](const TensorList& x) { return ag::matmul(x[0], x[1]); },
                                {randn64({2, 3, 4}, 3), randn64({4, 2}, 4)});
  check_pruned_against_backward("matmul vec", [](const TensorList& x) { return ag::matmul(x[0], x[1]); },
                                {randn64({4}, 5), randn64({4}, 6)});
  check_pruned_against_backward("linear", [](const TensorList& x) { return ag::linear(x[0], x[1], x[2]); },
                                {randn64({2, 3, 4}, 7), randn64({4, 5}, 8), randn64({5}, 9)});
  check_pruned_against_backward("layer_norm",
                                [](const TensorList& x) { return ag::layer_norm(x[0], {5}, x[1], x[2]); },
                                {randn64({3, 5}, 10), randn64({5}, 11), randn64({5}, 12)});
  check_pruned_against_backward("cat", [](const TensorList& x) { return ag::cat({x[0], x[1], x[2]}, 1); },
                                {randn64({2, 3}, 13), randn64({2, 1}, 14), randn64({2, 2}, 15)});
  check_pruned_against_backward("stack", [](const TensorList& x) { return ag::stack({x[0], x[1]}, 0); },
                                {randn64({2, 3}, 16), randn64({2, 3}, 17)});
  check_pruned_against_backward(
      "attention with mask",
      [](const TensorList& x) {
        const auto r = ag::scaled_dot_product_attention(x[0], x[1], x[2], {.attn_mask = x[3]});
        return ag::add(ag::sum(r.output), ag::sum(ag::mul(r.weights, r.weights)));
      },
      {randn64({1, 2, 3, 2}, 18), randn64({1, 2, 4, 2}, 19), randn64({1, 2, 4, 3}, 20), randn64({3, 4}, 21)});
  check_pruned_against_backward(
      "split (multi-output node)",
      [](const TensorList& x) {
        const TensorList parts = ag::split(ag::mul(x[0], x[1]), 2, 1);
        return ag::add(ag::mul(parts[0], parts[1]), ag::tanh(parts[2]));
      },
      {randn64({2, 6}, 30), randn64({2, 6}, 31)});
  // Tiled (flash) core: need_weights = false and T·S large enough, with a learned mask.
  check_pruned_against_backward(
      "flash attention with mask",
      [](const TensorList& x) {
        return ag::scaled_dot_product_attention(x[0], x[1], x[2], {.need_weights = false, .attn_mask = x[3]}).output;
      },
      {randn64({1, 2, 64, 4}, 32), randn64({1, 2, 64, 4}, 33), randn64({1, 2, 64, 3}, 34), randn64({64, 64}, 35)});
  check_pruned_against_backward("packed attention with mask",
                                [](const TensorList& x) {
                                  const auto r = ag::scaled_dot_product_attention_packed(x[0], 2, {.attn_mask = x[1]});
                                  return ag::add(ag::sum(r.output), ag::sum(ag::square(r.weights)));
                                },
                                {randn64({1, 5, 12}, 36), randn64({5, 5}, 37)});
  check_pruned_against_backward("packed flash attention with mask",
                                [](const TensorList& x) {
                                  return ag::scaled_dot_product_attention_packed(
                                             x[0], 2, {.need_weights = false, .attn_mask = x[1], .is_causal = true})
                                      .output;
                                },
                                {randn64({1, 64, 12}, 38), randn64({64, 64}, 39)});
  check_pruned_against_backward(
      "heads-last attention with mask",
      [](const TensorList& x) {
        return ag::scaled_dot_product_attention_heads_last(x[0], x[1], x[2], 2, {.attn_mask = x[3]}).output;
      },
      {randn64({1, 3, 4}, 40), randn64({1, 4, 4}, 41), randn64({1, 4, 6}, 42), randn64({3, 4}, 43)});
  check_pruned_against_backward(
      "broadcast binary ops",
      [](const TensorList& x) {
        const Tensor a = ag::div(ag::sub(x[0], x[1]), ag::add(ag::square(x[2]), 1.0));
        return ag::add(ag::pow(ag::add(ag::square(x[0]), 1.0), x[1]), ag::maximum(a, ag::mul(x[2], 0.5)));
      },
      {randn64({2, 3}, 44), randn64({3}, 45), randn64({2, 1}, 46)});
  check_pruned_against_backward(
      "where",
      [](const TensorList& x) { return ag::where(ag::gt(x[0], x[1]), ag::mul(x[0], x[2]), ag::square(x[1])); },
      {randn64({2, 3}, 47), randn64({2, 3}, 48), randn64({3}, 49)});
  check_pruned_against_backward(
      "linear_cat with biases",
      [](const TensorList& x) {
        const std::vector<Tensor> ws{x[1], x[2]}, bs{x[3], x[4]};
        return ag::linear_cat(x[0], ws, bs);
      },
      {randn64({2, 3}, 50), randn64({3, 2}, 51), randn64({3, 4}, 52), randn64({2}, 53), randn64({4}, 54)});
  check_pruned_against_backward(
      "linear_cat without biases",
      [](const TensorList& x) {
        const std::vector<Tensor> ws{x[1], x[2], x[3]};
        return ag::linear_cat(x[0], ws);
      },
      {randn64({2, 3}, 55), randn64({3, 2}, 56), randn64({3, 1}, 57), randn64({3, 3}, 58)});
  check_pruned_against_backward("attention causal",
                                [](const TensorList& x) {
                                  return ag::scaled_dot_product_attention(x[0], x[1], x[2], {.is_causal = true}).output;
                                },
                                {randn64({1, 2, 3, 2}, 22), randn64({1, 2, 3, 2}, 23), randn64({1, 2, 3, 2}, 24)});
}

// The gradient reaches x only through nodes whose other inputs (w, c, b) require grad but are not
// asked for; and one of them (w) is used twice, once on the wanted path and once not.
BOOST_AUTO_TEST_CASE(pruned_grad_through_nodes_with_unwanted_other_inputs) {
  const auto f = [](const TensorList& v) {
    const Tensor h = ag::tanh(ag::matmul(v[0], v[1]));          // x·w
    const Tensor k = ag::mul(h, v[2]);                           // ·c
    const Tensor z = ag::add(ag::matmul(k, ag::transpose(v[1], 0, 1)), v[3]);  // w again, + b
    return ag::sum(ag::mul(ag::softmax(z, -1), ag::exp(ag::tanh(v[3]))));
  };
  const TensorList vals{randn64({2, 3}, 1), randn64({3, 4}, 2), randn64({2, 4}, 3), randn64({2, 3}, 4)};
  for (std::size_t i = 0; i < vals.size(); ++i) {
    TensorList xs;
    for (const auto& v : vals) xs.push_back(v.detach().clone().requires_grad_());
    const Tensor g = ag::grad({f(xs)}, {xs[i]})[0];
    const Tensor n = numeric_gradient([&](const TensorList& p) { return f(p).item(); }, vals, i);
    check_close(g, n, 1e-7, "input " + std::to_string(i));
  }
}

// A custom rule that reads needs_input_grad: it sees false for the unwanted input under grad()
// and true for both under the backward() that follows on the retained graph; the numbers agree.
BOOST_AUTO_TEST_CASE(custom_rule_sees_needs_input_grad_and_retained_backward_after_grad) {
  Tensor x = randn64({3}, 1).requires_grad_(), w = randn64({3}, 2).requires_grad_();
  std::vector<std::pair<bool, bool>> seen;
  Tensor prod = ag::mul(x, w).detach();
  Tensor y = ag::record("custom_mul", {x, w}, prod, [&seen, x, w](const TensorList& g, const ag::Node& node) {
    seen.emplace_back(node.needs_input_grad(0), node.needs_input_grad(1));
    TensorList out(2);
    if (node.needs_input_grad(0)) out[0] = ag::mul(g[0], w.detach());
    if (node.needs_input_grad(1)) out[1] = ag::mul(g[0], x.detach());
    return out;
  });
  const Tensor loss = ag::sum(ag::square(y));
  // needs_input_grad asked outside any walk: both wanted.
  BOOST_TEST(y.grad_fn()->needs_input_grad(0));
  BOOST_TEST(y.grad_fn()->needs_input_grad(1));
  ag::GradOptions keep;
  keep.retain_graph = true;
  const Tensor gx = ag::grad({loss}, {x}, keep)[0];
  BOOST_REQUIRE_EQUAL(seen.size(), 1u);
  BOOST_TEST(seen[0].first);
  BOOST_TEST(!seen[0].second);
  loss.backward();
  BOOST_REQUIRE_EQUAL(seen.size(), 2u);
  BOOST_TEST(seen[1].first);
  BOOST_TEST(seen[1].second);
  check_close(gx, x.grad(), 1e-14, "grad() vs backward() for x");
  const Tensor expect_w = ag::mul(ag::mul(ag::mul(x, x), w), 2.0).detach();
  check_close(w.grad(), expect_w, 1e-12, "w.grad after the retained backward");
}

// A hook on an intermediate runs a nested grad() on another graph while the outer grad() walks;
// the outer node that runs next must still see its own wanted set (not the inner walk's).
BOOST_AUTO_TEST_CASE(nested_grad_inside_hook_keeps_outer_pruning_right) {
  Tensor x = randn64({2, 3}, 1).requires_grad_(), w = randn64({3, 2}, 2).requires_grad_();
  Tensor a = randn64({2, 3}, 3).requires_grad_(), b = randn64({3, 2}, 4).requires_grad_();
  Tensor inner_ga;
  const Tensor inner_loss = ag::sum(ag::square(ag::matmul(a, b)));  // recorded here: hooks run with grad mode off
  Tensor h = ag::matmul(x, w);
  h.register_hook([&](const Tensor& g) {
    inner_ga = ag::grad({inner_loss}, {a})[0];  // wants a, not b
    return g;
  });
  const Tensor y = ag::sum(ag::tanh(ag::mul(h, h)));
  const Tensor gw = ag::grad({y}, {w})[0];  // wants w, not x
  Tensor x2 = x.detach().clone().requires_grad_(), w2 = w.detach().clone().requires_grad_();
  ag::sum(ag::tanh(ag::square(ag::matmul(x2, w2)))).backward();
  check_close(gw, w2.grad(), 1e-12, "outer grad for w");
  Tensor a2 = a.detach().clone().requires_grad_(), b2 = b.detach().clone().requires_grad_();
  ag::sum(ag::square(ag::matmul(a2, b2))).backward();
  check_close(inner_ga, a2.grad(), 1e-12, "inner grad for a");
  BOOST_TEST(!x.grad().defined());
  BOOST_TEST(!w.grad().defined());
}

// A custom rule that itself runs a grad() on another graph before it reads needs_input_grad.
BOOST_AUTO_TEST_CASE(nested_grad_inside_rule_then_needs_input_grad) {
  Tensor x = randn64({3}, 1).requires_grad_(), w = randn64({3}, 2).requires_grad_();
  Tensor p = randn64({3}, 3).requires_grad_(), q = randn64({3}, 4).requires_grad_();
  bool wants_x = false, wants_w = true;
  const Tensor inner_loss = ag::sum(ag::mul(p, q));
  Tensor y = ag::record("custom", {x, w}, ag::mul(x, w).detach(), [&, x, w](const TensorList& g, const ag::Node& node) {
    const Tensor inner = ag::grad({inner_loss}, {q})[0];  // wants q, not p
    (void)inner;
    wants_x = node.needs_input_grad(0);
    wants_w = node.needs_input_grad(1);
    TensorList out(2);
    if (wants_x) out[0] = ag::mul(g[0], w.detach());
    if (wants_w) out[1] = ag::mul(g[0], x.detach());
    return out;
  });
  const Tensor gx = ag::grad({ag::sum(y)}, {x})[0];
  BOOST_TEST(wants_x);
  BOOST_TEST(!wants_w);
  check_close(gx, w, 1e-15, "d sum(x·w)/dx");
}

// gradgradcheck-style: the first grad() (create_graph) skips dw; the mixed derivative d/dw of
// that gradient, by grad() and by backward(), must still be right.
BOOST_AUTO_TEST_CASE(double_backward_after_pruned_first_grad) {
  const auto loss = [](const TensorList& v) {
    return ag::sum(ag::mul(ag::tanh(ag::matmul(v[0], v[1])), ag::layer_norm(ag::matmul(v[0], v[1]), {2}, v[2], Tensor())));
  };
  const TensorList vals{randn64({3, 4}, 1), randn64({4, 2}, 2), randn64({2}, 3)};
  TensorList xs;
  for (const auto& v : vals) xs.push_back(v.detach().clone().requires_grad_());
  ag::GradOptions o;
  o.create_graph = true;
  const Tensor gx = ag::grad({loss(xs)}, {xs[0]}, o)[0];
  const Tensor dir = randn64({3, 4}, 7);
  const Tensor s = ag::sum(ag::mul(gx, dir));
  ag::GradOptions keep;
  keep.retain_graph = true;
  keep.allow_unused = true;
  const TensorList mixed = ag::grad({s}, {xs[1], xs[2]}, keep);
  s.backward();
  // Reference: central differences of ⟨∂L/∂x, dir⟩ in w and in the layer_norm weight.
  const auto directional = [&](const TensorList& p) {
    TensorList q;
    for (const auto& t : p) q.push_back(t.detach().clone().requires_grad_());
    const Tensor g = ag::grad({loss(q)}, {q[0]})[0];
    return ag::sum(ag::mul(g, dir)).item();
  };
  for (std::size_t i = 1; i < 3; ++i) {
    const Tensor n = numeric_gradient(directional, vals, i);
    check_close(mixed[i - 1], n, 1e-7, "mixed derivative by grad() for input " + std::to_string(i));
    check_close(xs[i].grad(), n, 1e-7, "mixed derivative by backward() for input " + std::to_string(i));
  }
}

// ---------------- the transforms ----------------

BOOST_AUTO_TEST_CASE(identity_constant_and_detached_functions) {
  const Tensor x = randn64({2, 3}, 1), v = randn64({2, 3}, 2);
  const auto id = [](const TensorList& a) { return TensorList{a[0]}; };
  const auto r = ag::jvp(id, {x}, {v});
  check_close(r.tangents[0], v, 0, "jvp of the identity");
  const auto c = ag::vjp(id, {x}, {v});
  check_close(c.cotangents[0], v, 0, "vjp of the identity");
  for (auto mode : {ag::JacobianMode::Reverse, ag::JacobianMode::Forward}) {
    const Tensor J = ag::jacobian([](const TensorList& a) { return a[0]; }, {x}, {.mode = mode})[0];
    BOOST_TEST((J.shape() == Shape{2, 3, 2, 3}));
    const auto j = J.to_vector();
    for (std::size_t k = 0; k < j.size(); ++k) BOOST_TEST(j[k] == (k % 7 == 0 ? 1.0 : 0.0));
  }
  // A detached result and a constant: zero derivatives of the right shapes.
  const auto det = [](const TensorList& a) { return TensorList{ag::mul(a[0], 2.0).detach(), ag::ones({4}, Dtype::Float64)}; };
  const auto rd = ag::jvp(det, {x}, {v});
  check_close(rd.tangents[0], ag::zeros({2, 3}, Dtype::Float64), 0, "jvp of a detached result");
  check_close(rd.tangents[1], ag::zeros({4}, Dtype::Float64), 0, "jvp of a constant");
  const auto H = ag::hessian([](const TensorList& a) { return ag::sum(ag::mul(a[0], 3.0)); }, {x});
  check_close(H[0][0], ag::zeros({2, 3, 2, 3}, Dtype::Float64), 0, "hessian of a linear function");
}

BOOST_AUTO_TEST_CASE(zero_dim_and_empty) {
  const Tensor s = randn64({}, 1);
  const auto cube = [](const TensorList& a) { return ag::mul(ag::mul(a[0], a[0]), a[0]); };
  const double x = s.item();
  for (auto mode : {ag::JacobianMode::Reverse, ag::JacobianMode::Forward}) {
    const Tensor J = ag::jacobian(cube, {s}, {.mode = mode})[0];
    BOOST_TEST(J.shape().empty());
    BOOST_TEST(std::abs(J.item() - 3 * x * x) < 1e-12);
  }
  const auto H = ag::hessian(cube, {s});
  BOOST_TEST(H[0][0].shape().empty());
  BOOST_TEST(std::abs(H[0][0].item() - 6 * x) < 1e-12);
  const auto r = ag::jvp([](const TensorList& a) { return TensorList{ag::mul(a[0], a[0])}; }, {s}, {ag::ones({}, Dtype::Float64)});
  BOOST_TEST(std::abs(r.tangents[0].item() - 2 * x) < 1e-12);
  // Empty input and output.
  const Tensor e = ag::zeros({0, 3}, Dtype::Float64);
  for (auto mode : {ag::JacobianMode::Reverse, ag::JacobianMode::Forward}) {
    const TensorList J = ag::jacobian([](const TensorList& a) { return ag::sum(a[0], 0); }, {e}, {.mode = mode});
    BOOST_TEST((J[0].shape() == Shape{3, 0, 3}));
    const TensorList J2 = ag::jacobian([](const TensorList& a) { return ag::mul(a[0], 2.0); }, {e}, {.mode = mode});
    BOOST_TEST((J2[0].shape() == Shape{0, 3, 0, 3}));
  }
  const auto re = ag::jvp([](const TensorList& a) { return TensorList{ag::mul(a[0], 2.0)}; }, {e}, {e});
  BOOST_TEST((re.tangents[0].shape() == Shape{0, 3}));
  const auto He = ag::hessian([](const TensorList& a) { return ag::sum(ag::square(a[0])); }, {e});
  BOOST_TEST((He[0][0].shape() == Shape{0, 3, 0, 3}));
}

// The gradient of transpose/narrow/reshape may be a view: the Jacobian must still be laid out
// by the element order of the shapes.
BOOST_AUTO_TEST_CASE(jacobian_through_views_and_of_view_inputs) {
  const Tensor x = randn64({2, 3}, 1);
  const auto f = [](const TensorList& a) { return ag::square(ag::transpose(a[0], 0, 1)); };  // y[j,i] = x[i,j]²
  const auto xv = x.to_vector();
  for (auto mode : {ag::JacobianMode::Reverse, ag::JacobianMode::Forward}) {
    const Tensor J = ag::jacobian(f, {x}, {.mode = mode})[0];
    BOOST_REQUIRE((J.shape() == Shape{3, 2, 2, 3}));
    const auto j = J.to_vector();
    for (int a = 0; a < 3; ++a)
      for (int b = 0; b < 2; ++b)
        for (int c = 0; c < 2; ++c)
          for (int d = 0; d < 3; ++d) {
            const double want = (c == b && d == a) ? 2 * xv[static_cast<std::size_t>(b * 3 + a)] : 0.0;
            BOOST_CHECK_SMALL(j[static_cast<std::size_t>(((a * 2 + b) * 2 + c) * 3 + d)] - want, 1e-12);
          }
  }
  // A non-contiguous view as the input itself.
  const Tensor base = randn64({3, 4}, 2);
  const Tensor view = ag::narrow(ag::transpose(base, 0, 1), 0, 1, 2);  // (2, 3)
  const auto g = [](const TensorList& a) { return ag::sum(ag::mul(ag::square(a[0]), ag::tanh(a[0]))); };
  const Tensor contiguous = view.clone();
  const auto H1 = ag::hessian(g, {view});
  const auto H2 = ag::hessian(g, {contiguous});
  check_close(H1[0][0], H2[0][0], 1e-14, "hessian at a view vs at its copy");
  const Tensor Jv = ag::jacobian([](const TensorList& a) { return ag::tanh(a[0]); }, {view}, {.mode = ag::JacobianMode::Forward})[0];
  const Tensor Jc = ag::jacobian([](const TensorList& a) { return ag::tanh(a[0]); }, {contiguous}, {.mode = ag::JacobianMode::Forward})[0];
  check_close(Jv, Jc, 1e-14, "forward jacobian at a view vs at its copy");
}

BOOST_AUTO_TEST_CASE(same_tensor_twice_and_existing_grad_untouched) {
  Tensor x = randn64({3}, 1).requires_grad_();
  x.set_grad(ag::ones({3}, Dtype::Float64));
  const auto f = [](const TensorList& a) { return ag::sum(ag::mul(ag::square(a[0]), a[1])); };  // Σ x_i² y_i
  const auto H = ag::hessian(f, {x, x});
  const auto xv = x.to_vector();
  // H[0][1][i][j] = 2 x_i δ_ij, H[0][0] = 2 y δ.
  for (int i = 0; i < 3; ++i) {
    BOOST_CHECK_SMALL(H[0][1].to_vector()[static_cast<std::size_t>(i * 4)] - 2 * xv[static_cast<std::size_t>(i)], 1e-12);
    BOOST_CHECK_SMALL(H[0][0].to_vector()[static_cast<std::size_t>(i * 4)] - 2 * xv[static_cast<std::size_t>(i)], 1e-12);
  }
  const auto r = ag::vjp([](const TensorList& a) { return TensorList{ag::mul(a[0], a[1])}; }, {x, x}, {ag::ones({3}, Dtype::Float64)});
  check_close(r.cotangents[0], x, 0, "vjp for the first copy");
  ag::jvp([](const TensorList& a) { return TensorList{ag::mul(a[0], a[0])}; }, {x}, {x.detach()});
  ag::jacobian([](const TensorList& a) { return ag::mul(a[0], a[0]); }, {x}, {.mode = ag::JacobianMode::Forward});
  check_close(x.grad(), ag::ones({3}, Dtype::Float64), 0, "existing .grad after the transforms");
  BOOST_TEST(!x.grad().requires_grad());
}

// A function that reads the input tensor itself as well as its argument gets a derivative only
// through the argument: here d/dx (x·x) would silently come out x instead of 2x. It must be
// refused, naming the input, as it is when the argument is not used at all.
BOOST_AUTO_TEST_CASE(function_reading_the_input_itself_besides_its_argument_is_refused) {
  Tensor x = randn64({3}, 1).requires_grad_();
  const Tensor v = ag::ones({3}, Dtype::Float64);
  const auto f = [x](const TensorList& a) { return TensorList{ag::mul(a[0], x)}; };
  try {
    const auto r = ag::jvp(f, {x}, {v});
    // Not refused: then the number must at least be right (2x), not x.
    check_close(r.tangents[0], ag::mul(x, 2.0).detach(), 1e-14, "jvp of x·x read half through the argument");
  } catch (const std::exception& e) {
    check_mentions(e.what(), {"jvp", "input 0"});
  }
  try {
    const Tensor J = ag::jacobian([x](const TensorList& a) { return ag::sum(ag::mul(a[0], x)); }, {x})[0];
    check_close(J, ag::mul(x, 2.0).detach(), 1e-14, "jacobian of Σ x·x read half through the argument");
  } catch (const std::exception& e) {
    check_mentions(e.what(), {"jacobian", "input 0"});
  }
}

BOOST_AUTO_TEST_CASE(bad_arguments_name_the_transform_and_what_is_wrong) {
  const Tensor x = randn64({2, 3}, 1);
  const auto id = [](const TensorList& a) { return TensorList{ag::mul(a[0], 2.0)}; };
  check_mentions(message_of([&] { ag::jvp(id, {x}, {randn64({3, 2}, 2)}); }), {"jvp", "[3, 2]", "[2, 3]"});
  check_mentions(message_of([&] { ag::jvp(id, {x}, {x.to(Dtype::Float32)}); }), {"jvp", "Float32", "Float64"});
  check_mentions(message_of([&] { ag::jvp(id, {x}, {Tensor()}); }), {"jvp", "tangents[0]"});
  check_mentions(message_of([&] { ag::jvp(id, {x}, {}); }), {"jvp", "tangents"});
  check_mentions(message_of([&] { ag::vjp(id, {x}, {randn64({2}, 3)}); }), {"vjp", "[2]", "[2, 3]"});
  const Tensor i64 = ag::zeros({2}, Dtype::Int64);
  check_mentions(message_of([&] { ag::jvp(id, {i64}, {i64}); }), {"jvp", "Int64"});
  check_mentions(message_of([&] { ag::jacobian([](const TensorList& a) { return a[0]; }, {i64}); }), {"jacobian", "Int64"});
  check_mentions(message_of([&] { ag::hessian([](const TensorList& a) { return a[0]; }, {x}); }), {"hessian", "[2, 3]"});
  check_mentions(message_of([&] { ag::vjp([](const TensorList&) { return TensorList{}; }, {x}, {}); }), {"vjp", "no outputs"});
  check_mentions(message_of([&] { ag::jacobian([](const TensorList&) { return Tensor(); }, {x}); }), {"jacobian", "output 0"});
  check_mentions(message_of([&] {
                   ag::jacobian([](const TensorList& a) { return ag::argmax(a[0], 0); }, {x});
                 }),
                 {"jacobian", "Int64"});
  check_mentions(message_of([&] { ag::jacobian([](const TensorList& a) { return a[0]; }, {}); }), {"jacobian", "no inputs"});
}

// A function that throws leaves grad mode as it was, and the transforms work (and leave grad mode
// off) under NoGradGuard.
BOOST_AUTO_TEST_CASE(throwing_function_and_no_grad_guard) {
  const Tensor x = randn64({3}, 1);
  {
    ag::NoGradGuard off;
    BOOST_CHECK_THROW(ag::jvp([](const TensorList&) -> TensorList { throw std::runtime_error("boom"); }, {x},
                              {ag::ones({3}, Dtype::Float64)}),
                      std::runtime_error);
    BOOST_TEST(!ag::is_grad_enabled());
    const auto r = ag::jvp([](const TensorList& a) { return TensorList{ag::square(a[0])}; }, {x}, {ag::ones({3}, Dtype::Float64)});
    check_close(r.tangents[0], ag::mul(x, 2.0), 1e-15, "jvp under NoGradGuard");
    BOOST_TEST(!ag::is_grad_enabled());
    const auto H = ag::hessian([](const TensorList& a) { return ag::sum(ag::mul(ag::square(a[0]), a[0])); }, {x});
    BOOST_TEST(!H[0][0].requires_grad());
    BOOST_TEST(!ag::is_grad_enabled());
  }
  BOOST_TEST(ag::is_grad_enabled());
  BOOST_CHECK_THROW(ag::hessian([](const TensorList&) -> Tensor { throw std::runtime_error("boom"); }, {x}), std::runtime_error);
  BOOST_TEST(ag::is_grad_enabled());
}

// A function that runs backward() on its own result (without retain_graph) frees the graph the
// transform needs: the error must say which transform, not only "backward".
BOOST_AUTO_TEST_CASE(function_that_calls_backward_itself) {
  const Tensor x = randn64({3}, 1);
  const auto f = [](const TensorList& a) {
    Tensor y = ag::sum(ag::square(a[0]));
    y.backward();
    return TensorList{y};
  };
  const std::string msg = message_of([&] { ag::vjp(f, {x}, {ag::ones({}, Dtype::Float64)}); });
  check_mentions(msg, {"vjp"});
}

// Mixed Float32/Float64 inputs and outputs: values against float64 central differences.
BOOST_AUTO_TEST_CASE(mixed_dtypes) {
  const Tensor x = randn64({3}, 1);
  const Tensor w = randn64({3}, 2).to(Dtype::Float32);
  const auto f = [](const TensorList& a) { return ag::mul(ag::tanh(a[0]), a[1].to(Dtype::Float64)); };
  for (auto mode : {ag::JacobianMode::Reverse, ag::JacobianMode::Forward}) {
    const TensorList J = ag::jacobian(f, {x, w}, {.mode = mode});
    BOOST_TEST((J[0].dtype() == Dtype::Float64));
    BOOST_TEST((J[1].dtype() == Dtype::Float64));
    const auto xv = x.to_vector(), wv = w.to_vector();
    for (int i = 0; i < 3; ++i) {
      const auto k = static_cast<std::size_t>(i * 4);
      const auto ii = static_cast<std::size_t>(i);
      BOOST_CHECK_SMALL(J[0].to_vector()[k] - (1 - std::tanh(xv[ii]) * std::tanh(xv[ii])) * wv[ii], 1e-12);
      // J[1] is Float64, but the gradient for the Float32 input is rounded to Float32 on its way.
      BOOST_CHECK_SMALL(J[1].to_vector()[k] - std::tanh(xv[ii]), 1e-7);
    }
  }
  const auto g = [](const TensorList& a) { return ag::sum(ag::mul(ag::square(a[0]), a[1].to(Dtype::Float64))); };
  const auto H = ag::hessian(g, {x, w});
  BOOST_TEST((H[0][1].dtype() == Dtype::Float64));
  const auto xv = x.to_vector();
  for (int i = 0; i < 3; ++i) BOOST_CHECK_SMALL(H[0][1].to_vector()[static_cast<std::size_t>(i * 4)] - 2 * xv[static_cast<std::size_t>(i)], 1e-6);
}

// jvp, the two Jacobians and the Hessian of one function through attention and layer_norm agree
// with each other and with central differences (the first backward of jvp prunes weight grads).
BOOST_AUTO_TEST_CASE(transforms_agree_with_central_differences_under_pruning) {
  const auto f = [](const TensorList& a) {
    const Tensor n = ag::layer_norm(a[0], {2}, a[3], Tensor());
    const auto r = ag::scaled_dot_product_attention(n, a[1], a[2], {.is_causal = true});
    return ag::sum(ag::mul(r.output, r.output));
  };
  const TensorList vals{randn64({1, 1, 3, 2}, 1), randn64({1, 1, 3, 2}, 2), randn64({1, 1, 3, 2}, 3), randn64({2}, 4)};
  const TensorList Jr = ag::jacobian(f, vals);
  const TensorList Jf = ag::jacobian(f, vals, {.mode = ag::JacobianMode::Forward});
  const auto H = ag::hessian(f, vals);
  for (std::size_t i = 0; i < vals.size(); ++i) {
    const Tensor n = numeric_gradient([&](const TensorList& p) { return f(p).item(); }, vals, i);
    check_close(Jr[i], n, 1e-7, "reverse jacobian " + std::to_string(i));
    check_close(Jf[i], n, 1e-7, "forward jacobian " + std::to_string(i));
    TensorList tangents;
    for (std::size_t j = 0; j < vals.size(); ++j) tangents.push_back(ag::zeros(vals[j].shape(), Dtype::Float64));
    tangents[i] = randn64(vals[i].shape(), 50 + i);
    const auto r = ag::jvp([&](const TensorList& a) { return TensorList{f(a)}; }, vals, tangents);
    const double want = ag::sum(ag::mul(n, tangents[i])).item();
    BOOST_CHECK_SMALL(r.tangents[0].item() - want, 1e-7);
    for (std::size_t j = 0; j < vals.size(); ++j) {
      const Tensor Hij = ag::reshape(H[i][j], {vals[i].numel(), vals[j].numel()});
      const Tensor Hji = ag::reshape(H[j][i], {vals[j].numel(), vals[i].numel()});
      check_close(Hij, ag::transpose(Hji, 0, 1).clone(), 1e-10, "hessian symmetry " + std::to_string(i) + "," + std::to_string(j));
    }
  }
}

// A Jacobian far too large for memory: refused with a message naming the transform and the
// shape, not a bare std::bad_alloc (2^20 outputs × 2^20 inputs × 8 bytes = 8 TiB), before
// anything is allocated.
BOOST_AUTO_TEST_CASE(huge_jacobian_is_refused_by_name) {
  const Tensor x = ag::zeros({1 << 20}, Dtype::Float64);
  const std::string msg = message_of([&] { ag::jacobian([](const TensorList& a) { return ag::mul(a[0], 2.0); }, {x}); });
  check_mentions(msg, {"jacobian", "[1048576, 1048576]", "needs 8 TiB", "this machine's memory"});
  const std::string msg2 = message_of([&] { ag::hessian([](const TensorList& a) { return ag::sum(ag::square(a[0])); }, {x}); });
  check_mentions(msg2, {"hessian", "[1048576, 1048576]"});
}

// Pruned rules under anomaly detection, and grad() asked for the same input twice or for an input
// and a tensor computed from it.
BOOST_AUTO_TEST_CASE(pruned_grad_under_anomaly_repeated_and_nested_inputs) {
  Tensor x = randn64({3}, 1).requires_grad_(), w = randn64({3}, 2).requires_grad_();
  {
    ag::DetectAnomalyGuard anomaly;
    // d/dw would be 1/0 · ... : log of a zero w is -inf, but d/dx of x·log(w)... only x is asked.
    Tensor wz = ag::mul(w, 0.0);
    const Tensor y = ag::sum(ag::mul(x, ag::exp(wz)));
    const Tensor gx = ag::grad({y}, {x})[0];
    check_close(gx, ag::ones({3}, Dtype::Float64), 1e-15, "d/dx under anomaly detection");
  }
  const Tensor h = ag::mul(x, w);
  const Tensor y = ag::sum(ag::mul(h, h));  // Σ x²w²
  ag::GradOptions keep;
  keep.retain_graph = true;
  const TensorList g = ag::grad({y}, {x, x, h}, keep);
  const Tensor want_x = ag::mul(ag::mul(ag::mul(x, w), w), 2.0).detach();
  check_close(g[0], want_x, 1e-14, "first x");
  check_close(g[1], want_x, 1e-14, "second x");
  check_close(g[2], ag::mul(h, 2.0).detach(), 1e-14, "h");
}

// The transforms hand back tensors of their own: changing the tangent or cotangent given
// afterwards must not change the results (the identity's J·v is v's value, not v's storage).
BOOST_AUTO_TEST_CASE(results_do_not_alias_the_arguments) {
  const Tensor x = randn64({3}, 1);
  Tensor v = randn64({3}, 2);
  const Tensor v0 = v.clone();
  const auto id = [](const TensorList& a) { return TensorList{a[0]}; };
  const auto r = ag::jvp(id, {x}, {v});
  const auto c = ag::vjp(id, {x}, {v});
  v.data<double>()[0] += 100.0;
  check_close(r.tangents[0], v0, 0, "jvp tangent after the tangent given was changed");
  check_close(c.cotangents[0], v0, 0, "vjp cotangent after the cotangent given was changed");
}

namespace {

struct RawSquare : ag::Function<RawSquare> {  // backward from raw values, not declared
  static constexpr const char* name = "raw_square";
  static Tensor forward(ag::FunctionCtx& ctx, const Tensor& x) {
    ctx.save_for_backward({x});
    return ag::square(x);
  }
  static TensorList backward(ag::FunctionCtx& ctx, const TensorList& g) {
    const Tensor x = ctx.saved_tensors()[0];
    std::vector<double> v = x.to_vector(), gv = g[0].to_vector();
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = 2 * v[i] * gv[i];
    return {ag::tensor(v, x.shape(), x.dtype())};
  }
};

struct OnceSquare : ag::Function<OnceSquare> {
  static constexpr const char* name = "once_square";
  static constexpr bool once_differentiable = true;
  static Tensor forward(ag::FunctionCtx& ctx, const Tensor& x) {
    ctx.save_for_backward({x});
    return ag::square(x);
  }
  static TensorList backward(ag::FunctionCtx& ctx, const TensorList& g) {
    return {ag::mul(ag::mul(g[0], ctx.saved_tensors()[0]), 2.0)};
  }
};

// A custom Function that reads needs_input_grad from its context: under grad() for x alone it
// is asked (by the engine) only for what it computes; the numbers match backward().
struct MulReadsCtx : ag::Function<MulReadsCtx> {
  static constexpr const char* name = "mul_reads_ctx";
  static Tensor forward(ag::FunctionCtx& ctx, const Tensor& a, const Tensor& b) {
    ctx.save_for_backward({a, b});
    return ag::mul(a, b);
  }
  static TensorList backward(ag::FunctionCtx& ctx, const TensorList& g) {
    const TensorList s = ctx.saved_tensors();
    return {ctx.needs_input_grad(0) ? ag::mul(g[0], s[1]) : Tensor(), ctx.needs_input_grad(1) ? ag::mul(g[0], s[0]) : Tensor()};
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(forward_mode_through_custom_functions) {
  const Tensor x = randn64({3}, 1);
  const Tensor v = ag::ones({3}, Dtype::Float64);
  // Reverse mode through either works.
  const auto c = ag::vjp([](const TensorList& a) { return TensorList{RawSquare::apply(a[0])}; }, {x}, {v});
  check_close(c.cotangents[0], ag::mul(x, 2.0), 1e-15, "vjp through raw_square");
  // Forward mode: a message naming the transform and the function, never silent zeros.
  check_mentions(message_of([&] { ag::jvp([](const TensorList& a) { return TensorList{OnceSquare::apply(a[0])}; }, {x}, {v}); }),
                 {"jvp", "once_square"});
  check_mentions(message_of([&] {
                   ag::jacobian([](const TensorList& a) { return OnceSquare::apply(a[0]); }, {x},
                                {.mode = ag::JacobianMode::Forward});
                 }),
                 {"jacobian", "once_square"});
  check_mentions(message_of([&] { ag::hessian([](const TensorList& a) { return ag::sum(OnceSquare::apply(a[0])); }, {x}); }),
                 {"hessian", "once_square"});
  bool threw = false;
  Tensor t;
  try {
    t = ag::jvp([](const TensorList& a) { return TensorList{RawSquare::apply(a[0])}; }, {x}, {v}).tangents[0];
  } catch (const std::exception& e) {
    threw = true;
    check_mentions(e.what(), {"jvp", "raw_square"});
  }
  if (!threw) check_close(t, ag::mul(x, 2.0), 1e-15, "jvp through raw_square");
  // ctx.needs_input_grad under a pruned grad(), then a retained backward().
  Tensor a = randn64({3}, 2).requires_grad_(), b = randn64({3}, 3).requires_grad_();
  const Tensor y = ag::sum(ag::square(MulReadsCtx::apply(a, b)));
  ag::GradOptions keep;
  keep.retain_graph = true;
  const Tensor ga = ag::grad({y}, {a}, keep)[0];
  y.backward();
  check_close(ga, a.grad(), 1e-14, "custom Function grad() vs backward()");
  check_close(b.grad(), ag::mul(ag::mul(ag::mul(a, a), b), 2.0).detach(), 1e-12, "custom Function b.grad");
}

// Third order through pruned walks: d/dw of the Hessian-vector product in x of
// L = Σ tanh(x·w)², against central differences of the Hessian-vector product.
BOOST_AUTO_TEST_CASE(third_order_through_pruned_walks) {
  const auto L = [](const TensorList& v) { return ag::sum(ag::square(ag::tanh(ag::matmul(v[0], v[1])))); };
  const TensorList vals{randn64({2, 3}, 1), randn64({3, 2}, 2)};
  const Tensor dir = randn64({2, 3}, 3);
  const auto hvp_dot = [&](const TensorList& p, bool graph) {
    TensorList q;
    for (const auto& t : p) q.push_back(graph ? t : t.detach().clone().requires_grad_());
    ag::GradOptions o;
    o.create_graph = true;
    const Tensor g = ag::grad({L(q)}, {q[0]}, o)[0];
    const Tensor gd = ag::sum(ag::mul(g, dir));
    const Tensor h = ag::grad({gd}, {q[0]}, o)[0];  // H_xx·dir
    return std::make_pair(ag::sum(ag::mul(h, dir)), q);
  };
  TensorList xs;
  for (const auto& v : vals) xs.push_back(v.detach().clone().requires_grad_());
  const auto [s, q] = hvp_dot(xs, true);
  const Tensor d3 = ag::grad({s}, {xs[1]})[0];
  const Tensor n = numeric_gradient([&](const TensorList& p) { return hvp_dot(p, false).first.item(); }, vals, 1);
  check_close(d3, n, 1e-7, "d/dw ⟨dir, H_xx dir⟩");
}

// Transforms composed (torch.func's jacfwd(jacrev(f)) and friends): a transform inside another's
// function keeps its results in the graph, so the outer one differentiates them. Silent zeros
// (an inner result outside any graph) would be wrong.
BOOST_AUTO_TEST_CASE(composed_transforms_are_right_or_refused) {
  const Tensor x = randn64({3}, 1);
  const auto f = [](const TensorList& a) { return ag::sum(ag::mul(ag::square(a[0]), a[0])); };  // Σ x³
  const Tensor H = ag::hessian(f, {x})[0][0];                                                    // diag(6x)
  const auto grad_fn = [f](const TensorList& a) {
    return ag::vjp([f](const TensorList& b) { return TensorList{f(b)}; }, {a[0]}, {ag::ones({}, Dtype::Float64)})
        .cotangents[0];
  };
  for (auto mode : {ag::JacobianMode::Reverse, ag::JacobianMode::Forward}) {
    bool threw = false;
    Tensor J;
    try {
      J = ag::jacobian(grad_fn, {x}, {.mode = mode})[0];
    } catch (const std::exception& e) {
      threw = true;
      check_mentions(e.what(), {"jacobian"});
    }
    if (!threw) check_close(J, H, 1e-12, "jacobian of vjp (the Hessian)");
  }
  const auto jvp_fn = [f](const TensorList& a) {
    return ag::jvp([f](const TensorList& b) { return TensorList{f(b)}; }, {a[0]}, {ag::ones({3}, Dtype::Float64)})
        .tangents[0];
  };
  bool threw = false;
  Tensor J;
  try {
    J = ag::jacobian(jvp_fn, {x})[0];  // d/dx (Σ 3x²) = 6x
  } catch (const std::exception& e) {
    threw = true;
    check_mentions(e.what(), {"jacobian"});
  }
  if (!threw) check_close(J, ag::mul(x, 6.0), 1e-12, "jacobian of jvp");
}

// One output given twice, and an output that is another input passed through.
BOOST_AUTO_TEST_CASE(repeated_outputs_and_passthrough) {
  const Tensor x = randn64({3}, 1), w = randn64({3}, 2);
  const Tensor vx = randn64({3}, 3), vw = randn64({3}, 4);
  const auto r = ag::jvp(
      [](const TensorList& a) {
        const Tensor y = ag::mul(a[0], a[1]);
        return TensorList{y, y, a[1]};
      },
      {x, w}, {vx, vw});
  const Tensor want = ag::add(ag::mul(vx, w), ag::mul(x, vw));
  check_close(r.tangents[0], want, 1e-14, "first copy");
  check_close(r.tangents[1], want, 1e-14, "second copy");
  check_close(r.tangents[2], vw, 0, "passthrough");
  const auto c = ag::vjp(
      [](const TensorList& a) {
        const Tensor y = ag::mul(a[0], a[1]);
        return TensorList{y, y, a[1]};
      },
      {x, w}, {vx, vw, vx});
  check_close(c.cotangents[0], ag::mul(ag::add(vx, vw), w), 1e-14, "vjp x");
  check_close(c.cotangents[1], ag::add(ag::mul(ag::add(vx, vw), x), vx), 1e-14, "vjp w");
}

// A hook fired during grad() for x runs grad() for w over the same (retained) graph: both walks
// prune differently through the same nodes, and both must give backward()'s numbers.
BOOST_AUTO_TEST_CASE(nested_grad_over_the_same_graph_from_a_hook) {
  Tensor x = randn64({2, 3}, 1).requires_grad_(), w = randn64({3, 2}, 2).requires_grad_();
  Tensor c = randn64({2, 2}, 3).requires_grad_();
  const Tensor h = ag::matmul(x, w);
  Tensor k = ag::mul(ag::tanh(h), c);
  const Tensor y = ag::sum(ag::mul(k, k));
  Tensor inner_gw, inner_gc;
  bool fired = false;
  k.register_hook([&](const Tensor& g) {
    if (!fired) {
      fired = true;
      ag::GradOptions keep;
      keep.retain_graph = true;
      const TensorList gs = ag::grad({y}, {w, c}, keep);
      inner_gw = gs[0], inner_gc = gs[1];
    }
    return g;
  });
  ag::GradOptions keep;
  keep.retain_graph = true;
  const Tensor gx = ag::grad({y}, {x}, keep)[0];
  BOOST_REQUIRE(fired);
  Tensor x2 = x.detach().clone().requires_grad_(), w2 = w.detach().clone().requires_grad_();
  Tensor c2 = c.detach().clone().requires_grad_();
  const Tensor k2 = ag::mul(ag::tanh(ag::matmul(x2, w2)), c2);
  ag::sum(ag::mul(k2, k2)).backward();
  check_close(gx, x2.grad(), 1e-12, "outer grad for x");
  check_close(inner_gw, w2.grad(), 1e-12, "inner grad for w");
  check_close(inner_gc, c2.grad(), 1e-12, "inner grad for c");
}

// A rule that splits its work over threads (as OpenMP rules do) and asks needs_input_grad there
// must get the same answer as on the walk's thread.
// Known and not yet fixed: needs_input_grad is per thread during a grad() walk. The case asserts the right behaviour; it is expected to fail
// 1 check(s) until then (Boost reports it when it fails fewer).
BOOST_AUTO_TEST_CASE(needs_input_grad_same_answer_on_a_worker_thread, *boost::unit_test::expected_failures(1)) {
  Tensor x = randn64({3}, 1).requires_grad_(), w = randn64({3}, 2).requires_grad_();
  bool main_w = true, worker_w = true;
  Tensor y = ag::record("threaded_mul", {x, w}, ag::mul(x, w).detach(), [&, x, w](const TensorList& g, const ag::Node& node) {
    main_w = node.needs_input_grad(1);
    std::thread t([&] { worker_w = node.needs_input_grad(1); });
    t.join();
    TensorList out(2);
    if (node.needs_input_grad(0)) out[0] = ag::mul(g[0], w.detach());
    if (main_w) out[1] = ag::mul(g[0], x.detach());
    return out;
  });
  ag::grad({ag::sum(y)}, {x});
  BOOST_TEST(!main_w);
  BOOST_TEST(worker_w == main_w, "needs_input_grad(1): " << main_w << " on the walk's thread, " << worker_w << " on a worker");
}

BOOST_AUTO_TEST_CASE(invalid_jacobian_mode_is_refused_by_name) {
  const Tensor x = randn64({2}, 1);
  ag::JacobianOptions o;
  o.mode = static_cast<ag::JacobianMode>(7);
  check_mentions(message_of([&] { ag::jacobian([](const TensorList& a) { return a[0]; }, {x}, o); }), {"jacobian", "7"});
}

// The same transforms on two threads at once, over the same input data: each gets the
// single-threaded numbers.
BOOST_AUTO_TEST_CASE(transforms_on_two_threads_at_once) {
  const Tensor x = randn64({4}, 1), w = randn64({4, 3}, 2);
  const auto f = [](const TensorList& a) { return ag::sum(ag::square(ag::tanh(ag::matmul(a[0], a[1])))); };
  const auto H = ag::hessian(f, {x, w});
  const TensorList Jf = ag::jacobian([](const TensorList& a) { return ag::tanh(ag::matmul(a[0], a[1])); }, {x, w},
                                     {.mode = ag::JacobianMode::Forward});
  std::vector<double> errs(2, 0.0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep) {
        if (t == 0) {
          const auto H2 = ag::hessian(f, {x, w});
          for (std::size_t i = 0; i < 2; ++i)
            for (std::size_t j = 0; j < 2; ++j) errs[0] = std::max(errs[0], max_abs_diff(H2[i][j], H[i][j]));
        } else {
          const TensorList J2 = ag::jacobian([](const TensorList& a) { return ag::tanh(ag::matmul(a[0], a[1])); },
                                             {x, w}, {.mode = ag::JacobianMode::Forward});
          for (std::size_t i = 0; i < 2; ++i) errs[1] = std::max(errs[1], max_abs_diff(J2[i], Jf[i]));
        }
      }
    });
  for (auto& th : threads) th.join();
  BOOST_TEST(errs[0] == 0.0);
  BOOST_TEST(errs[1] == 0.0);
}

// nn::MultiHeadAttention (packed projection for self-attention, separate ones for cross): grad()
// for the input alone and for each parameter alone, with and without create_graph, against one
// backward() of everything.
BOOST_AUTO_TEST_CASE(pruned_grad_through_multi_head_attention) {
  for (bool self : {true, false}) {
    ag::Generator gen(42);
    nn::MultiHeadAttention mha{nn::MultiHeadAttentionOptions{.embed_dim = 8, .num_heads = 2, .dtype = Dtype::Float64}, gen};
    const Tensor xv = randn64({2, 3, 8}, 1), kv = randn64({2, 4, 8}, 2);
    const Tensor seed = randn64({2, 3, 8}, 3);
    const auto run = [&](const Tensor& x, const Tensor& m) {
      const Tensor out = self ? mha.forward(x, x, x).output : mha.forward(x, m, m).output;
      return ag::sum(ag::mul(out, seed));
    };
    const std::vector<Tensor> params = mha.parameters();
    for (const auto& p : params) p.set_grad(Tensor());
    Tensor x = xv.clone().requires_grad_(), m = kv.clone().requires_grad_();
    run(x, m).backward();
    std::vector<Tensor> want;
    for (const auto& p : params) want.push_back(p.grad().clone());
    for (const auto& p : params) p.set_grad(Tensor());
    for (bool create : {false, true}) {
      ag::GradOptions o;
      o.create_graph = create;
      Tensor x2 = xv.clone().requires_grad_(), m2 = kv.clone().requires_grad_();
      check_close(ag::grad({run(x2, m2)}, {x2}, o)[0], x.grad(), 1e-12, std::string(self ? "self" : "cross") + ": x");
      if (!self) {
        Tensor x3 = xv.clone().requires_grad_(), m3 = kv.clone().requires_grad_();
        check_close(ag::grad({run(x3, m3)}, {m3}, o)[0], m.grad(), 1e-12, "cross: memory");
      }
      for (std::size_t i = 0; i < params.size(); ++i) {
        Tensor x4 = xv.clone().requires_grad_(), m4 = kv.clone().requires_grad_();
        check_close(ag::grad({run(x4, m4)}, {params[i]}, o)[0], want[i], 1e-12,
                    std::string(self ? "self" : "cross") + ": parameter " + std::to_string(i) + (create ? " (create_graph)" : ""));
      }
      for (const auto& p : params) BOOST_TEST(!p.grad().defined());
    }
  }
}

// The tiled (flash) core at small sizes: grad() for each of q, k, v and the mask alone, and for the
// packed projection, against backward(), with and without create_graph.
BOOST_AUTO_TEST_CASE(pruned_grad_through_tiled_attention) {
  struct SmallTiles {
    ag::sdpa::FlashTiles saved = ag::sdpa::flash_tiles();
    SmallTiles() { ag::sdpa::flash_tiles() = {3, 4, 0}; }
    ~SmallTiles() { ag::sdpa::flash_tiles() = saved; }
  } small_tiles;
  check_pruned_against_backward(
      "tiled attention with mask",
      [](const TensorList& x) {
        return ag::scaled_dot_product_attention(x[0], x[1], x[2], {.need_weights = false, .attn_mask = x[3]}).output;
      },
      {randn64({1, 2, 5, 4}, 60), randn64({1, 2, 7, 4}, 61), randn64({1, 2, 7, 3}, 62), randn64({5, 7}, 63)});
  check_pruned_against_backward(
      "tiled causal attention with broadcast mask",
      [](const TensorList& x) {
        return ag::scaled_dot_product_attention(x[0], x[1], x[2],
                                                {.need_weights = false, .attn_mask = x[3], .is_causal = true})
            .output;
      },
      {randn64({2, 1, 6, 2}, 64), randn64({2, 1, 6, 2}, 65), randn64({2, 1, 6, 2}, 66), randn64({1, 6}, 67)});
  check_pruned_against_backward(
      "tiled packed attention with mask",
      [](const TensorList& x) {
        return ag::scaled_dot_product_attention_packed(x[0], 2, {.need_weights = false, .attn_mask = x[1]}).output;
      },
      {randn64({1, 7, 12}, 68), randn64({7, 7}, 69)});
  check_pruned_against_backward(
      "tiled heads-last attention with mask",
      [](const TensorList& x) {
        return ag::scaled_dot_product_attention_heads_last(x[0], x[1], x[2], 2,
                                                           {.need_weights = false, .attn_mask = x[3]})
            .output;
      },
      {randn64({1, 5, 4}, 70), randn64({1, 7, 4}, 71), randn64({1, 7, 6}, 72), randn64({5, 7}, 73)});
}

// Negative control: the comparison used above fails a gradient taken with another seed.
BOOST_AUTO_TEST_CASE(negative_control_pruned_comparison_detects_a_wrong_gradient) {
  Tensor x = randn64({3, 4}, 1).requires_grad_(), w = randn64({4, 2}, 2).requires_grad_();
  ag::sum(ag::mul(ag::matmul(x, w), randn64({3, 2}, 99))).backward();
  Tensor x2 = x.detach().clone().requires_grad_(), w2 = w.detach().clone().requires_grad_();
  ag::GradOptions o;
  o.grad_outputs = {randn64({3, 2}, 98)};
  const Tensor g = ag::grad({ag::matmul(x2, w2)}, {x2}, o)[0];
  BOOST_TEST(max_abs_diff(g, x.grad()) > 1e-3);
}

BOOST_AUTO_TEST_CASE(one_element_non_scalar_output_and_empty_operands) {
  const Tensor x = randn64({2}, 1);
  const auto H = ag::hessian([](const TensorList& a) { return ag::reshape(ag::sum(ag::mul(ag::square(a[0]), a[0])), {1, 1}); }, {x});
  BOOST_REQUIRE((H[0][0].shape() == Shape{1, 1, 2, 2}));
  const auto h = H[0][0].to_vector(), xv = x.to_vector();
  BOOST_CHECK_SMALL(h[0] - 6 * xv[0], 1e-12);
  BOOST_CHECK_SMALL(h[3] - 6 * xv[1], 1e-12);
  BOOST_CHECK_SMALL(h[1], 1e-15);
  check_pruned_against_backward("matmul with an empty inner dim", [](const TensorList& v) { return ag::matmul(v[0], v[1]); },
                                {randn64({2, 0}, 2), randn64({0, 3}, 3)});
  check_pruned_against_backward("layer_norm of no rows",
                                [](const TensorList& v) { return ag::layer_norm(v[0], {4}, v[1], v[2]); },
                                {randn64({0, 4}, 4), randn64({4}, 5), randn64({4}, 6)});
}

// A backward computed from raw values cannot be differentiated: hessian and a nested reverse
// jacobian refuse it by name as jvp does, instead of giving zero rows.
BOOST_AUTO_TEST_CASE(hessian_through_a_raw_value_backward_is_refused) {
  const Tensor x = randn64({3}, 1);
  const auto f = [](const TensorList& a) { return ag::sum(RawSquare::apply(a[0])); };
  check_mentions(message_of([&] { ag::hessian(f, {x}); }), {"hessian", "raw_square"});
  const ag::GradcheckFn nested = [f](const TensorList& a) { return ag::jacobian(f, a)[0]; };
  check_mentions(message_of([&] { ag::jacobian(nested, {x}); }), {"jacobian", "raw_square"});
}
