// Int64 tensors where nn meets them unasked: Module::to leaves Int64 parameters alone, Int64
// attention masks are boolean (nonzero = blocked), and the optimizers and clipping functions refuse
// Int64 parameters or gradients before changing anything.
#define BOOST_TEST_MODULE int64_nn_hostile
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <nn/nn.hpp>

#include "checkpoint_support.hpp"
#include "int64_support.hpp"
#include "test_support.hpp"

using namespace test_support::prelude;
using test_support::I64;
using test_support::int_values;
using test_support::ints;

namespace {

constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();

// A float parameter "weight" and an Int64 counter "steps" (requires_grad = false).
struct Counted : nn::Module {
  Counted() : nn::Module("Counted") {
    w = register_parameter("weight", test_support::iota({2, 3}));
    steps = register_parameter("steps", ints({kMax, -3}, {2}), /*requires_grad=*/false);
  }
  Tensor w, steps;
};

// Batch entry 1 of a (2, ...) tensor, without the batch dimension.
Tensor second(const Tensor& t) {
  Shape s = t.shape();
  s.erase(s.begin());
  return ag::reshape(ag::narrow(t, 0, 1, 1), s);
}

double max_abs_diff(const Tensor& a, const Tensor& b) { return ag::max(ag::abs(a - b)).item(); }

}  // namespace

BOOST_AUTO_TEST_CASE(module_to_converts_floating_parameters_only) {
  checkpoint_support::TempDir dir;
  const std::string path = dir.file("m.safetensors");
  Counted m;
  nn::save_parameters(m, path);
  m.to(Dtype::Float64);  // the weight already is Float64; the counter must stay Int64
  BOOST_TEST((m.steps.dtype() == Dtype::Int64));
  nn::load_parameters(m, path);  // the file saved before still loads: steps is I64 in both
  m.to(Dtype::Float32);
  BOOST_TEST((m.w.dtype() == Dtype::Float32));
  BOOST_TEST((m.steps.dtype() == Dtype::Int64));
  BOOST_TEST(I64(m.steps.data<std::int64_t>(), m.steps.data<std::int64_t>() + 2) == I64({kMax, -3}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(int64_attn_mask_blocks_where_nonzero) {
  ag::Generator gen(11);
  nn::MultiHeadAttention attn(nn::MultiHeadAttentionOptions{.embed_dim = 4, .num_heads = 2, .dtype = F64}, gen);
  const Tensor x = ag::randn({2, 3, 4}, F64, gen);
  // a 0/1 causal mask from a comparison: key j > query i is 1 (blocked)
  const Tensor col = ints({0, 1, 2}, {1, 3}), row = ints({0, 1, 2}, {3, 1});
  const Tensor blocked = ag::gt(col, row);
  BOOST_TEST((blocked.dtype() == Dtype::Int64));
  const nn::AttentionOutput a = attn(x, x, x, {.attn_mask = blocked, .average_attn_weights = false});
  const nn::AttentionOutput c = attn(x, x, x, {.average_attn_weights = false, .is_causal = true});
  BOOST_TEST(max_abs_diff(a.output, c.output) < 1e-14);
  BOOST_TEST(max_abs_diff(a.weights, c.weights) < 1e-14);
  // the same mask as 0 / -inf floats, built by hand
  std::vector<double> f(9, 0.0);
  for (int i = 0; i < 3; ++i)
    for (int j = i + 1; j < 3; ++j) f[static_cast<std::size_t>(i * 3 + j)] = -kInf;
  const Tensor b = attn(x, x, x, {.attn_mask = ag::tensor(f, {3, 3}, F64)}).output;
  BOOST_TEST(max_abs_diff(a.output, b) < 1e-14);
  // a 3-D Int64 mask (B * num_heads, T, S): every row blocks key 2 only
  const Tensor key2 = ag::eq(ag::zeros({4, 3, 1}, F64) + ints({0, 1, 2}, {1, 1, 3}).to(F64), 2.0);
  const Tensor k = attn(x, x, x, {.attn_mask = key2, .average_attn_weights = false}).weights;
  const std::vector<double> w = k.to_vector();  // (B, H, T, S)
  for (std::size_t r = 0; r < w.size() / 3; ++r) {
    BOOST_TEST(w[r * 3 + 2] == 0.0);
    BOOST_TEST(w[r * 3] + w[r * 3 + 1] == 1.0, boost::test_tools::tolerance(1e-14));
  }
}

BOOST_AUTO_TEST_CASE(int64_key_padding_mask_from_eq) {
  ag::Generator gen(12);
  nn::MultiHeadAttention attn(nn::MultiHeadAttentionOptions{.embed_dim = 4, .num_heads = 2, .dtype = F64}, gen);
  const Tensor x = ag::randn({2, 3, 4}, F64, gen);
  const Tensor tokens = ints({5, 7, 0, 4, 0, 0}, {2, 3});
  const Tensor padding = ag::eq(tokens, 0.0);  // Int64 0/1
  BOOST_TEST((padding.dtype() == Dtype::Int64));
  const Tensor a = attn(x, x, x, {.key_padding_mask = padding}).output;
  const Tensor b = attn(x, x, x, {.key_padding_mask = padding.to(F64)}).output;
  BOOST_TEST(max_abs_diff(a, b) < 1e-14);
  // the unbatched call takes an (S) Int64 mask as well
  const Tensor x1 = second(x);
  const Tensor u = attn(x1, x1, x1, {.key_padding_mask = second(padding)}).output;
  BOOST_TEST(max_abs_diff(u, second(b)) < 1e-14);
}

BOOST_AUTO_TEST_CASE(optimizers_refuse_int64_parameters_at_construction) {
  const Tensor w = test_support::iota({2}).requires_grad_(), steps = ints({1, 2}, {2});
  const std::vector<Tensor> list = {w, steps};
  check_throws<std::invalid_argument>([&] { nn::SGD(list, {.lr = 0.1}); },
                                      {"SGD: parameter 1 is Int64 [2]", "Float32 or Float64"});
  check_throws<std::invalid_argument>([&] { nn::Adam(list, {}); }, {"Adam: parameter 1 is Int64 [2]"});
  Counted m;
  check_throws<std::invalid_argument>([&] { nn::AdamW(m.named_parameters(), {}); },
                                      {"AdamW: parameter 1 ('steps') is Int64 [2]"});
}

BOOST_AUTO_TEST_CASE(optimizer_step_refuses_a_parameter_turned_int64_and_changes_nothing) {
  Tensor a = test_support::iota({3}).requires_grad_(), b = test_support::iota({2});  // b frozen
  nn::SGD sgd({a, b}, {.lr = 0.5});
  nn::Adam adam({a, b}, {});
  a.set_grad(ag::ones({3}, F64));
  {
    ag::NoGradGuard no_grad;
    b.set_data(ints({4, 5}, {2}));
  }
  const std::vector<double> before = a.to_vector();
  check_throws<std::invalid_argument>([&] { sgd.step(); }, {"SGD.step: parameter 1 is", "Int64", "no parameter"});
  check_throws<std::invalid_argument>([&] { adam.step(); }, {"Adam.step: parameter 1 is", "Int64"});
  BOOST_TEST(a.to_vector() == before, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(clipping_never_meets_an_int64_gradient_and_skips_int64_parameters) {
  Tensor a = test_support::iota({3}).requires_grad_();
  a.set_grad(ag::full({3}, 10.0, F64));
  Tensor n = ints({7, 8}, {2});
  // An Int64 gradient cannot be attached, so clipping (which checks every gradient before it
  // changes one) only ever sees floating gradients.
  check_throws<std::invalid_argument>([&] { n.set_grad(ints({9, -9}, {2})); }, {"set_grad", "Int64"});
  BOOST_TEST(!n.grad().defined());
  const Tensor untouched = ints({1}, {1});  // Int64 without a gradient: skipped
  nn::clip_grad_value_({a, untouched, n}, 1.0);
  BOOST_TEST(a.grad().to_vector() == std::vector<double>(3, 1.0), boost::test_tools::per_element());
  nn::clip_grad_norm_({a, untouched}, 1.0);
  const auto g = a.grad().to_vector();
  // PyTorch's rule: scale by max_norm / (norm + 1e-6); the Int64 parameter adds nothing to the norm.
  const double expected = std::sqrt(3.0) / (std::sqrt(3.0) + 1e-6);
  BOOST_TEST(std::sqrt(g[0] * g[0] + g[1] * g[1] + g[2] * g[2]) == expected, boost::test_tools::tolerance(1e-12));
}
