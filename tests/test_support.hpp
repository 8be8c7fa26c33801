#pragma once
// Helpers shared by the test programs: value checks, float64 inputs, gradchecks, error text.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

namespace test_support {

namespace ag = autograd;

// t has `shape` and, element by element, the `expected` values within tol·(1 + |expected|).
inline void check_values(const ag::Tensor& t, const ag::Shape& shape, const std::vector<double>& expected,
                         double tol = 1e-12) {
  BOOST_TEST(ag::shape_str(t.shape()) == ag::shape_str(shape));
  const std::vector<double> got = t.to_vector();
  BOOST_REQUIRE_EQUAL(got.size(), expected.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    BOOST_TEST(std::abs(got[i] - expected[i]) <= tol * (1.0 + std::abs(expected[i])),
               "element " << i << ": " << got[i] << " vs expected " << expected[i]);
}

inline ag::Tensor f64(const std::vector<double>& v, const ag::Shape& s) {
  return ag::tensor(v, s, ag::Dtype::Float64);
}

// Standard-normal float64 values from a seeded generator, requiring grad.
inline ag::Tensor input(const ag::Shape& shape, std::uint64_t seed) {
  ag::Generator gen(seed);
  return ag::randn(shape, ag::Dtype::Float64, gen).requires_grad_();
}

// Gradcheck of f at the inputs with the default (tight) tolerances; the report on failure.
inline void check_gradients(const std::string& what, const std::function<ag::Tensor(const ag::TensorList&)>& f,
                            const ag::TensorList& inputs) {
  const ag::GradcheckResult r = ag::gradcheck(f, inputs);
  BOOST_TEST(r.ok, fmt::format("{}: {}", what, r));
  BOOST_TEST_MESSAGE(fmt::format("{}: worst abs error {:.3g}", what, r.max_abs_error));
}

// The message of the std::invalid_argument f throws ("" when it throws none).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

}  // namespace test_support
