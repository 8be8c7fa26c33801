// The AVX-512 Philox-4x32-10 kernel (16 counters side by side) against the one-counter
// function of kernels/philox.hpp, word for word, at counters whose high word changes within the
// group; and the dropout factors of every kernel variant against the one-element rule.
#define BOOST_TEST_MODULE philox_vector
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "../autograd/src/kernels/philox.hpp"
#include "isa_support.hpp"

namespace ag = autograd;
namespace philox = ag::philox;
using test_support::available_isas;
using test_support::IsaScope;

BOOST_AUTO_TEST_CASE(sixteen_counters_at_once_give_the_words_of_one_at_a_time) {
  const std::vector<std::uint64_t> starts = {0,
                                             1,
                                             12345,
                                             (std::uint64_t{1} << 32) - 8,
                                             (std::uint64_t{1} << 32) - 1,
                                             (std::uint64_t{7} << 32) - 15,
                                             0xFFFFFFFFFFFFFFF0ULL};
  const std::vector<philox::Key> keys = {{0, 0}, {0xffffffff, 0xffffffff}, {0x89abcdef, 0x01234567}};
  for (const std::string& isa : available_isas()) {
    IsaScope scope(isa);
    for (const philox::Key& key : keys)
      for (std::uint64_t c : starts) {
        std::uint32_t out[64] = {};
        if (!ag::approx::philox_bits(key[0], key[1], c, out)) {
          BOOST_TEST(isa != "avx512", "the AVX-512 variant has the kernel");
          continue;
        }
        std::size_t wrong = 0;
        for (std::uint64_t g = 0; g < 16; ++g) {
          const std::uint64_t counter = c + g;
          const philox::Counter want = philox::philox4x32_10(
              {static_cast<std::uint32_t>(counter), static_cast<std::uint32_t>(counter >> 32), 0, 0}, key);
          for (int lane = 0; lane < 4; ++lane) wrong += out[4 * g + static_cast<std::uint64_t>(lane)] != want[lane];
        }
        BOOST_TEST(wrong == 0u, isa << " counter " << c << " key " << key[0]);
      }
  }
}

BOOST_AUTO_TEST_CASE(every_variant_draws_the_factors_of_the_one_element_rule) {
  for (const std::string& isa : available_isas()) {
    IsaScope scope(isa);
    for (std::uint64_t base : {std::uint64_t{0}, (std::uint64_t{1} << 34) - 70, std::uint64_t{1} << 40})
      for (double p : {0.1, 0.5}) {
        const philox::DropoutStream s(base + 7, p);
        for (std::uint64_t first = base; first < base + 6; ++first)
          for (std::int64_t count : {63, 64, 65, 129, 300}) {
            std::vector<float> f(static_cast<std::size_t>(count));
            std::vector<double> d(static_cast<std::size_t>(count));
            philox::keep_factors(s, first, count, 2.0f, f.data());
            philox::keep_factors(s, first, count, 2.0, d.data());
            std::size_t wrong = 0;
            for (std::int64_t k = 0; k < count; ++k) {
              const bool kept = s.kept(first + static_cast<std::uint64_t>(k));
              wrong += f[static_cast<std::size_t>(k)] != (kept ? 2.0f : 0.0f);
              wrong += d[static_cast<std::size_t>(k)] != (kept ? 2.0 : 0.0);
            }
            BOOST_TEST(wrong == 0u, isa << " first " << first << " count " << count << " p " << p);
          }
      }
  }
}
