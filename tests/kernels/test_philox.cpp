// The counter-based random stream of dropout: Philox-4x32-10 against the published known-answer
// vectors, the block generator against the one-element rule at any offset, the threshold rule,
// and ag::dropout drawing exactly that mask with one generator draw per call, the same at 1, 2
// and 3 threads, with the kept fraction near 1 - p in every Philox lane.
#define BOOST_TEST_MODULE philox
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include <autograd/autograd.hpp>

#include "../autograd/src/kernels/philox.hpp"
#include "test_support.hpp"

using namespace test_support::prelude;
namespace philox = ag::philox;

BOOST_AUTO_TEST_CASE(philox4x32_10_gives_the_random123_known_answers) {
  // Random123's tests/kat_vectors, rows "philox4x32 10": counter[4], key[2] -> output[4].
  struct Kat {
    philox::Counter counter;
    philox::Key key;
    philox::Counter expected;
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    const philox::Counter got = philox::philox4x32_10(k.counter, k.key);
    for (int i = 0; i < 4; ++i) BOOST_TEST(got[i] == k.expected[i], "word " << i << " of " << std::hex << k.counter[0]);
  }
}

BOOST_AUTO_TEST_CASE(the_stream_numbers_elements_four_to_a_counter) {
  const std::uint64_t seed = 0x0123456789abcdefULL, n = (std::uint64_t{5} << 32) * 4 + 4 * 7 + 2;
  const philox::DropoutStream s(seed, 0.5);
  const philox::Counter c = philox::philox4x32_10({7, 5, 0, 0}, {0x89abcdef, 0x01234567});
  BOOST_TEST(s.bits(n) == c[2]);
  BOOST_TEST(s.bits(n + 1) == c[3]);
  BOOST_TEST(s.uniform(n) == static_cast<double>(c[2]) / 4294967296.0);
}

BOOST_AUTO_TEST_CASE(block_generation_equals_the_one_element_rule_at_any_offset) {
  // Heads before a multiple of 4, whole groups of counters, tails; a counter crossing 2^32.
  for (std::uint64_t base : {std::uint64_t{0}, (std::uint64_t{1} << 34) - 70}) {
    const philox::DropoutStream s(99, 0.3);
    for (std::uint64_t first = base; first < base + 9; ++first)
      for (std::int64_t count : {0, 1, 3, 4, 5, 63, 64, 65, 131, 200}) {
        std::vector<double> out(static_cast<std::size_t>(count) + 1, -1.0);
        philox::keep_factors(s, first, count, 2.5, out.data());
        bool same = out.back() == -1.0;  // nothing written past the end
        for (std::int64_t k = 0; k < count; ++k)
          same = same && out[static_cast<std::size_t>(k)] == (s.kept(first + static_cast<std::uint64_t>(k)) ? 2.5 : 0.0);
        BOOST_TEST(same, "first " << first << ", count " << count);
      }
  }
}

BOOST_AUTO_TEST_CASE(an_element_is_kept_iff_its_uniform_is_at_least_p) {
  for (double p : {0.0, 1e-12, 0.1, 0.5, 1.0 / 3.0, 0.9, 1.0 - 1e-12, 1.0}) {
    const philox::DropoutStream s(4, p);
    bool rule = true;
    for (std::uint64_t n = 0; n < 4000; ++n) rule = rule && s.kept(n) == (s.uniform(n) >= p);
    BOOST_TEST(rule, "p = " << p);
  }
  // The threshold at a grid point: u = t/2^32 is kept exactly when p <= u.
  const std::uint64_t t = 0x80000000u;
  BOOST_TEST(philox::DropoutStream(1, 0.5).threshold == t);
  BOOST_TEST(philox::DropoutStream(1, std::nextafter(0.5, 1.0)).threshold == t + 1);
  BOOST_TEST(philox::DropoutStream(1, 1.0).threshold == std::uint64_t{1} << 32);
  BOOST_TEST(philox::DropoutStream(1, 0.0).threshold == 0u);
}

BOOST_AUTO_TEST_CASE(ag_dropout_draws_one_seed_and_keeps_by_the_stream) {
  const double p = 0.35;
  ag::Generator gen(21), reference(21);
  Tensor x = ag::ones({3, 7, 11}, Dtype::Float64);
  const auto y = ag::dropout(x, p, true, gen).to_vector();
  const philox::DropoutStream s(reference.next_u64(), p);
  BOOST_TEST(gen.state() == reference.state());  // exactly one draw, whatever the size
  bool same = true;
  for (std::size_t n = 0; n < y.size(); ++n) same = same && y[n] == (s.kept(n) ? 1.0 / (1.0 - p) : 0.0);
  BOOST_TEST(same);
  // A bigger tensor still advances the generator by one draw.
  ag::dropout(ag::ones({100000}), p, true, gen);
  reference.next_u64();
  BOOST_TEST(gen.state() == reference.state());
}

BOOST_AUTO_TEST_CASE(ag_dropout_is_the_same_at_one_two_and_three_threads) {
  const int threads = ag::get_num_threads();
  ag::Generator init(3);
  const Tensor x0 = ag::randn({300000}, Dtype::Float32, init);
  std::vector<std::vector<double>> ys, gs;
  for (int n : {1, 2, 3}) {
    ag::set_num_threads(n);
    ag::Generator gen(17);
    Tensor x = x0.clone().requires_grad_();
    Tensor y = ag::dropout(x, 0.2, true, gen);
    ag::sum(y).backward();
    ys.push_back(y.to_vector());
    gs.push_back(x.grad().to_vector());
  }
  ag::set_num_threads(threads);
  BOOST_TEST(ys[0] == ys[1]);
  BOOST_TEST(ys[0] == ys[2]);
  BOOST_TEST(gs[0] == gs[1]);
  BOOST_TEST(gs[0] == gs[2]);
}

BOOST_AUTO_TEST_CASE(kept_fraction_is_one_minus_p_in_every_lane) {
  // 2^22 elements, 2^20 per Philox lane (n mod 4): the kept fraction of each lane and of the
  // whole lies within 5 standard deviations sqrt(p(1-p)/n) of 1 - p.
  const std::int64_t n = std::int64_t{1} << 22;
  for (double p : {0.1, 0.5, 0.8}) {
    ag::Generator gen(23);
    const auto y = ag::dropout(ag::ones({n}, Dtype::Float32), p, true, gen).to_vector();
    double kept_all = 0, kept_lane[4] = {0, 0, 0, 0};
    for (std::size_t i = 0; i < y.size(); ++i) {
      const double k = y[i] != 0.0;
      kept_all += k;
      kept_lane[i % 4] += k;
    }
    const double sd_all = std::sqrt(p * (1 - p) / static_cast<double>(n)), sd_lane = 2 * sd_all;
    BOOST_TEST(std::abs(kept_all / static_cast<double>(n) - (1 - p)) <= 5 * sd_all, "p = " << p);
    for (int l = 0; l < 4; ++l)
      BOOST_TEST(std::abs(kept_lane[l] / static_cast<double>(n / 4) - (1 - p)) <= 5 * sd_lane, "p = " << p << ", lane " << l);
  }
}

BOOST_AUTO_TEST_CASE(p_one_gives_zeros_and_p_zero_the_identity) {
  ag::Generator gen(5);
  Tensor x = ag::randn({1000}, Dtype::Float64, gen).requires_grad_();
  Tensor zero = ag::dropout(x, 1.0, true, gen);
  bool zeros = true;
  for (double v : zero.to_vector()) zeros = zeros && v == 0.0;  // not NaN: no 0·(1/0)
  BOOST_TEST(zeros);
  const std::uint64_t before = gen.state();
  BOOST_TEST(ag::dropout(x, 0.0, true, gen).is_same(x));
  BOOST_TEST(gen.state() == before);  // p = 0 draws nothing
}
