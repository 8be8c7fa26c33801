// Second derivatives of the nn op family: matmul, linear and linear_cat, index_select and
// embedding, softmax and log_softmax, layer_norm, cross_entropy. Each is checked with
// gradgradcheck (float64, default tolerances) as the op nearest the seed and inside a chain,
// and where a composed equivalent exists, the fused op's second derivatives agree with it.
// Run with --log_level=message to see the worst errors of each check.
#define BOOST_TEST_MODULE double_backward_nn_ops
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>

#include <autograd/autograd.hpp>

#include "test_support.hpp"

namespace ag = autograd;
using ag::Dtype;
using ag::Tensor;
using ag::TensorList;
using test_support::check_values;
using test_support::input;

namespace {

// gradgradcheck with the default tolerances; the report on failure, the worst errors logged.
void check_gradgrad(const std::string& what, const ag::GradcheckFn& f, const TensorList& inputs) {
  const ag::GradcheckResult r = ag::gradgradcheck(f, inputs);
  BOOST_TEST(r.ok, what << ": " << fmt::format("{}", r));
  BOOST_TEST(r.elements_checked > 0, what << ": nothing was checked");
  BOOST_TEST_MESSAGE(fmt::format("gradgradcheck {}: max abs {:.3g}, max rel {:.3g}", what, r.max_abs_error,
                                 r.max_rel_error));
}

// a and b hold the same values within tol (absolute, elementwise), and the same shape.
void check_close(const Tensor& a, const Tensor& b, double tol = 1e-12) {
  BOOST_REQUIRE(a.defined() && b.defined());
  BOOST_TEST(ag::shape_str(a.shape()) == ag::shape_str(b.shape()));
  const auto x = a.to_vector(), y = b.to_vector();
  BOOST_REQUIRE_EQUAL(x.size(), y.size());
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  BOOST_TEST(worst <= tol, "largest difference " << worst);
}

// Values drawn from N(0, 1) with a seed, no grad (a constant of a test).
Tensor constant(const ag::Shape& shape, std::uint64_t seed) { return input(shape, seed).detach(); }

// Every element of the hvp of f at the inputs, one tensor per input.
TensorList hvp_at(const ag::GradcheckFn& f, const TensorList& inputs, const TensorList& v) {
  return ag::hvp(f, inputs, v);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(matmul_second_order)

BOOST_AUTO_TEST_CASE(every_rank_combination_at_the_seed) {
  struct Case {
    const char* what;
    ag::Shape a, b;
  };
  const Case cases[] = {
      {"1-D . 1-D", {4}, {4}},
      {"2-D . 2-D", {3, 4}, {4, 5}},
      {"1-D . 3-D", {4}, {2, 4, 3}},
      {"3-D . 1-D", {2, 3, 4}, {4}},
      {"2-D . 1-D", {3, 4}, {4}},
      {"1-D . 2-D", {4}, {4, 3}},
      {"batch folds into rows", {2, 3, 4}, {4, 5}},
      {"only B batched", {3, 4}, {2, 4, 5}},
      {"same batch", {2, 3, 4}, {2, 4, 5}},
      {"broadcast batch dims", {2, 1, 3, 4}, {5, 4, 2}},
      {"broadcast both ways", {1, 3, 2, 4}, {2, 1, 4, 3}},
  };
  std::uint64_t seed = 1;
  for (const Case& c : cases) {
    const Tensor a = input(c.a, seed++), b = input(c.b, seed++);
    check_gradgrad(c.what, [](const TensorList& in) { return ag::matmul(in[0], in[1]); }, {a, b});
  }
}

BOOST_AUTO_TEST_CASE(only_one_operand_requires_grad) {
  const Tensor a = input({2, 3, 4}, 11), w = constant({4, 5}, 12);
  check_gradgrad("A only", [&](const TensorList& in) { return ag::matmul(in[0], w) * ag::matmul(in[0], w); }, {a});
  const Tensor x = constant({2, 3, 4}, 13), b = input({2, 4, 5}, 14);
  check_gradgrad("B only", [&](const TensorList& in) { return ag::matmul(x, in[0]) * ag::matmul(x, in[0]); }, {b});
}

BOOST_AUTO_TEST_CASE(in_a_chain) {
  // (A·B)·C multiplied by A·B: every factor appears in second-order cross terms
  const Tensor a = input({2, 3, 4}, 21), b = input({1, 4, 5}, 22), c = input({5, 2}, 23);
  check_gradgrad(
      "chain",
      [](const TensorList& in) {
        const Tensor ab = ag::matmul(in[0], in[1]);
        return ag::matmul(ag::matmul(ab, in[2]), ag::transpose(in[2], 0, 1)) * ab;
      },
      {a, b, c});
  const Tensor u = input({4}, 24), m = input({3, 4, 4}, 25);
  check_gradgrad(
      "vector chain",
      [](const TensorList& in) {
        const Tensor mu = ag::matmul(in[1], in[0]);  // [3, 4]
        return ag::matmul(mu, in[0]) * ag::matmul(ag::matmul(in[0], in[1]), in[0]);
      },
      {u, m});
}

BOOST_AUTO_TEST_CASE(hvp_of_a_quadratic_form_is_exact) {
  // f(x) = ½ xᵀAx through two matmuls: H = ½(A + Aᵀ), so Hv = ½(Av + Aᵀv), computed here from A.
  const int n = 5;
  const Tensor A = constant({n, n}, 31);
  const Tensor x = input({n}, 32), v = constant({n}, 33);
  auto f = [&](const TensorList& in) { return ag::matmul(in[0], ag::matmul(A, in[0])) * 0.5; };
  const TensorList hv = hvp_at(f, {x}, {v});
  const auto a = A.to_vector(), vs = v.to_vector();
  std::vector<double> expected(n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) expected[i] += 0.5 * (a[i * n + j] + a[j * n + i]) * vs[j];
  check_values(hv[0], {n}, expected);

  // batched: f(X) = ½ Σ_b x_bᵀ A x_b with X [3, n] as 3 rows: (HV)_b = ½(A + Aᵀ) v_b
  const Tensor X = input({3, n}, 34), V = constant({3, n}, 35);
  auto fb = [&](const TensorList& in) {
    const Tensor ax = ag::matmul(ag::unsqueeze(in[0], 1), ag::unsqueeze(ag::matmul(in[0], ag::transpose(A, 0, 1)), 2));
    return ag::sum(ax) * 0.5;  // Σ_b x_bᵀ (A x_b)
  };
  const TensorList hvb = hvp_at(fb, {X}, {V});
  const auto vb = V.to_vector();
  std::vector<double> expected_b(3 * n, 0.0);
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) expected_b[r * n + i] += 0.5 * (a[i * n + j] + a[j * n + i]) * vb[r * n + j];
  check_values(hvb[0], {3, n}, expected_b);
}

BOOST_AUTO_TEST_CASE(first_order_unchanged_under_create_graph) {
  // The composed backward gives the kernel's gradients, to rounding.
  const Tensor a = input({2, 1, 3, 4}, 41), b = input({5, 4, 2}, 42);
  const Tensor u = constant({2, 5, 3, 2}, 43);
  const TensorList plain = ag::grad({ag::matmul(a, b)}, {a, b}, {.grad_outputs = {u}});
  const TensorList graph = ag::grad({ag::matmul(a, b)}, {a, b}, {.grad_outputs = {u}, .create_graph = true});
  BOOST_TEST(graph[0].requires_grad());
  check_close(plain[0], graph[0]);
  check_close(plain[1], graph[1]);
}

BOOST_AUTO_TEST_SUITE_END()

// ---------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(softmax_second_order)

BOOST_AUTO_TEST_CASE(along_each_dim_at_the_seed) {
  const Tensor x = input({2, 4, 3}, 51);
  for (std::int64_t dim : {-1, 1, 0}) {
    check_gradgrad(fmt::format("softmax dim {}", dim), [dim](const TensorList& in) { return ag::softmax(in[0], dim); },
                   {x});
    check_gradgrad(fmt::format("log_softmax dim {}", dim),
                   [dim](const TensorList& in) { return ag::log_softmax(in[0], dim); }, {x});
  }
  const Tensor s = input({}, 52);
  check_gradgrad("softmax of a 0-d tensor", [](const TensorList& in) { return ag::softmax(in[0], 0); }, {s});
  check_gradgrad("log_softmax of a 0-d tensor", [](const TensorList& in) { return ag::log_softmax(in[0], 0); }, {s});
}

BOOST_AUTO_TEST_CASE(in_a_chain) {
  // attention-like: softmax(Q·Kᵀ)·V, times itself; and log_softmax of a product, squared
  const Tensor q = input({2, 3, 4}, 61), k = input({2, 5, 4}, 62), v = input({2, 5, 3}, 63);
  for (std::int64_t dim : {-1, 1}) {
    check_gradgrad(
        fmt::format("softmax(Q K^T, dim {}) V", dim),
        [dim](const TensorList& in) {
          const Tensor p = ag::softmax(ag::matmul(in[0], ag::transpose(in[1], 1, 2)), dim);
          const Tensor o = ag::matmul(p, in[2]);
          return o * o;
        },
        {q, k, v});
    check_gradgrad(
        fmt::format("log_softmax(Q K^T, dim {}) squared", dim),
        [dim](const TensorList& in) {
          const Tensor l = ag::log_softmax(ag::matmul(in[0], ag::transpose(in[1], 1, 2)), dim);
          return l * l;
        },
        {q, k});
  }
  const Tensor x = input({3, 4}, 64);
  check_gradgrad("softmax of softmax", [](const TensorList& in) {
    const Tensor p = ag::softmax(ag::softmax(in[0], -1) * 3.0, 0);
    return p * p;
  }, {x});
}

BOOST_AUTO_TEST_CASE(masked_entries_and_fully_masked_rows) {
  // Row 0 has two masked entries, row 1 is masked throughout, row 2 is plain (a -inf added to a
  // logit masks it); the masked row keeps its zero gradient at second order too.
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor mask = ag::tensor({0, -inf, 0, -inf, -inf, -inf, -inf, -inf, 0, 0, 0, 0}, {3, 4}, Dtype::Float64);
  const Tensor x = input({3, 4}, 71), w = input({4, 4}, 75);
  for (std::int64_t dim : {-1, 0}) {
    check_gradgrad(fmt::format("masked softmax dim {}", dim), [&, dim](const TensorList& in) {
      const Tensor p = ag::softmax(ag::matmul(in[0], in[1]) + mask, dim);
      return p * p;
    }, {x, w});
    check_gradgrad(fmt::format("masked log_softmax dim {}", dim), [&, dim](const TensorList& in) {
      return ag::log_softmax(ag::matmul(in[0], in[1]) + mask, dim);
    }, {x, w});
  }
  // the fully masked row's first and second derivatives are exactly zero, not NaN
  const Tensor z = input({2, 3}, 72);
  const Tensor row_mask = ag::tensor({0, 0, 0, -inf, -inf, -inf}, {2, 3}, Dtype::Float64);
  for (bool log : {false, true}) {
    const Tensor y = log ? ag::log_softmax(z + row_mask, -1) : ag::softmax(z + row_mask, -1);
    const Tensor u = constant({2, 3}, 73);
    const Tensor gx = ag::grad({y}, {z}, {.grad_outputs = {u}, .create_graph = true})[0];
    const Tensor w2 = constant({2, 3}, 74);
    const Tensor ggx = ag::grad({gx}, {z}, {.grad_outputs = {w2}})[0];
    const auto g1 = gx.to_vector(), g2 = ggx.to_vector();
    for (int i = 3; i < 6; ++i) {
      BOOST_TEST(g1[i] == 0.0);
      BOOST_TEST(g2[i] == 0.0);
    }
    for (double e : g2) BOOST_TEST(std::isfinite(e));
  }
}

BOOST_AUTO_TEST_CASE(hvp_agrees_with_the_analytic_hessian) {
  // f(x) = cᵀ softmax(x) for one row: with s = softmax(x) and Js = diag(s) − s sᵀ,
  // ∇f = s ⊙ (c − cᵀs) and the Hessian-vector product is
  //   Hv = (Js v) ⊙ (c − cᵀs) − s · (cᵀ Js v),
  // computed here in plain doubles.
  const int n = 6;
  const Tensor x = input({n}, 81), c = constant({n}, 82), v = constant({n}, 83);
  const TensorList hv = hvp_at([&](const TensorList& in) { return ag::sum(ag::softmax(in[0], 0) * c); }, {x}, {v});
  std::vector<double> s(n), cs(n), vs(n);
  const auto xs = x.to_vector();
  double mx = xs[0], z = 0;
  for (double e : xs) mx = std::max(mx, e);
  for (int i = 0; i < n; ++i) z += s[i] = std::exp(xs[i] - mx);
  for (int i = 0; i < n; ++i) s[i] /= z;
  cs = c.to_vector();
  vs = v.to_vector();
  double sv = 0, cts = 0;
  for (int i = 0; i < n; ++i) {
    sv += s[i] * vs[i];
    cts += cs[i] * s[i];
  }
  std::vector<double> jv(n), expected(n);
  double cjv = 0;
  for (int i = 0; i < n; ++i) {
    jv[i] = s[i] * vs[i] - s[i] * sv;
    cjv += cs[i] * jv[i];
  }
  for (int i = 0; i < n; ++i) expected[i] = jv[i] * (cs[i] - cts) - s[i] * cjv;
  check_values(hv[0], {n}, expected);

  // log_softmax: f = cᵀ log_softmax(x) = cᵀx − (Σc) logΣexp(x): H = −(Σc)(diag(s) − s sᵀ)
  const TensorList hl = hvp_at([&](const TensorList& in) { return ag::sum(ag::log_softmax(in[0], 0) * c); }, {x}, {v});
  double csum = 0;
  for (double e : cs) csum += e;
  for (int i = 0; i < n; ++i) expected[i] = -csum * jv[i];
  check_values(hl[0], {n}, expected);
}

BOOST_AUTO_TEST_SUITE_END()

namespace {

// Class indices as a float64 tensor (targets are not differentiated).
Tensor targets_of(const std::vector<double>& t, const ag::Shape& shape) { return ag::tensor(t, shape, Dtype::Float64); }

// Rows of a constant matrix m [R, K]: rows [begin, begin + count).
Tensor rows_of(const Tensor& m, std::int64_t begin, std::int64_t count) {
  const auto v = m.to_vector();
  const std::int64_t k = m.size(1);
  return ag::tensor(std::vector<double>(v.begin() + begin * k, v.begin() + (begin + count) * k), {count, k},
                    Dtype::Float64);
}

// The one-hot matrix [index.size(), size]: row k has a 1 at index[k].
Tensor one_hot(const std::vector<std::int64_t>& index, std::int64_t size) {
  std::vector<double> v(index.size() * static_cast<std::size_t>(size), 0.0);
  for (std::size_t k = 0; k < index.size(); ++k) v[k * static_cast<std::size_t>(size) + static_cast<std::size_t>(index[k])] = 1.0;
  return ag::tensor(v, {static_cast<std::int64_t>(index.size()), size}, Dtype::Float64);
}

// hvp of f at inputs along v (seeded per input), against hvp of the reference g: equal to 1e-12.
void check_same_hvp(const ag::GradcheckFn& f, const ag::GradcheckFn& g, const TensorList& inputs, std::uint64_t seed) {
  TensorList v;
  for (const Tensor& t : inputs) v.push_back(constant(t.shape(), seed++));
  const TensorList a = ag::hvp(f, inputs, v), b = ag::hvp(g, inputs, v);
  BOOST_REQUIRE_EQUAL(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    BOOST_TEST_CONTEXT("input " << i) check_close(a[i], b[i]);
    // not vacuous: some second-order term reaches every input
    double norm = 0;
    for (double e : a[i].to_vector()) norm += e * e;
    BOOST_TEST(norm > 1e-6, "hvp of input " << i << " is zero");
  }
}

// First-order gradients with and without create_graph agree (the composed path is the kernel's math).
void check_same_first_order(const ag::GradcheckFn& f, const TensorList& inputs, std::uint64_t seed) {
  const Tensor y = f(inputs);
  const Tensor u = constant(y.shape(), seed);
  const TensorList plain = ag::grad({f(inputs)}, inputs, {.grad_outputs = {u}});
  const TensorList graph = ag::grad({f(inputs)}, inputs, {.grad_outputs = {u}, .create_graph = true});
  bool any_graph = false;  // (a bias's gradient depends on no input: it has none)
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    any_graph = any_graph || graph[i].requires_grad();
    BOOST_TEST_CONTEXT("input " << i) check_close(plain[i], graph[i]);
  }
  BOOST_TEST(any_graph, "no gradient is part of a graph");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(linear_second_order)

BOOST_AUTO_TEST_CASE(at_the_seed) {
  const Tensor w = input({4, 3}, 101), b = input({3}, 102);
  for (const ag::Shape& xs : {ag::Shape{4}, ag::Shape{5, 4}, ag::Shape{2, 3, 4}}) {
    const Tensor x = input(xs, 103);
    const std::string s = ag::shape_str(xs);
    check_gradgrad("linear x " + s, [](const TensorList& in) { return ag::linear(in[0], in[1], in[2]); }, {x, w, b});
    check_gradgrad("linear without bias x " + s, [](const TensorList& in) { return ag::linear(in[0], in[1]); }, {x, w});
    check_same_first_order([](const TensorList& in) { return ag::linear(in[0], in[1], in[2]); }, {x, w, b}, 104);
  }
}

BOOST_AUTO_TEST_CASE(in_a_chain) {
  const Tensor x = input({2, 3, 4}, 111), w = input({4, 5}, 112), b = input({5}, 113), w2 = input({5, 2}, 114);
  check_gradgrad(
      "linear chain",
      [](const TensorList& in) {
        const Tensor h = ag::linear(in[0], in[1], in[2]);
        return ag::linear(h * h, in[3]);
      },
      {x, w, b, w2});
  // only x requires grad; then only the weight
  const Tensor wc = w.detach(), xc = x.detach();
  check_gradgrad("linear chain, x only", [&](const TensorList& in) {
    const Tensor h = ag::linear(in[0], wc);
    return h * h;
  }, {x});
  check_gradgrad("linear chain, w only", [&](const TensorList& in) {
    const Tensor h = ag::linear(xc, in[0], b.detach());
    return ag::softmax(h, -1) * h;
  }, {w});
}

BOOST_AUTO_TEST_CASE(hvp_equals_matmul_plus_add) {
  const Tensor x = input({2, 3, 4}, 121), w = input({4, 5}, 122), b = input({5}, 123);
  const Tensor t = targets_of({0, 4, 2, 1, 3, 0}, {2, 3});
  check_same_hvp([&](const TensorList& in) { return ag::cross_entropy(ag::linear(in[0], in[1], in[2]), t); },
                 [&](const TensorList& in) { return ag::cross_entropy(ag::matmul(in[0], in[1]) + in[2], t); },
                 {x, w, b}, 124);
}

BOOST_AUTO_TEST_CASE(linear_cat_at_the_seed_and_in_a_chain) {
  const Tensor x = input({2, 3, 4}, 131);
  const Tensor w1 = input({4, 2}, 132), w2 = input({4, 3}, 133), w3 = input({4, 1}, 134);
  const Tensor b1 = input({2}, 135), b3 = input({1}, 136);
  check_gradgrad("linear_cat, one weight", [](const TensorList& in) {
    const Tensor ws[] = {in[1]};
    return ag::linear_cat(in[0], ws);
  }, {x, w1});
  check_gradgrad("linear_cat, three weights, mixed biases", [](const TensorList& in) {
    const Tensor ws[] = {in[1], in[2], in[3]};
    const Tensor bs[] = {in[4], Tensor(), in[5]};
    return ag::linear_cat(in[0], ws, bs);
  }, {x, w1, w2, w3, b1, b3});
  check_gradgrad("linear_cat chain", [](const TensorList& in) {
    const Tensor ws[] = {in[1], in[2]};
    const Tensor bs[] = {in[3], Tensor()};
    const Tensor y = ag::linear_cat(in[0], ws, bs);  // [2, 3, 5]
    return ag::softmax(ag::matmul(y, ag::transpose(y, 1, 2)), -1);
  }, {x, w1, w2, b1});
  // a weight that needs no gradient still shapes the second derivatives of x
  const Tensor w2c = w2.detach();
  check_gradgrad("linear_cat, one weight constant", [&](const TensorList& in) {
    const Tensor ws[] = {in[1], w2c};
    const Tensor y = ag::linear_cat(in[0], ws);
    return y * y;
  }, {x, w1});
  check_same_first_order([](const TensorList& in) {
    const Tensor ws[] = {in[1], in[2], in[3]};
    const Tensor bs[] = {in[4], Tensor(), in[5]};
    return ag::linear_cat(in[0], ws, bs);
  }, {x, w1, w2, w3, b1, b3}, 137);
}

BOOST_AUTO_TEST_CASE(linear_cat_hvp_equals_separate_linears) {
  // loss(y) = cross_entropy(y·M) with y = [y1 | y2] equals cross_entropy(y1·M1 + y2·M2), M1 and
  // M2 the row blocks of M
  const Tensor x = input({6, 4}, 141), w1 = input({4, 2}, 142), w2 = input({4, 3}, 143);
  const Tensor b1 = input({2}, 144), b2 = input({3}, 145);
  const Tensor m = constant({5, 3}, 146), m1 = rows_of(m, 0, 2), m2 = rows_of(m, 2, 3);
  const Tensor t = targets_of({0, 2, 1, 1, 0, 2}, {6});
  check_same_hvp(
      [&](const TensorList& in) {
        const Tensor ws[] = {in[1], in[2]};
        const Tensor bs[] = {in[3], in[4]};
        return ag::cross_entropy(ag::matmul(ag::linear_cat(in[0], ws, bs), m), t);
      },
      [&](const TensorList& in) {
        return ag::cross_entropy(
            ag::matmul(ag::linear(in[0], in[1], in[3]), m1) + ag::matmul(ag::linear(in[0], in[2], in[4]), m2), t);
      },
      {x, w1, w2, b1, b2}, 147);
}

BOOST_AUTO_TEST_SUITE_END()

// ---------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(indexing_second_order)

BOOST_AUTO_TEST_CASE(index_select_at_the_seed_and_in_a_chain) {
  const Tensor x = input({4, 5, 3}, 151);
  const std::vector<std::int64_t> index = {2, 0, 2, 4};  // a repeat: the scatter adds
  for (std::int64_t dim : {0, 1, -1}) {
    const std::int64_t size = x.size(dim);
    std::vector<std::int64_t> idx;
    for (std::int64_t i : index) idx.push_back(i % size);
    check_gradgrad(fmt::format("index_select dim {}", dim),
                   [=](const TensorList& in) { return ag::index_select(in[0], dim, idx); }, {x});
    check_gradgrad(fmt::format("index_select dim {} squared", dim), [=](const TensorList& in) {
      const Tensor y = ag::index_select(in[0], dim, idx);
      return y * y;
    }, {x});
  }
  const Tensor idx = ag::tensor({1, 1, 3}, {3}, Dtype::Float64);
  check_gradgrad("index_select by tensor, in a softmax", [&](const TensorList& in) {
    return ag::softmax(ag::index_select(in[0], 1, idx), 1);
  }, {x});
}

BOOST_AUTO_TEST_CASE(embedding_at_the_seed_and_in_a_chain) {
  const Tensor w = input({5, 3}, 161), v = input({3, 4}, 162);
  const Tensor ids = ag::tensor({1, 4, 1, 0, 2, 4}, {2, 3}, Dtype::Float64);
  check_gradgrad("embedding", [&](const TensorList& in) { return ag::embedding(in[0], ids); }, {w});
  check_gradgrad("embedding chain", [&](const TensorList& in) {
    const Tensor e = ag::embedding(in[0], ids);  // [2, 3, 3]
    return ag::log_softmax(ag::matmul(e, in[1]), -1) * ag::matmul(e, in[1]);
  }, {w, v});
  check_same_first_order([&](const TensorList& in) { return ag::embedding(in[0], ids) * ag::embedding(in[0], ids); },
                         {w}, 163);
}

BOOST_AUTO_TEST_CASE(hvp_equals_one_hot_products) {
  // embedding(W, ids) = onehot(ids)·W and index_select(x, 1, idx) = x·S with S[j, k] = [idx[k] == j]
  const std::vector<std::int64_t> ids = {3, 0, 3, 1, 4};
  const Tensor idt = ag::tensor({3, 0, 3, 1, 4}, {5}, Dtype::Float64);
  const Tensor w = input({5, 3}, 171), v = input({3, 4}, 172);
  const Tensor t = targets_of({0, 3, 2, 2, 1}, {5});
  const Tensor oh = one_hot(ids, 5);
  check_same_hvp([&](const TensorList& in) { return ag::cross_entropy(ag::matmul(ag::embedding(in[0], idt), in[1]), t); },
                 [&](const TensorList& in) { return ag::cross_entropy(ag::matmul(ag::matmul(oh, in[0]), in[1]), t); },
                 {w, v}, 173);
  const Tensor x = input({2, 5}, 174);
  const Tensor s = ag::transpose(oh, 0, 1);  // [5, 5]: column k picks ids[k]
  const Tensor t2 = targets_of({4, 1}, {2});
  check_same_hvp([&](const TensorList& in) { return ag::cross_entropy(ag::index_select(in[0], 1, ids) * 2.0, t2); },
                 [&](const TensorList& in) { return ag::cross_entropy(ag::matmul(in[0], s) * 2.0, t2); }, {x}, 175);
}

BOOST_AUTO_TEST_CASE(third_derivatives_through_the_scatter) {
  // f(W) = Σ e³ with e = embedding(W, ids): the third derivative goes through the gradient's
  // scatter-add and its own gradient, the gather
  const Tensor w = input({4, 2}, 181);
  const Tensor ids = ag::tensor({1, 3, 1, 1}, {4}, Dtype::Float64);
  auto gradient = [&](const TensorList& in) {
    const ag::EnableGradGuard grad_on;  // (gradcheck evaluates without grad mode)
    const Tensor e = ag::embedding(in[0], ids);
    return ag::grad({ag::sum(e * e * e)}, {in[0]}, {.create_graph = true})[0];
  };
  // the gradient's own derivatives (second order of f) against central differences of it ...
  test_support::check_gradients("gradient of embedding cubed", gradient, {w});
  // ... and their derivatives (third order of f)
  check_gradgrad("gradient of embedding cubed", gradient, {w});
}

BOOST_AUTO_TEST_SUITE_END()

namespace {

// 1/√x whose backward is written with ag ops (itself included): differentiable to any order, for
// references built only of ops whose second derivatives are known.
struct Rsqrt : ag::Function<Rsqrt> {
  static constexpr const char* name = "test_rsqrt";
  static Tensor forward(ag::FunctionCtx& ctx, const Tensor& x) {
    ctx.save_for_backward({x});
    return ag::rsqrt(x);
  }
  static TensorList backward(ag::FunctionCtx& ctx, const TensorList& g) {
    const Tensor r = Rsqrt::apply(ctx.saved_tensors()[0]);
    return {g[0] * r * r * r * -0.5};  // d(x^-½) = -½ x^-3/2
  }
};

// layer_norm by its formula on rows of d elements: means as products with a column of 1/d.
Tensor layer_norm_formula(const Tensor& x, std::int64_t d, const Tensor& w, const Tensor& b, double eps) {
  const Tensor rows = ag::reshape(x, {-1, d});
  const Tensor avg = ag::full({d, 1}, 1.0 / static_cast<double>(d), Dtype::Float64);
  const Tensor centred = rows - ag::matmul(rows, avg);
  const Tensor xhat = centred * Rsqrt::apply(ag::matmul(centred * centred, avg) + eps);
  Tensor y = xhat;
  if (w.defined()) y = y * ag::reshape(w, {1, d});
  if (b.defined()) y = y + ag::reshape(b, {1, d});
  return ag::reshape(y, x.shape());
}

}  // namespace

// ---------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(layer_norm_second_order)

BOOST_AUTO_TEST_CASE(with_and_without_weight_and_bias_at_the_seed) {
  const Tensor x = input({3, 5}, 201), w = input({5}, 202), b = input({5}, 203);
  check_gradgrad("layer_norm", [](const TensorList& in) { return ag::layer_norm(in[0], {5}, in[1], in[2]); },
                 {x, w, b});
  check_gradgrad("layer_norm, weight only", [](const TensorList& in) { return ag::layer_norm(in[0], {5}, in[1]); },
                 {x, w});
  check_gradgrad("layer_norm, bias only",
                 [](const TensorList& in) { return ag::layer_norm(in[0], {5}, Tensor(), in[1]); }, {x, b});
  check_gradgrad("layer_norm, neither", [](const TensorList& in) { return ag::layer_norm(in[0], {5}); }, {x});
  const Tensor x3 = input({2, 2, 3}, 204), w2 = input({2, 3}, 205), b2 = input({2, 3}, 206);
  check_gradgrad("layer_norm over two dims, eps 0.1",
                 [](const TensorList& in) { return ag::layer_norm(in[0], {2, 3}, in[1], in[2], 0.1); }, {x3, w2, b2});
  const Tensor xc = x.detach();
  check_gradgrad("layer_norm, only the weight varies",
                 [&](const TensorList& in) { return ag::layer_norm(xc, {5}, in[0], in[1]); }, {w, b});
  check_same_first_order([](const TensorList& in) { return ag::layer_norm(in[0], {5}, in[1], in[2]); }, {x, w, b},
                         207);
}

BOOST_AUTO_TEST_CASE(in_a_chain) {
  const Tensor x = input({2, 3, 4}, 211), w = input({4}, 212), b = input({4}, 213), lw = input({4, 4}, 214);
  check_gradgrad("layer_norm chain", [](const TensorList& in) {
    const Tensor h = ag::layer_norm(ag::linear(in[0], in[3]), {4}, in[1], in[2]);
    return ag::layer_norm(h * h, {4});
  }, {x, w, b, lw});
}

BOOST_AUTO_TEST_CASE(hvp_equals_the_formula_in_ag_ops) {
  const Tensor x = input({2, 3, 4}, 221), w = input({4}, 222), b = input({4}, 223), v = input({4, 3}, 224);
  const Tensor t = targets_of({0, 2, 1, 1, 0, 2}, {2, 3});
  for (double eps : {1e-5, 0.5}) {
    check_same_hvp(
        [&](const TensorList& in) {
          return ag::cross_entropy(ag::matmul(ag::layer_norm(in[0], {4}, in[1], in[2], eps), in[3]), t);
        },
        [&](const TensorList& in) {
          return ag::cross_entropy(ag::matmul(layer_norm_formula(in[0], 4, in[1], in[2], eps), in[3]), t);
        },
        {x, w, b, v}, 225);
  }
  check_same_hvp(
      [&](const TensorList& in) { return ag::cross_entropy(ag::matmul(ag::layer_norm(in[0], {3, 4}), in[1]), t.detach()); },
      [&](const TensorList& in) { return ag::cross_entropy(ag::matmul(layer_norm_formula(in[0], 12, {}, {}, 1e-5), in[1]), t); },
      {x, v}, 226);
}

BOOST_AUTO_TEST_SUITE_END()

namespace {

// cross_entropy by its definition: −Σ_c q_c · log_softmax(x)_c per row, q = (1−ε)·onehot + ε/C
// for rows not ignored (zero for ignored ones), reduced; row sums as products with ones.
Tensor cross_entropy_formula(const Tensor& logits, const std::vector<std::int64_t>& targets,
                             const ag::CrossEntropyOptions& o) {
  const std::int64_t c = logits.size(-1);
  const auto n = static_cast<std::int64_t>(targets.size());
  std::vector<double> q(static_cast<std::size_t>(n * c), 0.0);
  double counted = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t t = targets[static_cast<std::size_t>(i)];
    if (t == o.ignore_index) continue;
    ++counted;
    for (std::int64_t k = 0; k < c; ++k)
      q[static_cast<std::size_t>(i * c + k)] = o.label_smoothing / static_cast<double>(c) + (k == t ? 1.0 - o.label_smoothing : 0.0);
  }
  const Tensor qs = ag::tensor(q, {n, c}, Dtype::Float64);
  const Tensor per_row = -ag::matmul(ag::log_softmax(ag::reshape(logits, {n, c}), -1) * qs,
                                     ag::ones({c}, Dtype::Float64));  // [n]
  if (o.reduction == ag::Reduction::None)
    return ag::reshape(per_row, ag::Shape(logits.shape().begin(), logits.shape().end() - 1));
  const Tensor total = ag::matmul(per_row, ag::ones({n}, Dtype::Float64));
  return o.reduction == ag::Reduction::Sum ? total : total / counted;
}

std::string options_text(const ag::CrossEntropyOptions& o) {
  const char* r = o.reduction == ag::Reduction::None ? "none" : o.reduction == ag::Reduction::Sum ? "sum" : "mean";
  return fmt::format("reduction {}, smoothing {}, ignore_index {}", r, o.label_smoothing, o.ignore_index);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(cross_entropy_second_order)

BOOST_AUTO_TEST_CASE(every_reduction_and_smoothing_at_the_seed) {
  const Tensor x = input({5, 4}, 301), x3 = input({2, 3, 4}, 302);
  const std::vector<std::int64_t> t = {1, -100, 3, 0, 3};
  const std::vector<std::int64_t> t3 = {0, 2, 2, 3, 2, 1};  // with ignore_index 2 below
  for (auto reduction : {ag::Reduction::Mean, ag::Reduction::Sum, ag::Reduction::None})
    for (double eps : {0.0, 0.2, 1.0}) {
      const ag::CrossEntropyOptions o{.reduction = reduction, .label_smoothing = eps};
      check_gradgrad(options_text(o), [&](const TensorList& in) { return ag::cross_entropy(in[0], t, o); }, {x});
      const ag::CrossEntropyOptions o3{.ignore_index = 2, .reduction = reduction, .label_smoothing = eps};
      check_gradgrad("3-D logits, " + options_text(o3), [&](const TensorList& in) {
        return ag::cross_entropy(in[0], targets_of({0, 2, 2, 3, 2, 1}, {2, 3}), o3);
      }, {x3});
      check_same_first_order([&](const TensorList& in) { return ag::cross_entropy(in[0], t3, o3) * 1.0; }, {x3}, 303);
    }
}

BOOST_AUTO_TEST_CASE(in_a_chain) {
  const Tensor x = input({2, 3, 4}, 311), w = input({4, 5}, 312), g = input({4}, 313);
  const Tensor t = targets_of({0, 4, 2, 1, 3, 0}, {2, 3});
  for (double eps : {0.0, 0.1})
    check_gradgrad(fmt::format("cross_entropy(linear(layer_norm)), smoothing {}", eps), [&](const TensorList& in) {
      return ag::cross_entropy(ag::linear(ag::layer_norm(in[0], {4}, in[2]), in[1]), t, {.label_smoothing = eps});
    }, {x, w, g});
}

BOOST_AUTO_TEST_CASE(hvp_equals_the_log_softmax_formula) {
  const Tensor x = input({3, 2, 5}, 321), w = input({5, 5}, 322);
  const std::vector<std::int64_t> t = {0, 4, -100, 1, 3, 3};
  const Tensor c = constant({3, 2}, 323);  // weights of the per-row losses (reduction None)
  for (auto reduction : {ag::Reduction::Mean, ag::Reduction::Sum, ag::Reduction::None})
    for (double eps : {0.0, 0.1, 1.0}) {
      const ag::CrossEntropyOptions o{.reduction = reduction, .label_smoothing = eps};
      BOOST_TEST_CONTEXT(options_text(o)) {
        auto loss = [&](const Tensor& l) { return reduction == ag::Reduction::None ? ag::sum(l * c) : l; };
        check_same_hvp(
            [&](const TensorList& in) { return loss(ag::cross_entropy(ag::matmul(in[0], in[1]), t, o)); },
            [&](const TensorList& in) { return loss(cross_entropy_formula(ag::matmul(in[0], in[1]), t, o)); },
            {x, w}, 324);
      }
    }
}

BOOST_AUTO_TEST_CASE(masked_logits_follow_the_first_order_conventions) {
  // Row 0: a masked class that is not the target; row 1: masked target (loss +inf); row 2:
  // every class masked (loss +inf, gradient zero); row 3 plain.
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor mask = ag::tensor({0, -inf, 0, 0, 0, 0, -inf, 0, -inf, -inf, -inf, -inf, 0, 0, 0, 0}, {4, 4},
                                 Dtype::Float64);
  const std::vector<std::int64_t> t = {2, 2, 1, 3};
  const Tensor x = input({4, 3}, 331), w = input({3, 4}, 332);
  for (double eps : {0.0, 0.3})
    for (auto reduction : {ag::Reduction::Sum, ag::Reduction::None}) {
      const ag::CrossEntropyOptions o{.reduction = reduction, .label_smoothing = eps};
      check_gradgrad("masked logits, " + options_text(o), [&](const TensorList& in) {
        return ag::cross_entropy(ag::matmul(in[0], in[1]) + mask, t, o);
      }, {x, w});
    }
  // at the logits: first and second derivatives of the fully masked row are zero, all finite
  const Tensor z = input({4, 4}, 333);
  for (double eps : {0.0, 0.3}) {
    const Tensor loss = ag::cross_entropy(z + mask, t, {.reduction = ag::Reduction::Sum, .label_smoothing = eps});
    const Tensor gz = ag::grad({loss}, {z}, {.create_graph = true})[0];
    const Tensor ggz = ag::grad({gz}, {z}, {.grad_outputs = {constant({4, 4}, 334)}})[0];
    const TensorList plain = ag::grad({ag::cross_entropy(z + mask, t, {.reduction = ag::Reduction::Sum,
                                                                        .label_smoothing = eps})},
                                      {z});
    check_close(plain[0], gz);
    const auto g1 = gz.to_vector(), g2 = ggz.to_vector();
    for (int i = 8; i < 12; ++i) {
      BOOST_TEST(g1[i] == 0.0);
      BOOST_TEST(g2[i] == 0.0);
    }
    for (double e : g2) BOOST_TEST(std::isfinite(e));
  }
}

BOOST_AUTO_TEST_SUITE_END()

// ---------------------------------------------------------------------------------------------
BOOST_AUTO_TEST_SUITE(composed_paths_at_the_edges)

BOOST_AUTO_TEST_CASE(empty_tensors_give_empty_gradients_of_a_graph) {
  // each op with an empty input, differentiated with create_graph: right shapes, no error
  auto check = [](const std::string& what, const ag::GradcheckFn& f, const TensorList& inputs) {
    BOOST_TEST_CONTEXT(what) {
      const Tensor y = f(inputs);
      const TensorList g = ag::grad({y}, inputs, {.grad_outputs = {ag::ones(y.shape(), Dtype::Float64)},
                                                  .create_graph = true, .allow_unused = true});
      for (std::size_t i = 0; i < inputs.size(); ++i)
        if (g[i].defined()) BOOST_TEST(ag::shape_str(g[i].shape()) == ag::shape_str(inputs[i].shape()));
    }
  };
  check("matmul", [](const TensorList& in) { return ag::matmul(in[0], in[1]); }, {input({2, 0, 3}, 1), input({3, 4}, 2)});
  check("matmul, empty inner", [](const TensorList& in) { return ag::matmul(in[0], in[1]); },
        {input({2, 0}, 1), input({0, 4}, 2)});
  check("linear", [](const TensorList& in) { return ag::linear(in[0], in[1], in[2]); },
        {input({0, 3}, 3), input({3, 2}, 4), input({2}, 5)});
  check("linear_cat", [](const TensorList& in) {
    const Tensor ws[] = {in[1], in[2]};
    return ag::linear_cat(in[0], ws);
  }, {input({0, 3}, 6), input({3, 2}, 7), input({3, 1}, 8)});
  check("softmax", [](const TensorList& in) { return ag::softmax(in[0], 1); }, {input({0, 3}, 9)});
  check("log_softmax", [](const TensorList& in) { return ag::log_softmax(in[0], 0); }, {input({0, 3}, 9)});
  check("layer_norm", [](const TensorList& in) { return ag::layer_norm(in[0], {3}, in[1], in[2]); },
        {input({0, 3}, 10), input({3}, 11), input({3}, 12)});
  check("embedding", [](const TensorList& in) { return ag::embedding(in[0], ag::zeros({0}, Dtype::Float64)); },
        {input({4, 3}, 13)});
  check("cross_entropy", [](const TensorList& in) {
    return ag::cross_entropy(in[0], std::vector<std::int64_t>{}, {.reduction = ag::Reduction::Sum});
  }, {input({0, 3}, 14)});
}

BOOST_AUTO_TEST_CASE(float32_second_derivatives_match_float64) {
  // the composed paths run in the input's dtype: float32 hvps agree with float64 ones
  const Tensor x = input({3, 4}, 401), w = input({4, 5}, 402), g = input({4}, 403);
  const Tensor t = targets_of({0, 4, 2}, {3});
  auto f = [&](const TensorList& in) {
    const Tensor h = ag::layer_norm(in[0], {4}, in[2]);
    return ag::cross_entropy(ag::log_softmax(ag::linear(h, in[1]), -1), t, {.label_smoothing = 0.1});
  };
  const TensorList v = {constant({3, 4}, 404), constant({4, 5}, 405), constant({4}, 406)};
  const TensorList h64 = ag::hvp(f, {x, w, g}, v);
  TensorList in32, v32;
  for (const Tensor& e : {x, w, g}) in32.push_back(e.detach().to(Dtype::Float32).requires_grad_());
  for (const Tensor& e : v) v32.push_back(e.to(Dtype::Float32));
  const TensorList h32 = ag::hvp(f, in32, v32);
  for (std::size_t i = 0; i < 3; ++i) {
    BOOST_TEST((h32[i].dtype() == Dtype::Float32));
    BOOST_TEST_CONTEXT("input " << i) check_close(h32[i].to(Dtype::Float64), h64[i], 1e-4);
  }
}

BOOST_AUTO_TEST_CASE(linear_cat_weight_changed_in_place_before_create_graph) {
  // The first-order backward uses the packed copy of the weights; the composed one uses the
  // weights themselves, so a change in place in between is refused there, naming the op.
  const Tensor x = input({2, 3}, 411), w1 = input({3, 2}, 412);
  Tensor w2 = input({3, 1}, 413);
  const Tensor ws[] = {w1, w2};
  const Tensor y = ag::linear_cat(x, ws);
  {
    const ag::NoGradGuard no_grad;
    w2.mul_(2.0);
  }
  test_support::check_throws<std::runtime_error>(
      [&] { ag::grad({ag::sum(y * y)}, {x}, {.create_graph = true}); },
      {"linear_cat: a tensor of shape [3, 1] saved for backward was changed in place"});
}

BOOST_AUTO_TEST_SUITE_END()
