// Float32 elementwise arithmetic under broadcast patterns the kernels' fast paths must recognise
// or refuse: both operands broadcast, a broadcast operand on the left, rank 4 with size-one dims in
// several places, zero-size dims; NaN, infinities and denormals among the values. Every result is
// compared bit for bit with the same float operation on scalars, under every instruction-set
// variant this CPU supports and at 1, 2 and 3 threads.
#define BOOST_TEST_MODULE elementwise_hostile
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "isa_support.hpp"

namespace ag = autograd;

namespace {

using test_support::available_isas;

std::vector<float> values(std::int64_t n, std::uint64_t seed) {
  ag::Generator gen(seed);
  const std::vector<double> r = ag::randn({n}, ag::Dtype::Float64, gen).to_vector();
  std::vector<float> v(r.begin(), r.end());
  const float inf = std::numeric_limits<float>::infinity();
  const float odd[] = {std::numeric_limits<float>::quiet_NaN(), inf, -inf, 0.0f, -0.0f, 1e-40f, -3e-39f};
  for (std::size_t k = 0; k < 7 && k < v.size(); ++k) v[(k * 11 + seed) % v.size()] = odd[k];
  return v;
}

// Row-major offset of a broadcast operand of shape s (right-aligned in out) at output index idx.
std::int64_t offset(const ag::Shape& s, const ag::Shape& out, const std::vector<std::int64_t>& idx) {
  std::int64_t off = 0;
  const std::size_t lead = out.size() - s.size();
  for (std::size_t d = 0; d < s.size(); ++d) off = off * s[d] + (s[d] == 1 ? 0 : idx[d + lead]);
  return off;
}

ag::Shape broadcast(const ag::Shape& a, const ag::Shape& b) {
  const std::size_t r = std::max(a.size(), b.size());
  std::vector<std::int64_t> out(r);
  for (std::size_t d = 0; d < r; ++d) {
    const std::int64_t x = d + a.size() >= r ? a[d + a.size() - r] : 1;
    const std::int64_t y = d + b.size() >= r ? b[d + b.size() - r] : 1;
    out[d] = x == 1 ? y : x;
  }
  return out;
}

bool same(double got, float want) {
  const float g = static_cast<float>(got);
  if (std::isnan(g) || std::isnan(want)) return std::isnan(g) && std::isnan(want);
  return std::memcmp(&g, &want, sizeof g) == 0;
}

template <class F, class G>
std::size_t check(const ag::Shape& sa, const ag::Shape& sb, F scalar, G op) {
  const std::int64_t na = ag::shape_numel(sa), nb = ag::shape_numel(sb);
  const std::vector<float> a = values(na, 3 + na), b = values(nb, 7 + nb);
  const ag::Tensor ta = ag::tensor(std::vector<double>(a.begin(), a.end()), sa, ag::Dtype::Float32);
  const ag::Tensor tb = ag::tensor(std::vector<double>(b.begin(), b.end()), sb, ag::Dtype::Float32);
  const ag::Shape so = broadcast(sa, sb);
  const std::vector<double> got = op(ta, tb).to_vector();
  const std::int64_t n = ag::shape_numel(so);
  if (static_cast<std::int64_t>(got.size()) != n) return 1000000;
  std::size_t bad = 0;
  std::vector<std::int64_t> idx(so.size(), 0);
  for (std::int64_t i = 0; i < n; ++i) {
    const float want = scalar(a[offset(sa, so, idx)], b[offset(sb, so, idx)]);
    if (!same(got[i], want)) ++bad;
    for (std::size_t d = so.size(); d-- > 0;) {
      if (++idx[d] < so[d]) break;
      idx[d] = 0;
    }
  }
  return bad;
}

const std::vector<std::pair<ag::Shape, ag::Shape>> kPairs = {
    {{37, 1}, {1, 53}},          {{1, 53}, {37, 1}},        {{53}, {37, 53}},          {{37, 1}, {37, 53}},
    {{}, {37, 53}},              {{37, 53}, {}},            {{2, 1, 3, 1}, {1, 4, 1, 5}}, {{2, 3, 1, 17}, {2, 1, 19, 17}},
    {{2, 3, 19, 17}, {3, 1, 1}}, {{3, 1, 17}, {2, 3, 19, 17}}, {{5, 1, 33}, {5, 7, 33}}, {{5, 7, 33}, {5, 7, 1}},
    {{1}, {40}},                 {{40}, {1}},               {{0, 5}, {5}},             {{3, 0, 2}, {3, 1, 2}},
    {{1, 0}, {7, 1}},            {{65, 1, 129}, {1, 31, 129}}, {{300, 1}, {1, 300}},   {{1, 1, 1, 1}, {4, 3, 2, 33}},
    {{4, 3, 2, 33}, {1, 3, 1, 33}}, {{700, 700}, {700}},    {{700, 700}, {700, 1}},    {{700}, {700, 700}},
    {{700, 1}, {700, 700}},      {{700, 1}, {1, 700}}};

}  // namespace

BOOST_AUTO_TEST_CASE(broadcast_patterns_give_the_bits_of_scalar_float_arithmetic) {
  for (const std::string& isa : available_isas()) {
    ag::set_kernel_isa(isa);
    for (int threads : {1, 2, 3}) {
      ag::set_num_threads(threads);
      for (const auto& [sa, sb] : kPairs) {
        const std::string where = isa + " threads " + std::to_string(threads) + " " + ag::shape_str(sa) + " with " +
                                  ag::shape_str(sb);
        BOOST_TEST(check(sa, sb, [](float x, float y) { return x + y; }, [](auto& x, auto& y) { return ag::add(x, y); }) == 0u,
                   "add " << where);
        BOOST_TEST(check(sa, sb, [](float x, float y) { return x - y; }, [](auto& x, auto& y) { return ag::sub(x, y); }) == 0u,
                   "sub " << where);
        BOOST_TEST(check(sa, sb, [](float x, float y) { return x * y; }, [](auto& x, auto& y) { return ag::mul(x, y); }) == 0u,
                   "mul " << where);
        BOOST_TEST(check(sa, sb, [](float x, float y) { return x / y; }, [](auto& x, auto& y) { return ag::div(x, y); }) == 0u,
                   "div " << where);
      }
    }
  }
  ag::set_num_threads(2);
}
