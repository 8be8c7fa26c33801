// The second-order API under hostile use: odd inputs and outputs, graphs walked twice, in-place
// changes between the first and second backward, nested and concurrent walks, deep chains,
// and gradgradcheck / hvp given bad requests. Expected values are worked out in each test.
#define BOOST_TEST_MODULE grad_hostile
#include <boost/test/unit_test.hpp>

#include <autograd/autograd.hpp>

#include <cmath>
#include <thread>

#include "test_support.hpp"

namespace ag = autograd;
using ag::Dtype;
using ag::Tensor;
using ag::TensorList;
using test_support::check_values;

namespace {

auto message_has(const std::string& part) {
  return [part](const std::exception& e) { return test_support::message_has(e, {part}); };
}

Tensor vec(std::vector<double> v, Dtype dtype = Dtype::Float64) {
  const auto n = static_cast<std::int64_t>(v.size());
  return ag::tensor(v, {n}, dtype).requires_grad_();
}

}  // namespace

BOOST_AUTO_TEST_SUITE(odd_inputs_and_outputs)

BOOST_AUTO_TEST_CASE(the_same_input_twice_gets_the_same_gradient) {
  Tensor x = vec({1.0, -3.0});
  Tensor y = ag::sum(x * x);
  const TensorList g = ag::grad({y}, {x, x});
  check_values(g[0], {2}, {2.0, -6.0});
  check_values(g[1], {2}, {2.0, -6.0});
}

BOOST_AUTO_TEST_CASE(the_same_output_twice_counts_twice) {
  Tensor x = vec({2.0});
  Tensor y = x * x;
  const TensorList g = ag::grad({y, y}, {x});
  check_values(g[0], {1}, {2 * 2 * 2.0});
}

BOOST_AUTO_TEST_CASE(an_input_that_is_an_output_gets_its_seed) {
  Tensor x = vec({1.0, 2.0});
  Tensor y = x * x;
  const Tensor u = ag::tensor({0.5, -4.0}, {2}, Dtype::Float64);
  const TensorList g = ag::grad({y}, {y, x}, {.grad_outputs = {u}});
  check_values(g[0], {2}, {0.5, -4.0});
  check_values(g[1], {2}, {0.5 * 2 * 1.0, -4.0 * 2 * 2.0});
  // A leaf as its own output: the seed comes straight back.
  Tensor s = vec({3.0});
  check_values(ag::grad({s}, {s})[0], {1}, {1.0});
}

BOOST_AUTO_TEST_CASE(a_middle_input_that_also_leads_to_another_input) {
  // h = x², y = Σ h·x = Σ x³: dy/dh = x, dy/dx = 3x² (through h and directly).
  Tensor x = vec({1.5, -2.0});
  Tensor h = x * x;
  Tensor y = ag::sum(h * x);
  const TensorList g = ag::grad({y}, {h, x}, {.create_graph = true});
  check_values(g[0], {2}, {1.5, -2.0});
  check_values(g[1], {2}, {3 * 1.5 * 1.5, 3 * 4.0});
  // and differentiated again: d(Σ dy/dx)/dx = 6x
  check_values(ag::grad({ag::sum(g[1])}, {x})[0], {2}, {9.0, -12.0});
}

BOOST_AUTO_TEST_CASE(a_leaf_in_another_graph_is_unused_here) {
  Tensor x = vec({1.0}), z = vec({2.0});
  Tensor other = z * z;  // z has an accumulator, in a graph that y does not reach
  Tensor y = x * x;
  BOOST_CHECK_EXCEPTION(ag::grad({y}, {x, z}, {.retain_graph = true}), std::invalid_argument,
                        message_has("input 1 [1] is not used"));
  const TensorList g = ag::grad({y}, {x, z}, {.allow_unused = true});
  check_values(g[0], {1}, {2.0});
  BOOST_TEST(!g[1].defined());
}

BOOST_AUTO_TEST_CASE(zero_element_tensors) {
  Tensor x = ag::tensor(std::vector<double>{}, {0}, Dtype::Float64).requires_grad_();
  Tensor y = ag::sum(x * x * x);
  const Tensor g = ag::grad({y}, {x}, {.create_graph = true})[0];
  BOOST_TEST(g.shape() == ag::Shape({0}));
  const Tensor g2 = ag::grad({ag::sum(g)}, {x}, {.allow_unused = true})[0];
  BOOST_TEST((!g2.defined() || g2.shape() == ag::Shape({0})));
  // A zero-element output needs its (zero-element) grad_outputs.
  Tensor e = x * x;
  BOOST_CHECK_EXCEPTION(ag::grad({e}, {x}), std::invalid_argument, message_has("pass grad_outputs"));
  const Tensor ge = ag::grad({e}, {x}, {.grad_outputs = {ag::zeros({0}, Dtype::Float64)}})[0];
  BOOST_TEST(ge.shape() == ag::Shape({0}));
}

BOOST_AUTO_TEST_CASE(bad_grad_outputs) {
  Tensor x = vec({1.0, 2.0});
  Tensor y = x * x;
  BOOST_CHECK_EXCEPTION(ag::grad({y}, {x}, {.grad_outputs = {ag::ones({2}, Dtype::Float32)}}),
                        std::invalid_argument, message_has("grad_outputs[0] is [2] Float32"));
  BOOST_CHECK_EXCEPTION(ag::grad({y}, {x}, {.grad_outputs = {ag::ones({1, 2}, Dtype::Float64)}}),
                        std::invalid_argument, message_has("grad_outputs[0] is [1, 2]"));
  BOOST_CHECK_EXCEPTION(ag::grad({y}, {x}, {.grad_outputs = {Tensor()}}), std::invalid_argument,
                        message_has("pass grad_outputs"));
  BOOST_CHECK_EXCEPTION(ag::grad({y}, {x}, {.grad_outputs = {Tensor(), Tensor()}}), std::invalid_argument,
                        message_has("1 outputs but 2 grad_outputs"));
  BOOST_CHECK_EXCEPTION(ag::grad({ag::sum(y), Tensor()}, {x}), std::invalid_argument, message_has("output 1"));
  BOOST_CHECK_EXCEPTION(ag::grad({y}, {x, Tensor()}), std::invalid_argument, message_has("input 1"));
  BOOST_CHECK_EXCEPTION(ag::grad({}, {x}), std::invalid_argument, message_has("no outputs"));
  BOOST_CHECK_EXCEPTION(ag::grad({y}, {}), std::invalid_argument, message_has("no inputs"));
}

BOOST_AUTO_TEST_CASE(grad_outputs_with_a_graph_are_differentiated_through) {
  // grad(x², x, grad_outputs = w) = 2 x w; its derivative in w is 2x.
  Tensor x = vec({1.0, -2.0}), w = vec({3.0, 0.5});
  const Tensor g = ag::grad({x * x}, {x}, {.grad_outputs = {w}, .create_graph = true})[0];
  check_values(g, {2}, {6.0, -2.0});
  check_values(ag::grad({ag::sum(g)}, {w})[0], {2}, {2.0, -4.0});
}

BOOST_AUTO_TEST_CASE(float32_second_order) {
  Tensor x = vec({1.5, -0.5}, Dtype::Float32);
  const Tensor g = ag::grad({ag::sum(x * x * x)}, {x}, {.create_graph = true})[0];
  BOOST_TEST((g.dtype() == Dtype::Float32));
  const Tensor h = ag::grad({ag::sum(g)}, {x})[0];
  BOOST_TEST((h.dtype() == Dtype::Float32));
  check_values(h, {2}, {9.0, -3.0}, 1e-6);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(walking_twice)

BOOST_AUTO_TEST_CASE(grad_twice_needs_retain_graph) {
  Tensor x = vec({2.0});
  Tensor y = x * x * x;
  check_values(ag::grad({y}, {x}, {.retain_graph = true})[0], {1}, {12.0});
  check_values(ag::grad({y}, {x})[0], {1}, {12.0});
  BOOST_CHECK_EXCEPTION(ag::grad({y}, {x}), std::runtime_error, message_has("already freed"));
}

BOOST_AUTO_TEST_CASE(create_graph_then_first_order_backward_on_the_same_graph) {
  Tensor x = vec({2.0, -1.0});
  Tensor y = ag::sum(x * x * x);
  const Tensor g = ag::grad({y}, {x}, {.create_graph = true})[0];
  BOOST_TEST(!x.grad().defined());
  y.backward();
  check_values(x.grad(), {2}, {12.0, 3.0});
  BOOST_TEST(!x.grad().requires_grad());
  // g's graph goes back through y's nodes, which that walk freed: said so, as PyTorch does.
  BOOST_CHECK_EXCEPTION(ag::grad({ag::sum(g)}, {x}), std::runtime_error, message_has("already freed"));
}

BOOST_AUTO_TEST_CASE(grad_leaves_grad_and_retained_grads_alone) {
  Tensor x = vec({1.0, 2.0});
  x.set_grad(ag::tensor({7.0, 8.0}, {2}, Dtype::Float64));
  Tensor h = x * x;
  h.retain_grad();
  Tensor y = ag::sum(h * x);
  const Tensor g = ag::grad({y}, {x}, {.create_graph = true})[0];
  ag::grad({ag::sum(g)}, {x});
  check_values(x.grad(), {2}, {7.0, 8.0});
  BOOST_TEST(!h.grad().defined());
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(changed_between_backwards)

BOOST_AUTO_TEST_CASE(in_place_change_of_a_saved_non_leaf) {
  Tensor x = vec({1.0, 2.0});
  Tensor h = x * x;  // its value is needed by the second derivative of h³
  Tensor y = ag::sum(h * h * h);
  const Tensor g = ag::grad({y}, {x}, {.create_graph = true})[0];  // 6x⁵, through h
  {
    ag::NoGradGuard off;
    h.add_(ag::ones({2}, Dtype::Float64));
  }
  BOOST_CHECK_EXCEPTION(ag::grad({ag::sum(g)}, {x}), std::runtime_error, message_has("changed in place"));
}

BOOST_AUTO_TEST_CASE(in_place_change_of_a_leaf_like_an_optimizer_step) {
  Tensor x = vec({1.0, 2.0});
  Tensor y = ag::sum(x * x * x);
  y.backward({.create_graph = true});
  const Tensor g = x.grad();
  {
    ag::NoGradGuard off;
    x.add_(g.detach(), -0.1);
  }
  BOOST_CHECK_EXCEPTION(ag::grad({ag::sum(g)}, {x}), std::runtime_error, message_has("changed in place"));
}

BOOST_AUTO_TEST_CASE(set_data_on_a_leaf_between_backwards) {
  Tensor x = vec({1.0, 2.0});
  Tensor y = ag::sum(x * x * x);
  const Tensor g = ag::grad({y}, {x}, {.create_graph = true})[0];
  x.set_data(ag::tensor({5.0, 6.0}, {2}, Dtype::Float64));
  // The same shape and dtype: the graph still reaches x, and the gradient is the one of the data
  // the graph was built on (6x at x = 1, 2), as in PyTorch.
  check_values(ag::grad({ag::sum(g)}, {x}, {.retain_graph = true})[0], {2}, {6.0, 12.0});
  ag::sum(g).backward();
  check_values(x.grad(), {2}, {6.0, 12.0});
}

BOOST_AUTO_TEST_CASE(set_data_of_another_shape_makes_an_older_graph_refuse_its_backward) {
  Tensor x = vec({1.0, 2.0, 3.0});
  x.set_name("w");
  const Tensor y = ag::sum(x * x);
  x.set_data(ag::tensor({5.0, 6.0}, {2}, Dtype::Float64));
  test_support::check_throws<std::runtime_error>(
      [&] { y.backward(); }, {"backward", "'w'", "[3] Float64", "now [2] Float64", "set_data"});
  BOOST_TEST(!x.grad().defined());  // no gradient of the old shape was stored
  // A forward recorded after set_data reaches x with its new shape.
  ag::sum(x * x).backward();
  check_values(x.grad(), {2}, {10.0, 12.0});
}

BOOST_AUTO_TEST_CASE(first_order_backward_into_a_create_graph_grad) {
  // .grad from a create_graph backward, then a first-order one adds into it.
  Tensor x = vec({1.0, 2.0});
  ag::sum(x * x * x).backward({.create_graph = true});
  const Tensor first = x.grad();  // 3x², with a graph
  const Tensor penalty = ag::sum(first * first);  // saves `first`
  ag::sum(x * x).backward();  // adds 2x
  check_values(x.grad(), {2}, {3.0 + 2.0, 12.0 + 4.0});
  // The graph of the penalty saw `first` before the addition: right, or a version error.
  try {
    const Tensor d = ag::grad({penalty}, {x})[0];  // Σ 9x⁴ -> 36x³
    check_values(d, {2}, {36.0, 288.0});
  } catch (const std::runtime_error& e) {
    BOOST_TEST(test_support::message_has(e, {"changed in place"}));
  }
  x.set_grad(Tensor());  // .grad's graph holds x: dropping .grad breaks that cycle (as in PyTorch)
}

BOOST_AUTO_TEST_CASE(create_graph_backward_onto_a_first_order_grad) {
  Tensor x = vec({1.0, 2.0});
  ag::sum(x * x).backward();  // .grad = 2x, no graph
  ag::sum(x * x * x).backward({.create_graph = true});  // + 3x², with a graph
  const Tensor g = x.grad();
  check_values(g, {2}, {2.0 + 3.0, 4.0 + 12.0});
  BOOST_TEST(g.requires_grad());
  check_values(ag::grad({ag::sum(g)}, {x})[0], {2}, {6.0, 12.0});  // the constant 2x adds nothing
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(hooks_and_nesting)

BOOST_AUTO_TEST_CASE(a_hook_that_replaces_the_gradient_under_create_graph) {
  // h = x², hook doubles dL/dh; y = Σ h·x: g = 2·x·2x + x² = 5x². The hook stays on h, so it
  // doubles what flows through h in the second walk too (as PyTorch's tensor hooks do): the
  // x² term (h itself) contributes 2·2x, the 4x² term 8x: 12x.
  Tensor x = vec({1.0, -2.0});
  Tensor h = x * x;
  h.register_hook([](const Tensor& gh) { return gh * 2.0; });
  Tensor y = ag::sum(h * x);
  const Tensor g = ag::grad({y}, {x}, {.create_graph = true})[0];
  check_values(g, {2}, {5.0, 20.0});
  check_values(ag::grad({ag::sum(g)}, {x})[0], {2}, {12.0, -24.0});
}

BOOST_AUTO_TEST_CASE(grad_inside_a_hook_during_backward) {
  Tensor x = vec({1.0, 3.0});
  Tensor h = x * x * x;
  Tensor side;
  h.register_hook([&](const Tensor& gh) {
    // a separate graph from the same leaf, differentiated twice, in the middle of backward()
    // (whose rules run with grad mode off: the hook turns it on to record a graph)
    ag::EnableGradGuard on;
    const Tensor d = ag::grad({ag::sum(x * x * x)}, {x}, {.create_graph = true})[0];
    side = ag::grad({ag::sum(d)}, {x})[0];
    return gh;
  });
  ag::sum(h).backward();
  check_values(x.grad(), {2}, {3.0, 27.0});
  check_values(side, {2}, {6.0, 18.0});
}

BOOST_AUTO_TEST_CASE(grad_of_the_running_graph_inside_a_hook) {
  Tensor x = vec({2.0});
  Tensor h = x * x;
  Tensor y = h * x;
  Tensor inner;
  h.register_hook([&](const Tensor& gh) {
    inner = ag::grad({h}, {x}, {.retain_graph = true})[0];  // runs this hook again: without end
    return gh;
  });
  BOOST_CHECK_EXCEPTION(y.backward(), std::runtime_error, message_has("nested in hooks"));
  // A hook that differentiates a graph of its own is fine.
  Tensor x2 = vec({2.0});
  Tensor h2 = x2 * x2;
  Tensor y2 = h2 * x2;
  h2.register_hook([&](const Tensor& gh) {
    ag::EnableGradGuard on;
    inner = ag::grad({x2 * x2}, {x2})[0];
    return gh;
  });
  y2.backward();
  check_values(inner, {1}, {4.0});
  check_values(x2.grad(), {1}, {12.0});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(scale)

BOOST_AUTO_TEST_CASE(third_and_fourth_order) {
  Tensor x = vec({1.5});
  const double v = 1.5;
  Tensor y = x * x * x * x * x;
  Tensor d = y;
  const double expected[] = {5 * std::pow(v, 4), 20 * std::pow(v, 3), 60 * v * v, 120 * v, 120};
  for (double e : expected) {
    d = ag::grad({d}, {x}, {.create_graph = true})[0];
    check_values(d, {1}, {e});
  }
}

BOOST_AUTO_TEST_CASE(a_deep_chain_with_create_graph) {
  // y = x·c·c·...·c (n times): dy/dx = cⁿ, and d²(x·dy/dx)/dx² = 0 ... use y = x² cⁿ instead:
  // dy/dx = 2x cⁿ, d²y/dx² = 2cⁿ.
  constexpr int n = 100000;
  const double c = 1.0 + 1e-6;
  Tensor x = vec({0.75});
  Tensor y = x * x;
  for (int i = 0; i < n; ++i) y = y * c;
  const Tensor d1 = ag::grad({y}, {x}, {.create_graph = true})[0];
  const double cn = std::pow(c, n);
  check_values(d1, {1}, {2 * 0.75 * cn}, 1e-9);
  const Tensor d2 = ag::grad({d1}, {x})[0];
  check_values(d2, {1}, {2 * cn}, 1e-9);
}

BOOST_AUTO_TEST_CASE(dropped_create_graph_results_free_their_graphs) {
  std::weak_ptr<ag::Node> forward_node, backward_node;
  Tensor x = vec({1.0, 2.0});
  {
    Tensor y = ag::sum(x * x * x);
    forward_node = y.grad_fn();
    const Tensor g = ag::grad({y}, {x}, {.create_graph = true})[0];
    backward_node = g.grad_fn();
    BOOST_TEST(!backward_node.expired());
  }
  BOOST_TEST(forward_node.expired());
  BOOST_TEST(backward_node.expired());
  {
    ag::sum(x * x * x).backward({.create_graph = true});  // .grad holds the graph of the backward ...
    backward_node = x.grad().grad_fn();
  }
  BOOST_TEST(!backward_node.expired());
  x.set_grad(Tensor());  // ... until it is dropped
  BOOST_TEST(backward_node.expired());
}

BOOST_AUTO_TEST_CASE(threads_over_separate_graphs_and_a_shared_leaf) {
  Tensor shared = vec({0.5, -1.5, 2.0});
  constexpr int kThreads = 4, kRounds = 200;
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t)
    pool.emplace_back([&, t] {
      try {
        Tensor own = vec({1.0 + t, -0.5, 0.25});
        for (int r = 0; r < kRounds; ++r) {
          // y = Σ s² o: dy/ds = 2 s o, d(Σ dy/ds)/ds = 2 o, d(Σ dy/ds)/do = 2 s
          Tensor y = ag::sum(shared * shared * own);
          const Tensor g = ag::grad({y}, {shared}, {.create_graph = true})[0];
          const TensorList h = ag::grad({ag::sum(g)}, {shared, own});
          const auto s = shared.to_vector(), o = own.to_vector(), hs = h[0].to_vector(), ho = h[1].to_vector();
          for (std::size_t i = 0; i < 3; ++i)
            if (hs[i] != 2 * o[i] || ho[i] != 2 * s[i]) throw std::runtime_error("wrong value");
        }
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(t)] = e.what();
      }
    });
  for (auto& th : pool) th.join();
  for (const auto& e : errors) BOOST_TEST(e.empty(), e);
  BOOST_TEST(!shared.grad().defined());
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(checks_given_bad_requests)

BOOST_AUTO_TEST_CASE(gradgradcheck_with_unused_and_constant_inputs) {
  Tensor x = vec({0.3, -0.7}), unused = vec({1.0}), c = ag::tensor({2.0, 3.0}, {2}, Dtype::Float64);
  const auto fn = [](const TensorList& in) { return in[0] * in[0] * in[0] * in[2]; };
  const auto r = ag::gradgradcheck(fn, {x, unused, c});
  BOOST_TEST(r.ok, r.message);
}

BOOST_AUTO_TEST_CASE(gradgradcheck_refuses_float32_and_changing_shapes) {
  Tensor x32 = vec({0.3}, Dtype::Float32);
  BOOST_CHECK_EXCEPTION(ag::gradgradcheck([](const TensorList& in) { return in[0] * in[0]; }, {x32}),
                        std::invalid_argument, message_has("Float64"));
  Tensor x = vec({0.3, 0.4});
  int calls = 0;
  const auto changing = [&](const TensorList& in) {
    return ++calls == 1 ? in[0] * in[0] : ag::sum(in[0] * in[0]);
  };
  BOOST_CHECK_EXCEPTION(ag::gradgradcheck(changing, {x}), std::invalid_argument, message_has("shape changed"));
  BOOST_CHECK_EXCEPTION(ag::gradgradcheck([](const TensorList& in) { return in[0] * 2.0; },
                                          {ag::tensor({1.0}, {1}, Dtype::Float64)}),
                        std::invalid_argument, message_has("no input requires grad"));
  BOOST_CHECK_EXCEPTION(ag::gradgradcheck([](const TensorList&) { return Tensor(); }, {x}), std::invalid_argument,
                        message_has("undefined"));
}

BOOST_AUTO_TEST_CASE(gradgradcheck_of_a_linear_function) {
  Tensor x = vec({0.3, -0.7});
  const auto r = ag::gradgradcheck([](const TensorList& in) { return in[0] * 3.0; }, {x});
  BOOST_TEST(r.ok, r.message);
}

BOOST_AUTO_TEST_CASE(hvp_bad_requests_and_edge_cases) {
  Tensor x = vec({0.5, 2.0}), c = ag::tensor({3.0}, {1}, Dtype::Float64);
  const auto cubic = [](const TensorList& in) { return ag::sum(in[0] * in[0] * in[0] * in[1]); };
  const Tensor v = ag::tensor({1.0, -1.0}, {2}, Dtype::Float64);
  // H = diag(6 x c): H v = 6 x c v
  const TensorList hv = ag::hvp(cubic, {x, c}, {v, Tensor()});
  check_values(hv[0], {2}, {6 * 0.5 * 3.0, -6 * 2.0 * 3.0});
  BOOST_TEST(!hv[1].defined());
  BOOST_CHECK_EXCEPTION(ag::hvp(cubic, {x, c}, {v}), std::invalid_argument, message_has("2 inputs but 1"));
  BOOST_CHECK_EXCEPTION(ag::hvp(cubic, {x, c}, {ag::ones({3}, Dtype::Float64), Tensor()}), std::invalid_argument,
                        message_has("v[0] is [3]"));
  BOOST_CHECK_EXCEPTION(ag::hvp(cubic, {x, c}, {ag::ones({2}, Dtype::Float32), Tensor()}), std::invalid_argument,
                        message_has("Float32"));
  BOOST_CHECK_EXCEPTION(ag::hvp(cubic, {x, c}, {Tensor(), Tensor()}), std::invalid_argument, message_has("v[0]"));
  BOOST_CHECK_EXCEPTION(ag::hvp([](const TensorList& in) { return in[0] * in[0]; }, {x}, {v}), std::invalid_argument,
                        message_has("one element"));
  check_values(ag::hvp([](const TensorList& in) { return ag::sum(in[0] * 4.0); }, {x}, {v})[0], {2}, {0.0, 0.0});
  BOOST_CHECK_EXCEPTION(ag::hvp([](const TensorList& in) { return ag::sum(in[0].detach()); }, {x}, {v}),
                        std::invalid_argument, message_has("hvp: the function's result does not depend"));
  BOOST_CHECK_EXCEPTION(ag::hvp(cubic, {c, c}, {Tensor(), Tensor()}), std::invalid_argument,
                        message_has("no input requires grad"));
}

BOOST_AUTO_TEST_SUITE_END()

namespace {

// exp whose backward reads its own saved output: the second walk must find that output's node.
struct ExpSavesOutput : ag::Function<ExpSavesOutput> {
  static constexpr const char* name = "exp_saves_output";
  static Tensor forward(ag::FunctionCtx& ctx, const Tensor& x) {
    Tensor y = ag::exp(x);
    ctx.save_for_backward({y});
    return y;
  }
  static TensorList backward(ag::FunctionCtx& ctx, const TensorList& g) { return {g[0] * ctx.saved_tensors()[0]}; }
};

// Two outputs, x² and x³, from one node; the backward reads undefined as "no gradient".
struct SquareAndCube : ag::Function<SquareAndCube> {
  static constexpr const char* name = "square_and_cube";
  static TensorList forward(ag::FunctionCtx& ctx, const Tensor& x) {
    ctx.save_for_backward({x});
    return {x * x, x * x * x};
  }
  static TensorList backward(ag::FunctionCtx& ctx, const TensorList& g) {
    const Tensor x = ctx.saved_tensors()[0];
    Tensor r;
    if (g[0].defined()) r = g[0] * x * 2.0;
    if (g[1].defined()) r = r.defined() ? r + g[1] * x * x * 3.0 : g[1] * x * x * 3.0;
    return {r};
  }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(custom_functions_and_retained)

BOOST_AUTO_TEST_CASE(a_function_that_saves_its_output) {
  Tensor x = vec({0.3, -1.2});
  Tensor y = ExpSavesOutput::apply(x);
  const Tensor g = ag::grad({ag::sum(y * y)}, {x}, {.create_graph = true})[0];  // 2e^{2x}
  const Tensor h = ag::grad({ag::sum(g)}, {x})[0];                               // 4e^{2x}
  check_values(h, {2}, {4 * std::exp(0.6), 4 * std::exp(-2.4)});
  const auto r = ag::gradgradcheck([](const TensorList& in) { return ExpSavesOutput::apply(in[0]); }, {x});
  BOOST_TEST(r.ok, r.message);
}

BOOST_AUTO_TEST_CASE(a_multi_output_function_with_one_output_used) {
  Tensor x = vec({1.5, -2.0});
  const TensorList ys = SquareAndCube::apply(x);
  const Tensor g = ag::grad({ag::sum(ys[1])}, {x}, {.create_graph = true})[0];  // 3x²
  check_values(g, {2}, {3 * 2.25, 12.0});
  check_values(ag::grad({ag::sum(g)}, {x})[0], {2}, {9.0, -12.0});
  const auto r = ag::gradgradcheck([](const TensorList& in) { return SquareAndCube::apply(in[0])[0]; }, {x});
  BOOST_TEST(r.ok, r.message);
}

BOOST_AUTO_TEST_CASE(retain_grad_under_create_graph) {
  Tensor x = vec({1.0, 2.0});
  Tensor h = x * x;
  h.retain_grad();
  ag::sum(h * h * x).backward({.create_graph = true});  // dL/dh = 2 h x = 2x³
  check_values(h.grad(), {2}, {2.0, 16.0});
  BOOST_TEST(h.grad().requires_grad());
  const Tensor d = ag::grad({ag::sum(h.grad())}, {x})[0];  // d(Σ 2x³)/dx = 6x²
  check_values(d, {2}, {6.0, 24.0});
  x.set_grad(Tensor());  // break the .grad <-> graph cycles (x's and h's), as in PyTorch
  h.set_grad(Tensor());
}

BOOST_AUTO_TEST_CASE(the_input_as_its_own_grad_output) {
  // grad(x², x, grad_outputs = x) = 2x·x; differentiated: 4x.
  Tensor x = vec({1.0, -3.0});
  const Tensor g = ag::grad({x * x}, {x}, {.grad_outputs = {x}, .create_graph = true})[0];
  check_values(g, {2}, {2.0, 18.0});
  check_values(ag::grad({ag::sum(g)}, {x})[0], {2}, {4.0, -12.0});
}

BOOST_AUTO_TEST_CASE(gradgradcheck_of_odd_functions) {
  Tensor x = vec({0.3, -0.7});
  const auto identity = ag::gradgradcheck([](const TensorList& in) { return in[0]; }, {x});
  BOOST_TEST(identity.ok, identity.message);
  Tensor empty = ag::tensor(std::vector<double>{}, {0}, Dtype::Float64).requires_grad_();
  const auto none = ag::gradgradcheck([](const TensorList& in) { return in[0] * in[0]; }, {empty, x});
  BOOST_TEST(none.ok, none.message);
}

BOOST_AUTO_TEST_CASE(threads_over_one_shared_retained_graph) {
  // Several threads walk the same graph: each either gets the right answer or a clear error.
  Tensor x = vec({0.5, -1.5});
  Tensor y = ag::sum(x * x * x);
  constexpr int kThreads = 4;
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t)
    pool.emplace_back([&, t] {
      for (int r = 0; r < 100; ++r) {
        try {
          const Tensor g = ag::grad({y}, {x}, {.create_graph = true})[0];
          const auto h = ag::grad({ag::sum(g)}, {x})[0].to_vector();
          if (h[0] != 3.0 || h[1] != -9.0) errors[static_cast<std::size_t>(t)] = "wrong value";
        } catch (const std::runtime_error& e) {
          if (!test_support::message_has(e, {"backward"})) errors[static_cast<std::size_t>(t)] = e.what();
        }
      }
    });
  for (auto& th : pool) th.join();
  for (const auto& e : errors) BOOST_TEST(e.empty(), e);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(hooks_on_inputs)

BOOST_AUTO_TEST_CASE(the_hooks_of_an_input_shape_what_grad_returns_for_it) {
  // A hook doubles dL/dh. grad() in h must return the hooked gradient, the same one that then
  // flows on to x: grad in h, and grad in x through h, agree whichever is asked.
  Tensor x = vec({1.0, -2.0});
  Tensor h = x * x;
  h.register_hook([](const Tensor& g) { return g * 2.0; });
  Tensor y = ag::sum(h * x);  // dL/dh = x, hooked 2x; dL/dx = h + 2x·2x = 5x²
  const TensorList both = ag::grad({y}, {h, x}, {.retain_graph = true});
  check_values(both[0], {2}, {2.0, -4.0});
  check_values(both[1], {2}, {5.0, 20.0});
  check_values(ag::grad({y}, {h}, {.retain_graph = true})[0], {2}, {2.0, -4.0});  // h alone: its node need not run
  // A leaf's hooks too (as backward() would apply them before adding into .grad).
  Tensor w = vec({3.0});
  int calls = 0;
  w.register_hook([&](const Tensor& g) {
    ++calls;
    return g * 10.0;
  });
  Tensor z = w * w;
  check_values(ag::grad({z}, {w}, {.retain_graph = true})[0], {1}, {60.0});
  BOOST_TEST(calls == 1);
  z.backward();
  check_values(w.grad(), {1}, {60.0});
  BOOST_TEST(calls == 2);
  Tensor bad = vec({1.0, 2.0});
  bad.register_hook([](const Tensor&) { return ag::ones({3}, Dtype::Float64); });
  BOOST_CHECK_EXCEPTION(ag::grad({ag::sum(bad * bad)}, {bad}), std::invalid_argument,
                        message_has("grad: a hook on input 0 [2] Float64 returned a gradient [3] Float64"));
}

BOOST_AUTO_TEST_SUITE_END()
