// ag::randint: Int64 values uniform on [low, high), with no modulo bias even for ranges near 2^64,
// reproducible from the seed, and clear errors for an empty range.
#define BOOST_TEST_MODULE randint
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

namespace ag = autograd;

namespace {

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();

std::vector<std::int64_t> values_of(const ag::Tensor& t) {
  const std::int64_t* p = t.data<std::int64_t>();
  return {p, p + t.numel()};
}

// Pearson's chi-square statistic of observed counts against equal expected counts.
double chi_square(const std::vector<std::int64_t>& counts) {
  double total = 0;
  for (auto c : counts) total += static_cast<double>(c);
  const double expected = total / static_cast<double>(counts.size());
  double x2 = 0;
  for (auto c : counts) x2 += (static_cast<double>(c) - expected) * (static_cast<double>(c) - expected) / expected;
  return x2;
}

// With 5 degrees of freedom, P(chi-square > 30) is about 1.5e-5.
constexpr double kChiSquareLimit5 = 30.0;

}  // namespace

BOOST_AUTO_TEST_CASE(values_lie_in_the_half_open_range_with_equal_frequencies) {
  ag::Generator gen(7);
  const ag::Tensor t = ag::randint(-3, 3, {600, 1000}, gen);
  BOOST_TEST((t.dtype() == ag::Dtype::Int64));
  BOOST_TEST((t.shape() == ag::Shape{600, 1000}));
  std::vector<std::int64_t> counts(6, 0);
  for (auto v : values_of(t)) {
    BOOST_REQUIRE(v >= -3);
    BOOST_REQUIRE(v < 3);
    ++counts[static_cast<std::size_t>(v + 3)];
  }
  BOOST_TEST(chi_square(counts) < kChiSquareLimit5);
}

BOOST_AUTO_TEST_CASE(the_uniformity_check_rejects_a_skewed_sample) {
  // Negative control for the check above: one value 2 % too rare, at the sample size used above, must be caught.
  std::vector<std::int64_t> counts(6, 100000);
  counts[2] = 98000;
  BOOST_TEST(chi_square(counts) > kChiSquareLimit5);
}

BOOST_AUTO_TEST_CASE(a_range_wider_than_half_of_two_to_the_64_has_no_modulo_bias) {
  // Range 3 * 2^62: reducing a 64-bit draw modulo the range would make the values below 2^62
  // twice as likely as the others (probability 1/2 instead of 1/3).
  const std::int64_t quarter = std::int64_t{1} << 62;
  ag::Generator gen(11);
  const std::int64_t high = kMin + quarter + quarter + quarter;  // 2^62
  const ag::Tensor t = ag::randint(kMin, high, {30000}, gen);
  std::int64_t low_part = 0;
  for (auto v : values_of(t)) {
    BOOST_REQUIRE(v >= kMin);
    BOOST_REQUIRE(v < high);
    if (v < kMin + quarter) ++low_part;
  }
  const double fraction = static_cast<double>(low_part) / 30000.0;
  BOOST_TEST(fraction > 1.0 / 3.0 - 0.015);  // the standard deviation is 0.0027
  BOOST_TEST(fraction < 1.0 / 3.0 + 0.015);
}

BOOST_AUTO_TEST_CASE(the_full_int64_range_and_a_single_value_work) {
  ag::Generator gen(3);
  const ag::Tensor wide = ag::randint(kMin, kMax, {4000}, gen);
  std::int64_t negative = 0;
  for (auto v : values_of(wide)) {
    BOOST_REQUIRE(v < kMax);
    if (v < 0) ++negative;
  }
  BOOST_TEST(negative > 1800);
  BOOST_TEST(negative < 2200);
  for (auto v : values_of(ag::randint(kMax - 1, kMax, {50}, gen))) BOOST_TEST(v == kMax - 1);
  BOOST_TEST(ag::randint(0, 5, {0, 3}, gen).numel() == 0);
}

BOOST_AUTO_TEST_CASE(the_same_seed_gives_the_same_values) {
  ag::Generator a(42), b(42), c(43);
  const auto va = values_of(ag::randint(0, 1000, {64}, a));
  BOOST_TEST(va == values_of(ag::randint(0, 1000, {64}, b)));
  BOOST_TEST(va != values_of(ag::randint(0, 1000, {64}, c)));
  ag::manual_seed(42);
  BOOST_TEST(va == values_of(ag::randint(0, 1000, {64})));
}

BOOST_AUTO_TEST_CASE(an_empty_range_is_an_error_naming_randint_and_the_bounds) {
  auto message = [](std::int64_t low, std::int64_t high) {
    try {
      (void)ag::randint(low, high, {2});
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no exception");
  };
  BOOST_TEST(message(5, 5) == "randint: needs low < high, got low 5 and high 5");
  BOOST_TEST(message(kMax, kMin).find("randint: needs low < high") == 0);
  BOOST_CHECK_THROW((void)ag::randint(0, 3, {-1}), std::invalid_argument);
}
