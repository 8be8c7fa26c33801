// Threads: results with 1 and 2 threads agree to float rounding, and a run is repeatable:
// the same seed and thread count give bit-identical training losses. Each thread has its own
// default generator, and a thread count below 1 is refused.
#define BOOST_TEST_MODULE threading
#include <boost/test/unit_test.hpp>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <limits>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

#include "test_support.hpp"

using namespace test_support::prelude;
using test_support::ThreadCount;

namespace {

// Largest |a - b| relative to max(|b|, 1).
double max_rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  BOOST_REQUIRE_EQUAL(a.size(), b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(std::abs(b[i]), 1.0));
  return worst;
}

struct Outputs {
  std::vector<double> value, grad_a, grad_b;
};

// matmul of (batch) matrices big enough for the GEMM to split work between threads.
Outputs run_matmul(int threads, Dtype dtype) {
  ThreadCount tc(threads);
  ag::Generator gen(11);
  Tensor a = ag::randn({2, 96, 160}, dtype, gen).requires_grad_(true);
  Tensor b = ag::randn({160, 128}, dtype, gen).requires_grad_(true);
  Tensor c = ag::matmul(a, b);
  ag::sum(c * c).backward();
  return {c.to_vector(), a.grad().to_vector(), b.grad().to_vector()};
}

// Fused attention, forward and backward.
Outputs run_attention(int threads, Dtype dtype) {
  ThreadCount tc(threads);
  ag::Generator gen(12);
  Tensor q = ag::randn({3, 4, 33, 16}, dtype, gen).requires_grad_(true);
  Tensor k = ag::randn({3, 4, 41, 16}, dtype, gen).requires_grad_(true);
  Tensor v = ag::randn({3, 4, 41, 16}, dtype, gen);
  auto r = ag::scaled_dot_product_attention(q, k, v);
  ag::sum(r.output * r.output).backward();
  return {r.output.to_vector(), q.grad().to_vector(), k.grad().to_vector()};
}

void check_close(const Outputs& one, const Outputs& two, double tol) {
  BOOST_TEST(max_rel_diff(one.value, two.value) <= tol);
  BOOST_TEST(max_rel_diff(one.grad_a, two.grad_a) <= tol);
  BOOST_TEST(max_rel_diff(one.grad_b, two.grad_b) <= tol);
}

// A small attention model trained for a few steps with dropout; returns the losses.
std::vector<double> train_losses(int threads, std::uint64_t seed, int steps) {
  ThreadCount tc(threads);
  ag::Generator gen(seed);
  nn::MultiHeadAttentionOptions opt{.embed_dim = 32, .num_heads = 4, .dropout = 0.1};
  nn::MultiHeadAttention mha(opt, gen);
  nn::Linear head(nn::LinearOptions{32, 7}, gen);
  std::vector<Tensor> params = mha.parameters();
  for (const auto& p : head.parameters()) params.push_back(p);
  nn::Adam adam(params, {.lr = 1e-2});
  const Tensor x = ag::randn({4, 24, 32}, Dtype::Float32, gen);
  std::vector<std::int64_t> targets;
  for (std::int64_t i = 0; i < 4 * 24; ++i) targets.push_back((i * 5 + 1) % 7);
  nn::AttentionOptions ao;
  ao.need_weights = false;
  ao.is_causal = true;
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    adam.zero_grad();
    auto out = mha.forward(x, x, x, ao).output;  // (4, 24, 32)
    Tensor logits = ag::reshape(head.forward(ag::gelu(out)), {-1, 7});
    Tensor loss = nn::cross_entropy(logits, targets);
    loss.backward();
    adam.step();
    losses.push_back(loss.item());
  }
  return losses;
}

}  // namespace

BOOST_AUTO_TEST_CASE(two_threads_are_in_use_for_these_tests) {
  ThreadCount tc(2);
  BOOST_TEST(ag::get_num_threads() == 2);
}

BOOST_AUTO_TEST_CASE(matmul_with_one_and_two_threads_agrees_to_rounding) {
  check_close(run_matmul(1, Dtype::Float64), run_matmul(2, Dtype::Float64), 1e-12);
  check_close(run_matmul(1, Dtype::Float32), run_matmul(2, Dtype::Float32), 1e-5);
}

BOOST_AUTO_TEST_CASE(fused_attention_with_one_and_two_threads_agrees_to_rounding) {
  check_close(run_attention(1, Dtype::Float64), run_attention(2, Dtype::Float64), 1e-12);
  check_close(run_attention(1, Dtype::Float32), run_attention(2, Dtype::Float32), 1e-5);
}

BOOST_AUTO_TEST_CASE(fused_attention_does_not_depend_on_the_thread_count_at_all) {
  // attention.hpp: each (batch, head) slice is computed by one thread alone.
  const auto one = run_attention(1, Dtype::Float32), two = run_attention(2, Dtype::Float32);
  BOOST_TEST(one.value == two.value, boost::test_tools::per_element());
  BOOST_TEST(one.grad_a == two.grad_a, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(same_seed_and_thread_count_give_bit_identical_losses) {
  for (int threads : {1, 2}) {
    const auto first = train_losses(threads, 2024, 15);
    const auto second = train_losses(threads, 2024, 15);
    BOOST_TEST_CONTEXT("threads " << threads) {
      BOOST_TEST(first == second, boost::test_tools::per_element());
      BOOST_TEST(first.back() < first.front());  // it trains
    }
  }
}

BOOST_AUTO_TEST_CASE(training_with_one_and_two_threads_agrees_to_rounding) {
  const auto one = train_losses(1, 77, 10), two = train_losses(2, 77, 10);
  BOOST_TEST(max_rel_diff(one, two) <= 1e-4);
}

BOOST_AUTO_TEST_CASE(a_different_seed_gives_different_losses) {
  // Negative control for the bit-identity claim: the losses do depend on the seed.
  BOOST_TEST(train_losses(1, 2024, 3) != train_losses(1, 2025, 3));
}

BOOST_AUTO_TEST_CASE(set_num_threads_refuses_a_count_below_one_or_above_256) {
  ThreadCount tc(2);
  for (int n : {0, -1, -64, 257, 1 << 20, std::numeric_limits<int>::max()}) {
    try {
      ag::set_num_threads(n);
      BOOST_ERROR("set_num_threads(" << n << ") did not throw");
    } catch (const std::invalid_argument& e) {
      BOOST_TEST(std::string(e.what()) ==
                 "set_num_threads: the thread count must be in [1, 256], got " + std::to_string(n));
    }
    BOOST_TEST(ag::get_num_threads() == 2);  // unchanged
  }
  // The largest count allowed runs a threaded product and reduction to the right numbers.
  ThreadCount most(256);
  const Tensor a = ag::ones({512, 512}, Dtype::Float64);
  BOOST_TEST(ag::sum(ag::matmul(a, a)).item() == 512.0 * 512.0 * 512.0);
}

namespace {

// What a module made from the default generator holds, and a tensor drawn after it.
std::vector<double> draws_from_the_default_generator() {
  nn::Linear layer(nn::LinearOptions{16, 8});
  std::vector<double> v = layer.weight().to_vector();
  const std::vector<double> more = ag::randn({64}).to_vector();
  v.insert(v.end(), more.begin(), more.end());
  return v;
}

}  // namespace

BOOST_AUTO_TEST_CASE(each_thread_has_its_own_default_generator) {
  // Two threads initialise modules at once: each draws the numbers a lone thread draws after
  // manual_seed, none taken by the other thread.
  ag::manual_seed(7);
  const std::vector<double> alone = draws_from_the_default_generator();
  ag::manual_seed(7);
  std::vector<double> first, second;
  std::thread t1([&] { first = draws_from_the_default_generator(); });
  std::thread t2([&] { second = draws_from_the_default_generator(); });
  t1.join();
  t2.join();
  BOOST_TEST(first == alone, boost::test_tools::per_element());
  BOOST_TEST(second == alone, boost::test_tools::per_element());
  // The calling thread's generator was reseeded by manual_seed and not touched by the others.
  BOOST_TEST(draws_from_the_default_generator() == alone, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(manual_seed_in_one_thread_does_not_move_another_threads_generator) {
  ag::manual_seed(11);
  const std::vector<double> reference = ag::randn({32}).to_vector();
  ag::manual_seed(11);
  std::vector<double> got;
  std::thread t([&] {
    ag::manual_seed(99);  // this thread's generator only (and the seed of threads made later)
    (void)ag::randn({32});
  });
  t.join();
  got = ag::randn({32}).to_vector();
  BOOST_TEST(got == reference, boost::test_tools::per_element());
  ag::manual_seed(0x5eed);
}

// Forwards of one module with dropout on two threads at once: every call draws its own number
// from the module's generator (none lost, none drawn twice), so the generator ends where 2·n
// draws of one thread put it, and the two threads' outputs, each equal to the output of one
// single-threaded call with the same draw, are never the same mask twice.
BOOST_AUTO_TEST_CASE(forwards_on_two_threads_draw_distinct_dropout_numbers_from_the_module) {
  ag::Generator gen(41);
  nn::MultiHeadAttention mha(nn::MultiHeadAttentionOptions{.embed_dim = 4, .num_heads = 2, .dropout = 0.5}, gen);
  mha.train();
  const Tensor x = ag::randn({1, 3, 4}, Dtype::Float64, gen);
  mha.to(Dtype::Float64);
  const std::uint64_t seed = 1234;
  mha.dropout_generator().manual_seed(seed);
  constexpr int kCalls = 4000;
  std::vector<std::vector<double>> outputs(2 * kCalls);
  auto run = [&](int first) {
    ag::NoGradGuard no_grad;
    for (int c = 0; c < kCalls; ++c) outputs[first + c] = mha(x, x, x).output.to_vector();
  };
  std::thread t1(run, 0), t2(run, kCalls);
  t1.join();
  t2.join();
  ag::Generator reference(seed);
  for (int c = 0; c < 2 * kCalls; ++c) (void)reference.next_u64();
  BOOST_TEST(mha.dropout_generator().state() == reference.state());
  // The same outputs, in some order, as 2·n calls on one thread from the same seed.
  mha.dropout_generator().manual_seed(seed);
  std::vector<std::vector<double>> sequential;
  for (int c = 0; c < 2 * kCalls; ++c) sequential.push_back(mha(x, x, x).output.to_vector());
  std::sort(outputs.begin(), outputs.end());
  std::sort(sequential.begin(), sequential.end());
  BOOST_TEST((outputs == sequential));
}

// ---- the thread policy ----

namespace {

// Runs this test program again, as a child process, on the one test case `test`, with the
// environment of this process minus OMP_WAIT_POLICY, GOMP_SPINCOUNT and the variables `extra`
// sets, plus `extra`; its exit status (0: the case passed).
int run_child(const std::string& test, const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  auto replaced = [&](std::string_view v) {
    if (v.starts_with("OMP_WAIT_POLICY=") || v.starts_with("GOMP_SPINCOUNT=")) return true;
    for (const std::string& x : extra)
      if (v.substr(0, v.find('=') + 1) == std::string_view(x).substr(0, x.find('=') + 1)) return true;
    return false;
  };
  for (char** e = environ; *e != nullptr; ++e)
    if (!replaced(*e)) env.emplace_back(*e);
  env.insert(env.end(), extra.begin(), extra.end());
  std::vector<char*> envp, argv;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe", run = "--run_test=" + test;
  argv = {exe.data(), run.data(), nullptr};
  pid_t pid = 0;
  BOOST_REQUIRE(posix_spawn(&pid, exe.c_str(), nullptr, nullptr, argv.data(), envp.data()) == 0);
  int status = 0;
  BOOST_REQUIRE(waitpid(pid, &status, 0) == pid);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

// In a child started by the case below (HEADGRAD_EXPECT_WAIT_POLICY set), the wait policy its
// OpenMP runtime started with; elsewhere nothing to check.
BOOST_AUTO_TEST_CASE(wait_policy_seen_by_a_child) {
  const char* expected = std::getenv("HEADGRAD_EXPECT_WAIT_POLICY");
  if (expected == nullptr) return;
  const char* got = std::getenv("OMP_WAIT_POLICY");
  BOOST_TEST(std::string(got ? got : "(unset)") == std::string(expected));
}

BOOST_AUTO_TEST_CASE(idle_threads_sleep_unless_the_environment_says_otherwise) {
  // Nothing set: the program starts with OMP_WAIT_POLICY=passive (before the OpenMP runtime reads it).
  BOOST_TEST(run_child("wait_policy_seen_by_a_child", {"HEADGRAD_EXPECT_WAIT_POLICY=passive"}) == 0);
  // A policy or a spin count the user set is kept.
  BOOST_TEST(run_child("wait_policy_seen_by_a_child",
                       {"HEADGRAD_EXPECT_WAIT_POLICY=active", "OMP_WAIT_POLICY=active"}) == 0);
  BOOST_TEST(run_child("wait_policy_seen_by_a_child",
                       {"HEADGRAD_EXPECT_WAIT_POLICY=(unset)", "GOMP_SPINCOUNT=1000"}) == 0);
}

// In a child started by the case below (HEADGRAD_EXPECT_THREADS set), the thread count the
// program starts with, and a product big enough to run on the threads gives the one-thread bits.
BOOST_AUTO_TEST_CASE(thread_count_seen_by_a_child) {
  const char* expected = std::getenv("HEADGRAD_EXPECT_THREADS");
  if (expected == nullptr) return;
  BOOST_TEST(ag::get_num_threads() == std::stoi(expected));
  ag::manual_seed(3);
  const ag::Tensor a = ag::randn({300, 200}), b = ag::randn({200, 100});
  const std::vector<double> many = ag::matmul(a, b).to_vector();
  ag::set_num_threads(1);
  BOOST_TEST(ag::matmul(a, b).to_vector() == many, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(omp_num_threads_above_the_limit_is_capped) {
  // The OpenMP runtime would try to start that many threads (and fail or crash at 50,000 or more);
  // the program starts with the first number of the list lowered to 256 instead.
  BOOST_TEST(run_child("thread_count_seen_by_a_child", {"HEADGRAD_EXPECT_THREADS=256", "OMP_NUM_THREADS=100000"}) == 0);
  BOOST_TEST(run_child("thread_count_seen_by_a_child", {"HEADGRAD_EXPECT_THREADS=256", "OMP_NUM_THREADS=257,2"}) == 0);
  // Counts within the limit, with leading zeros too, are kept.
  BOOST_TEST(run_child("thread_count_seen_by_a_child", {"HEADGRAD_EXPECT_THREADS=3", "OMP_NUM_THREADS=0003"}) == 0);
  BOOST_TEST(run_child("thread_count_seen_by_a_child", {"HEADGRAD_EXPECT_THREADS=256", "OMP_NUM_THREADS=256"}) == 0);
  // Negative control: the child checks what it is told, so a wrong expectation fails.
  BOOST_TEST(run_child("thread_count_seen_by_a_child", {"HEADGRAD_EXPECT_THREADS=255", "OMP_NUM_THREADS=256"}) != 0);
}

BOOST_AUTO_TEST_CASE(every_region_an_op_asks_for_is_run_or_held_back_and_counted) {
  // Fused attention over 12 slices of 33x41 keys asks for a region in forward and one in
  // backward: at 2 threads each is either run on the threads or held back, and counted; at 1
  // thread none is asked for.
  auto regions = [] {
    const ag::ThreadPolicyStats s = ag::thread_policy_stats();
    return s.regions_run + s.regions_held;
  };
  const std::int64_t before = regions();
  (void)run_attention(1, Dtype::Float32);
  BOOST_TEST(regions() == before);
  (void)run_attention(2, Dtype::Float32);
  BOOST_TEST(regions() == before + 2);
  const ag::ThreadPolicyStats s = ag::thread_policy_stats();
  BOOST_TEST(s.regions_lost <= s.regions_run);
}
