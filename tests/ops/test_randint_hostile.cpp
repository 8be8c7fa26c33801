// randint at the edges of int64: the full range, ranges of width one and two at either end,
// empty and negative shapes, element counts that overflow, low >= high.
#define BOOST_TEST_MODULE randint_hostile
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>

#include <autograd/autograd.hpp>

namespace ag = autograd;
using L = std::numeric_limits<std::int64_t>;

namespace {
bool throws_naming(auto f, const std::string& what) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return std::string(e.what()).find(what) != std::string::npos;
  }
  return false;
}
}  // namespace

BOOST_AUTO_TEST_CASE(extreme_bounds_stay_in_range) {
  ag::Generator gen(1);
  const struct {
    std::int64_t lo, hi;
  } ranges[] = {{L::min(), L::max()}, {L::max() - 1, L::max()}, {L::min(), L::min() + 1}, {L::min(), L::min() + 2},
                {-1, 0}, {L::min(), 0}, {0, L::max()}, {-3, 3}};
  for (auto [lo, hi] : ranges) {
    const ag::Tensor t = ag::randint(lo, hi, {4096}, gen);
    BOOST_TEST((t.dtype() == ag::Dtype::Int64));
    const std::int64_t* p = t.data<std::int64_t>();
    bool in = true, saw_lo = false;
    for (std::int64_t i = 0; i < 4096; ++i) {
      in = in && p[i] >= lo && p[i] < hi;
      saw_lo = saw_lo || p[i] == lo;
    }
    BOOST_TEST(in, lo << " .. " << hi);
    if (static_cast<std::uint64_t>(hi) - static_cast<std::uint64_t>(lo) <= 6) BOOST_TEST(saw_lo, lo << " .. " << hi);
  }
}

BOOST_AUTO_TEST_CASE(bad_bounds_and_shapes_throw_naming_randint) {
  ag::Generator gen(1);
  BOOST_TEST(throws_naming([&] { ag::randint(5, 5, {3}, gen); }, "randint"));
  BOOST_TEST(throws_naming([&] { ag::randint(L::max(), L::min(), {3}, gen); }, "randint"));
  BOOST_TEST(throws_naming([&] { ag::randint(0, 2, {-1}, gen); }, "randint"));
  BOOST_TEST(throws_naming([&] { ag::randint(0, 2, {2, -3}, gen); }, "randint"));
  BOOST_TEST(throws_naming([&] { ag::randint(0, 2, {L::max(), L::max()}, gen); }, "randint"));
  BOOST_TEST(throws_naming([&] { ag::randint(0, 2, {L::max() / 4}, gen); }, "randint"));
  BOOST_TEST(ag::randint(0, 2, {0, 5}, gen).numel() == 0);
  BOOST_TEST(ag::randint(0, 2, {}, gen).numel() == 1);
  // an empty draw does not advance the generator
  ag::Generator a(9), b(9);
  (void)ag::randint(0, 10, {0}, a);
  BOOST_TEST(a.next_u64() == b.next_u64());
}
