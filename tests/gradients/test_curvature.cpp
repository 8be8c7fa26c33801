// The curvature example's tools (examples/hessian_power.hpp): power iteration on Hessian-vector
// products against the top eigenvalue of the full Hessian, built column by column from the same
// products and diagonalised by Eigen; the products against hvp, against central differences of
// gradients, and the gradient of a gradient penalty against central differences of the penalised
// loss. All in float64, on models small enough for the full Hessian.
#define BOOST_TEST_MODULE curvature
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>

#include <Eigen/Dense>
#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

#include "../../examples/hessian_power.hpp"
#include "test_support.hpp"

namespace ag = autograd;
using ag::Dtype;
using ag::Tensor;
using ag::TensorList;
using curvature::Vector;

namespace {

auto message_has(const std::string& part) {
  return [part](const std::exception& e) { return test_support::message_has(e, {part}); };
}

// A two-layer classifier: h = softmax(X·A), loss = mean cross entropy of h·B against fixed
// classes, written with matmul, softmax, log_softmax and elementwise ops.
struct SoftmaxModel {
  Tensor X, Y;  // inputs (6, 3) and one-hot targets (6, 4)
  std::vector<Tensor> params = {test_support::input({3, 5}, 11), test_support::input({5, 4}, 12)};

  SoftmaxModel() {
    ag::Generator gen(7);
    X = ag::randn({6, 3}, Dtype::Float64, gen);
    std::vector<double> y(24, 0.0);
    for (int i = 0; i < 6; ++i) y[static_cast<std::size_t>(4 * i + (i * 3) % 4)] = 1.0;
    Y = ag::tensor(y, {6, 4}, Dtype::Float64);
  }
  Tensor loss(const std::vector<Tensor>& p) const {
    const Tensor h = ag::softmax(ag::matmul(X, p[0]), -1);
    return ag::neg(ag::sum(Y * ag::log_softmax(ag::matmul(h, p[1]), -1))) / 6.0;
  }
  Tensor loss() const { return loss(params); }
};

// Causal two-head self-attention on 3 tokens of width 4, a fixed readout to 3 classes, and
// cross entropy: the fused attention core and the linear projections inside.
struct AttentionModel {
  ag::Generator gen{21};
  mutable nn::MultiHeadAttention mha{nn::MultiHeadAttentionOptions{.embed_dim = 4, .num_heads = 2}, gen};
  Tensor x, readout;
  std::vector<std::int64_t> targets = {2, 0, 1, 1, 2, 0};
  AttentionModel() {
    mha.to(Dtype::Float64);
    x = ag::randn({2, 3, 4}, Dtype::Float64, gen);
    readout = ag::randn({4, 3}, Dtype::Float64, gen);
  }
  std::vector<Tensor> params() const { return mha.parameters(); }
  Tensor loss() const {
    nn::AttentionOptions o;
    o.is_causal = true;
    o.need_weights = false;
    const Tensor out = mha.forward(x, x, x, o).output;  // (2, 3, 4)
    return nn::cross_entropy(ag::matmul(out, readout), targets);
  }
};

// The full Hessian, column j = H·e_j, from the curvature tools.
Eigen::MatrixXd full_hessian(const curvature::Hessian& H) {
  const auto n = H.size();
  Eigen::MatrixXd M(n, n);
  for (std::int64_t j = 0; j < n; ++j) {
    Vector e(static_cast<std::size_t>(n), 0.0);
    e[static_cast<std::size_t>(j)] = 1.0;
    const Vector col = H.apply(e);
    for (std::int64_t i = 0; i < n; ++i) M(i, j) = col[static_cast<std::size_t>(i)];
  }
  return M;
}

// Power iteration's eigenvalue, and its vector, against Eigen's on the full Hessian.
void check_power_iteration(const curvature::Hessian& H) {
  const Eigen::MatrixXd M = full_hessian(H);
  BOOST_TEST((M - M.transpose()).cwiseAbs().maxCoeff() <= 1e-12 * M.cwiseAbs().maxCoeff());
  const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eig(M);
  const auto& values = eig.eigenvalues();  // ascending
  const Eigen::Index top = std::abs(values(0)) > std::abs(values(values.size() - 1)) ? 0 : values.size() - 1;
  const double expected = values(top);
  BOOST_TEST_MESSAGE("top eigenvalue " << expected << ", next by magnitude "
                                       << std::max(std::abs(values(1)), std::abs(values(values.size() - 2))));
  ag::Generator gen(3);
  const auto r = curvature::power_iteration([&H](const Vector& v) { return H.apply(v); },
                                            curvature::random_vector(H.size(), gen),
                                            {.max_iterations = 20000, .tolerance = 1e-9});
  BOOST_TEST(r.converged, "residual " << r.residual << " after " << r.iterations);
  BOOST_TEST(std::abs(r.eigenvalue - expected) <= 1e-8 * std::abs(expected),
             "power iteration " << r.eigenvalue << " vs Eigen " << expected);
  const Eigen::VectorXd u = eig.eigenvectors().col(top);
  double along = 0;
  for (Eigen::Index i = 0; i < u.size(); ++i) along += u(i) * r.vector[static_cast<std::size_t>(i)];
  BOOST_TEST(std::abs(along) >= 1 - 1e-8);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(power_iteration)

BOOST_AUTO_TEST_CASE(finds_the_eigenvalue_of_largest_magnitude) {
  // A diagonal operator: the dominant eigenvalue is the one of largest |λ|, negative too.
  for (const std::vector<double>& d : {std::vector<double>{3.0, -1.0, 0.5, 2.0}, {1.0, -4.0, 2.0, 0.25}}) {
    auto hv = [&d](const Vector& v) {
      Vector w(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) w[i] = d[i] * v[i];
      return w;
    };
    const double expected = *std::max_element(d.begin(), d.end(), [](double a, double b) { return std::abs(a) < std::abs(b); });
    const auto r = curvature::power_iteration(hv, {1.0, 1.0, 1.0, 1.0}, {.max_iterations = 500, .tolerance = 1e-12});
    BOOST_TEST(r.converged);
    BOOST_TEST(std::abs(r.eigenvalue - expected) <= 1e-12 * std::abs(expected), r.eigenvalue << " vs " << expected);
    BOOST_TEST(r.history.size() == static_cast<std::size_t>(r.iterations));
  }
}

BOOST_AUTO_TEST_CASE(a_zero_operator_has_eigenvalue_zero) {
  const auto r = curvature::power_iteration([](const Vector& v) { return Vector(v.size(), 0.0); }, {1.0, 2.0});
  BOOST_TEST(r.converged);
  BOOST_TEST(r.eigenvalue == 0.0);
  BOOST_TEST(r.iterations == 1);
}

BOOST_AUTO_TEST_CASE(bad_requests_say_what_is_wrong) {
  auto identity = [](const Vector& v) { return v; };
  BOOST_CHECK_EXCEPTION(curvature::power_iteration(identity, {0.0, 0.0}), std::invalid_argument,
                        message_has("start vector must be nonzero"));
  BOOST_CHECK_EXCEPTION(curvature::power_iteration(identity, {1.0}, {.max_iterations = 0}), std::invalid_argument,
                        message_has("max_iterations >= 1"));
  auto broken = [](const Vector& v) { return Vector(v.size(), std::nan("")); };
  BOOST_CHECK_EXCEPTION(curvature::power_iteration(broken, {1.0}), std::runtime_error, message_has("not finite"));
  BOOST_CHECK_EXCEPTION(curvature::unflatten({1.0, 2.0}, {ag::zeros({3})}), std::invalid_argument,
                        message_has("too few"));
  BOOST_CHECK_EXCEPTION(curvature::Hessian(ag::zeros({2}), {}), std::invalid_argument, message_has("one-element"));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(hessian_of_a_model)

BOOST_AUTO_TEST_CASE(products_match_hvp_and_central_differences) {
  const SoftmaxModel m;
  const curvature::Hessian H(m.loss(), m.params);
  ag::Generator gen(5);
  const Vector v = curvature::random_vector(H.size(), gen);
  // A second route through the API: ag::hvp, which runs the forward again.
  const TensorList hv = ag::hvp([&m](const TensorList& p) { return m.loss(p); }, m.params,
                                curvature::unflatten(v, m.params));
  const Vector a = H.apply(v), b = curvature::flatten(hv);
  for (std::size_t i = 0; i < a.size(); ++i) BOOST_TEST(std::abs(a[i] - b[i]) <= 1e-12 * (1 + std::abs(b[i])));
  // Independent of any second backward: central differences of first-order gradients along v.
  const double eps = 1e-6;
  const Vector theta = curvature::flatten(m.params);
  auto gradient_at = [&](double t) {
    Vector shifted(theta.size());
    for (std::size_t i = 0; i < theta.size(); ++i) shifted[i] = theta[i] + t * v[i];
    const TensorList p = curvature::unflatten(shifted, m.params);
    std::vector<Tensor> leaves;
    for (const auto& x : p) leaves.push_back(Tensor(x).requires_grad_());
    return curvature::flatten(ag::grad({m.loss(leaves)}, leaves));
  };
  const Vector plus = gradient_at(eps), minus = gradient_at(-eps);
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double numeric = (plus[i] - minus[i]) / (2 * eps);
    BOOST_TEST(std::abs(a[i] - numeric) <= 1e-8 + 1e-6 * std::abs(numeric), "element " << i << ": " << a[i] << " vs " << numeric);
  }
}

BOOST_AUTO_TEST_CASE(power_iteration_matches_the_full_hessian_softmax_model) {
  const SoftmaxModel m;
  check_power_iteration(curvature::Hessian(m.loss(), m.params));
}

BOOST_AUTO_TEST_CASE(power_iteration_matches_the_full_hessian_through_attention) {
  const AttentionModel m;
  check_power_iteration(curvature::Hessian(m.loss(), m.params()));
}

BOOST_AUTO_TEST_CASE(gradient_penalty_gradient_matches_central_differences) {
  // P(θ) = L + λ‖∇_θ L‖², differentiated by backward through the gradient's graph, against central
  // differences of P element by element.
  const AttentionModel m;
  const double lambda = 0.3;
  const std::vector<Tensor> params = m.params();
  auto penalised = [&](bool graph) {
    const Tensor L = m.loss();
    const TensorList g = ag::grad({L}, params, {.create_graph = graph});
    Tensor P = L;
    for (const auto& gi : g) P = P + ag::sum(gi * gi) * lambda;
    return P;
  };
  for (const auto& p : params) Tensor(p).set_grad(Tensor());
  penalised(true).backward();
  const double eps = 1e-6;
  for (const auto& p : params) {
    const Vector analytic = p.grad().to_vector();
    Vector values = p.to_vector();
    for (std::size_t i = 0; i < values.size(); ++i) {
      const double keep = values[i];
      auto at = [&](double x) {
        values[i] = x;
        ag::NoGradGuard no_grad;
        Tensor(p).copy_(ag::tensor(values, p.shape(), Dtype::Float64));
      };
      at(keep + eps);
      const double plus = penalised(false).item();
      at(keep - eps);
      const double minus = penalised(false).item();
      at(keep);
      const double numeric = (plus - minus) / (2 * eps);
      BOOST_TEST(std::abs(analytic[i] - numeric) <= 1e-8 + 1e-6 * std::abs(numeric),
                 p.name() << " element " << i << ": backward " << analytic[i] << " vs central " << numeric);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(double_backward_doc)

BOOST_AUTO_TEST_CASE(softmax_hessian_per_row_is_diag_a_minus_a_y_minus_y_a) {
  // f(x) = g·softmax(x) for one row: its Hessian is T(g) = diag(a) − a·yᵀ − y·aᵀ with
  // y = softmax(x) and a = y ⊙ (g − g·y), the first-order gradient (docs/double_backward.md).
  const Tensor x = test_support::input({5}, 31);
  ag::Generator gen(32);
  const Tensor g = ag::randn({5}, Dtype::Float64, gen);
  const curvature::Hessian H(ag::sum(g * ag::softmax(x, 0)), {x});
  const Eigen::MatrixXd M = full_hessian(H);
  Vector y = x.to_vector(), gv = g.to_vector();
  double zmax = *std::max_element(y.begin(), y.end()), z = 0;
  for (auto& e : y) z += (e = std::exp(e - zmax));
  double gy = 0;
  for (std::size_t i = 0; i < y.size(); ++i) y[i] /= z, gy += gv[i] * y[i];
  for (std::size_t j = 0; j < 5; ++j)
    for (std::size_t k = 0; k < 5; ++k) {
      const double aj = y[j] * (gv[j] - gy), ak = y[k] * (gv[k] - gy);
      const double expected = (j == k ? aj : 0.0) - aj * y[k] - y[j] * ak;
      BOOST_TEST(std::abs(M(static_cast<Eigen::Index>(j), static_cast<Eigen::Index>(k)) - expected) <= 1e-12,
                 "T[" << j << "][" << k << "] = " << M(static_cast<Eigen::Index>(j), static_cast<Eigen::Index>(k))
                      << " vs " << expected);
    }
  BOOST_TEST(M.rowwise().sum().cwiseAbs().maxCoeff() <= 1e-15);  // adding a constant to x changes nothing
}

BOOST_AUTO_TEST_CASE(worked_example_through_the_fused_core) {
  // The doc's example: Q = K = I, V = 2I, scale 1/√2, L = O[t1, 0]. Along the first query row,
  // L = 2σ(z) with z = scale·(q_a − q_b), so H_q1 = 2σ''(z)·scale²·[1 −1; −1 1], and the HVP with
  // v = (1, 0) on row t1 is c·(1, −1) with c = 2σ(1−σ)(1−2σ)·scale².
  const Tensor q = ag::tensor({1, 0, 0, 1}, {1, 1, 2, 2}, Dtype::Float64).requires_grad_();
  const Tensor k = ag::tensor({1, 0, 0, 1}, {1, 1, 2, 2}, Dtype::Float64);
  const Tensor v = ag::tensor({2, 0, 0, 2}, {1, 1, 2, 2}, Dtype::Float64);
  const Tensor pick = ag::tensor({1, 0, 0, 0}, {1, 1, 2, 2}, Dtype::Float64);
  const double scale = 1 / std::sqrt(2.0), sigma = 1 / (1 + std::exp(-scale));
  const double c = 2 * sigma * (1 - sigma) * (1 - 2 * sigma) * scale * scale;
  const Tensor dir = ag::tensor({1, 0, 0, 0}, {1, 1, 2, 2}, Dtype::Float64);
  auto fused = [&](const TensorList& in) {
    return ag::sum(ag::scaled_dot_product_attention(in[0], k, v).output * pick);
  };
  auto composed = [&](const TensorList& in) {
    const Tensor p = ag::softmax(ag::matmul(in[0], ag::transpose(k, -2, -1)) * scale, -1);
    return ag::sum(ag::matmul(p, v) * pick);
  };
  const Vector hf = curvature::flatten(ag::hvp(fused, {q}, {dir}));
  const Vector hc = curvature::flatten(ag::hvp(composed, {q}, {dir}));
  const Vector expected = {c, -c, 0, 0};
  for (std::size_t i = 0; i < 4; ++i) {
    BOOST_TEST(std::abs(hf[i] - expected[i]) <= 1e-14, "fused " << i << ": " << hf[i] << " vs " << expected[i]);
    BOOST_TEST(std::abs(hf[i] - hc[i]) <= 1e-14, "fused " << hf[i] << " vs composed " << hc[i]);
  }
  BOOST_TEST_MESSAGE("c = " << c);
}

BOOST_AUTO_TEST_SUITE_END()

