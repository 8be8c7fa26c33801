// layer_norm of rows whose values are near the ends of their type's range: a float32 row of
// 3e38 and -3e38 (x - mu is beyond float), float32 denormal rows with eps = 0 (r is beyond float),
// float64 rows of 1e301 (the squared deviations are beyond double). The normalised values are
// bounded by sqrt(D), so every result must be finite and right: checked against a long double
// reference computed here from the definitions, against the same rows in float64 (a second route,
// for float32), on every instruction-set variant, through the fused backward, the composed one
// (create_graph) and nn::LayerNorm, with float64 gradchecks and gradgradchecks of scaled rows.
#define BOOST_TEST_MODULE layer_norm_extreme
#include "test_support.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <nn/nn.hpp>

#include "isa_support.hpp"

using namespace test_support::prelude;
using test_support::available_isas;
using test_support::IsaScope;

namespace {

constexpr auto F32 = Dtype::Float32;

// y = x̂·w + b and the gradients of sum(y ⊙ g), per row of n, in long double from the definitions.
struct Ref {
  std::vector<long double> y, dx, dw, db, r;
};

Ref reference(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
              const std::vector<double>& g, std::int64_t rows, std::int64_t n, double eps) {
  Ref out{std::vector<long double>(x.size()), std::vector<long double>(x.size()), std::vector<long double>(n, 0),
          std::vector<long double>(n, 0), std::vector<long double>(rows)};
  for (std::int64_t i = 0; i < rows; ++i) {
    const double* xr = x.data() + i * n;
    const double* gr = g.data() + i * n;
    long double mu = 0, var = 0, m1 = 0, m2 = 0;
    for (std::int64_t j = 0; j < n; ++j) mu += xr[j];
    mu /= n;
    for (std::int64_t j = 0; j < n; ++j) var += (xr[j] - mu) * (xr[j] - mu);
    var /= n;
    const long double r = 1 / std::sqrt(var + eps);
    out.r[i] = r;
    std::vector<long double> xh(n), gh(n);
    for (std::int64_t j = 0; j < n; ++j) {
      xh[j] = (xr[j] - mu) * r;
      gh[j] = static_cast<long double>(gr[j]) * w[j];
      m1 += gh[j] / n;
      m2 += gh[j] * xh[j] / n;
      out.y[i * n + j] = xh[j] * w[j] + b[j];
      out.dw[j] += gr[j] * xh[j];
      out.db[j] += gr[j];
    }
    for (std::int64_t j = 0; j < n; ++j) out.dx[i * n + j] = r * (gh[j] - m1 - xh[j] * m2);
  }
  return out;
}

// got matches want element by element within rel·|want| + abs; the first miss is reported.
void near(const std::vector<double>& got, const std::vector<long double>& want, double rel, double abs,
          const std::string& what) {
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const long double err = std::fabs(got[i] - want[i]);
    if (!(std::isfinite(got[i]) && err <= rel * std::fabs(want[i]) + abs)) {
      BOOST_ERROR(what << " element " << i << ": " << got[i] << ", expected " << static_cast<double>(want[i]));
      return;
    }
  }
}

std::vector<long double> widen(const std::vector<double>& v) { return {v.begin(), v.end()}; }

struct Results {
  std::vector<double> y, dx, dw, db;
};

// layer_norm of x (rows, n) with weight and bias in `dtype`, and the gradients of sum(y ⊙ g),
// through backward() or, with create_graph, through ag::grad building a graph.
Results run(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
            const std::vector<double>& g, std::int64_t rows, std::int64_t n, Dtype dtype, double eps,
            bool create_graph = false) {
  Tensor xt = ag::tensor(x, {rows, n}, dtype).requires_grad_();
  Tensor wt = ag::tensor(w, {n}, dtype).requires_grad_(), bt = ag::tensor(b, {n}, dtype).requires_grad_();
  const Tensor y = ag::layer_norm(xt, {n}, wt, bt, eps);
  const Tensor loss = ag::sum(ag::mul(y, ag::tensor(g, {rows, n}, dtype)));
  if (create_graph) {
    const TensorList d = ag::grad({loss}, {xt, wt, bt}, {.create_graph = true});
    return {y.to_vector(), d[0].to_vector(), d[1].to_vector(), d[2].to_vector()};
  }
  loss.backward();
  return {y.to_vector(), xt.grad().to_vector(), wt.grad().to_vector(), bt.grad().to_vector()};
}

std::vector<double> seeded(std::int64_t n, std::uint64_t seed, double scale, double shift) {
  ag::Generator gen(seed);
  std::vector<double> v = ag::randn({n}, F32, gen).to_vector();
  for (auto& e : v) e = static_cast<double>(static_cast<float>(e * scale + shift));  // exact in float32
  return v;
}

// Three float32 rows of 33: the row of the report (one -3e38, the rest 3e38), huge values of
// both signs spread over [1e38, 3.3e38], and an ordinary row between them.
struct Case {
  std::int64_t rows = 3, n = 33;
  std::vector<double> x, w, b, g;
  Case() {
    x.assign(static_cast<std::size_t>(rows * n), 3e38);
    x[0] = -3e38;
    for (std::int64_t j = 0; j < n; ++j) {
      x[static_cast<std::size_t>(n + j)] = static_cast<float>((j % 2 ? -1 : 1) * (1e38 + 7e36 * static_cast<double>(j)));
    }
    const std::vector<double> plain = seeded(n, 5, 2.0, 1.0);
    for (std::int64_t j = 0; j < n; ++j) x[static_cast<std::size_t>(2 * n + j)] = plain[static_cast<std::size_t>(j)];
    std::swap_ranges(x.begin() + n, x.begin() + 2 * n, x.begin() + 2 * n);  // the ordinary row in the middle
    w = seeded(n, 6, 0.5, 1.0);
    b = seeded(n, 7, 1.0, 0.0);
    g = seeded(rows * n, 8, 1.0, 0.0);
  }
};

// The tolerances: a wide row's results are rounded once from long double (u = 2^-24), an ordinary
// row's go through the float32 kernels (sums of n terms in float).
void check_against(const Results& got, const Ref& want, const Case& c, const std::string& what) {
  const double u = 0x1p-24, tiny = 0x1p-149;
  const std::int64_t n = c.n;
  for (std::int64_t i = 0; i < c.rows; ++i) {
    const bool ordinary = i == 1;
    auto part = [&](const auto& v) {
      using V = typename std::decay_t<decltype(v)>::value_type;
      return std::vector<V>(v.begin() + i * n, v.begin() + (i + 1) * n);
    };
    long double top_dx = 0;
    for (long double e : part(want.dx)) top_dx = std::max(top_dx, std::fabs(e));
    const std::string row = what + " row " + std::to_string(i);
    near(part(got.y), part(want.y), ordinary ? 64 * u : 2 * u, ordinary ? 64 * u : 2 * u, row + " y");
    near(part(got.dx), part(want.dx), 0.0, static_cast<double>((ordinary ? 256 : 4) * u * top_dx) + tiny, row + " dx");
  }
  near(got.dw, want.dw, 0.0, 1e-5, what + " dw");
  near(got.db, want.db, 0.0, 1e-5, what + " db");
}

}  // namespace

BOOST_AUTO_TEST_CASE(float32_rows_near_the_float_range_are_finite_and_exact_on_every_isa) {
  const Case c;
  const Ref want = reference(c.x, c.w, c.b, c.g, c.rows, c.n, 1e-5);
  // the second route: the same values in float64, where nothing is near the range
  const Results f64 = run(c.x, c.w, c.b, c.g, c.rows, c.n, F64, 1e-5);
  check_against(f64, want, c, "float64");
  for (const std::string& isa : available_isas()) {
    IsaScope scope(isa);
    const Results got = run(c.x, c.w, c.b, c.g, c.rows, c.n, F32, 1e-5);
    check_against(got, want, c, isa);
    check_against(got, {widen(f64.y), widen(f64.dx), widen(f64.dw), widen(f64.db), {}}, c, isa + " vs float64");
    // the composed backward (create_graph) gives the same gradients
    check_against(run(c.x, c.w, c.b, c.g, c.rows, c.n, F32, 1e-5, true), want, c, isa + " create_graph");
  }
}

BOOST_AUTO_TEST_CASE(float32_denormal_rows_with_eps_zero_normalise_on_every_isa) {
  // k·2^-149 (denormals): r ≈ 2^148 is beyond float; y is the row standardised.
  const std::int64_t n = 9;
  std::vector<double> x(n), one(n, 1.0), zero(n, 0.0);
  for (std::int64_t j = 0; j < n; ++j) x[static_cast<std::size_t>(j)] = std::ldexp(static_cast<double>(j * j % 7 + 1), -149);
  const Ref want = reference(x, one, zero, one, 1, n, 0.0);
  const Results f64 = run(x, one, zero, one, 1, n, F64, 0.0);
  near(f64.y, want.y, 1e-12, 1e-12, "float64 y");
  for (const std::string& isa : available_isas()) {
    IsaScope scope(isa);
    const Tensor y = ag::layer_norm(ag::tensor(x, {1, n}, F32), {n}, Tensor(), Tensor(), 0.0);
    near(y.to_vector(), want.y, 0x1p-23, 0x1p-23, isa + " y");
  }
}

BOOST_AUTO_TEST_CASE(float64_rows_whose_squares_overflow_are_exact_and_pass_gradchecks) {
  // x = u·2^1000: (x - mu)² is beyond double. y(x) = y(u) for eps = 0, so the scaled rows are
  // checked against a long double reference, and their gradients (through the exact scaling)
  // by central differences on u, first and second order.
  const std::int64_t rows = 2, n = 7;
  const Tensor u = input({rows, n}, 11), w = input({n}, 12), b = input({n}, 13);
  auto f = [n](const std::vector<Tensor>& in) {
    return ag::layer_norm(ag::mul(in[0], 0x1p1000), {n}, in[1], in[2], 0.0);
  };
  std::vector<double> x = u.to_vector();
  for (auto& e : x) e = std::ldexp(e, 1000);
  const std::vector<double> ones(rows * n, 1.0);
  const Ref want = reference(x, w.to_vector(), b.to_vector(), ones, rows, n, 0.0);
  near(f({u, w, b}).to_vector(), want.y, 1e-14, 1e-14, "y");
  check_gradients("first order", f, {u, w, b});
  const ag::GradcheckResult second = ag::gradgradcheck(f, {u, w, b});
  BOOST_TEST(second.ok, fmt::format("{}", second));
}

BOOST_AUTO_TEST_CASE(nn_layer_norm_of_a_row_near_the_float_range_is_finite) {
  const std::int64_t n = 33;
  std::vector<double> x(n, 3e38), g(n);
  x[0] = -3e38;
  for (std::int64_t j = 0; j < n; ++j) g[static_cast<std::size_t>(j)] = 0.25 * static_cast<double>(j % 5) - 0.5;
  nn::LayerNorm norm(n);
  const Tensor xt = ag::tensor(x, {1, n}, F32).requires_grad_();
  const Tensor y = norm(xt);
  ag::sum(ag::mul(y, ag::tensor(g, {1, n}, F32))).backward();
  const std::vector<double> one(n, 1.0), zero(n, 0.0);
  const Ref want = reference(x, one, zero, g, 1, n, 1e-5);
  near(y.to_vector(), want.y, 0x1p-23, 0x1p-23, "y");
  long double top = 0;
  for (long double e : want.dx) top = std::max(top, std::fabs(e));
  near(xt.grad().to_vector(), want.dx, 0.0, static_cast<double>(4 * 0x1p-24 * top) + 0x1p-149, "dx");
  near(norm.weight().grad().to_vector(), want.dw, 0.0, 1e-5, "weight grad");
  near(norm.bias().grad().to_vector(), want.db, 0.0, 1e-5, "bias grad");
}
