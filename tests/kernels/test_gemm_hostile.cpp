// Matrix products on shapes around libxsmm's routing bounds (2^12 and 2^23 multiply-adds, the upper
// one since raised to 2^27), with
// one row, one column or one term, float32 and float64: the forward product and both gradients
// against a long double reference within the rounding bound of a sum of K products, the same bits
// at 1, 2 and 3 threads, and within the bound under every instruction-set variant.
#define BOOST_TEST_MODULE gemm_hostile
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <autograd/autograd.hpp>

#include "isa_support.hpp"

namespace ag = autograd;

namespace {

using test_support::available_isas;

struct Shape3 {
  std::int64_t m, n, k;
};
const Shape3 kShapes[] = {{16, 16, 16}, {16, 16, 15}, {1, 64, 64}, {64, 1, 64}, {64, 64, 1}, {1, 4096, 1},
                          {4096, 1, 1}, {1, 1, 4096}, {17, 15, 17}, {3, 1365, 1}, {128, 256, 256}, {128, 256, 255},
                          {2048, 2048, 2}, {1, 8192, 1024}, {8192, 1, 1024}, {33, 31, 4097}, {7, 600, 999}};

// |got - C| <= gamma_k · (|A|·|B|) elementwise (plus a denormal floor), C from long double sums.
// a is [m, k], b is [k, n], both row-major; returns the number of elements outside the bound.
std::size_t outside(const std::vector<double>& got, const std::vector<double>& a, const std::vector<double>& b,
                    std::int64_t m, std::int64_t n, std::int64_t k, double u) {
  if (static_cast<std::int64_t>(got.size()) != m * n) return got.size() + 1;
  const double gamma = (k + 2) * u / (1 - (k + 2) * u);
  std::size_t bad = 0;
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      long double s = 0, abs = 0;
      for (std::int64_t p = 0; p < k; ++p) {
        s += static_cast<long double>(a[i * k + p]) * b[p * n + j];
        abs += std::fabs(static_cast<long double>(a[i * k + p]) * b[p * n + j]);
      }
      const double err = std::fabs(static_cast<double>(got[i * n + j] - s));
      if (!(err <= gamma * static_cast<double>(abs) + 1e-300)) ++bad;
    }
  return bad;
}

std::vector<double> transposed(const std::vector<double>& x, std::int64_t r, std::int64_t c) {
  std::vector<double> t(x.size());
  for (std::int64_t i = 0; i < r; ++i)
    for (std::int64_t j = 0; j < c; ++j) t[j * r + i] = x[i * c + j];
  return t;
}

struct Run {
  std::vector<double> c, ga, gb;
};

Run run(const Shape3& s, ag::Dtype dt, std::uint64_t seed) {
  ag::Generator gen(seed);
  ag::Tensor a = ag::randn({s.m, s.k}, dt, gen).requires_grad_();
  ag::Tensor b = ag::randn({s.k, s.n}, dt, gen).requires_grad_();
  ag::Tensor g = ag::randn({s.m, s.n}, dt, gen);
  ag::Tensor c = ag::matmul(a, b);
  ag::sum(ag::mul(c, g)).backward();
  return {c.to_vector(), a.grad().to_vector(), b.grad().to_vector()};
}

void check_against_reference(const Shape3& s, ag::Dtype dt, const Run& r, const std::string& where) {
  ag::Generator gen(11);
  const std::vector<double> a = ag::randn({s.m, s.k}, dt, gen).to_vector();
  const std::vector<double> b = ag::randn({s.k, s.n}, dt, gen).to_vector();
  const std::vector<double> g = ag::randn({s.m, s.n}, dt, gen).to_vector();
  const double u = dt == ag::Dtype::Float32 ? std::numeric_limits<float>::epsilon() / 2
                                           : std::numeric_limits<double>::epsilon() / 2;
  BOOST_TEST(outside(r.c, a, b, s.m, s.n, s.k, u) == 0u, "forward " << where);
  // dA = G·Bᵀ ([m, n]·[n, k]), dB = Aᵀ·G ([k, m]·[m, n])
  BOOST_TEST(outside(r.ga, g, transposed(b, s.k, s.n), s.m, s.k, s.n, u) == 0u, "dA " << where);
  BOOST_TEST(outside(r.gb, transposed(a, s.m, s.k), g, s.k, s.n, s.m, u) == 0u, "dB " << where);
}

bool bits_equal(const std::vector<double>& x, const std::vector<double>& y) {
  if (x.size() != y.size()) return false;
  for (std::size_t i = 0; i < x.size(); ++i)
    if (!(x[i] == y[i]) && !(std::isnan(x[i]) && std::isnan(y[i]))) return false;
  return true;
}

}  // namespace

BOOST_AUTO_TEST_CASE(products_around_the_libxsmm_bounds_are_within_the_rounding_bound_and_thread_independent) {
  for (const std::string& isa : available_isas()) {
    ag::set_kernel_isa(isa);
    for (ag::Dtype dt : {ag::Dtype::Float32, ag::Dtype::Float64}) {
      for (const Shape3& s : kShapes) {
        const std::string where = isa + (dt == ag::Dtype::Float32 ? " f32 " : " f64 ") + std::to_string(s.m) + "x" +
                                  std::to_string(s.n) + "x" + std::to_string(s.k);
        ag::set_num_threads(1);
        const Run one = run(s, dt, 11);
        check_against_reference(s, dt, one, where);
        for (int t : {2, 3}) {
          ag::set_num_threads(t);
          const Run other = run(s, dt, 11);
          BOOST_TEST(bits_equal(one.c, other.c), "forward bits at " << t << " threads " << where);
          BOOST_TEST(bits_equal(one.ga, other.ga), "dA bits at " << t << " threads " << where);
          BOOST_TEST(bits_equal(one.gb, other.gb), "dB bits at " << t << " threads " << where);
        }
      }
    }
  }
  ag::set_num_threads(2);
}

// linear(x, w, b) = x·w + b (w of shape (in, out)), its gradients accumulated over two backward passes, against the
// long double reference (each pass within the bound, so twice the bound for the sum of two).
BOOST_AUTO_TEST_CASE(linear_around_the_bounds_accumulates_gradients_within_the_rounding_bound) {
  ag::set_num_threads(3);
  for (ag::Dtype dt : {ag::Dtype::Float32, ag::Dtype::Float64}) {
    const double u = dt == ag::Dtype::Float32 ? std::numeric_limits<float>::epsilon() : std::numeric_limits<double>::epsilon();
    for (const Shape3& s : kShapes) {
      ag::Generator gen(3);
      ag::Tensor x = ag::randn({s.m, s.k}, dt, gen).requires_grad_();
      ag::Tensor w = ag::randn({s.k, s.n}, dt, gen).requires_grad_();
      ag::Tensor b = ag::randn({s.n}, dt, gen).requires_grad_();
      ag::Tensor g = ag::randn({s.m, s.n}, dt, gen);
      for (int pass = 0; pass < 2; ++pass) ag::sum(ag::mul(ag::linear(x, w, b), g)).backward();
      const std::vector<double> xv = x.to_vector(), wv = w.to_vector(), gv = g.to_vector();
      const std::string where = std::string(dt == ag::Dtype::Float32 ? "f32 " : "f64 ") + std::to_string(s.m) + "x" +
                                std::to_string(s.n) + "x" + std::to_string(s.k);
      std::vector<double> half_gx = x.grad().to_vector(), half_gw = w.grad().to_vector();
      for (double& e : half_gx) e /= 2;
      for (double& e : half_gw) e /= 2;
      // dx = g·wᵀ ([m, n]·[n, k]), dw = xᵀ·g ([k, m]·[m, n]); halves of two equal passes
      BOOST_TEST(outside(half_gx, gv, transposed(wv, s.k, s.n), s.m, s.k, s.n, u) == 0u, "dx " << where);
      BOOST_TEST(outside(half_gw, transposed(xv, s.m, s.k), gv, s.k, s.n, s.m, u) == 0u, "dw " << where);
      const std::vector<double> y = ag::linear(x, w).to_vector();
      BOOST_TEST(outside(y, xv, wv, s.m, s.n, s.k, u / 2) == 0u, "y " << where);
    }
  }
  ag::set_num_threads(2);
}

// Program threads asking for kernels of many shapes at once (each thread's table of kernels, and
// libxsmm's registry behind it, filled concurrently): every product has the bits it has alone.
BOOST_AUTO_TEST_CASE(program_threads_multiplying_different_shapes_at_once_get_the_bits_of_a_lone_run) {
  ag::set_num_threads(2);
  std::vector<Run> alone;
  for (const Shape3& s : kShapes) alone.push_back(run(s, ag::Dtype::Float32, 5));
  bool ok[3] = {true, true, true};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 2; ++rep)
        for (std::size_t i = 0; i < alone.size(); ++i) {
          const std::size_t j = (i * (t + 2) + static_cast<std::size_t>(rep)) % alone.size();
          const Run r = run(kShapes[j], ag::Dtype::Float32, 5);
          ok[t] = ok[t] && bits_equal(r.c, alone[j].c) && bits_equal(r.ga, alone[j].ga) && bits_equal(r.gb, alone[j].gb);
        }
    });
  for (std::thread& th : threads) th.join();
  BOOST_TEST(ok[0]);
  BOOST_TEST(ok[1]);
  BOOST_TEST(ok[2]);
}
