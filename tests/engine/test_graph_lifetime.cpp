// How long a graph lives and how it is freed: a chain of a million nodes is dropped unwalked,
// walked, and walked after retain_graph without deep recursion (the stack of a thread stays
// small whatever the depth of the graph), and what a graph saved is freed with it.
#define BOOST_TEST_MODULE graph_lifetime
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <memory>
#include <thread>

#include <autograd/autograd.hpp>

namespace ag = autograd;
using ag::Dtype;
using ag::Tensor;

namespace {

constexpr int kSteps = 500000;  // two nodes a step: a chain of a million nodes

Tensor leaf(double v) { return ag::tensor({v}, {1}, Dtype::Float64).requires_grad_(); }

// x · 1.0001 + 0, kSteps times: a chain of 2 · kSteps nodes ending in one AccumulateGrad.
Tensor long_chain(const Tensor& x) {
  Tensor y = x;
  for (int i = 0; i < kSteps; ++i) y = y * 1.0001 + 0.0;
  return ag::sum(y);
}

double chain_gradient() { return std::pow(1.0001, kSteps); }

// A custom function whose context saves its input.
struct Twice : ag::Function<Twice> {
  static constexpr const char* name = "twice";
  static Tensor forward(ag::FunctionCtx& ctx, const Tensor& t) {
    ctx.save_for_backward({t});
    return t * 2.0;
  }
  static ag::TensorList backward(ag::FunctionCtx&, const ag::TensorList& g) { return {g[0] * 2.0}; }
};

// Runs f on a thread with a small stack (256 KiB), so that a release or walk that recursed once
// per node would overflow it at any depth worth testing; std::thread has no stack-size option.
template <class F>
void on_small_stack(F f) {
  std::exception_ptr error;
  auto body = [&] {
    try {
      f();
    } catch (...) {
      error = std::current_exception();
    }
  };
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  pthread_t thread;
  auto trampoline = [](void* p) -> void* {
    (*static_cast<decltype(body)*>(p))();
    return nullptr;
  };
  BOOST_REQUIRE_EQUAL(pthread_create(&thread, &attr, trampoline, &body), 0);
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
  if (error) std::rethrow_exception(error);
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_million_node_chain_is_dropped_without_being_walked) {
  on_small_stack([] {
    Tensor x = leaf(1.0);
    Tensor loss = long_chain(x);
    BOOST_CHECK(loss.requires_grad());
    loss = Tensor();  // frees the whole chain
    BOOST_CHECK(!x.grad().defined());
  });
}

BOOST_AUTO_TEST_CASE(a_million_node_chain_is_walked_and_freed) {
  on_small_stack([] {
    Tensor x = leaf(1.0);
    Tensor loss = long_chain(x);
    loss.backward();
    BOOST_CHECK_CLOSE_FRACTION(x.grad().item(), chain_gradient(), 1e-9);
  });
}

BOOST_AUTO_TEST_CASE(a_million_node_chain_kept_by_retain_graph_is_walked_twice_and_dropped) {
  on_small_stack([] {
    Tensor x = leaf(1.0);
    Tensor loss = long_chain(x);
    loss.backward({.retain_graph = true});
    loss.backward({.retain_graph = true});
    BOOST_CHECK_CLOSE_FRACTION(x.grad().item(), 2.0 * chain_gradient(), 1e-9);
    loss = Tensor();  // the retained chain is freed here
  });
}

BOOST_AUTO_TEST_CASE(a_loss_accumulated_without_detach_is_dropped) {
  // An epoch's running loss summed without detach: every step's graph hangs off the sum.
  on_small_stack([] {
    Tensor w = ag::tensor({0.5, -1.0}, {2}, Dtype::Float64).requires_grad_();
    Tensor total = ag::scalar_tensor(0.0, Dtype::Float64);
    for (int step = 0; step < 300000; ++step) total = total + ag::sum(w * 2.0);
    BOOST_CHECK_CLOSE_FRACTION(total.item(), 300000 * 2.0 * (0.5 - 1.0), 1e-12);
    total = Tensor();
  });
}

BOOST_AUTO_TEST_CASE(a_wide_graph_is_dropped_too) {
  // Many branches meeting in one sum: the release keeps a list as wide as the graph, no more.
  on_small_stack([] {
    Tensor x = leaf(2.0);
    Tensor total = x * 0.0;
    for (int i = 0; i < 2000; ++i) {
      Tensor branch = x;
      for (int k = 0; k < 100; ++k) branch = branch * 1.0;
      total = total + branch;
    }
    total.backward({.retain_graph = true});
    BOOST_CHECK_EQUAL(x.grad().item(), 2000.0);
  });
}

BOOST_AUTO_TEST_CASE(saved_tensors_of_a_dropped_graph_are_freed) {
  Tensor x = ag::tensor({1.0, 2.0}, {2}, Dtype::Float64).requires_grad_();
  std::weak_ptr<ag::Storage> saved;
  Tensor loss;
  {
    Tensor y = ag::exp(x);  // exp saves its output
    saved = y.impl()->storage;
    for (int i = 0; i < 1000; ++i) y = y * 1.0;
    loss = ag::sum(y);
  }
  BOOST_CHECK(!saved.expired());
  loss = Tensor();
  BOOST_CHECK(saved.expired());
}

BOOST_AUTO_TEST_CASE(a_node_still_used_elsewhere_survives_the_release_of_another_graph) {
  Tensor x = leaf(3.0);
  Tensor shared = ag::exp(x);
  Tensor a = ag::sum(shared * 2.0);
  {
    Tensor b = ag::sum(shared * 5.0);
  }  // b's graph goes; exp stays (a and shared hold it)
  shared = Tensor();
  a.backward();
  BOOST_CHECK_CLOSE_FRACTION(x.grad().item(), 2.0 * std::exp(3.0), 1e-12);
}

BOOST_AUTO_TEST_CASE(a_custom_function_chain_is_dropped) {
  on_small_stack([] {
    Tensor x = leaf(1.0);
    Tensor y = x;
    for (int i = 0; i < 200000; ++i) y = Twice::apply(y * 0.5);
    y = Tensor();
  });
}

BOOST_AUTO_TEST_CASE(a_chain_whose_hooks_hold_the_previous_tensor_is_dropped) {
  // Each node's hook keeps the tensor before it (and so that tensor's node) alive: dropping the
  // chain frees hooks and nodes in turn, and must not recurse through the hooks either.
  on_small_stack([] {
    Tensor x = leaf(1.0);
    Tensor y = x;
    for (int i = 0; i < 200000; ++i) {
      Tensor previous = y;
      y = y * 1.0;
      y.register_hook([previous](const Tensor& g) { return g; });
    }
    y = Tensor();
    BOOST_CHECK(!x.grad().defined());
  });
}
