// The instruction-set variants of the vector kernels (autograd/isa.hpp): which one runs, and that
// every variant this CPU supports computes the matrix products (forward and both backward
// products, transposed operands, accumulation into C) and the row kernels to tight tolerances of
// a long double reference computed here from the definitions, at sizes with odd tails, with the
// same bits on every call and thread count.
#define BOOST_TEST_MODULE isa_dispatch
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <autograd/autograd.hpp>

#include "test_support.hpp"

namespace ag = autograd;

namespace {

// The variants set_kernel_isa accepts here, lowest first.
std::vector<std::string> available_isas() {
  const std::string before(ag::kernel_isa());
  std::vector<std::string> out;
  for (const char* isa : {"generic", "avx2", "avx512"}) {
    try {
      ag::set_kernel_isa(isa);
      out.emplace_back(isa);
    } catch (const std::invalid_argument&) {
    }
  }
  ag::set_kernel_isa(before);
  return out;
}

// Sets the variant for a scope and restores the previous one.
struct IsaScope {
  std::string previous{ag::kernel_isa()};
  explicit IsaScope(const std::string& isa) { ag::set_kernel_isa(isa); }
  ~IsaScope() { ag::set_kernel_isa(previous); }
  IsaScope(const IsaScope&) = delete;
  IsaScope& operator=(const IsaScope&) = delete;
};

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

BOOST_AUTO_TEST_SUITE_END()
