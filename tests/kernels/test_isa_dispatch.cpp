// The instruction-set variants of the vector kernels (autograd/isa.hpp): which one runs, and that
// every variant this CPU supports computes the matrix products (forward and both backward
// products, transposed operands, accumulation into C) and the row kernels to tight tolerances of
// a long double reference computed here from the definitions, at sizes with odd tails, with the
// same bits on every call and thread count.
#define BOOST_TEST_MODULE isa_dispatch
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <autograd/autograd.hpp>

#include "isa_support.hpp"
#include "test_support.hpp"

namespace ag = autograd;

namespace {

using test_support::available_isas;
using test_support::IsaScope;

ag::Tensor random(const ag::Shape& s, ag::Dtype dtype, std::uint64_t seed) {
  ag::Generator gen(seed);
  return ag::randn(s, dtype, gen);
}

double unit_roundoff(ag::Dtype dtype) {
  return dtype == ag::Dtype::Float32 ? std::numeric_limits<float>::epsilon() / 2 : std::numeric_limits<double>::epsilon() / 2;
}

// C = A·B for row-major [m, k] and [k, n] values, in long double, and the error bound of a sum of
// k products in the tensor's precision: (k + 2)·u·Σ|a||b| (the rounding of every term and partial
// sum, of the inputs' conversion excluded: they are exact), plus the smallest normal number.
struct Reference {
  std::vector<long double> value;
  std::vector<double> bound;
};

Reference reference_product(const std::vector<double>& a, const std::vector<double>& b, std::int64_t m,
                            std::int64_t k, std::int64_t n, double u) {
  Reference r{std::vector<long double>(static_cast<std::size_t>(m * n)), std::vector<double>(static_cast<std::size_t>(m * n))};
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      long double s = 0, abs_sum = 0;
      for (std::int64_t p = 0; p < k; ++p) {
        const long double t = static_cast<long double>(a[i * k + p]) * b[p * n + j];
        s += t;
        abs_sum += std::fabs(t);
      }
      r.value[i * n + j] = s;
      r.bound[i * n + j] = static_cast<double>((k + 2) * u * abs_sum) + std::numeric_limits<float>::min();
    }
  return r;
}

std::vector<double> transposed(const std::vector<double>& x, std::int64_t rows, std::int64_t cols) {
  std::vector<double> t(x.size());
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) t[j * rows + i] = x[i * cols + j];
  return t;
}

// The largest |got − ref| / bound: at most 1 when `got` is within the bound everywhere.
double worst_excess(const std::vector<double>& got, const Reference& ref) {
  BOOST_REQUIRE_EQUAL(got.size(), ref.value.size());
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, static_cast<double>(std::fabs(got[i] - ref.value[i])) / ref.bound[i]);
  return worst;
}

// C = A·B ([m, k] x [k, n]) and, from backward with seed G [m, n], dA = G·Bᵀ and dB = Aᵀ·G.
struct ProductResults {
  std::vector<double> c, da, db;
};

ProductResults run_product(const ag::Tensor& a0, const ag::Tensor& b0, const ag::Tensor& g) {
  ag::Tensor a = a0.detach().requires_grad_(), b = b0.detach().requires_grad_();
  ag::Tensor c = ag::matmul(a, b);
  c.backward(g);
  return {c.to_vector(), a.grad().to_vector(), b.grad().to_vector()};
}

struct Size {
  std::int64_t m, k, n;
};

// Whole vectors, odd tails in every dimension, more than one register block, and the transposed-B
// products from 16 rows up (where the small kernel packs B).
const std::vector<Size> kSizes = {{1, 1, 1},   {3, 5, 7},    {8, 8, 8},   {32, 16, 32}, {32, 32, 16},
                                  {17, 9, 24}, {13, 31, 40}, {5, 64, 48}, {16, 7, 64},  {33, 19, 16},
                                  {24, 40, 8}, {64, 32, 56}, {7, 100, 4}, {45, 45, 45}};

// Every product of `isa` within the error bound of the reference, in float32 and float64.
void check_products(const std::string& isa) {
  IsaScope scope(isa);
  BOOST_TEST(ag::kernel_isa() == isa);
  for (ag::Dtype dtype : {ag::Dtype::Float64, ag::Dtype::Float32}) {
    const double u = unit_roundoff(dtype);
    for (const Size& s : kSizes) {
      const ag::Tensor a = random({s.m, s.k}, dtype, 1 + s.m), b = random({s.k, s.n}, dtype, 2 + s.n);
      const ag::Tensor g = random({s.m, s.n}, dtype, 3 + s.k);
      const std::vector<double> av = a.to_vector(), bv = b.to_vector(), gv = g.to_vector();
      const ProductResults r = run_product(a, b, g);
      const std::string what = isa + " " + std::string(ag::dtype_name(dtype)) + " " + std::to_string(s.m) + "x" +
                               std::to_string(s.k) + "x" + std::to_string(s.n);
      BOOST_TEST(worst_excess(r.c, reference_product(av, bv, s.m, s.k, s.n, u)) <= 1.0, what << ": A·B");
      BOOST_TEST(worst_excess(r.da, reference_product(gv, transposed(bv, s.k, s.n), s.m, s.n, s.k, u)) <= 1.0,
                 what << ": G·Bᵀ");
      BOOST_TEST(worst_excess(r.db, reference_product(transposed(av, s.m, s.k), gv, s.k, s.m, s.n, u)) <= 1.0,
                 what << ": Aᵀ·G");
    }
  }
}

// gelu (exact) and its derivative of float values, in long double from std::erf and std::exp.
long double gelu_ref(long double x) { return 0.5L * x * (1 + std::erf(x / std::sqrt(2.0L))); }
long double gelu_slope_ref(long double x) {
  return 0.5L * (1 + std::erf(x / std::sqrt(2.0L))) + x * std::exp(-0.5L * x * x) / std::sqrt(2 * 3.14159265358979323846L);
}

// x, and dx for the seed g, of gelu at `values` through `isa`.
std::pair<std::vector<double>, std::vector<double>> run_gelu(const std::string& isa, const ag::Tensor& x0,
                                                             const ag::Tensor& g,
                                                             ag::GeluApproximation approximate = ag::GeluApproximation::None) {
  IsaScope scope(isa);
  ag::Tensor x = x0.detach().requires_grad_();
  ag::Tensor y = ag::gelu(x, approximate);
  y.backward(g);
  return {y.to_vector(), x.grad().to_vector()};
}

// The worst error of gelu's value and slope over the bound 4·u·|x| (value) and 4·u·|g|·(1 + |x|)
// (gradient): Eigen's float erf is within a few ulps of 1, and the rest a handful of roundings
// (measured: at most 0.55 of it).
double worst_gelu_excess(const std::vector<double>& xs, const std::vector<double>& gs,
                         const std::pair<std::vector<double>, std::vector<double>>& got) {
  const double u = unit_roundoff(ag::Dtype::Float32), tiny = std::numeric_limits<float>::min();
  double worst = 0;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const long double x = xs[i];
    const double ey = static_cast<double>(std::fabs(got.first[i] - gelu_ref(x)));
    const double ed = static_cast<double>(std::fabs(got.second[i] - gs[i] * gelu_slope_ref(x)));
    worst = std::max(worst, ey / (4 * u * std::fabs(xs[i]) + tiny));
    worst = std::max(worst, ed / (4 * u * std::fabs(gs[i]) * (1 + std::fabs(xs[i])) + tiny));
  }
  return worst;
}

// Values across gelu's range: around 0, the erf clamp at |x/√2| = 4, far out, ±0 and a tail
// (an odd count, so no vector width divides it).
ag::Tensor gelu_inputs() {
  std::vector<double> v;
  for (int i = -200; i <= 200; ++i) v.push_back(i * 0.05);
  for (double x : {5.6, 5.7, -5.6, -5.7, 30.0, -30.0, 0.0, -0.0, 1e-20, -1e-20}) v.push_back(x);
  v.push_back(0.3);
  return ag::tensor(v, {static_cast<std::int64_t>(v.size())}, ag::Dtype::Float32);
}

// The worst error of a float32 softmax over its rows of n (the last dim) against long double,
// over the bound (|x − max| + n + 8)·u·y: exp's argument is rounded (relative error |x − m|·u
// in the result), exp and the division a few ulps, the sum n roundings at most.
double worst_softmax_excess(const std::vector<double>& x, const std::vector<double>& y, std::int64_t n) {
  const double u = unit_roundoff(ag::Dtype::Float32), tiny = std::numeric_limits<float>::denorm_min();
  double worst = 0;
  for (std::size_t r = 0; r * n < x.size(); ++r) {
    const double* xr = x.data() + r * n;
    const long double m = *std::max_element(xr, xr + n);
    long double sum = 0;
    for (std::int64_t j = 0; j < n; ++j) sum += std::exp(xr[j] - m);
    for (std::int64_t j = 0; j < n; ++j) {
      const long double want = std::exp(xr[j] - m) / sum;
      const double bound = static_cast<double>((std::fabs(xr[j] - m) + n + 8) * u * want) + tiny;
      worst = std::max(worst, static_cast<double>(std::fabs(y[r * n + j] - want)) / bound);
    }
  }
  return worst;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(isa_dispatch)

BOOST_AUTO_TEST_CASE(kernel_isa_names_the_best_variant_and_rejects_unknown_ones) {
  const std::string best(ag::kernel_isa());
  BOOST_TEST((best == "avx512" || best == "avx2" || best == "generic"));
  const std::vector<std::string> isas = available_isas();
  BOOST_REQUIRE(!isas.empty());
  BOOST_TEST(isas.front() == "generic");  // always there
  if (std::getenv("HEADGRAD_ISA") == nullptr) BOOST_TEST(isas.back() == best);
#if (defined(__x86_64__) || defined(__i386__)) && !defined(__SANITIZE_ADDRESS__)
  // The AVX-512 variant is compiled into every x86 build but the sanitizer ones: on a CPU that has
  // it, it is there to use.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw"))
    BOOST_TEST(isas.back() == "avx512");
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    BOOST_TEST(isas.back() == "avx2");
#endif
  test_support::check_throws<std::invalid_argument>([] { ag::set_kernel_isa("avx9"); },
                                                    {"set_kernel_isa", "'avx9'", "avx512, avx2, generic"});
  BOOST_TEST(ag::kernel_isa() == best);  // a rejected name changes nothing
}

// HEADGRAD_ISA chooses the variant at the first use, and a bad value throws from there, naming
// the variable. Run as a child process of this test program with the variable set (the choice is
// made once per process); the parent checks that each child passes.
BOOST_AUTO_TEST_CASE(headgrad_isa_environment_variable) {
  const char* env = std::getenv("HEADGRAD_ISA");
  if (env != nullptr) {  // the child
    const std::string want(env);
    if (want == "avx9") {
      test_support::check_throws<std::invalid_argument>([] { (void)ag::kernel_isa(); }, {"HEADGRAD_ISA", "'avx9'"});
      test_support::check_throws<std::invalid_argument>(
          [] { (void)ag::matmul(ag::ones({16, 16}), ag::ones({16, 16})); }, {"HEADGRAD_ISA", "'avx9'"});
    } else {
      BOOST_TEST(ag::kernel_isa() == want);
    }
    return;
  }
  const std::string self = boost::unit_test::framework::master_test_suite().argv[0];
  std::vector<std::string> values = available_isas();
  values.emplace_back("avx9");
  for (const std::string& v : values) {
    const std::string cmd = "HEADGRAD_ISA=" + v + " '" + self +
                            "' --run_test=isa_dispatch/headgrad_isa_environment_variable > /dev/null 2>&1";
    BOOST_TEST(std::system(cmd.c_str()) == 0, cmd);
  }
}

BOOST_AUTO_TEST_CASE(every_variant_computes_products_within_the_rounding_bound) {
  for (const std::string& isa : available_isas()) check_products(isa);
}

// The error bound catches a wrong result: one element of a product off by a few bounds (the
// last element of a tail column), and a product with its columns shifted by one.
BOOST_AUTO_TEST_CASE(negative_control_the_bound_catches_wrong_products) {
  const Size s{13, 31, 40};
  for (ag::Dtype dtype : {ag::Dtype::Float64, ag::Dtype::Float32}) {
    const ag::Tensor a = random({s.m, s.k}, dtype, 5), b = random({s.k, s.n}, dtype, 6);
    const Reference ref = reference_product(a.to_vector(), b.to_vector(), s.m, s.k, s.n, unit_roundoff(dtype));
    std::vector<double> c = ag::matmul(a, b).to_vector();
    BOOST_TEST(worst_excess(c, ref) <= 1.0);
    c.back() += 3 * ref.bound.back();
    BOOST_TEST(worst_excess(c, ref) > 1.0);
    std::vector<double> shifted = ag::matmul(a, b).to_vector();
    for (std::size_t i = 0; i + 1 < shifted.size(); ++i) shifted[i] = shifted[i + 1];
    BOOST_TEST(worst_excess(shifted, ref) > 1.0);
  }
}

// The two vector variants run the same operations on every element of a product, so they agree
// to the bit, and every variant gives the same bits on every call and at 1 and 2 threads (sizes
// large enough to be cut into pieces and shared among the threads).
BOOST_AUTO_TEST_CASE(variants_are_deterministic_and_the_vector_ones_agree_to_the_bit) {
  const std::vector<std::string> isas = available_isas();
  std::vector<std::vector<double>> per_isa;
  for (ag::Dtype dtype : {ag::Dtype::Float32, ag::Dtype::Float64}) {
    for (const Size& s : {Size{32, 16, 32}, Size{17, 9, 24}, Size{300, 200, 64}, Size{64, 1024, 48}}) {
      const ag::Tensor a = random({s.m, s.k}, dtype, 11), b = random({s.k, s.n}, dtype, 12);
      const ag::Tensor g = random({s.m, s.n}, dtype, 13);
      std::vector<ProductResults> results;
      for (const std::string& isa : isas) {
        IsaScope scope(isa);
        const ProductResults once = run_product(a, b, g);
        test_support::ThreadCount two(2);
        const ProductResults again = run_product(a, b, g);
        BOOST_TEST((once.c == again.c && once.da == again.da && once.db == again.db), isa << " 1 vs 2 threads");
        results.push_back(once);
      }
      for (std::size_t i = 1; i < isas.size(); ++i)
        if (isas[i - 1] != "generic")
          BOOST_TEST((results[i].c == results[i - 1].c && results[i].da == results[i - 1].da &&
                      results[i].db == results[i - 1].db), isas[i - 1] << " vs " << isas[i]);
    }
  }
}

BOOST_AUTO_TEST_CASE(every_variant_computes_the_exact_gelu_and_its_slope_within_the_bound) {
  const ag::Tensor x = gelu_inputs(), g = random(x.shape(), ag::Dtype::Float32, 21);
  const std::vector<double> xs = x.to_vector(), gs = g.to_vector();
  for (const std::string& isa : available_isas()) {
    const auto got = run_gelu(isa, x, g);
    BOOST_TEST_MESSAGE(isa << ": worst error / bound " << worst_gelu_excess(xs, gs, got));
    BOOST_TEST(worst_gelu_excess(xs, gs, got) <= 1.0, isa);
    BOOST_TEST(got.first == run_gelu(isa, x, g).first, isa << ": same bits again");
    // the odd ones out: NaN stays NaN, ±inf gives the limits
    IsaScope scope(isa);
    const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    const std::vector<double> y = ag::gelu(ag::tensor({nan, inf, -inf}, {3}, ag::Dtype::Float32)).to_vector();
    BOOST_TEST(std::isnan(y[0]));
    BOOST_TEST(y[1] == inf);
  }
  // negative control: the tanh approximation is off the exact gelu by far more than the bound
  BOOST_TEST(worst_gelu_excess(xs, gs, run_gelu("generic", x, g, ag::GeluApproximation::Tanh)) > 10.0);
}

// Large enough to be shared among the threads: the same bits at 1 and 2 threads, per variant.
BOOST_AUTO_TEST_CASE(gelu_has_the_same_bits_at_every_thread_count) {
  const ag::Tensor x = random({70001}, ag::Dtype::Float32, 31), g = random({70001}, ag::Dtype::Float32, 32);
  for (const std::string& isa : available_isas()) {
    const auto one = run_gelu(isa, x, g);
    test_support::ThreadCount two(2);
    const auto both = run_gelu(isa, x, g);
    BOOST_TEST((one.first == both.first && one.second == both.second), isa);
  }
}

BOOST_AUTO_TEST_CASE(every_variant_computes_softmax_rows_within_the_bound) {
  for (const std::string& isa : available_isas()) {
    IsaScope scope(isa);
    for (std::int64_t n : {1, 3, 8, 17, 33, 100}) {
      const ag::Tensor x = ag::mul(random({5, n}, ag::Dtype::Float32, 40 + n), 4.0);
      const std::vector<double> xs = x.to_vector(), ys = ag::softmax(x, -1).to_vector();
      BOOST_TEST(worst_softmax_excess(xs, ys, n) <= 1.0, isa << " n = " << n);
      BOOST_TEST(ys == ag::softmax(x, -1).to_vector(), isa << " n = " << n << ": same bits again");
      // negative control: the softmax of the row with its last element moved by 1e-4 is caught
      std::vector<double> moved = xs;
      moved.back() += 1e-4;
      const auto ym = ag::softmax(ag::tensor(moved, {5, n}, ag::Dtype::Float32), -1).to_vector();
      if (n > 1) BOOST_TEST(worst_softmax_excess(xs, ym, n) > 1.0, isa << " n = " << n);
    }
    // blocked entries (−inf) get exactly 0, a fully blocked row is all 0, a NaN fills its row
    const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    const std::vector<double> y = ag::softmax(ag::tensor({0.5, -inf, 1.5, -inf, -inf, -inf, -inf, -inf, 1.0, nan, 2.0, 3.0},
                                                         {3, 4}, ag::Dtype::Float32), -1).to_vector();
    BOOST_TEST(y[1] == 0.0);
    BOOST_TEST(y[3] == 0.0);
    BOOST_TEST(std::fabs(y[0] - static_cast<double>(1 / (1 + std::exp(1.0L)))) < 1e-7);
    for (int j = 4; j < 8; ++j) BOOST_TEST(y[j] == 0.0);
    for (int j = 8; j < 12; ++j) BOOST_TEST(std::isnan(y[j]));
  }
}

BOOST_AUTO_TEST_SUITE_END()
