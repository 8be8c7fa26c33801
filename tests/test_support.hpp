#pragma once
// Helpers shared by the test programs: a scoped thread count, value checks, float64 inputs, gradchecks, error text,
// a small custom Function, and the prelude of names most test programs use unqualified.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

namespace test_support {

namespace ag = autograd;

// Sets the thread count for a scope and restores the previous one when the scope ends.
struct ThreadCount {
  int previous = ag::get_num_threads();
  explicit ThreadCount(int n) { ag::set_num_threads(n); }
  ~ThreadCount() { ag::set_num_threads(previous); }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;
};

// Which non-finite expected values check_values accepts. By default neither: a NaN or an
// infinity in `expected` fails the check, whatever was computed.
struct NonFinite {
  bool nan = false;  // an expected NaN passes when the value is NaN too
  bool inf = false;  // an expected ±inf passes when the value equals it exactly
};

// t has `shape` and, element by element, the `expected` values within tol·(1 + |expected|)
// (non-finite expected values only as `non_finite` allows).
inline void check_values(const ag::Tensor& t, const ag::Shape& shape, const std::vector<double>& expected,
                         double tol = 1e-12, NonFinite non_finite = {}) {
  BOOST_TEST(ag::shape_str(t.shape()) == ag::shape_str(shape));
  const std::vector<double> got = t.to_vector();
  BOOST_REQUIRE_EQUAL(got.size(), expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (non_finite.nan && std::isnan(expected[i])) {
      BOOST_TEST(std::isnan(got[i]), "element " << i << ": " << got[i] << ", expected NaN");
      continue;
    }
    if (non_finite.inf && std::isinf(expected[i])) {
      BOOST_TEST(got[i] == expected[i], "element " << i << ": " << got[i] << " vs expected " << expected[i]);
      continue;
    }
    BOOST_TEST(std::abs(got[i] - expected[i]) <= tol * (1.0 + std::abs(expected[i])),
               "element " << i << ": " << got[i] << " vs expected " << expected[i]);
  }
}

// check_values for results that may be non-finite: an expected NaN must come out NaN and an
// expected ±inf exactly equal.
inline void check_values_nonfinite(const ag::Tensor& t, const ag::Shape& shape, const std::vector<double>& expected,
                                   double tol = 1e-12) {
  check_values(t, shape, expected, tol, {.nan = true, .inf = true});
}

inline ag::Tensor f64(const std::vector<double>& v, const ag::Shape& s) {
  return ag::tensor(v, s, ag::Dtype::Float64);
}

// 0, 1, 2, ... in the given shape (float64 unless told).
inline ag::Tensor iota(const ag::Shape& s, ag::Dtype dtype = ag::Dtype::Float64) {
  return ag::reshape(ag::arange(static_cast<double>(ag::shape_numel(s)), dtype), s);
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

// The same, unnamed: the report alone on failure.
inline void check_gradients(const ag::GradcheckFn& f, const ag::TensorList& inputs) {
  const ag::GradcheckResult r = ag::gradcheck(f, inputs);
  BOOST_TEST(r.ok, fmt::format("{}", r));
  BOOST_TEST_MESSAGE(fmt::format("worst abs error {:.3g}, rel {:.3g}", r.max_abs_error, r.max_rel_error));
}

// The message of the std::invalid_argument f throws (`if_none` when it throws none).
inline std::string error_of(const std::function<void()>& f, const std::string& if_none = "") {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return if_none;
}

// Runs f, which must throw an E; returns its message. When f throws none the test case stops
// with "expected <expected>".
template <class E, class F>
std::string message_of(F&& f, const std::string& expected) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  BOOST_FAIL("expected " << expected);
  return {};
}

// Runs f; checks that it throws E and that the message contains every part. Logs the message
// (run with --log_level=message to see them all).
template <class E, class F>
void check_throws(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const E& e) {
    const std::string msg = e.what();
    BOOST_TEST_MESSAGE("  -> " << msg);
    for (const auto& p : parts) BOOST_TEST(msg.find(p) != std::string::npos, "message lacks '" << p << "': " << msg);
    return;
  } catch (const std::exception& e) {
    BOOST_ERROR("threw the wrong exception type: " << e.what());
    return;
  }
  BOOST_ERROR("did not throw");
}

// e's message holds every one of `parts`; the first missing one is logged.
inline bool message_has(const std::exception& e, const std::vector<std::string>& parts) {
  const std::string m = e.what();
  for (const auto& p : parts)
    if (m.find(p) == std::string::npos) {
      BOOST_TEST_MESSAGE("message \"" << m << "\" lacks \"" << p << "\"");
      return false;
    }
  return true;
}

// The largest |a - b| over the elements of two defined tensors of one shape.
inline double max_abs_diff(const ag::Tensor& a, const ag::Tensor& b) {
  BOOST_REQUIRE(a.defined() && b.defined());
  BOOST_REQUIRE(a.shape() == b.shape());
  const auto x = a.to_vector(), y = b.to_vector();
  double worst = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

// No element is NaN or infinite.
inline bool all_finite(const ag::Tensor& t) {
  for (double x : t.to_vector())
    if (!std::isfinite(x)) return false;
  return true;
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// f throws a std::invalid_argument whose message contains `fragment`.
inline void check_message(const std::function<void()>& f, const std::string& fragment) {
  try {
    f();
    BOOST_ERROR("no error; expected one mentioning: " << fragment);
  } catch (const std::invalid_argument& e) {
    BOOST_CHECK_MESSAGE(std::string(e.what()).find(fragment) != std::string::npos, e.what());
  }
}

// y = x³ as a custom Function with a correct hand-written backward (its node is named "cube").
struct Cube : ag::Function<Cube> {
  static constexpr const char* name = "cube";
  static ag::Tensor forward(ag::FunctionCtx& ctx, const ag::Tensor& x) {
    ctx.save_for_backward({x});
    return x * x * x;
  }
  static ag::TensorList backward(ag::FunctionCtx& ctx, const ag::TensorList& g) {
    ag::Tensor x = ctx.saved_tensors()[0];
    return {g[0] * 3.0 * x * x};  // d(x³)/dx = 3x²
  }
};

// The same x³ declared once_differentiable: differentiating its backward (create_graph, forward
// mode, Hessians) is refused, naming "cube_once".
struct CubeOnce : ag::Function<CubeOnce> {
  static constexpr const char* name = "cube_once";
  static constexpr bool once_differentiable = true;
  static ag::Tensor forward(ag::FunctionCtx& ctx, const ag::Tensor& x) { return Cube::forward(ctx, x); }
  static ag::TensorList backward(ag::FunctionCtx& ctx, const ag::TensorList& g) { return Cube::backward(ctx, g); }
};

// The names most test programs use unqualified; a test file brings them in with
// `using namespace test_support::prelude;`.
namespace prelude {
namespace ag = autograd;
using autograd::Dtype;
using autograd::Shape;
using autograd::Tensor;
using autograd::TensorList;
using test_support::check_gradients;
using test_support::check_message;
using test_support::check_throws;
using test_support::check_values;
using test_support::check_values_nonfinite;
using test_support::contains;
using test_support::error_of;
using test_support::f64;
using test_support::input;
using test_support::iota;
inline constexpr auto F64 = autograd::Dtype::Float64;
inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
}  // namespace prelude

}  // namespace test_support
