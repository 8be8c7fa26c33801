// backward() on several threads at once. Graphs that share only leaves are walked in parallel
// and every gradient reaches the shared .grad; a node that two threads' walks reach at the same
// time is refused by one of them with an error, and the gradients of the walks that ran are exact.
#define BOOST_TEST_MODULE concurrent_backward
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include <autograd/autograd.hpp>

#include "test_support.hpp"

using namespace test_support::prelude;
using test_support::ThreadCount;

BOOST_AUTO_TEST_CASE(two_threads_backward_through_one_shared_leaf) {
  ThreadCount one(1);  // kernels on one thread: the test is about the engine's threads
  constexpr int kIterations = 2000;
  Tensor w = ag::tensor({1.0, 2.0, 3.0, 4.0}, {4}, Dtype::Float64).requires_grad_();
  auto work = [&](double scale) {
    for (int i = 0; i < kIterations; ++i) {
      Tensor loss = ag::sum(w * scale + 1.0);  // d/dw = scale, each element
      loss.backward();
    }
  };
  std::thread a(work, 1.0), b(work, 2.0);
  a.join();
  b.join();
  // Sums of small integers: exact in float64, whatever the order of the additions.
  for (double g : w.grad().to_vector()) BOOST_CHECK_EQUAL(g, 3.0 * kIterations);
}

BOOST_AUTO_TEST_CASE(threads_building_graphs_on_a_fresh_leaf_share_one_accumulator) {
  ThreadCount one(1);  // kernels on one thread: the test is about the engine's threads
  for (int round = 0; round < 200; ++round) {
    Tensor w = ag::tensor({0.5}, {1}, Dtype::Float64).requires_grad_();  // no accumulator yet
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&] { ag::sum(w * 3.0).backward(); });
    for (auto& t : threads) t.join();
    BOOST_REQUIRE_EQUAL(w.grad().item(), 12.0);
  }
}

BOOST_AUTO_TEST_CASE(walks_on_two_threads_reaching_one_interior_node_are_exact_or_refused) {
  ThreadCount one(1);  // kernels on one thread: the test is about the engine's threads
  constexpr int kIterations = 500;
  Tensor x = ag::tensor({0.5, -0.25}, {2}, Dtype::Float64).requires_grad_();
  Tensor shared = ag::exp(x);  // reached by both threads' walks
  std::atomic<int> ran{0}, refused{0}, other{0};
  std::string other_message;
  auto work = [&] {
    for (int i = 0; i < kIterations; ++i) {
      Tensor loss = ag::sum(shared * 1.0);
      try {
        loss.backward({.retain_graph = true});
        ++ran;
      } catch (const std::runtime_error& e) {
        const std::string what = e.what();
        if (what.find("another thread") != std::string::npos && what.find("'exp'") != std::string::npos) {
          ++refused;
        } else {
          other_message = what;
          ++other;
        }
      }
    }
  };
  std::thread a(work), b(work);
  a.join();
  b.join();
  BOOST_TEST_MESSAGE("walks run: " << ran.load() << ", refused: " << refused.load());
  BOOST_CHECK_EQUAL(other.load(), 0);
  BOOST_CHECK_MESSAGE(other.load() == 0, other_message);
  BOOST_CHECK_EQUAL(ran.load() + refused.load(), 2 * kIterations);
  const auto g = x.grad().to_vector();
  BOOST_CHECK_CLOSE_FRACTION(g[0], ran.load() * std::exp(0.5), 1e-12);
  BOOST_CHECK_CLOSE_FRACTION(g[1], ran.load() * std::exp(-0.25), 1e-12);
  // Walked one after the other, the shared node is no problem.
  x.set_grad(Tensor());
  ag::sum(shared * 1.0).backward({.retain_graph = true});
  std::thread([&] { ag::sum(shared * 2.0).backward({.retain_graph = true}); }).join();
  BOOST_CHECK_CLOSE_FRACTION(x.grad().to_vector()[0], 3.0 * std::exp(0.5), 1e-12);
}

BOOST_AUTO_TEST_CASE(many_threads_train_their_own_graphs_on_shared_weights) {
  ThreadCount one(1);  // kernels on one thread: the test is about the engine's threads
  Tensor w = ag::tensor({0.1, 0.2, 0.3, 0.4, 0.5, 0.6}, {2, 3}, Dtype::Float64).requires_grad_();
  Tensor b = ag::tensor({0.0, 0.0, 0.0}, {3}, Dtype::Float64).requires_grad_();
  constexpr int kThreads = 4, kSteps = 300;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      Tensor xin = ag::full({5, 2}, 1.0 + t, Dtype::Float64);
      for (int s = 0; s < kSteps; ++s) ag::sum(ag::matmul(xin, w) + b).backward();
    });
  for (auto& t : threads) t.join();
  // d/dw[i][j] = sum over rows of x = 5 · (1 + t); d/db = 5 per step.
  double expected_w = 0;
  for (int t = 0; t < kThreads; ++t) expected_w += 5.0 * (1 + t) * kSteps;
  for (double g : w.grad().to_vector()) BOOST_CHECK_EQUAL(g, expected_w);
  for (double g : b.grad().to_vector()) BOOST_CHECK_EQUAL(g, 5.0 * kThreads * kSteps);
}
