// The instruction-set variants (autograd/isa.hpp) of the float32 elementwise arithmetic (+, −, ·,
// / of tensors, broadcast or not, and of a tensor and a number), of the column sums of a
// reduction, and of layer_norm's rows: every variant this CPU supports against a reference
// computed here (the same IEEE operation on scalars, to the bit, or long double from the
// definitions within a rounding bound), at sizes with odd tails, with NaN and infinities, with the
// same bits at 1 and 2 threads; and negative controls showing that the checks can fail.
#define BOOST_TEST_MODULE isa_elementwise
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "isa_support.hpp"
#include "test_support.hpp"

namespace ag = autograd;

namespace {

using test_support::available_isas;
using test_support::IsaScope;

const std::vector<std::int64_t> kSizes = {0, 1, 15, 16, 17, 1003};
constexpr double kU = std::numeric_limits<float>::epsilon() / 2;

// n float values: normal ones, with NaN, ±inf, ±0 and a denormal among them when `special`.
std::vector<float> values(std::int64_t n, std::uint64_t seed, bool special) {
  ag::Generator gen(seed);
  const std::vector<double> r = ag::randn({n}, ag::Dtype::Float64, gen).to_vector();
  std::vector<float> v(r.begin(), r.end());
  const float inf = std::numeric_limits<float>::infinity();
  const float odd[] = {std::numeric_limits<float>::quiet_NaN(), inf, -inf, 0.0f, -0.0f, 1e-40f};
  if (special)
    for (std::size_t k = 0; k < 6 && k < v.size(); ++k) v[(k * 7 + seed) % v.size()] = odd[k];
  return v;
}

ag::Tensor tensor_of(const std::vector<float>& v, const ag::Shape& shape) {
  return ag::tensor(std::vector<double>(v.begin(), v.end()), shape, ag::Dtype::Float32);
}

// Equal as floats bit for bit, or both NaN.
bool same(double got, float want) {
  const float g = static_cast<float>(got);
  if (std::isnan(g) || std::isnan(want)) return std::isnan(g) && std::isnan(want);
  return std::memcmp(&g, &want, sizeof g) == 0;
}

// How many elements of `got` differ from `want` (bits, NaN as NaN).
std::size_t mismatches(const std::vector<double>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return std::max(got.size(), want.size()) + 1;
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) bad += same(got[i], want[i]) ? 0 : 1;
  return bad;
}

using Scalar = std::function<float(float, float)>;
struct BinaryCase {
  const char* name;
  Scalar scalar;
  ag::Tensor (*tensors)(const ag::Tensor&, const ag::Tensor&);
  ag::Tensor (*with_number)(const ag::Tensor&, double);
};
using ag::Tensor;
const BinaryCase kBinary[] = {
    {"add", [](float a, float b) { return a + b; }, [](const Tensor& a, const Tensor& b) { return ag::add(a, b); },
     [](const Tensor& a, double c) { return ag::add(a, c); }},
    {"sub", [](float a, float b) { return a - b; }, [](const Tensor& a, const Tensor& b) { return ag::sub(a, b); },
     [](const Tensor& a, double c) { return ag::sub(a, c); }},
    {"mul", [](float a, float b) { return a * b; }, [](const Tensor& a, const Tensor& b) { return ag::mul(a, b); },
     [](const Tensor& a, double c) { return ag::mul(a, c); }},
    {"div", [](float a, float b) { return a / b; }, [](const Tensor& a, const Tensor& b) { return ag::div(a, b); },
     [](const Tensor& a, double c) { return ag::div(a, c); }},
};

// The mismatches of op(a, b) against the scalar operation, for a [rows, n] a and b of shape
// [rows, n] (same), [n] (a row broadcast), [rows, 1] (a column broadcast) or [] (a scalar), and
// of a ∘ c, c ∘ a for a number c.
std::size_t binary_mismatches(const BinaryCase& op, std::int64_t rows, std::int64_t n, bool special) {
  const std::vector<float> a = values(rows * n, 3 + n, special);
  std::size_t bad = 0;
  for (int form = 0; form < 4; ++form) {
    const std::int64_t bn = form == 0 ? rows * n : form == 1 ? n : form == 2 ? rows : 1;
    const std::vector<float> b = values(bn, 5 + n, special && form == 0);
    const ag::Shape bshape =
        form == 0 ? ag::Shape{rows, n} : form == 1 ? ag::Shape{n} : form == 2 ? ag::Shape{rows, 1} : ag::Shape{};
    std::vector<float> want(a.size());
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        const std::int64_t k = form == 0 ? i * n + j : form == 1 ? j : form == 2 ? i : 0;
        want[i * n + j] = op.scalar(a[i * n + j], b[k]);
      }
    bad += mismatches(op.tensors(tensor_of(a, {rows, n}), tensor_of(b, bshape)).to_vector(), want);
    // b broadcast on the left: b ∘ a
    if (form == 1) {
      for (std::int64_t i = 0; i < rows * n; ++i) want[i] = op.scalar(b[i % n], a[i]);
      bad += mismatches(op.tensors(tensor_of(b, bshape), tensor_of(a, {rows, n})).to_vector(), want);
    }
  }
  const double c = -1.75;
  std::vector<float> want(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) want[i] = op.scalar(a[i], static_cast<float>(c));
  bad += mismatches(op.with_number(tensor_of(a, {rows, n}), c).to_vector(), want);
  return bad;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_variant_gives_the_bits_of_the_scalar_arithmetic) {
  for (const std::string& isa : available_isas()) {
    IsaScope scope(isa);
    for (const BinaryCase& op : kBinary)
      for (std::int64_t n : kSizes)
        for (bool special : {false, true})
          for (std::int64_t rows : {std::int64_t{1}, std::int64_t{3}})
            BOOST_TEST(binary_mismatches(op, rows, n, special) == 0u,
                       isa << " " << op.name << " rows " << rows << " n " << n << (special ? " with NaN/inf" : ""));
  }
}

BOOST_AUTO_TEST_CASE(reversed_number_forms_give_the_scalar_bits) {
  for (const std::string& isa : available_isas()) {
    IsaScope scope(isa);
    for (std::int64_t n : kSizes) {
      const std::vector<float> a = values(n, 17 + n, true);
      const ag::Tensor t = tensor_of(a, {n});
      std::vector<float> minus(a.size()), over(a.size());
      for (std::size_t i = 0; i < a.size(); ++i) {
        minus[i] = 2.5f - a[i];
        over[i] = 2.5f / a[i];
      }
      BOOST_TEST(mismatches((2.5 - t).to_vector(), minus) == 0u, isa << " c − a, n " << n);
      BOOST_TEST(mismatches((2.5 / t).to_vector(), over) == 0u, isa << " c / a, n " << n);
    }
  }
}

BOOST_AUTO_TEST_CASE(negative_control_a_one_ulp_change_in_the_tail_is_seen) {
  // The last element (in a vector tail for every width) changed by one ulp must be reported.
  const std::vector<float> a = values(17, 1, false), b = values(17, 2, false);
  std::vector<float> want(17);
  for (int i = 0; i < 17; ++i) want[i] = a[i] + b[i];
  want[16] = std::nextafter(want[16], std::numeric_limits<float>::infinity());
  for (const std::string& isa : available_isas()) {
    IsaScope scope(isa);
    BOOST_TEST(mismatches(ag::add(tensor_of(a, {17}), tensor_of(b, {17})).to_vector(), want) == 1u, isa);
  }
}

BOOST_AUTO_TEST_CASE(column_sums_give_the_bits_of_the_rows_added_in_order) {
  for (const std::string& isa : available_isas()) {
    IsaScope scope(isa);
    for (std::int64_t n : kSizes) {
      const std::int64_t rows = 5;
      const std::vector<float> x = values(rows * n, 23 + n, true);
      std::vector<float> want(static_cast<std::size_t>(n), 0.0f);
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = 0; j < n; ++j) want[j] += x[i * n + j];
      BOOST_TEST(mismatches(ag::sum(tensor_of(x, {rows, n}), 0).to_vector(), want) == 0u, isa << " n " << n);
    }
  }
}

BOOST_AUTO_TEST_CASE(arithmetic_and_column_sums_have_the_same_bits_at_every_thread_count) {
  const std::int64_t rows = 70, n = 1003;  // above the size that shares elementwise work
  const ag::Tensor a = tensor_of(values(rows * n, 31, true), {rows, n}), b = tensor_of(values(n, 32, false), {n});
  for (const std::string& isa : available_isas()) {
    IsaScope scope(isa);
    auto run = [&] {
      std::vector<double> out = ag::mul(a, b).to_vector();
      for (double v : ag::sub(a, a).to_vector()) out.push_back(v);
      for (double v : ag::sum(a, 0).to_vector()) out.push_back(v);
      return out;
    };
    const std::vector<double> one = run();
    test_support::ThreadCount two(2);
    const std::vector<double> again = run();
    BOOST_TEST(std::memcmp(one.data(), again.data(), one.size() * sizeof(double)) == 0, isa);
  }
}

namespace {

// layer_norm of [rows, n] float32 rows with weight and bias (or without), and its gradients for
// the seed g, through the variant in use.
struct NormResults {
  std::vector<double> y, dx, dw, db;
};

NormResults run_norm(const ag::Tensor& x0, const ag::Tensor& w0, const ag::Tensor& b0, const ag::Tensor& g,
                     bool affine) {
  const std::int64_t n = x0.size(1);
  ag::Tensor x = x0.detach().requires_grad_(), w = w0.detach().requires_grad_(), b = b0.detach().requires_grad_();
  ag::Tensor y = affine ? ag::layer_norm(x, {n}, w, b, 1e-5) : ag::layer_norm(x, {n}, ag::Tensor(), ag::Tensor(), 1e-5);
  y.backward(g);
  NormResults r{y.to_vector(), x.grad().to_vector(), {}, {}};
  if (affine) {
    r.dw = w.grad().to_vector();
    r.db = b.grad().to_vector();
  }
  return r;
}

// The worst error of layer_norm's value and gradients over their rounding bounds, from long
// double and the definitions (eps as given). Per row of n: μ and r in double are exact to far
// below float rounding; y = ((x − μ)·r)·w + b takes the rounding of μ to float and four more,
// bound 6u·((|x| + |μ|)·r·|w| + |b|). dx = r·(dx̂ − mean dx̂ − x̂·mean(dx̂·x̂)) adds float sums of n
// terms: bound (n + 16)·u·r·(|dx̂| + mean|dx̂| + (|x̂| + 1)·(mean|dx̂·x̂| + mean|dx̂|)). dw and db are
// sums over the rows: (rows + 8)·u·Σ|dy|·(|x̂| + 1).
double worst_norm_excess(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                         const std::vector<double>& g, std::int64_t rows, std::int64_t n, bool affine, double eps,
                         const NormResults& got) {
  const double tiny = std::numeric_limits<float>::min();
  double worst = 0;
  std::vector<long double> dw(n, 0), db(n, 0), dw_abs(n, 0);
  for (std::int64_t i = 0; i < rows; ++i) {
    const double* xr = x.data() + i * n;
    const double* gr = g.data() + i * n;
    long double mu = 0, var = 0;
    for (std::int64_t j = 0; j < n; ++j) mu += xr[j];
    mu /= n;
    for (std::int64_t j = 0; j < n; ++j) var += (xr[j] - mu) * (xr[j] - mu);
    var /= n;
    const long double r = 1 / std::sqrt(var + eps);
    std::vector<long double> xh(n), gh(n);
    long double m1 = 0, m2 = 0, a1 = 0, a2 = 0;
    for (std::int64_t j = 0; j < n; ++j) {
      xh[j] = (xr[j] - mu) * r;
      gh[j] = gr[j] * (affine ? w[j] : 1.0);
      m1 += gh[j];
      m2 += gh[j] * xh[j];
      a1 += std::fabs(gh[j]);
      a2 += std::fabs(gh[j] * xh[j]);
      dw[j] += gr[j] * xh[j];
      db[j] += gr[j];
      dw_abs[j] += std::fabs(gr[j]) * (std::fabs(xh[j]) + 1);
    }
    m1 /= n, m2 /= n, a1 /= n, a2 /= n;
    for (std::int64_t j = 0; j < n; ++j) {
      const std::int64_t k = i * n + j;
      const long double wj = affine ? w[j] : 1.0L, bj = affine ? b[j] : 0.0L;
      const long double y = xh[j] * wj + bj;
      const long double dx = r * (gh[j] - m1 - xh[j] * m2);
      const long double spread = (std::fabs(xr[j]) + std::fabs(mu)) * r * std::fabs(wj);
      const double by = static_cast<double>(6 * kU * (spread + std::fabs(bj)));
      const double bdx = static_cast<double>((n + 16) * kU * r *
                                             (std::fabs(gh[j]) + a1 + (std::fabs(xh[j]) + 1) * (a2 + a1)));
      worst = std::max(worst, static_cast<double>(std::fabs(got.y[k] - y)) / (by + tiny));
      worst = std::max(worst, static_cast<double>(std::fabs(got.dx[k] - dx)) / (bdx + tiny));
    }
  }
  for (std::int64_t j = 0; affine && j < n; ++j) {
    const double bound = static_cast<double>((rows + 8) * kU * dw_abs[j]) + tiny;
    worst = std::max(worst, static_cast<double>(std::fabs(got.dw[j] - dw[j])) / bound);
    worst = std::max(worst, static_cast<double>(std::fabs(got.db[j] - db[j])) / bound);
  }
  return worst;
}

ag::Tensor random(const ag::Shape& s, std::uint64_t seed, double scale = 1.0, double shift = 0.0) {
  ag::Generator gen(seed);
  return ag::add(ag::mul(ag::randn(s, ag::Dtype::Float32, gen), scale), shift);
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_variant_computes_layer_norm_within_the_bound) {
  for (const std::string& isa : available_isas()) {
    IsaScope scope(isa);
    for (std::int64_t n : {1, 15, 16, 17, 1003}) {
      for (bool affine : {true, false}) {
        const std::int64_t rows = 3;
        // rows away from 0 and of unequal spread: the mean's subtraction matters
        const ag::Tensor x = random({rows, n}, 41 + n, 3.0, 5.0), g = random({rows, n}, 43 + n);
        const ag::Tensor w = random({n}, 45 + n), b = random({n}, 47 + n);
        const NormResults got = run_norm(x, w, b, g, affine);
        const double worst = worst_norm_excess(x.to_vector(), w.to_vector(), b.to_vector(), g.to_vector(), rows, n,
                                               affine, 1e-5, got);
        BOOST_TEST(worst <= 1.0, isa << " n " << n << (affine ? " affine" : "") << ": worst " << worst);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(negative_control_the_layer_norm_bound_sees_a_wrong_eps) {
  // The reference with eps = 1e-3 instead of 1e-5 must be out of the bound (rows of unit spread).
  const std::int64_t rows = 3, n = 17;
  const ag::Tensor x = random({rows, n}, 5), g = random({rows, n}, 6), w = random({n}, 7), b = random({n}, 8);
  for (const std::string& isa : available_isas()) {
    IsaScope scope(isa);
    const NormResults got = run_norm(x, w, b, g, true);
    BOOST_TEST(worst_norm_excess(x.to_vector(), w.to_vector(), b.to_vector(), g.to_vector(), rows, n, true, 1e-3,
                                 got) > 1.0, isa);
  }
}

BOOST_AUTO_TEST_CASE(layer_norm_propagates_nan_and_inf_to_its_row) {
  for (const std::string& isa : available_isas()) {
    IsaScope scope(isa);
    for (double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
      std::vector<double> v = random({2, 17}, 9).to_vector();
      v[16] = bad;  // in the first row's tail
      const ag::Tensor x = ag::tensor(v, {2, 17}, ag::Dtype::Float32);
      const NormResults r = run_norm(x, random({17}, 10), random({17}, 11), random({2, 17}, 12), true);
      for (int j = 0; j < 17; ++j) {
        BOOST_TEST(std::isnan(r.y[j]), isa << " row 0, " << j);
        BOOST_TEST(std::isnan(r.dx[j]), isa << " dx row 0, " << j);
        BOOST_TEST(std::isfinite(r.y[17 + j]), isa << " row 1, " << j);
        BOOST_TEST(std::isfinite(r.dx[17 + j]), isa << " dx row 1, " << j);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(layer_norm_has_the_same_bits_at_every_thread_count) {
  const std::int64_t rows = 300, n = 129;  // large enough to be shared among threads, in chunks
  const ag::Tensor x = random({rows, n}, 51, 2.0, 1.0), g = random({rows, n}, 52);
  const ag::Tensor w = random({n}, 53), b = random({n}, 54);
  for (const std::string& isa : available_isas()) {
    IsaScope scope(isa);
    const NormResults one = run_norm(x, w, b, g, true);
    test_support::ThreadCount two(2);
    const NormResults again = run_norm(x, w, b, g, true);
    BOOST_TEST((one.y == again.y && one.dx == again.dx && one.dw == again.dw && one.db == again.db), isa);
  }
}
