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

#include "../examples/hessian_power.hpp"
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
