// HEADGRAD_ISA set to a name no kernel variant has is refused by the first call of every op that
// runs a kernel with variants (float32 softmax, log_softmax, layer_norm, gelu, the elementwise
// arithmetic, sums, matrix products, attention, dropout), as a std::invalid_argument at that call:
// never ignored, and never std::terminate from inside a thread region, also when OMP_THREAD_LIMIT
// caps the threads. The variant is chosen once per process, so each check runs in a child
// process of this test program with the variables set; the parent checks that the child passed.
#define BOOST_TEST_MODULE unknown_isa_is_refused_by_every_kernel
#include <boost/test/unit_test.hpp>

#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <autograd/autograd.hpp>

#include "test_support.hpp"

using namespace test_support::prelude;

namespace {

// Runs this program's test case `test` with `env` ("NAME=value ...") prepended; true when it passed.
bool child_passes(const std::string& env, const std::string& test) {
  const std::string self = boost::unit_test::framework::master_test_suite().argv[0];
  const std::string cmd =
      env + " '" + self + "' --run_test=unknown_isa_is_refused_by_every_kernel/" + test + " > /dev/null 2>&1";
  const int status = std::system(cmd.c_str());
  BOOST_TEST_MESSAGE(cmd << " -> " << status);
  return status == 0;
}

Tensor randn(const Shape& s) {
  ag::Generator gen(7);
  return ag::randn(s, Dtype::Float32, gen);
}

// Every op family that chooses among the kernel variants, at a small size (one thread) and a
// large one (split over the threads).
std::vector<std::pair<std::string, std::function<void()>>> kernel_calls() {
  std::vector<std::pair<std::string, std::function<void()>>> calls;
  for (const std::int64_t rows : {std::int64_t{4}, std::int64_t{512}}) {
    const std::string at = " [" + std::to_string(rows) + ", 256]";
    calls.emplace_back("softmax" + at, [rows] { ag::softmax(randn({rows, 256}), -1); });
    calls.emplace_back("log_softmax" + at, [rows] { ag::log_softmax(randn({rows, 256}), -1); });
    calls.emplace_back("softmax over dim 0" + at, [rows] { ag::softmax(randn({rows, 256}), 0); });
    calls.emplace_back("layer_norm" + at, [rows] { ag::layer_norm(randn({rows, 256}), {256}); });
    calls.emplace_back("gelu" + at, [rows] { ag::gelu(randn({rows, 256})); });
    calls.emplace_back("add" + at, [rows] { ag::add(randn({rows, 256}), randn({rows, 256})); });
    calls.emplace_back("mul by a scalar" + at, [rows] { ag::mul(randn({rows, 256}), 2.0); });
    // (rows of 512 or more: shorter ones are summed inline, with no kernel to choose)
    calls.emplace_back("sum over dim 0 [" + std::to_string(rows) + ", 1024]", [rows] { ag::sum(randn({rows, 1024}), 0); });
    calls.emplace_back("matmul" + at, [rows] { ag::matmul(randn({rows, 256}), randn({256, 64})); });
    calls.emplace_back("cross_entropy" + at, [rows] {
      ag::cross_entropy(randn({rows, 256}), std::vector<std::int64_t>(static_cast<std::size_t>(rows), 3));
    });
    calls.emplace_back("dropout" + at, [rows] {
      ag::Generator gen(3);
      ag::dropout(randn({rows, 256}), 0.5, true, gen);
    });
  }
  for (const std::int64_t T : {std::int64_t{8}, std::int64_t{512}}) {
    calls.emplace_back("scaled_dot_product_attention T = " + std::to_string(T), [T] {
      const Tensor q = randn({1, 2, T, 32});
      (void)ag::scaled_dot_product_attention(q, q, q);
    });
  }
  return calls;
}

void check_every_kernel_refuses(const std::string& env_value) {
  for (const auto& [what, call] : kernel_calls()) {
    try {
      call();
      BOOST_ERROR(what << ": no error with HEADGRAD_ISA=" << env_value);
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      BOOST_TEST(m.rfind("HEADGRAD_ISA: unknown instruction set '" + env_value + "' (one of avx512, avx2, generic)",
                         0) == 0u,
                 what << ": " << m);
    }
  }
  // kernel_isa() itself refuses too, and the refusals repeat (nothing was chosen silently).
  BOOST_CHECK_THROW((void)ag::kernel_isa(), std::invalid_argument);
  BOOST_CHECK_THROW(ag::softmax(randn({4, 256}), -1), std::invalid_argument);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(unknown_isa_is_refused_by_every_kernel)

// The child's side: runs only with HEADGRAD_ISA set (by the cases below).
BOOST_AUTO_TEST_CASE(child_every_kernel_refuses_the_environment_isa) {
  const char* env = std::getenv("HEADGRAD_ISA");
  if (env == nullptr) return;
  check_every_kernel_refuses(env);
}

BOOST_AUTO_TEST_CASE(an_unknown_headgrad_isa_is_refused_by_every_kernel_family) {
  BOOST_TEST(child_passes("HEADGRAD_ISA=bogus", "child_every_kernel_refuses_the_environment_isa"));
}

BOOST_AUTO_TEST_CASE(an_unknown_headgrad_isa_is_an_exception_at_the_call_under_omp_thread_limit) {
  for (const char* limit : {"1", "2", "3"})
    BOOST_TEST(child_passes(std::string("OMP_THREAD_LIMIT=") + limit + " HEADGRAD_ISA=bogus",
                            "child_every_kernel_refuses_the_environment_isa"),
               "OMP_THREAD_LIMIT=" << limit);
}

BOOST_AUTO_TEST_CASE(negative_control_a_known_headgrad_isa_is_not_refused) {
  // The child check fails when the variable names a variant that exists (nothing throws).
  BOOST_TEST(!child_passes("HEADGRAD_ISA=generic", "child_every_kernel_refuses_the_environment_isa"));
}

BOOST_AUTO_TEST_SUITE_END()
