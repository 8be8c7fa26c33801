// The ops' forward-mode rules (Node::tangents), which ag::jvp and gradcheck's forward-mode check use
// where every op between the inputs and the outputs has one: linear, linear_cat and the fused
// attention core (the three nodes of nn::MultiHeadAttention), the elementwise ops, views and
// copies of shape, cat, sums and means, softmax, layer_norm, dropout, matmul, and custom Functions
// with a jvp.
// Each rule is checked in float64 by gradcheck's forward-mode check, now independent of the
// backward (the dot-product test ⟨u, J·v⟩ = ⟨Jᵀu, v⟩ to 1e-10 of the products' magnitudes, and J·v
// against central differences), and against the double-vjp construction the engine takes without
// rules. The negative controls: a custom Function whose jvp is wrong fails both checks, and one
// that returns the wrong number or shape of tangents is refused by name.
#define BOOST_TEST_MODULE forward_rules
#include <boost/test/unit_test.hpp>

#include <array>
#include <cmath>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

#include "test_support.hpp"

using namespace test_support::prelude;

namespace {

Tensor randn64(const Shape& shape, std::uint64_t seed) {
  ag::Generator gen(seed);
  return ag::randn(shape, Dtype::Float64, gen).requires_grad_();
}

// gradcheck with its forward-mode check on, reporting whether the rules were used.
ag::GradcheckResult check(const std::string& what, const ag::GradcheckFn& fn, const TensorList& inputs) {
  ag::GradcheckOptions o;
  o.forward_directions = 3;
  const ag::GradcheckResult r = ag::gradcheck(fn, inputs, o);
  BOOST_TEST_MESSAGE(fmt::format("{}: ok {} forward by rules {} dot error {:.3g} forward abs error {:.3g} {}", what,
                                 r.ok, r.forward_by_rules, r.forward_dot_error, r.forward_max_abs_error,
                                 r.forward_message));
  return r;
}

// The identity as a custom Function without a jvp: no forward-mode rule.
struct NoRule : ag::Function<NoRule> {
  static constexpr const char* name = "no_rule";
  static Tensor forward(ag::FunctionCtx&, const Tensor& x) { return x.clone(); }
  static TensorList backward(ag::FunctionCtx&, const TensorList& g) { return {g[0]}; }
};

// The largest |a - b| / max(1, |b|) between jvp's tangents and those of the same function with
// an op that has no forward-mode rule appended (NoRule, so the double-vjp construction is taken).
double rules_against_double_vjp(const ag::TensorListFn& fn, const TensorList& x, const TensorList& v) {
  const ag::JvpResult a = ag::jvp(fn, x, v);
  const ag::JvpResult b = ag::jvp(
      [&](const TensorList& in) {
        TensorList ys = fn(in);
        for (auto& y : ys) y = NoRule::apply(y);
        return ys;
      },
      x, v);
  double worst = 0.0;
  for (std::size_t j = 0; j < a.tangents.size(); ++j) {
    const auto p = a.tangents[j].to_vector(), q = b.tangents[j].to_vector();
    for (std::size_t k = 0; k < p.size(); ++k) worst = std::max(worst, std::abs(p[k] - q[k]) / std::max(1.0, std::abs(q[k])));
  }
  return worst;
}

// x³ with a correct jvp (3x²·ẋ), or with one off by 1 % when `wrong`; declared once_differentiable
// when `once`.
template <bool wrong, bool once = false>
struct CubeWithJvp : ag::Function<CubeWithJvp<wrong, once>> {
  static constexpr const char* name = wrong ? "cube_wrong_jvp" : once ? "raw_cube_jvp" : "cube_jvp";
  static constexpr bool once_differentiable = once;
  static Tensor forward(ag::FunctionCtx& ctx, const Tensor& x) {
    ctx.save_for_backward({x});
    return x * x * x;
  }
  static TensorList backward(ag::FunctionCtx& ctx, const TensorList& g) {
    const Tensor x = ctx.saved_tensors()[0];
    return {g[0] * 3.0 * x * x};
  }
  static TensorList jvp(ag::FunctionCtx& ctx, const TensorList& t) {
    const Tensor x = ctx.saved_tensors()[0];
    return {t[0] * (wrong ? 3.03 : 3.0) * x * x};
  }
};

// A jvp that returns two tangents for one output.
struct TwoTangents : ag::Function<TwoTangents> {
  static constexpr const char* name = "two_tangents";
  static Tensor forward(ag::FunctionCtx&, const Tensor& x) { return x * 2.0; }
  static TensorList backward(ag::FunctionCtx&, const TensorList& g) { return {g[0] * 2.0}; }
  static TensorList jvp(ag::FunctionCtx&, const TensorList& t) { return {t[0] * 2.0, t[0]}; }
};

// A jvp whose tangent has another shape than the output.
struct WrongShape : ag::Function<WrongShape> {
  static constexpr const char* name = "wrong_shape";
  static Tensor forward(ag::FunctionCtx&, const Tensor& x) { return x * 2.0; }
  static TensorList backward(ag::FunctionCtx&, const TensorList& g) { return {g[0] * 2.0}; }
  static TensorList jvp(ag::FunctionCtx&, const TensorList& t) { return {ag::reshape(t[0], {-1})}; }
};

}  // namespace

BOOST_AUTO_TEST_CASE(linear_rule_passes_gradcheck_in_every_argument) {
  const Tensor x = randn64({2, 3, 4}, 1), w = randn64({4, 5}, 2), b = randn64({5}, 3);
  const auto r = check("linear", [](const TensorList& in) { return ag::linear(in[0], in[1], in[2]); }, {x, w, b});
  BOOST_TEST(r.ok);
  BOOST_TEST(r.forward_checked);
  BOOST_TEST(r.forward_by_rules);
  // Only some arguments moving (the others constants: their tangents are zero, their rules' terms skipped).
  const Tensor wc = w.detach(), bc = b.detach();
  BOOST_TEST(check("linear, x only", [&](const TensorList& in) { return ag::linear(in[0], wc, bc); }, {x}).ok);
  const Tensor xc = x.detach();
  const auto rw = check("linear, W only", [&](const TensorList& in) { return ag::linear(xc, in[0], bc); }, {w});
  BOOST_TEST(rw.ok);
  BOOST_TEST(rw.forward_by_rules);
  BOOST_TEST(check("linear, b only", [&](const TensorList& in) { return ag::linear(xc, wc, in[0]); }, {b}).ok);
}

BOOST_AUTO_TEST_CASE(linear_cat_rule_passes_gradcheck_with_and_without_biases) {
  const Tensor x = randn64({3, 4}, 10), w0 = randn64({4, 2}, 11), w1 = randn64({4, 3}, 12), b0 = randn64({2}, 13),
               b1 = randn64({3}, 14);
  const auto r = check(
      "linear_cat",
      [](const TensorList& in) {
        const std::array<Tensor, 2> ws{in[1], in[2]}, bs{in[3], in[4]};
        return ag::linear_cat(in[0], ws, bs);
      },
      {x, w0, w1, b0, b1});
  BOOST_TEST(r.ok);
  BOOST_TEST(r.forward_by_rules);
  // One weight and one bias moving, no biases at all.
  const Tensor xc = x.detach(), w0c = w0.detach(), b1c = b1.detach();
  BOOST_TEST(check("linear_cat, W_1 and b_0",
                   [&](const TensorList& in) {
                     const std::array<Tensor, 2> ws{w0c, in[0]}, bs{in[1], b1c};
                     return ag::linear_cat(xc, ws, bs);
                   },
                   {w1, b0})
                 .ok);
  BOOST_TEST(check("linear_cat, no biases",
                   [](const TensorList& in) {
                     const std::array<Tensor, 2> ws{in[1], in[2]};
                     return ag::linear_cat(in[0], ws);
                   },
                   {x, w0, w1})
                 .ok);
}

BOOST_AUTO_TEST_CASE(attention_rule_passes_gradcheck_on_every_entry_point_and_option) {
  const Tensor q = randn64({2, 2, 5, 3}, 20), k = randn64({2, 2, 6, 3}, 21), v = randn64({2, 2, 6, 4}, 22);
  const Tensor mask = randn64({5, 6}, 23);
  auto sdpa = [](ag::SdpaOptions o) {
    return [o](const TensorList& in) {
      ag::SdpaOptions opt = o;
      if (in.size() > 3) opt.attn_mask = in[3];
      return ag::scaled_dot_product_attention(in[0], in[1], in[2], opt).output;
    };
  };
  for (const bool need_weights : {false, true}) {
    const auto r = check("sdpa", sdpa({.need_weights = need_weights}), {q, k, v});
    BOOST_TEST(r.ok);
    BOOST_TEST(r.forward_by_rules);
    BOOST_TEST(r.forward_dot_error <= 1e-12);
  }
  BOOST_TEST(check("sdpa, learned mask", sdpa({}), {q, k, v, mask}).ok);
  const Tensor qc = randn64({2, 2, 6, 3}, 24);
  BOOST_TEST(check("sdpa, causal", sdpa({.is_causal = true}), {qc, k, v}).ok);
  // Causal past one block of query rows (the rule's causal blocks).
  const Tensor ql = randn64({1, 1, 70, 2}, 25), kl = randn64({1, 1, 70, 2}, 26), vl = randn64({1, 1, 70, 2}, 27);
  BOOST_TEST(check("sdpa, causal, 70 rows", sdpa({.is_causal = true}), {ql, kl, vl}).ok);
  // Dropout: the same mask every evaluation (a generator of fixed seed made per call).
  const auto dropped = [](const TensorList& in) {
    ag::Generator gen(7);
    return ag::scaled_dot_product_attention(in[0], in[1], in[2], {.dropout_p = 0.3, .generator = &gen}).output;
  };
  const auto rd = check("sdpa, dropout", dropped, {q, k, v});
  BOOST_TEST(rd.ok);
  BOOST_TEST(rd.forward_by_rules);
  // The weights as the output: the rule's tangent of P.
  const auto rw = check("sdpa weights",
                        [](const TensorList& in) { return ag::scaled_dot_product_attention(in[0], in[1], in[2]).weights; },
                        {q, k, v});
  BOOST_TEST(rw.ok);
  BOOST_TEST(rw.forward_by_rules);
  // Heads-last and packed layouts.
  const Tensor qh = randn64({2, 5, 6}, 30), kh = randn64({2, 7, 6}, 31), vh = randn64({2, 7, 4}, 32);
  BOOST_TEST(check("sdpa heads_last",
                   [](const TensorList& in) {
                     return ag::scaled_dot_product_attention_heads_last(in[0], in[1], in[2], 2).output;
                   },
                   {qh, kh, vh})
                 .ok);
  const Tensor qkv = randn64({2, 5, 12}, 33);
  const auto rp = check("sdpa packed",
                        [](const TensorList& in) {
                          return ag::scaled_dot_product_attention_packed(in[0], 2, {.is_causal = true}).output;
                        },
                        {qkv});
  BOOST_TEST(rp.ok);
  BOOST_TEST(rp.forward_by_rules);
}

BOOST_AUTO_TEST_CASE(multi_head_attention_jvp_by_rules_equals_the_double_vjp_construction) {
  ag::Generator gen(42);
  nn::MultiHeadAttention mha{nn::MultiHeadAttentionOptions{.embed_dim = 8, .num_heads = 2, .dtype = Dtype::Float64}, gen};
  const auto fn = [&](const TensorList& x) { return TensorList{mha.forward(x[0])}; };
  const TensorList x = {randn64({2, 5, 8}, 40).detach()}, v = {randn64({2, 5, 8}, 41).detach()};
  const double e = rules_against_double_vjp(fn, x, v);
  BOOST_TEST_MESSAGE(fmt::format("MultiHeadAttention jvp, rules against double vjp: {:.3g}", e));
  BOOST_TEST(e <= 1e-12);
  const auto r = check("MultiHeadAttention", [&](const TensorList& in) { return mha.forward(in[0]); },
                       {randn64({2, 5, 8}, 42)});
  BOOST_TEST(r.ok);
  BOOST_TEST(r.forward_by_rules);
  // Causal, with the weights asked for.
  const auto causal = [&](const TensorList& in) {
    nn::AttentionOptions o;
    o.is_causal = true;
    return TensorList{mha.forward(in[0], o).output};
  };
  BOOST_TEST(rules_against_double_vjp(causal, x, v) <= 1e-12);
}

BOOST_AUTO_TEST_CASE(elementwise_shape_reduction_softmax_and_product_rules_pass_gradcheck) {
  const Tensor a = randn64({2, 3, 4}, 80), b = randn64({3, 4}, 81), pos = ag::add(ag::abs(randn64({2, 3, 4}, 82)), 0.5).detach().requires_grad_();
  const Tensor m = randn64({2, 4, 5}, 83), n = randn64({5, 3}, 84);
  struct Op {
    std::string name;
    ag::GradcheckFn fn;
    TensorList inputs;
  };
  const std::vector<Op> ops = {
      {"add (broadcast)", [](const TensorList& x) { return ag::add(x[0], x[1]); }, {a, b}},
      {"sub (broadcast)", [](const TensorList& x) { return ag::sub(x[1], x[0]); }, {a, b}},
      {"mul (broadcast)", [](const TensorList& x) { return ag::mul(x[0], x[1]); }, {a, b}},
      {"div (broadcast)", [](const TensorList& x) { return ag::div(x[1], x[0]); }, {pos, b}},
      {"scalar ops", [](const TensorList& x) { return ag::div(ag::mul(ag::rsub(ag::sub(ag::add(x[0], 2.0), 0.5), 1.0), 3.0), 7.0); }, {a}},
      {"neg, exp, tanh, sigmoid", [](const TensorList& x) { return ag::sigmoid(ag::tanh(ag::exp(ag::neg(x[0])))); }, {a}},
      {"log, sqrt, rsqrt", [](const TensorList& x) { return ag::add(ag::log(x[0]), ag::mul(ag::sqrt(x[0]), ag::rsqrt(x[0]))); }, {pos}},
      {"square, abs, relu, clamp", [](const TensorList& x) { return ag::clamp(ag::add(ag::relu(x[0]), ag::square(ag::abs(x[0]))), -1.0, 1.5); }, {a}},
      {"gelu, both forms", [](const TensorList& x) { return ag::add(ag::gelu(x[0]), ag::gelu(x[0], ag::GeluApproximation::Tanh)); }, {a}},
      {"reshape, permute, transpose, expand", [](const TensorList& x) {
         return ag::expand(ag::transpose(ag::permute(ag::reshape(x[0], {4, 3, 2}), {2, 0, 1}), 0, 2), {2, 3, 4, 2}); }, {a}},
      {"narrow, slice, cat", [](const TensorList& x) {
         return ag::cat({ag::narrow(x[0], 2, 1, 2), ag::slice(x[0], 2, 0, 4, 3), ag::expand(x[1], {2, 3, 4})}, 2); }, {a, b}},
      {"sum, mean", [](const TensorList& x) { return ag::add(ag::sum(x[0], {0, 2}, true), ag::mean(x[0], 1, true)); }, {a}},
      {"softmax, log_softmax", [](const TensorList& x) { return ag::add(ag::softmax(x[0], 1), ag::log_softmax(x[0], -1)); }, {a}},
      {"layer_norm", [](const TensorList& x) { return ag::layer_norm(x[0], {4}, x[1], x[2]); }, {a, randn64({4}, 86), randn64({4}, 87)}},
      {"layer_norm over two dims, no affine", [](const TensorList& x) { return ag::layer_norm(x[0], {3, 4}); }, {a}},
      {"layer_norm, weight only", [](const TensorList& x) { return ag::layer_norm(x[0], {4}, x[1]); }, {a, randn64({4}, 88)}},
      {"rdiv, pow, masked_fill", [](const TensorList& x) {
         const Tensor mask = ag::gt(x[0].detach(), 1.0);
         return ag::masked_fill(ag::add(ag::rdiv(x[0], 2.0), ag::pow(x[0], 3.0)), mask, 0.25); }, {pos}},
      {"stack", [](const TensorList& x) { return ag::stack({x[0], ag::mul(ag::narrow(x[0], 1, 0, 3), 2.0)}, 1); }, {randn64({1, 3}, 89)}},
      {"dropout", [](const TensorList& x) { ag::Generator gen(3); return ag::dropout(x[0], 0.4, true, gen); }, {a}},
      {"matmul (batched, broadcast)", [](const TensorList& x) { return ag::matmul(x[0], x[1]); }, {m, n}},
      {"matmul (vector)", [](const TensorList& x) { return ag::matmul(x[0], ag::reshape(x[1], {-1})); }, {b, randn64({4}, 85)}},
  };
  for (const Op& op : ops) {
    const auto r = check(op.name, op.fn, op.inputs);
    BOOST_TEST(r.ok, op.name << ": " << r.forward_message);
    BOOST_TEST(r.forward_by_rules, op.name);
    BOOST_TEST(r.forward_dot_error <= 1e-12, op.name);
  }
}

BOOST_AUTO_TEST_CASE(ops_without_rules_take_the_double_vjp_construction) {
  const Tensor a = randn64({3, 4}, 50), w = randn64({4, 2}, 51);
  const auto r = check("linear then no rule", [&](const TensorList& in) { return NoRule::apply(ag::linear(in[0], in[1])); }, {a, w});
  BOOST_TEST(r.ok);
  BOOST_TEST(!r.forward_by_rules);
  BOOST_TEST(r.forward_rule_missing == "'no_rule'");
  // A node with a rule after one without: still the construction (the walk needs every node).
  const auto r2 = check("no rule then tanh", [&](const TensorList& in) { return ag::tanh(NoRule::apply(ag::linear(in[0], in[1]))); }, {a, w});
  BOOST_TEST(r2.ok);
  BOOST_TEST(!r2.forward_by_rules);
  // A part of the graph no moving input reaches needs no rule: a rule-less op on a constant feeds matmul.
  const Tensor c = a.detach().requires_grad_();
  const auto r3 = check("constant through no rule into matmul",
                        [&](const TensorList& in) { return ag::matmul(NoRule::apply(c), in[0]); }, {randn64({4, 3}, 53)});
  BOOST_TEST(r3.ok);
  BOOST_TEST(r3.forward_by_rules);
}

BOOST_AUTO_TEST_CASE(custom_function_jvp_is_used_and_a_wrong_one_fails) {
  const Tensor x = randn64({3, 2}, 60);
  const auto good = check("cube with jvp", [](const TensorList& in) { return CubeWithJvp<false>::apply(in[0]); }, {x});
  BOOST_TEST(good.ok);
  BOOST_TEST(good.forward_by_rules);
  // Negative control: a jvp 1 % off fails the dot-product test and the central differences.
  const auto bad = check("cube with a wrong jvp", [](const TensorList& in) { return CubeWithJvp<true>::apply(in[0]); }, {x});
  BOOST_TEST(!bad.ok);
  BOOST_TEST(bad.reverse_ok);
  BOOST_TEST(!bad.forward_ok);
  BOOST_TEST(bad.forward_by_rules);
  BOOST_TEST(bad.forward_dot_error > 1e-4);
  BOOST_TEST(bad.forward_message.find("<u, J·v>") != std::string::npos, bad.forward_message);
  // And ag::jvp returns its (wrong) tangent: 3.03x²·v.
  const TensorList xs = {x.detach()}, vs = {ag::ones({3, 2}, Dtype::Float64)};
  const auto jv = ag::jvp([](const TensorList& in) { return TensorList{CubeWithJvp<true>::apply(in[0])}; }, xs, vs);
  const auto xv = x.to_vector(), tv = jv.tangents[0].to_vector();
  for (std::size_t i = 0; i < xv.size(); ++i) BOOST_TEST(std::abs(tv[i] - 3.03 * xv[i] * xv[i]) <= 1e-14);
}

BOOST_AUTO_TEST_CASE(custom_function_jvp_of_the_wrong_count_or_shape_is_refused_by_name) {
  const TensorList x = {randn64({2, 3}, 70).detach()}, v = {randn64({2, 3}, 71).detach()};
  test_support::check_throws<std::invalid_argument>(
      [&] { ag::jvp([](const TensorList& in) { return TensorList{TwoTangents::apply(in[0])}; }, x, v); },
      {"jvp of 'two_tangents' returned 2 tangents, but the function has 1 outputs"});
  test_support::check_throws<std::invalid_argument>(
      [&] { ag::jvp([](const TensorList& in) { return TensorList{WrongShape::apply(in[0])}; }, x, v); },
      {"jvp of 'wrong_shape' returned for output 0 a tangent [6] Float64, but that output is [2, 3] Float64"});
}

// Outputs that are leaves: an input returned as it is (in any order, or twice), or a leaf of the
// function's own that does not move (zero tangent). The walk keeps the leaves' accumulators alive.
BOOST_AUTO_TEST_CASE(outputs_that_are_leaves_get_their_own_tangents) {
  const Tensor a = ag::ones({2}, Dtype::Float64), b = ag::ones({2}, Dtype::Float64);
  const Tensor ta = ag::full({2}, 1.0, Dtype::Float64), tb = ag::full({2}, 10.0, Dtype::Float64);
  const Tensor P = ag::ones({2}, Dtype::Float64).requires_grad_();
  const auto r = ag::jvp([&](const TensorList& in) { return TensorList{in[1], in[0], P, in[0]}; }, {a, b}, {ta, tb});
  BOOST_TEST(r.tangents[0].to_vector() == std::vector<double>({10.0, 10.0}), boost::test_tools::per_element());
  BOOST_TEST(r.tangents[1].to_vector() == std::vector<double>({1.0, 1.0}), boost::test_tools::per_element());
  BOOST_TEST(r.tangents[2].to_vector() == std::vector<double>({0.0, 0.0}), boost::test_tools::per_element());
  BOOST_TEST(r.tangents[3].to_vector() == std::vector<double>({1.0, 1.0}), boost::test_tools::per_element());
  // Two outputs that are one tensor get tangents of their own storage.
  const auto twice = ag::jvp([](const TensorList& in) { const Tensor y = ag::linear(in[0], in[0]); return TensorList{y, y}; },
                             {ag::ones({2, 2}, Dtype::Float64)}, {ag::ones({2, 2}, Dtype::Float64)});
  BOOST_TEST(twice.tangents[0].impl()->storage != twice.tangents[1].impl()->storage);
  BOOST_TEST(twice.tangents[0].to_vector() == twice.tangents[1].to_vector(), boost::test_tools::per_element());
}

// A function that frees its own graph (by calling backward()) is refused as vjp refuses it, not
// given zero tangents.
BOOST_AUTO_TEST_CASE(a_function_that_frees_its_graph_is_refused) {
  const Tensor w = randn64({3, 2}, 90).detach();
  const auto fn = [&](const TensorList& in) {
    const Tensor y = ag::linear(in[0], w);
    ag::sum(y).backward();
    return TensorList{y};
  };
  test_support::check_throws<std::runtime_error>(
      [&] { ag::jvp(fn, {randn64({2, 3}, 91).detach()}, {randn64({2, 3}, 92).detach()}); }, {"jvp", "freed"});
}

// x³, once_differentiable, with its own jvp.
using RawCube = CubeWithJvp<false, true>;

// Forward-mode jacobian walks the rules column by column: a once_differentiable Function with a
// jvp goes through it (the construction would refuse it), and the columns equal reverse mode's.
BOOST_AUTO_TEST_CASE(forward_jacobian_uses_the_rules) {
  const Tensor x = randn64({3}, 95).detach();
  const auto fn = [](const TensorList& in) { return ag::tanh(RawCube::apply(in[0])); };
  const Tensor Jf = ag::jacobian(fn, {x}, {.mode = ag::JacobianMode::Forward})[0];
  const Tensor Jr = ag::jacobian(fn, {x})[0];
  const auto f = Jf.to_vector(), r = Jr.to_vector(), xv = x.to_vector();
  for (std::size_t k = 0; k < f.size(); ++k) BOOST_TEST(std::abs(f[k] - r[k]) <= 1e-15);
  for (std::size_t i = 0; i < 3; ++i) {  // diagonal: (1 − tanh²(x³))·3x²
    const double t = std::tanh(xv[i] * xv[i] * xv[i]);
    BOOST_TEST(std::abs(f[i * 3 + i] - (1 - t * t) * 3 * xv[i] * xv[i]) <= 1e-14);
  }
  // Through MultiHeadAttention (every node has a rule): forward and reverse agree to rounding.
  ag::Generator gen(5);
  nn::MultiHeadAttention mha{nn::MultiHeadAttentionOptions{.embed_dim = 4, .num_heads = 2, .dtype = Dtype::Float64}, gen};
  const auto attn = [&](const TensorList& in) { return mha.forward(in[0]); };
  const Tensor a = randn64({1, 3, 4}, 96).detach();
  const auto af = ag::jacobian(attn, {a}, {.mode = ag::JacobianMode::Forward})[0].to_vector();
  const auto ar = ag::jacobian(attn, {a})[0].to_vector();
  double worst = 0;
  for (std::size_t k = 0; k < af.size(); ++k) worst = std::max(worst, std::abs(af[k] - ar[k]));
  BOOST_TEST(worst <= 1e-14, worst);
}
