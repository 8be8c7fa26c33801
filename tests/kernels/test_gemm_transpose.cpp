// The transposition behind the matrix products with a transposed B (autograd/src/kernels/gemm.cpp
// lays op(B) out [K, N] before the small kernel or libxsmm, alpha folded in): its AVX-512 and
// AVX2 variants (gemm_small.hpp) against the definition dst[c·ldd + r] = alpha·src[r·lds + c]
// (one float multiply; alpha = 1 an exact copy), bit for bit,
// at every size from 1 x 1 to 40 x 40 (whole register blocks, partial ones, both), with padded
// leading dimensions whose padding must stay untouched. Negative controls: a checker that sees
// one swapped pair of elements and one written pad element.
#define BOOST_TEST_MODULE gemm_transpose
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "../autograd/src/kernels/gemm.hpp"  // transpose_scaled, which runs the kernels
#include "isa_support.hpp"

namespace ag = autograd;

namespace {

using Transpose =
    std::function<void(const float*, std::int64_t, std::int64_t, std::int64_t, float*, std::int64_t, float)>;

constexpr float kPad = -7777.f;

// Distinct values (their position), so a moved element cannot go unseen.
std::vector<float> source(std::int64_t rows, std::int64_t lds) {
  std::vector<float> s(static_cast<std::size_t>(rows * lds));
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<float>(i) + 0.25f;
  return s;
}

// Elements of dst [cols, rows] (rows ldd apart) not equal to the definition, the padding
// past each row's `rows` elements included (it must still hold kPad).
int wrong_elements(const std::vector<float>& src, std::int64_t lds, std::int64_t rows, std::int64_t cols,
                   const std::vector<float>& dst, std::int64_t ldd, float alpha = 1.f) {
  int wrong = 0;
  for (std::int64_t c = 0; c < cols; ++c)
    for (std::int64_t r = 0; r < ldd; ++r) {
      const float want = r >= rows ? kPad : alpha == 1.f ? src[r * lds + c] : alpha * src[r * lds + c];
      if (std::memcmp(&dst[c * ldd + r], &want, sizeof want) != 0) ++wrong;
    }
  return wrong;
}

std::vector<float> run(const Transpose& f, const std::vector<float>& src, std::int64_t lds, std::int64_t rows,
                       std::int64_t cols, std::int64_t ldd, float alpha = 1.f) {
  std::vector<float> dst(static_cast<std::size_t>(cols * ldd), kPad);
  f(src.data(), lds, rows, cols, dst.data(), ldd, alpha);
  return dst;
}

// The variants this CPU runs, by name.
std::vector<std::pair<std::string, Transpose>> variants() {
  std::vector<std::pair<std::string, Transpose>> out;
  for (const std::string& isa : test_support::available_isas()) {
    // Through the dispatcher with the variant set (a sanitizer build has no AVX-512 variant to
    // name directly; available_isas lists only those the build has).
    if (isa == "generic") continue;
    out.emplace_back(isa, [isa](const float* src, std::int64_t lds, std::int64_t rows, std::int64_t cols, float* dst,
                                std::int64_t ldd, float alpha) {
      test_support::IsaScope scope(isa);
      ag::transpose_scaled<float>(src, lds, rows, cols, alpha, dst, ldd);
    });
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_size_to_40_by_40_with_padded_strides) {
  const auto vs = variants();
  BOOST_TEST_MESSAGE("variants tested: " << vs.size());
  for (const auto& [name, f] : vs) {
    int failed_sizes = 0;
    for (std::int64_t rows = 1; rows <= 40; ++rows)
      for (std::int64_t cols = 1; cols <= 40; ++cols) {
        const std::int64_t lds = cols + 3, ldd = rows + 5;
        const std::vector<float> src = source(rows, lds);
        for (float alpha : {1.f, 0.37f, -3.f}) {
          const int wrong =
              wrong_elements(src, lds, rows, cols, run(f, src, lds, rows, cols, ldd, alpha), ldd, alpha);
          if (wrong != 0 && ++failed_sizes <= 5)
            BOOST_ERROR(name << " " << rows << "x" << cols << " alpha " << alpha << ": " << wrong << " elements wrong");
        }
      }
    BOOST_TEST(failed_sizes == 0, name << ": sizes with a wrong element");
  }
}

BOOST_AUTO_TEST_CASE(large_blocks_in_place_strides_and_zero_sizes) {
  for (const auto& [name, f] : variants()) {
    // A [33, 16] block of a packed [q | k | v] row layout (stride 3·64), as attention reads K.
    const std::int64_t rows = 33, cols = 16, lds = 192, ldd = 33;
    const std::vector<float> src = source(rows, lds);
    BOOST_TEST(wrong_elements(src, lds, rows, cols, run(f, src, lds, rows, cols, ldd), ldd) == 0, name);
    // 192 x 64 (a projection's weight) into a tight [64, 192].
    const std::vector<float> w = source(192, 64);
    BOOST_TEST(wrong_elements(w, 64, 192, 64, run(f, w, 64, 192, 64, 192), 192) == 0, name);
    // Nothing to do: nothing written.
    std::vector<float> dst(8, kPad);
    f(src.data(), lds, 0, 4, dst.data(), 2, 1.f);
    f(src.data(), lds, 4, 0, dst.data(), 2, 0.5f);
    BOOST_TEST(wrong_elements(src, lds, 0, 4, dst, 2) == 0, name);
  }
}

BOOST_AUTO_TEST_CASE(negative_controls_the_checker_sees_a_swap_and_a_pad) {
  const std::int64_t rows = 17, cols = 19, lds = 20, ldd = 18;
  const std::vector<float> src = source(rows, lds);
  const Transpose plain = [](const float* s, std::int64_t ls, std::int64_t r, std::int64_t c, float* d,
                             std::int64_t ld, float alpha) {
    for (std::int64_t i = 0; i < r; ++i)
      for (std::int64_t j = 0; j < c; ++j) d[j * ld + i] = alpha * s[i * ls + j];
  };
  std::vector<float> right = run(plain, src, lds, rows, cols, ldd);
  BOOST_TEST(wrong_elements(src, lds, rows, cols, right, ldd) == 0);
  std::vector<float> swapped = right;
  std::swap(swapped[3 * ldd + 5], swapped[5 * ldd + 3]);
  BOOST_TEST(wrong_elements(src, lds, rows, cols, swapped, ldd) == 2);
  std::vector<float> pad = right;
  pad[2 * ldd + rows] = 0.f;
  BOOST_TEST(wrong_elements(src, lds, rows, cols, pad, ldd) == 1);
  // alpha applied twice (or not at all) is seen too.
  const std::vector<float> scaled = run(plain, src, lds, rows, cols, ldd, 0.37f);
  BOOST_TEST(wrong_elements(src, lds, rows, cols, scaled, ldd, 0.37f) == 0);
  BOOST_TEST(wrong_elements(src, lds, rows, cols, right, ldd, 0.37f) > 0);
  BOOST_TEST(wrong_elements(src, lds, rows, cols, run(plain, src, lds, rows, cols, ldd, 0.37f * 0.37f), ldd, 0.37f) > 0);
}
