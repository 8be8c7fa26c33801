// ag::top_hessian_eigenvalues and the vector helpers of autograd/curvature.hpp: the helpers'
// values, Hessian-vector products against ag::hvp, the top k eigenvalues against Eigen's solver on
// the full Hessian (built column by column from the products), on a quadratic with known spectrum
// and on a small attention model; with k = 1 the same numbers, bit for bit, as the examples' power
// iteration (examples/hessian_power.hpp). All in float64.
#define BOOST_TEST_MODULE circuits_curvature
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include <Eigen/Dense>
#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

#include "../../examples/hessian_power.hpp"
#include "test_support.hpp"

namespace ag = autograd;
using ag::Dtype;
using ag::Tensor;
using ag::TensorList;

namespace {

// f(x, y) = ½ [x; y]ᵀ Q [x; y] with Q = R diag(λ) Rᵀ, R a rotation from a QR of a random matrix:
// the Hessian is Q, of eigenvalues λ, and the parameters are split into a (2, 1) and a (3) tensor.
struct Quadratic {
  std::vector<double> lambdas = {5.0, -3.0, 2.0, 1.0, 0.5};
  Eigen::MatrixXd Q;
  Tensor Qt;
  TensorList params = {test_support::input({2, 1}, 1), test_support::input({3}, 2)};
  Quadratic() {
    ag::Generator gen(17);
    const Tensor g = ag::randn({5, 5}, Dtype::Float64, gen);
    Eigen::MatrixXd M = g.as_matrix<double>();
    const Eigen::HouseholderQR<Eigen::MatrixXd> qr(M);
    const Eigen::MatrixXd R = qr.householderQ();
    Q = R * Eigen::VectorXd::Map(lambdas.data(), 5).asDiagonal() * R.transpose();
    Qt = ag::from_eigen(Q);
  }
  Tensor loss(const TensorList& p) const {
    const Tensor x = ag::cat({ag::reshape(p[0], {2}), p[1]}, 0);  // (5)
    return ag::sum(x * ag::squeeze(ag::matmul(Qt, ag::unsqueeze(x, -1)), -1)) * 0.5;
  }
};

// Causal two-head self-attention with a fixed readout and cross entropy.
struct AttentionModel {
  ag::Generator gen{21};
  mutable nn::MultiHeadAttention mha{nn::MultiHeadAttentionOptions{.embed_dim = 4, .num_heads = 2, .dtype = Dtype::Float64}, gen};
  Tensor x, readout;
  std::vector<std::int64_t> targets = {2, 0, 1, 1, 2, 0};
  AttentionModel() {
    x = ag::randn({2, 3, 4}, Dtype::Float64, gen);
    readout = ag::randn({4, 3}, Dtype::Float64, gen);
  }
  TensorList params() const { return mha.parameters(); }
  Tensor loss() const {
    const Tensor out = mha.forward(x, x, x, {.need_weights = false, .is_causal = true}).output;
    return nn::cross_entropy(ag::matmul(out, readout), targets);
  }
};

// The full Hessian from its products with the unit vectors.
Eigen::MatrixXd full_hessian(const ag::HessianVectorProduct& H) {
  const std::int64_t n = H.size();
  Eigen::MatrixXd M(n, n);
  for (std::int64_t j = 0; j < n; ++j) {
    std::vector<double> e(static_cast<std::size_t>(n), 0.0);
    e[static_cast<std::size_t>(j)] = 1.0;
    const Tensor col = ag::flatten_list(H(ag::unflatten_list(ag::tensor(e, {n}, Dtype::Float64), H.params())));
    const auto c = col.to_vector();
    for (std::int64_t i = 0; i < n; ++i) M(i, j) = c[static_cast<std::size_t>(i)];
  }
  return M;
}

// Eigen's eigenvalues sorted by decreasing magnitude.
std::vector<double> by_magnitude(const Eigen::MatrixXd& M) {
  const Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> eig(M);
  std::vector<double> v(eig.eigenvalues().data(), eig.eigenvalues().data() + eig.eigenvalues().size());
  std::sort(v.begin(), v.end(), [](double a, double b) { return std::abs(a) > std::abs(b); });
  return v;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(vectors_over_parameters)

BOOST_AUTO_TEST_CASE(dot_norm_axpy_and_flattening_compute_the_flat_vectors_values) {
  const TensorList a = {ag::tensor({1, 2, 3, 4}, {2, 2}, Dtype::Float64), ag::tensor({-1, 0.5}, {2}, Dtype::Float64)};
  const TensorList b = {ag::tensor({0.5, -1, 2, 1}, {2, 2}, Dtype::Float64), ag::tensor({3, 4}, {2}, Dtype::Float64)};
  BOOST_TEST(ag::dot(a, b) == 0.5 - 2 + 6 + 4 - 3 + 2);
  BOOST_TEST(ag::norm(a) == std::sqrt(1 + 4 + 9 + 16 + 1 + 0.25));
  TensorList y = {b[0].clone(), b[1].clone()};
  ag::axpy(2.0, a, y);
  test_support::check_values(y[0], {2, 2}, {2.5, 3, 8, 9});
  test_support::check_values(y[1], {2}, {1, 5});
  test_support::check_values(ag::scale(a, -1)[1], {2}, {1, -0.5});
  const Tensor flat = ag::flatten_list(a);
  test_support::check_values(flat, {6}, {1, 2, 3, 4, -1, 0.5});
  const TensorList back = ag::unflatten_list(flat, b);
  test_support::check_values(back[0], {2, 2}, {1, 2, 3, 4});
  test_support::check_values(back[1], {2}, {-1, 0.5});
}

BOOST_AUTO_TEST_CASE(mismatched_lists_are_refused_naming_the_tensor) {
  const TensorList a = {ag::zeros({2, 2}, Dtype::Float64)}, b = {ag::zeros({4}, Dtype::Float64)};
  test_support::check_message([&] { ag::dot(a, b); }, "dot: tensor 0 is [2, 2] in one list and [4] in the other");
  test_support::check_message([&] { ag::dot(a, {}); }, "dot: lists of 1 and 0 tensors");
  test_support::check_message([&] { ag::unflatten_list(ag::zeros({3}, Dtype::Float64), a); },
                              "unflatten_list: 3 values for tensors of 4 elements in all");
  test_support::check_message([&] { ag::flatten_list({ag::zeros({2}, Dtype::Float64), ag::zeros({2})}); },
                              "flatten_list: tensor 1 is Float32 but tensor 0 is Float64");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(hessian_eigenvalues)

BOOST_AUTO_TEST_CASE(products_match_ag_hvp) {
  const AttentionModel m;
  const auto params = m.params();
  const ag::HessianVectorProduct H([&m](const TensorList&) { return m.loss(); }, params);
  ag::Generator gen(4);
  TensorList v;
  for (const auto& p : params) v.push_back(ag::randn(p.shape(), Dtype::Float64, gen));
  const TensorList expected = ag::hvp([&m](const TensorList&) { return m.loss(); }, params, v);
  const TensorList got = H(v);
  for (std::size_t i = 0; i < params.size(); ++i)
    BOOST_TEST(test_support::max_abs_diff(got[i], expected[i]) <= 1e-13, "parameter " << i);
  BOOST_TEST(H.loss() == m.loss().item());
}

BOOST_AUTO_TEST_CASE(a_quadratic_gives_its_known_eigenvalues_by_magnitude) {
  const Quadratic q;
  const auto r = ag::top_hessian_eigenvalues([&q](const TensorList& p) { return q.loss(p); }, q.params, 3,
                                             {.max_iterations = 2000, .tolerance = 1e-11});
  const std::vector<double> expected = {5.0, -3.0, 2.0};
  for (std::size_t j = 0; j < 3; ++j) {
    BOOST_TEST(r.converged[j], "eigenvalue " << j << " residual " << r.residuals[j]);
    BOOST_TEST(std::abs(r.eigenvalues[j] - expected[j]) <= 1e-9, r.eigenvalues[j] << " vs " << expected[j]);
    BOOST_TEST(std::abs(ag::norm(r.eigenvectors[j]) - 1) <= 1e-12);
    // Q u = λ u
    const Eigen::VectorXd u = Eigen::VectorXd::Map(ag::flatten_list(r.eigenvectors[j]).data<double>(), 5);
    BOOST_TEST((q.Q * u - expected[j] * u).norm() <= 1e-5);
  }
  BOOST_TEST(std::abs(ag::dot(r.eigenvectors[0], r.eigenvectors[1])) <= 1e-8);
}

BOOST_AUTO_TEST_CASE(top_three_of_an_attention_model_match_the_full_hessian) {
  const AttentionModel m;
  const auto params = m.params();
  auto fn = [&m](const TensorList&) { return m.loss(); };
  const auto expected = by_magnitude(full_hessian(ag::HessianVectorProduct(fn, params)));
  BOOST_TEST_MESSAGE("full Hessian (" << expected.size() << " rows): top by magnitude " << expected[0] << ", "
                                      << expected[1] << ", " << expected[2] << ", " << expected[3]);
  const auto r = ag::top_hessian_eigenvalues(fn, params, 3, {.max_iterations = 20000, .tolerance = 1e-10, .seed = 3});
  for (std::size_t j = 0; j < 3; ++j) {
    BOOST_TEST(r.converged[j], "eigenvalue " << j << " residual " << r.residuals[j] << " after " << r.iterations[j]);
    BOOST_TEST(std::abs(r.eigenvalues[j] - expected[j]) <= 1e-7 * std::abs(expected[0]),
               "eigenvalue " << j << ": " << r.eigenvalues[j] << " vs Eigen " << expected[j]);
    BOOST_TEST_MESSAGE("eigenvalue " << j << ": " << r.eigenvalues[j] << " in " << r.iterations[j] << " products");
  }
}

BOOST_AUTO_TEST_CASE(a_scaled_operator_fails_the_full_hessian_comparison) {
  // Negative control: products off by 1 % give eigenvalues the comparison above rejects.
  const AttentionModel m;
  const auto params = m.params();
  auto fn = [&m](const TensorList&) { return m.loss(); };
  const ag::HessianVectorProduct H(fn, params);
  const auto expected = by_magnitude(full_hessian(H));
  const auto r = ag::top_eigenvalues([&H](const TensorList& v) { return ag::scale(H(v), 1.01); }, params, 1,
                                     {.max_iterations = 20000, .tolerance = 1e-10, .seed = 3});
  BOOST_TEST(std::abs(r.eigenvalues[0] - expected[0]) > 1e-7 * std::abs(expected[0]));
}

BOOST_AUTO_TEST_CASE(one_eigenvalue_is_the_examples_power_iteration_bit_for_bit) {
  const AttentionModel m;
  const auto params = m.params();
  const curvature::Hessian example_H(m.loss(), params);
  ag::Generator gen(3);
  const curvature::Vector start = curvature::random_vector(example_H.size(), gen);
  const auto expected = curvature::power_iteration([&](const curvature::Vector& v) { return example_H.apply(v); }, start,
                                                   {.max_iterations = 60, .tolerance = 1e-3});
  const auto r = ag::top_hessian_eigenvalues([&m](const TensorList&) { return m.loss(); }, params, 1,
                                             {.max_iterations = 60, .tolerance = 1e-3,
                                              .start = ag::unflatten_list(ag::tensor(start, {example_H.size()}, Dtype::Float64), params)});
  BOOST_TEST(r.eigenvalues[0] == expected.eigenvalue);
  BOOST_TEST(r.residuals[0] == expected.residual);
  BOOST_TEST(r.iterations[0] == expected.iterations);
  BOOST_TEST(r.converged[0] == expected.converged);
  BOOST_TEST(r.history[0] == expected.history);
  BOOST_TEST(ag::flatten_list(r.eigenvectors[0]).to_vector() == expected.vector);
}

BOOST_AUTO_TEST_CASE(bad_requests_are_refused_by_name) {
  const Quadratic q;
  auto fn = [&q](const TensorList& p) { return q.loss(p); };
  test_support::check_message([&] { ag::top_hessian_eigenvalues(fn, q.params, 0); },
                              "top_eigenvalues: k = 0 must be between 1 and the vectors' 5 elements");
  test_support::check_message([&] { ag::top_hessian_eigenvalues(fn, q.params, 1, {.max_iterations = 0}); },
                              "wants max_iterations >= 1 and tolerance > 0");
  test_support::check_message([&] { ag::top_hessian_eigenvalues(fn, {ag::zeros({2}, Dtype::Float64)}, 1); },
                              "HessianVectorProduct: params[0] does not require grad");
  test_support::check_message([&] { ag::HessianVectorProduct([](const TensorList& p) { return p[0]; }, {test_support::input({2}, 1)}); },
                              "HessianVectorProduct: the function must return one element, got shape [2]");
  // The same tensor twice would double every eigenvalue; a NaN loss has no curvature to report.
  const Tensor x = test_support::input({3}, 2);
  test_support::check_message([&] { ag::top_hessian_eigenvalues([](const TensorList& p) { return ag::sum(p[0] * p[1]); }, {x, x}, 1); },
                              "HessianVectorProduct: params[0] and params[1] are the same tensor");
  test_support::check_message([&] {
    ag::top_hessian_eigenvalues([](const TensorList& p) { return ag::sum(p[0] * p[0]) * std::nan(""); }, {x}, 1);
  }, "top_hessian_eigenvalues: the loss is nan at these parameters");
}

BOOST_AUTO_TEST_SUITE_END()
