// The float32 exponentials of the softmax rows (autograd/src/kernels/approx.hpp) in their vector
// variants: AVX-512 forms y·2^m in one instruction (vscalefps), AVX2 with Eigen's four
// power-of-two factors; both must give the same bits for every input, denormal results included,
// and exactly 0 below -88.723, where exp would clamp its argument. The one-pass weights-and-slopes kernel of the attention backward must
// give the bits of the exponentials followed by the plain expression, and the row maximum must
// be the largest element, or NaN when one is.
#define BOOST_TEST_MODULE isa_exp
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "../autograd/src/kernels/approx.hpp"
#include "isa_support.hpp"

namespace ag = autograd;

namespace {

using test_support::available_isas;
using test_support::IsaScope;

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

bool has(const std::string& isa) {
  const std::vector<std::string> isas = available_isas();
  return std::find(isas.begin(), isas.end(), isa) != isas.end();
}

// Every float from lo up to hi (both finite, lo < hi), in order.
void append_range(std::vector<float>& v, float lo, float hi) {
  for (float x = lo; x <= hi; x = std::nextafter(x, hi)) {
    v.push_back(x);
    if (x == hi) break;
  }
}

// The inputs: every float whose exponential is denormal or clamped (x in [-104, -85]) or
// overflows ([88, 89]), every float in [1/2, 1], a stride through all bit patterns, and the odd
// ones out.
std::vector<float> inputs() {
  std::vector<float> v;
  append_range(v, -104.0f, -85.0f);
  append_range(v, 88.0f, 89.0f);
  append_range(v, 0.5f, 1.0f);
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 4099)
    v.push_back(from_bits(static_cast<std::uint32_t>(u)));
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {inf, -inf, std::numeric_limits<float>::quiet_NaN(), 0.0f, -0.0f, 1e-45f, -1e-45f, -88.723f,
                  88.723f, -87.33655f, -103.972076f})
    v.push_back(x);
  return v;
}

// exp_shifted(x − m) under one variant.
std::vector<float> exponentials(const std::string& isa, const std::vector<float>& x, float m) {
  IsaScope scope(isa);
  std::vector<float> y(x.size());
  float sum = 0;
  BOOST_REQUIRE(ag::approx::exp_shifted(x.data(), y.data(), static_cast<std::int64_t>(x.size()), m, sum));
  return y;
}

// How many elements differ in their bits (any NaN equal to any NaN).
std::size_t differences(const std::vector<float>& a, const std::vector<float>& b) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!(std::isnan(a[i]) && std::isnan(b[i])) && bits_of(a[i]) != bits_of(b[i])) ++n;
  return n;
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_two_vector_variants_give_the_same_bits_for_every_kind_of_input) {
  if (!has("avx512") || !has("avx2")) {
    BOOST_TEST_MESSAGE("this CPU lacks AVX-512 or AVX2: nothing to compare");
    return;
  }
  const std::vector<float> x = inputs();
  for (float m : {0.0f, 3.5f, -20.0f}) {
    const std::vector<float> a = exponentials("avx512", x, m), b = exponentials("avx2", x, m);
    BOOST_TEST(differences(a, b) == 0u, "m = " << m);
    // the denormal results are there (those of x in [-88.723, -87.34], about 470,000 at m = 0):
    // the comparison covers them
    const auto denormal = std::count_if(a.begin(), a.end(), [](float y) { return y > 0 && !std::isnormal(y); });
    if (m == 0.0f) BOOST_TEST(denormal > 400000);
    BOOST_TEST_MESSAGE("m = " << m << ": " << denormal << " denormal results");
  }
}

BOOST_AUTO_TEST_CASE(the_exponentials_are_exp_within_a_few_ulps_and_denormal_where_exp_is) {
  // A second route: long double exp, rounded to float. Normal results within 4 ulps; denormal
  // ones within 2 units of the smallest denormal (the polynomial's few ulps, then one rounding).
  // Below -88.723 exp would clamp its argument: those are 0 (the next test).
  std::vector<float> x;
  append_range(x, -88.72f, -86.0f);
  for (float t = -80.0f; t < 80.0f; t += 0.37f) x.push_back(t);
  for (const std::string& isa : available_isas()) {
    if (isa == "generic") continue;
    const std::vector<float> y = exponentials(isa, x, 0.0f);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const long double want = std::exp(static_cast<long double>(x[i]));
      const float wf = static_cast<float>(want);
      const double ulp = std::isnormal(wf) ? std::nextafter(wf, 2 * wf) - wf : 1e-45;
      const double limit = std::isnormal(wf) ? 4 * ulp : 2 * ulp;
      if (std::fabs(static_cast<long double>(y[i]) - want) > limit) ++bad;
    }
    BOOST_TEST(bad == 0u, isa);
  }
}

BOOST_AUTO_TEST_CASE(below_the_clamp_the_exponentials_are_zero) {
  // exp(x − m) for x − m < -88.723, where exp clamps its argument (its value there, 2.9e-39, is
  // far from exp's): exactly 0, -inf included; from -88.723 up, a positive value; NaN stays NaN.
  std::vector<float> x;
  append_range(x, -104.0f, -88.7231f);
  const std::size_t below = x.size();
  x.push_back(-std::numeric_limits<float>::infinity());
  x.push_back(-88.723f);
  x.push_back(-88.0f);
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  for (const std::string& isa : available_isas()) {
    if (isa == "generic") continue;
    for (float m : {0.0f, 5.0f}) {
      std::vector<float> shifted(x);
      for (float& v : shifted) v += m;  // x + m − m: the same differences (exact for these m)
      const std::vector<float> y = exponentials(isa, shifted, m);
      std::size_t nonzero = 0;
      for (std::size_t i = 0; i <= below; ++i) nonzero += y[i] != 0.0f ? 1 : 0;
      BOOST_TEST(nonzero == 0u, isa << " m = " << m);
      BOOST_TEST(y[below + 1] > 0.0f, isa);
      BOOST_TEST(y[below + 2] > 0.0f, isa);
      BOOST_TEST(std::isnan(y[below + 3]), isa);
    }
  }
}

BOOST_AUTO_TEST_CASE(weights_and_slopes_in_one_pass_give_the_bits_of_two) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const std::string& isa : available_isas()) {
    IsaScope scope(isa);
    for (std::int64_t n : {0, 1, 7, 15, 16, 17, 31, 33, 64, 130}) {
      ag::Generator gen(static_cast<std::uint64_t>(n) + 5);
      const std::vector<double> r = ag::randn({2 * n}, ag::Dtype::Float64, gen).to_vector();
      std::vector<float> p(static_cast<std::size_t>(n)), g(static_cast<std::size_t>(n));
      for (std::int64_t j = 0; j < n; ++j) {
        p[static_cast<std::size_t>(j)] = static_cast<float>(3 * r[static_cast<std::size_t>(j)] - 2);
        g[static_cast<std::size_t>(j)] = static_cast<float>(r[static_cast<std::size_t>(n + j)]);
      }
      // blocked entries, a NaN score, an infinite slope, a score far below the maximum
      if (n > 3) p[1] = -inf, p[3] = -inf, g[2] = inf;
      if (n > 10) p[9] = nan, p[10] = -150.0f;
      for (float m : {0.5f, 2.0f}) {
        const float c = 0.25f;
        std::vector<float> p1 = p, g1 = g, p2 = p, g2 = g;
        const bool vector = ag::approx::exp_slopes(p1.data(), g1.data(), n, m, c);
        BOOST_TEST(vector == (isa != "generic"), isa);
        if (!vector) continue;
        float sum = 0;
        BOOST_REQUIRE(ag::approx::exp_shifted(p2.data(), p2.data(), n, m, sum));
        for (std::size_t j = 0; j < g2.size(); ++j) g2[j] = p2[j] * (g2[j] - c);
        BOOST_TEST(differences(p1, p2) == 0u, isa << " n = " << n);
        BOOST_TEST(differences(g1, g2) == 0u, isa << " n = " << n);
        if (n > 3) BOOST_TEST((p1[1] == 0.0f && g1[1] == 0.0f && p1[3] == 0.0f), isa);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(the_row_maximum_is_the_largest_element_or_nan_when_one_is) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (const std::string& isa : available_isas()) {
    IsaScope scope(isa);
    for (std::int64_t n : {1, 2, 7, 8, 9, 15, 16, 17, 31, 33, 256, 300}) {
      ag::Generator gen(static_cast<std::uint64_t>(n) + 11);
      const std::vector<double> r = ag::randn({n}, ag::Dtype::Float64, gen).to_vector();
      std::vector<float> x(r.begin(), r.end());
      // the plain maximum, and what it is with the largest element at each end
      for (std::int64_t at : {std::int64_t{0}, n / 2, n - 1}) {
        std::vector<float> y = x;
        y[static_cast<std::size_t>(at)] = 50.0f;
        float got = 0;
        const bool vector = ag::approx::max(y.data(), n, got);
        BOOST_TEST(vector == (isa != "generic"), isa);
        if (vector) BOOST_TEST(got == 50.0f, isa << " n = " << n << " at " << at);
      }
      // all -inf but one; +inf; a NaN anywhere (the tail included) makes it NaN
      std::vector<float> blocked(static_cast<std::size_t>(n), -inf);
      blocked[static_cast<std::size_t>(n - 1)] = -3.0f;
      float got = 0;
      if (!ag::approx::max(blocked.data(), n, got)) continue;
      BOOST_TEST(got == -3.0f, isa << " n = " << n);
      std::fill(blocked.begin(), blocked.end(), -inf);
      ag::approx::max(blocked.data(), n, got);
      BOOST_TEST(got == -inf, isa << " n = " << n);
      for (std::int64_t at = 0; at < n; at += std::max<std::int64_t>(1, n / 5)) {
        std::vector<float> y = x;
        y[static_cast<std::size_t>(at)] = nan;
        if (at + 1 < n) y[static_cast<std::size_t>(at + 1)] = inf;
        ag::approx::max(y.data(), n, got);
        BOOST_TEST(std::isnan(got), isa << " n = " << n << " NaN at " << at);
        y[static_cast<std::size_t>(at)] = 0.0f;
        ag::approx::max(y.data(), n, got);
        BOOST_TEST(got == (at + 1 < n ? inf : *std::max_element(y.begin(), y.end())), isa << " n = " << n);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(negative_control_one_ulp_off_in_one_element_is_seen) {
  std::vector<float> a = {1.0f, 2.0f, 1e-40f}, b = a;
  BOOST_TEST(differences(a, b) == 0u);
  b[2] = std::nextafter(b[2], 1.0f);
  BOOST_TEST(differences(a, b) == 1u);
}
