// Every route of the matrix product behind the ops (autograd/src/kernels/gemm.cpp): the tiny
// products taken before any cut, the small register-blocked kernel (packed transposed B, few
// rows included), libxsmm's kernels when the build has them (gemm_xsmm.hpp, alpha 1 and scaled,
// beta 0 and 1), Eigen, the BLAS, and the cuts into pieces (rows, columns, the summed dimension).
// Each is checked against a long double reference computed here from the definition, at odd
// sizes, for all four transpose pairs, several alpha and beta, padded leading dimensions (the
// padding must stay untouched, C's NaN must not leak when beta = 0), with the same bits at 1, 2
// and 3 threads and through a PreparedGemm (one kernel looked up for many operands); and
// libxsmm's kernel table is asked for the same new shapes by two threads at once. Negative
// controls show that the checks see a wrong element, a touched pad and a changed bit.
#define BOOST_TEST_MODULE gemm_paths
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <array>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <autograd/autograd.hpp>

#include "../autograd/src/kernels/gemm.hpp"       // the product every op calls, tested directly
#include "../autograd/src/kernels/gemm_xsmm.hpp"  // which products libxsmm takes
#include "isa_support.hpp"

namespace ag = autograd;

namespace {

struct Case {
  bool ta, tb;
  std::int64_t M, N, K;
  double alpha, beta;
};

std::string describe(const Case& c, const char* type) {
  return std::string(type) + " " + (c.ta ? "T" : "N") + (c.tb ? "T" : "N") + " " + std::to_string(c.M) + "x" +
         std::to_string(c.N) + "x" + std::to_string(c.K) + " alpha " + std::to_string(c.alpha) + " beta " +
         std::to_string(c.beta);
}

// Deterministic values in [-1, 1) with every mantissa bit in use.
std::vector<double> values(std::size_t n, std::uint64_t seed) {
  std::vector<double> v(n);
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (double& x : v) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x = static_cast<double>(s >> 11) / static_cast<double>(std::uint64_t{1} << 52) - 1.0;
  }
  return v;
}

constexpr std::int64_t kPad = 3;  // extra elements per row of every operand
constexpr double kPadValue = 12345.0;

// The operands of one case, stored with leading dimensions cols + kPad, C's pad set to kPadValue.
template <class T>
struct Operands {
  std::int64_t lda, ldb, ldc;
  std::vector<T> a, b, c0;
};

template <class T>
Operands<T> operands(const Case& c, std::uint64_t seed) {
  const std::int64_t a_rows = c.ta ? c.K : c.M, a_cols = c.ta ? c.M : c.K;
  const std::int64_t b_rows = c.tb ? c.N : c.K, b_cols = c.tb ? c.K : c.N;
  Operands<T> o{a_cols + kPad, b_cols + kPad, c.N + kPad, {}, {}, {}};
  auto fill = [](std::int64_t rows, std::int64_t cols, std::int64_t ld, std::uint64_t sd, double pad) {
    const std::vector<double> v = values(static_cast<std::size_t>(rows * ld), sd);
    std::vector<T> out(v.size());
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < ld; ++j) out[i * ld + j] = j < cols ? static_cast<T>(v[i * ld + j]) : static_cast<T>(pad);
    return out;
  };
  o.a = fill(a_rows, a_cols, o.lda, seed, 0.5);
  o.b = fill(b_rows, b_cols, o.ldb, seed + 1, 0.5);
  o.c0 = fill(c.M, c.N, o.ldc, seed + 2, kPadValue);
  if (c.beta == 0)  // must be overwritten, never read
    for (std::int64_t i = 0; i < c.M; ++i)
      for (std::int64_t j = 0; j < c.N; ++j) o.c0[i * o.ldc + j] = std::numeric_limits<T>::quiet_NaN();
  return o;
}

template <class T>
std::vector<T> run(const Case& c, const Operands<T>& o) {
  std::vector<T> out = o.c0;
  ag::gemm<T>(c.ta, c.tb, c.M, c.N, c.K, static_cast<T>(c.alpha), o.a.data(), o.lda, o.b.data(), o.ldb,
              static_cast<T>(c.beta), out.data(), o.ldc);
  return out;
}

// The same product through a PreparedGemm made for it (the attention cores' route).
template <class T>
std::vector<T> run_prepared(const Case& c, const Operands<T>& o) {
  std::vector<T> out = o.c0;
  const ag::PreparedGemm<T> product(c.ta, c.tb, c.M, c.N, c.K, static_cast<T>(c.alpha), o.lda, o.ldb,
                                    static_cast<T>(c.beta), o.ldc);
  product(o.a.data(), o.b.data(), out.data());
  return out;
}

// op(A)·op(B) and Σ|a·b| in long double for every element of C, computed once for a shape and
// its operands (the large products below check several alpha and beta against one).
struct Sums {
  std::vector<long double> s, abs;
};

template <class T>
Sums sums_of(const Case& c, const Operands<T>& o) {
  Sums r{std::vector<long double>(static_cast<std::size_t>(c.M * c.N)), std::vector<long double>(static_cast<std::size_t>(c.M * c.N))};
  for (std::int64_t i = 0; i < c.M; ++i)
    for (std::int64_t j = 0; j < c.N; ++j) {
      long double s = 0, abs_sum = 0;
      for (std::int64_t k = 0; k < c.K; ++k) {
        const long double p = static_cast<long double>(c.ta ? o.a[k * o.lda + i] : o.a[i * o.lda + k]) *
                              static_cast<long double>(c.tb ? o.b[j * o.ldb + k] : o.b[k * o.ldb + j]);
        s += p;
        abs_sum += std::fabs(p);
      }
      r.s[i * c.N + j] = s;
      r.abs[i * c.N + j] = abs_sum;
    }
  return r;
}

// The largest error of `got` against the long double definition, over the error bound
// (K + 3)·u·(|alpha|·Σ|a||b| + |beta·c|) + the smallest normal: at most 1 when right. A pad
// element changed counts as infinitely wrong.
template <class T>
double worst_excess_of(const Case& c, const Operands<T>& o, const Sums& sums, const std::vector<T>& got) {
  const long double u = std::numeric_limits<T>::epsilon() / 2, alpha = c.alpha, beta = c.beta;
  double worst = 0;
  for (std::int64_t i = 0; i < c.M; ++i) {
    for (std::int64_t j = 0; j < c.N; ++j) {
      const long double c0 = c.beta == 0 ? 0.0L : static_cast<long double>(o.c0[i * o.ldc + j]);
      const long double want = alpha * sums.s[i * c.N + j] + beta * c0;
      const long double bound =
          (c.K + 3) * u * (std::fabs(alpha) * sums.abs[i * c.N + j] + std::fabs(beta * c0)) + std::numeric_limits<T>::min();
      const long double err = std::fabs(static_cast<long double>(got[i * o.ldc + j]) - want);
      worst = std::max(worst, std::isnan(static_cast<double>(err)) ? std::numeric_limits<double>::infinity()
                                                                  : static_cast<double>(err / bound));
    }
    for (std::int64_t j = c.N; j < o.ldc; ++j)
      if (got[i * o.ldc + j] != static_cast<T>(kPadValue)) worst = std::numeric_limits<double>::infinity();
  }
  return worst;
}

template <class T>
double worst_excess(const Case& c, const Operands<T>& o, const std::vector<T>& got) {
  return worst_excess_of(c, o, sums_of(c, o), got);
}

bool same_bits(const auto& x, const auto& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0;
}

// (M, N, K) reaching each route: tiny (below a few hundred multiply-adds: the seed shapes), the
// small kernel and few-row transposed-B products (tiny shape), libxsmm's range (2^12 to 2^27, a
// transposed B laid out first) with pieces cut by rows, by columns and along K, and the BLAS's
// (2^27 and up; with the generic kernel variant, which leaves libxsmm and the small kernels
// out, from 2^17: the generic cases below).
const std::vector<std::array<std::int64_t, 3>> kShapes = {
    {2, 12, 4},  {2, 4, 12},   {4, 12, 2},   {1, 1, 1},    {3, 5, 7},      {8, 8, 8},     {8, 32, 96},
    {5, 24, 33}, {13, 37, 29}, {32, 16, 32}, {31, 17, 33}, {300, 67, 65}, {67, 300, 65}, {33, 35, 1030},
    {129, 63, 257}, {259, 65, 250}, {301, 131, 230}};

template <class T>
void check_every_route(const char* type) {
  int threads_before = ag::get_num_threads();
  std::uint64_t seed = 1;
  for (const auto& [M, N, K] : kShapes) {
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (double alpha : {1.0, 0.37})
          for (double beta : {0.0, 1.0, -0.5}) {
            const Case c{ta, tb, M, N, K, alpha, beta};
            const Operands<T> o = operands<T>(c, seed++);
            ag::set_num_threads(1);
            const std::vector<T> one = run(c, o);
            BOOST_TEST(worst_excess(c, o, one) <= 1.0, describe(c, type));
            BOOST_TEST(same_bits(run_prepared(c, o), one), describe(c, type) << ": prepared");
            for (int t : {2, 3}) {
              ag::set_num_threads(t);
              BOOST_TEST(same_bits(run(c, o), one), describe(c, type) << ": bits at " << t << " threads");
            }
          }
  }
  ag::set_num_threads(threads_before);
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_route_float32) { check_every_route<float>("float32"); }
BOOST_AUTO_TEST_CASE(every_route_float64) { check_every_route<double>("float64"); }

// The generic variant: no libxsmm, no small kernels, so the BLAS (from 2^17 multiply-adds and
// 32 in every dimension) and Eigen take what those took above.
BOOST_AUTO_TEST_CASE(every_route_generic_variant) {
  const test_support::IsaScope generic("generic");
  check_every_route<float>("float32 generic");
  check_every_route<double>("float64 generic");
}

BOOST_AUTO_TEST_CASE(libxsmm_takes_the_products_it_won) {
  // Built with libxsmm: NN and TN products of 2^12 to 2^27 multiply-adds, beta 0 or 1, any alpha
  // (gemm() lays a transposed B out first and asks for the NN or TN product).
  if (std::string(ag::xsmm::target()).empty()) {
    BOOST_TEST(!ag::xsmm::fits<float>(false, 32, 16, 32, 1.f, 32, 16, 0.f, 16));
    BOOST_TEST(!ag::xsmm::fits_in_blocks<float>(false, 2048, 256, 256, 1.f, 256, 256, 0.f, 256));
    return;
  }
  BOOST_TEST(ag::xsmm::fits<float>(false, 32, 16, 32, 1.f, 32, 16, 0.f, 16));
  BOOST_TEST(ag::xsmm::fits<double>(true, 256, 64, 256, 1.0, 256, 64, 1.0, 64) == false);  // B transposed
  BOOST_TEST(ag::xsmm::fits<double>(false, 256, 64, 255, 0.125, 256, 64, 1.0, 64));
  BOOST_TEST(!ag::xsmm::fits<float>(false, 8, 8, 8, 1.f, 8, 8, 0.f, 8));              // 2^9: ours
  BOOST_TEST(ag::xsmm::fits<float>(false, 2048, 128, 128, 1.f, 128, 128, 0.f, 128));   // 2^25: medium's
  BOOST_TEST(!ag::xsmm::fits<float>(false, 2048, 256, 256, 1.f, 256, 256, 0.f, 256));  // 2^27: the BLAS
  BOOST_TEST(ag::xsmm::fits_in_blocks<float>(false, 2048, 256, 256, 1.f, 256, 256, 0.f, 256));    // or blocks
  BOOST_TEST(!ag::xsmm::fits_in_blocks<float>(false, 2048, 128, 128, 1.f, 128, 128, 0.f, 128));   // one call
  BOOST_TEST(!ag::xsmm::fits_in_blocks<float>(false, 2048, 256, 256, 1.f, 256, 256, 0.5f, 256));  // beta 0.5
  BOOST_TEST(!ag::xsmm::fits<float>(false, 32, 16, 32, 1.f, 32, 16, 0.5f, 16));        // beta 0.5
  BOOST_TEST(!ag::xsmm::fits<float>(false, 32, 16, 32, 1.f, std::int64_t{1} << 31, 16, 0.f, 16));
  // A product it takes, called directly, against the route without it (small kernel or Eigen).
  const Case c{true, false, 31, 17, 33, 0.37, 1.0};
  const Operands<float> o = operands<float>(c, 99);
  std::vector<float> got = o.c0;
  BOOST_TEST(ag::xsmm::product<float>(true, c.M, c.N, c.K, 0.37f, o.a.data(), o.lda, o.b.data(), o.ldb, 1.f, got.data(),
                                      o.ldc));
  BOOST_TEST(worst_excess(c, o, got) <= 1.0);
}

BOOST_AUTO_TEST_CASE(two_threads_ask_for_the_same_new_shapes_at_once) {
  // Each shape is new to the process (never dispatched before); both threads ask at the same
  // moment, then compare with a product computed afterwards on this thread.
  std::vector<Case> cases;
  for (std::int64_t n = 0; n < 24; ++n) cases.push_back({n % 2 == 1, false, 17 + n, 19 + 2 * n, 23 + n, 1.0, 0.0});
  std::vector<Operands<float>> ops;
  for (const Case& c : cases) ops.push_back(operands<float>(c, 1000 + ops.size()));
  std::vector<std::vector<float>> got[2];
  std::barrier sync(2);
  auto worker = [&](int w) {
    for (std::size_t i = 0; i < cases.size(); ++i) {
      sync.arrive_and_wait();
      got[w].push_back(run(cases[i], ops[i]));
    }
  };
  std::thread t0(worker, 0), t1(worker, 1);
  t0.join();
  t1.join();
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const std::vector<float> again = run(cases[i], ops[i]);
    BOOST_TEST(worst_excess(cases[i], ops[i], again) <= 1.0, describe(cases[i], "float32"));
    BOOST_TEST(same_bits(got[0][i], again), describe(cases[i], "float32") << " thread 0");
    BOOST_TEST(same_bits(got[1][i], again), describe(cases[i], "float32") << " thread 1");
  }
}

BOOST_AUTO_TEST_CASE(negative_controls_the_checks_see_what_they_must) {
  const Case c{false, false, 13, 37, 29, 1.0, 0.0};
  const Operands<float> o = operands<float>(c, 7);
  const std::vector<float> right = run(c, o);
  BOOST_TEST(worst_excess(c, o, right) <= 1.0);
  std::vector<float> wrong = right;
  wrong[5 * o.ldc + 3] = std::nextafter(std::nextafter(wrong[5 * o.ldc + 3], 10.f), 10.f) * 1.0001f;
  BOOST_TEST(worst_excess(c, o, wrong) > 1.0);  // one element off by 1e-4
  std::vector<float> padded = right;
  padded[2 * o.ldc + c.N] = 0.f;
  BOOST_TEST(worst_excess(c, o, padded) > 1.0);  // the pad written
  std::vector<float> one_bit = right;
  std::uint32_t bits;
  std::memcpy(&bits, &one_bit[0], 4);
  bits ^= 1u;
  std::memcpy(&one_bit[0], &bits, 4);
  BOOST_TEST(!same_bits(one_bit, right));
  std::vector<float> nan = right;
  nan[0] = std::numeric_limits<float>::quiet_NaN();
  BOOST_TEST(worst_excess(c, o, nan) > 1.0);
}

namespace {

// The products of `c` at the kernel variant `isa` ("avx512", "avx2"), or nothing when this CPU
// or build lacks it.
template <class T>
std::vector<T> at_isa(const std::string& isa, const Case& c, const Operands<T>& o) {
  const std::string before(ag::kernel_isa());
  try {
    ag::set_kernel_isa(isa);
  } catch (const std::invalid_argument&) {
    return {};
  }
  std::vector<T> out = run(c, o);
  ag::set_kernel_isa(before);
  return out;
}

template <class T>
void check_variants_agree(const char* type) {
  // A·Bᵀ with fewer than 16 rows (the dot-product kernel), and the other small-kernel products.
  const std::vector<Case> cases = {{false, true, 8, 32, 96, 1.0, 0.0},  {false, true, 5, 24, 33, 0.37, 1.0},
                                   {false, true, 8, 8, 8, 1.0, -0.5},   {false, true, 15, 41, 17, 1.0, 1.0},
                                   {false, false, 8, 32, 40, 0.37, 0.0}, {true, true, 24, 16, 20, 1.0, 1.0}};
  std::uint64_t seed = 500;
  for (const Case& c : cases) {
    const Operands<T> o = operands<T>(c, seed++);
    const std::vector<T> wide = at_isa<T>("avx512", c, o), narrow = at_isa<T>("avx2", c, o);
    if (!wide.empty()) BOOST_TEST(worst_excess(c, o, wide) <= 1.0, describe(c, type) << " avx512");
    if (!narrow.empty()) BOOST_TEST(worst_excess(c, o, narrow) <= 1.0, describe(c, type) << " avx2");
    if (!wide.empty() && !narrow.empty()) BOOST_TEST(same_bits(wide, narrow), describe(c, type) << ": avx512 vs avx2");
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_avx512_and_avx2_kernels_give_the_same_bits) {
  check_variants_agree<float>("float32");
  check_variants_agree<double>("float64");
}

namespace {

// 1030 x 300 x 520 = 1.6e8 multiply-adds, past libxsmm's single-call bound (2^27): the BLAS, or,
// where OpenBLAS runs AVX2 kernels on an AVX-512 core, libxsmm in blocks of 512 rows, 256 columns
// and 512 terms, every edge a partial block (1030 = 2·512 + 6, 300 = 256 + 44, 520 = 512 + 8).
template <class T>
void check_large_products(const char* type) {
  const int threads_before = ag::get_num_threads();
  std::uint64_t seed = 700;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const Case shape{ta, tb, 1030, 300, 520, 1.0, 1.0};
      const Operands<T> o = operands<T>(shape, seed++);  // c0 finite: beta 0 cases put NaN in below
      const Sums sums = sums_of(shape, o);
      for (double alpha : {1.0, 0.37})
        for (double beta : {0.0, 1.0, -0.5}) {
          const Case c{ta, tb, shape.M, shape.N, shape.K, alpha, beta};
          Operands<T> oc = o;
          if (beta == 0)
            for (std::int64_t i = 0; i < c.M; ++i)
              for (std::int64_t j = 0; j < c.N; ++j) oc.c0[i * oc.ldc + j] = std::numeric_limits<T>::quiet_NaN();
          ag::set_num_threads(1);
          const std::vector<T> one = run(c, oc);
          BOOST_TEST(worst_excess_of(c, oc, sums, one) <= 1.0, describe(c, type));
          for (int t : {2, 3}) {
            ag::set_num_threads(t);
            BOOST_TEST(same_bits(run(c, oc), one), describe(c, type) << ": bits at " << t << " threads");
          }
          if (ta && tb && alpha == 1.0 && beta == 0.0) {  // negative control: one element 0.01 off
            std::vector<T> wrong = one;                   // (the float32 bound is ~5e-3 here)
            wrong[700 * oc.ldc + 299] += T(0.01);
            BOOST_TEST(worst_excess_of(c, oc, sums, wrong) > 1.0);
          }
        }
    }
  ag::set_num_threads(threads_before);
}

}  // namespace

BOOST_AUTO_TEST_CASE(products_past_libxsmms_bound) {
  BOOST_TEST_MESSAGE("large products in libxsmm blocks: " << (ag::large_products_in_blocks() ? "yes" : "no"));
  check_large_products<float>("float32");
  check_large_products<double>("float64");
}
