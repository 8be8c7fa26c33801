// Second derivatives through the fused attention cores (heads-first, heads-last, packed): the
// backward that runs while a graph is being built (create_graph) is composed of differentiable
// ops, so gradients of gradients are right. Checked with gradgradcheck (float64, default
// tolerances) for every layout with each mask kind, causality, dropout with a fixed mask and
// gradients reaching the output, the weights or both; against the same attention composed from
// ops (Hessian-vector products, a gradient penalty, third order) to 1e-12; and fully blocked rows
// (zeros, never NaN).
#define BOOST_TEST_MODULE double_backward_attention
#include <boost/test/unit_test.hpp>

#include <array>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "test_support.hpp"

using namespace test_support::prelude;
using test_support::all_finite;
using test_support::max_abs_diff;

namespace {

enum class Layout { HeadsFirst, HeadsLast, Packed };
// The additive mask: none; (B, H, T, S) with some -inf entries; (T, S) with one -inf; key padding
// (B, 1, 1, S) with the last key of batch 1 blocked; padding blocking every key of batch 0 (fully
// blocked rows); (T, S) with key 0 blocked (with is_causal: query 0 sees nothing); and learned
// (differentiable, an input of the check) score biases of shapes (T, S), (B, H, T, S), (B, 1, 1, S).
enum class Mask { None, Full, Shared, Padding, Blocked, FirstKeyBlocked, Learned, LearnedFull, LearnedPadding };
enum class Reach { Output, Weights, Both };  // which results the checked function returns

struct Case {
  Layout layout = Layout::HeadsFirst;
  Mask mask = Mask::None;
  bool causal = false;
  double dropout = 0.0;
  Reach reach = Reach::Both;
  bool chain = false;  // tanh after the op: its gradients arrive carrying a graph
};

std::string layout_name(Layout l) {
  return l == Layout::HeadsFirst ? "heads-first" : l == Layout::HeadsLast ? "heads-last" : "packed";
}

std::string describe(const Case& c) {
  static const char* masks[] = {"none",    "full",   "shared (T, S)", "padding", "blocked rows", "first key blocked",
                                "learned (T, S)", "learned (B, H, T, S)", "learned (B, 1, 1, S)"};
  static const char* reaches[] = {"output", "weights", "both"};
  return fmt::format("{}, mask {}{}{}, gradient to {}{}", layout_name(c.layout), masks[static_cast<int>(c.mask)],
                     c.causal ? ", causal" : "", c.dropout > 0 ? fmt::format(", dropout {}", c.dropout) : "",
                     reaches[static_cast<int>(c.reach)], c.chain ? ", inside tanh" : " (seed)");
}

constexpr std::int64_t B = 2, H = 2, DK = 2, DV = 3;

Tensor randn64(const Shape& shape, std::uint64_t seed, bool grad = true) {
  ag::Generator gen(seed);
  Tensor t = ag::randn(shape, F64, gen);
  if (grad) t.requires_grad_(true);
  return t;
}

Tensor flat(const Tensor& t) { return ag::reshape(t, {-1}); }

// The inputs of one case: q, k, v (packed: the one qkv tensor) and a learned mask, then the
// constant mask, if any.
struct Inputs {
  TensorList checked;  // what gradgradcheck differentiates
  Tensor fixed_mask;   // a constant mask (undefined when none or learned)
  std::int64_t T = 3, S = 4;
};

Tensor make_mask(Mask kind, std::int64_t T, std::int64_t S, std::uint64_t seed) {
  switch (kind) {
    case Mask::None: return Tensor();
    case Mask::Full: {
      Tensor m = randn64({B, H, T, S}, seed, false);
      for (std::int64_t i : {1, 6, 14, 19}) m.data<double>()[i % m.numel()] = -kInf;  // no row fully blocked
      m.data<double>()[0] = 0.0;
      return m;
    }
    case Mask::Shared: {
      Tensor m = randn64({T, S}, seed, false);
      m.data<double>()[S + 1] = -kInf;
      return m;
    }
    case Mask::Padding: {
      std::vector<double> m(static_cast<std::size_t>(B * S), 0.0);
      m.back() = -kInf;
      return ag::tensor(m, {B, 1, 1, S}, F64);
    }
    case Mask::Blocked: {
      std::vector<double> m(static_cast<std::size_t>(B * S), 0.0);
      for (std::int64_t j = 0; j < S; ++j) m[static_cast<std::size_t>(j)] = -kInf;  // batch 0: every key
      m.back() = -kInf;
      return ag::tensor(m, {B, 1, 1, S}, F64);
    }
    case Mask::FirstKeyBlocked: {
      Tensor m = randn64({T, S}, seed, false);
      for (std::int64_t i = 0; i < T; ++i) m.data<double>()[i * S] = -kInf;
      return m;
    }
    case Mask::Learned: return randn64({T, S}, seed);
    case Mask::LearnedFull: return randn64({B, H, T, S}, seed);
    case Mask::LearnedPadding: return randn64({B, 1, 1, S}, seed);
  }
  return Tensor();
}

bool learned(Mask m) { return m == Mask::Learned || m == Mask::LearnedFull || m == Mask::LearnedPadding; }

Inputs make_inputs(const Case& c, std::uint64_t seed = 11) {
  Inputs in;
  if (c.causal || c.layout == Layout::Packed) in.S = in.T;
  const std::int64_t T = in.T, S = in.S;
  switch (c.layout) {
    case Layout::HeadsFirst:
      in.checked = {randn64({B, H, T, DK}, seed), randn64({B, H, S, DK}, seed + 1), randn64({B, H, S, DV}, seed + 2)};
      break;
    case Layout::HeadsLast:
      in.checked = {randn64({B, T, H * DK}, seed), randn64({B, S, H * DK}, seed + 1),
                    randn64({B, S, H * DV}, seed + 2)};
      break;
    case Layout::Packed: in.checked = {randn64({B, T, 3 * H * DK}, seed)}; break;
  }
  const Tensor mask = make_mask(c.mask, T, S, seed + 3);
  if (learned(c.mask)) {
    in.checked.push_back(mask);
  } else {
    in.fixed_mask = mask;
  }
  return in;
}

// The case's op on x (laid out as make_inputs makes them), its dropout drawn from gen.
ag::SdpaResult run_op(const Case& c, const TensorList& x, const Tensor& fixed_mask, ag::Generator* gen) {
  const bool packed = c.layout == Layout::Packed;
  const Tensor mask = learned(c.mask) ? x[packed ? 1 : 3] : fixed_mask;
  switch (c.layout) {
    case Layout::HeadsFirst:
      return ag::scaled_dot_product_attention(
          x[0], x[1], x[2], {.attn_mask = mask, .dropout_p = c.dropout, .is_causal = c.causal, .generator = gen});
    case Layout::HeadsLast:
      return ag::scaled_dot_product_attention_heads_last(
          x[0], x[1], x[2], H, {.attn_mask = mask, .dropout_p = c.dropout, .is_causal = c.causal, .generator = gen});
    case Layout::Packed:
      return ag::scaled_dot_product_attention_packed(
          x[0], H, {.attn_mask = mask, .dropout_p = c.dropout, .is_causal = c.causal, .generator = gen});
  }
  throw std::logic_error("layout");
}

// What gradgradcheck differentiates for a case: the results it asks for, laid end to end
// (through tanh when chained). The dropout mask is the same at every evaluation.
ag::GradcheckFn case_fn(const Case& c, const Tensor& fixed_mask) {
  auto gen = std::make_shared<ag::Generator>();
  return [c, fixed_mask, gen](const TensorList& x) {
    gen->manual_seed(99);
    const ag::SdpaResult r = run_op(c, x, fixed_mask, gen.get());
    Tensor y = c.reach == Reach::Output    ? flat(r.output)
               : c.reach == Reach::Weights ? flat(r.weights)
                                           : ag::cat({flat(r.output), flat(r.weights)}, 0);
    return c.chain ? ag::tanh(y) : y;
  };
}

// gradgradcheck of the case with the default tolerances; the worst error is logged.
void check_case(const Case& c) {
  const Inputs in = make_inputs(c);
  const ag::GradcheckResult r = ag::gradgradcheck(case_fn(c, in.fixed_mask), in.checked);
  BOOST_TEST(r.ok, describe(c) << ": " << fmt::format("{}", r));
  BOOST_TEST(r.elements_checked > 0);
  BOOST_TEST_MESSAGE(fmt::format("gradgradcheck {}: worst abs error {:.3g}, rel {:.3g}", describe(c), r.max_abs_error,
                                 r.max_rel_error));
}

// Every mask kind, causality and dropout, gradients reaching the output, the weights or both,
// as the last op (seed) and inside a chain.
std::vector<Case> cases_of(Layout layout) {
  std::vector<Case> cs;
  for (Reach reach : {Reach::Output, Reach::Weights, Reach::Both})
    for (bool chain : {false, true}) cs.push_back({layout, Mask::None, false, 0.0, reach, chain});
  for (Mask m : {Mask::Full, Mask::Shared, Mask::Padding, Mask::Blocked, Mask::Learned, Mask::LearnedFull,
                 Mask::LearnedPadding})
    for (bool chain : {false, true}) cs.push_back({layout, m, false, 0.0, Reach::Both, chain});
  for (Mask m : {Mask::None, Mask::Shared, Mask::FirstKeyBlocked, Mask::Learned})
    cs.push_back({layout, m, true, 0.0, Reach::Both, true});
  cs.push_back({layout, Mask::Shared, false, 0.5, Reach::Both, false});
  cs.push_back({layout, Mask::Blocked, false, 0.3, Reach::Both, true});
  cs.push_back({layout, Mask::Learned, true, 0.4, Reach::Both, true});
  cs.push_back({layout, Mask::None, false, 0.5, Reach::Output, true});
  return cs;
}

// ---- the same attention composed from ops, heads-first: the reference ----

// (B, L, H·d) -> (B, H, L, d)
Tensor split_heads(const Tensor& x) {
  return ag::transpose(ag::reshape(x, {x.size(0), x.size(1), H, x.size(2) / H}), 1, 2);
}

// (T, T) with 1 above the diagonal: the keys a causal query may not see.
Tensor causal_blocked(std::int64_t n) {
  std::vector<double> m(static_cast<std::size_t>(n * n), 0.0);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = i + 1; j < n; ++j) m[static_cast<std::size_t>(i * n + j)] = 1.0;
  return ag::tensor(m, {n, n}, F64);
}

// scores = scale·q·kᵀ + mask (causal: -inf above the diagonal), softmax, dropout by ag::dropout
// (which draws as the fused op does), weighted sum of v. Heads-last and packed inputs are split
// into heads first; the output comes back in the case's layout.
ag::SdpaResult reference(const Case& c, const TensorList& x, const Tensor& fixed_mask, ag::Generator& gen) {
  Tensor q, k, v;
  if (c.layout == Layout::Packed) {
    const TensorList parts = ag::chunk(x[0], 3, 2);
    q = split_heads(parts[0]), k = split_heads(parts[1]), v = split_heads(parts[2]);
  } else if (c.layout == Layout::HeadsLast) {
    q = split_heads(x[0]), k = split_heads(x[1]), v = split_heads(x[2]);
  } else {
    q = x[0], k = x[1], v = x[2];
  }
  const Tensor mask = learned(c.mask) ? x[c.layout == Layout::Packed ? 1 : 3] : fixed_mask;
  Tensor scores = ag::matmul(q, ag::transpose(k, -2, -1)) * (1.0 / std::sqrt(static_cast<double>(q.size(3))));
  if (mask.defined()) scores = scores + mask;
  if (c.causal) scores = ag::masked_fill(scores, causal_blocked(q.size(2)), -kInf);
  const Tensor weights = ag::softmax(scores, -1);
  const Tensor dropped = c.dropout > 0 ? ag::dropout(weights, c.dropout, true, gen) : weights;
  Tensor out = ag::matmul(dropped, v);  // (B, H, T, d_v)
  if (c.layout != Layout::HeadsFirst)
    out = ag::reshape(ag::transpose(out, 1, 2), {out.size(0), out.size(2), out.size(1) * out.size(3)});
  return {out, weights};
}

// A scalar loss of both results, nonlinear in each: Σ tanh(out)·R1 + Σ weights²·R2.
using Attend = std::function<ag::SdpaResult(const TensorList&)>;
ag::GradcheckFn loss_of(const Attend& attend, std::uint64_t seed) {
  return [attend, seed](const TensorList& x) {
    const ag::SdpaResult r = attend(x);
    const Tensor r1 = randn64(r.output.shape(), seed, false), r2 = randn64(r.weights.shape(), seed + 1, false);
    return ag::sum(ag::tanh(r.output) * r1) + ag::sum(ag::square(r.weights) * r2);
  };
}

Attend fused_attend(const Case& c, const Tensor& fixed_mask) {
  auto gen = std::make_shared<ag::Generator>();
  return [c, fixed_mask, gen](const TensorList& x) {
    gen->manual_seed(7);
    return run_op(c, x, fixed_mask, gen.get());
  };
}

Attend composed_attend(const Case& c, const Tensor& fixed_mask) {
  auto gen = std::make_shared<ag::Generator>();
  return [c, fixed_mask, gen](const TensorList& x) {
    gen->manual_seed(7);
    return reference(c, x, fixed_mask, *gen);
  };
}

TensorList random_like(const TensorList& xs, std::uint64_t seed) {
  TensorList v;
  for (const Tensor& x : xs) v.push_back(randn64(x.shape(), seed++, false));
  return v;
}

// The cases the fused-against-composed comparisons run over.
std::vector<Case> comparison_cases() {
  std::vector<Case> cs;
  for (Layout l : {Layout::HeadsFirst, Layout::HeadsLast, Layout::Packed}) {
    cs.push_back({l, Mask::None});
    cs.push_back({l, Mask::Full});
    cs.push_back({l, Mask::Padding});
    cs.push_back({l, Mask::LearnedFull});
    cs.push_back({l, Mask::LearnedPadding, true});
    cs.push_back({l, Mask::Shared, true, 0.4});
  }
  return cs;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(gradgradcheck_of_the_fused_cores)

BOOST_AUTO_TEST_CASE(heads_first) {
  for (const Case& c : cases_of(Layout::HeadsFirst)) check_case(c);
}

BOOST_AUTO_TEST_CASE(heads_last) {
  for (const Case& c : cases_of(Layout::HeadsLast)) check_case(c);
}

BOOST_AUTO_TEST_CASE(packed) {
  for (const Case& c : cases_of(Layout::Packed)) check_case(c);
}

BOOST_AUTO_TEST_CASE(t_differs_from_s_and_d_v_from_d_k) {
  // Rectangular scores and value width != key width, with a broadcast learned mask.
  Tensor q = randn64({1, 2, 2, 3}, 41), k = randn64({1, 2, 5, 3}, 42), v = randn64({1, 2, 5, 1}, 43);
  Tensor bias = randn64({1, 2, 1, 5}, 44);
  const auto r = ag::gradgradcheck(
      [](const TensorList& x) {
        const auto a = ag::scaled_dot_product_attention(x[0], x[1], x[2], {.attn_mask = x[3], .scale = 0.7});
        return ag::cat({flat(a.output), flat(a.weights)}, 0);
      },
      {q, k, v, bias});
  BOOST_TEST(r.ok, fmt::format("{}", r));
}

BOOST_AUTO_TEST_CASE(only_some_inputs_require_grad) {
  // The rule computes only the gradients asked for; the second derivatives of those stay right.
  for (int which = 0; which < 3; ++which) {
    TensorList x = {randn64({1, 2, 3, 2}, 51, which == 0), randn64({1, 2, 4, 2}, 52, which == 1),
                    randn64({1, 2, 4, 2}, 53, which == 2)};
    const auto r = ag::gradgradcheck(
        [x, which](const TensorList& in) {
          TensorList y = x;
          y[static_cast<std::size_t>(which)] = in[0];
          const auto a = ag::scaled_dot_product_attention(y[0], y[1], y[2]);
          return ag::tanh(ag::cat({flat(a.output), flat(a.weights)}, 0));
        },
        {x[static_cast<std::size_t>(which)]});
    BOOST_TEST(r.ok, "input " << which << ": " << fmt::format("{}", r));
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(composed_backward)

BOOST_AUTO_TEST_CASE(create_graph_gradients_equal_the_kernel_gradients) {
  // The first derivatives of the composed backward are the kernel's (to rounding), for every case.
  for (Layout l : {Layout::HeadsFirst, Layout::HeadsLast, Layout::Packed})
    for (const Case& c : cases_of(l)) {
      const Inputs in = make_inputs(c);
      const auto fn = case_fn(c, in.fixed_mask);
      const Tensor y = fn(in.checked);
      const Tensor u = randn64(y.shape(), 5, false);
      // Weights only: v does not reach them (allow_unused).
      const TensorList fast =
          ag::grad({y}, in.checked, {.grad_outputs = {u}, .retain_graph = true, .allow_unused = true});
      const TensorList built =
          ag::grad({y}, in.checked, {.grad_outputs = {u}, .create_graph = true, .allow_unused = true});
      for (std::size_t i = 0; i < fast.size(); ++i) {
        BOOST_TEST(fast[i].defined() == built[i].defined(), describe(c) << ": gradient " << i);
        if (!fast[i].defined()) continue;
        BOOST_TEST(built[i].requires_grad(), describe(c) << ": gradient " << i << " has no graph");
        BOOST_TEST(max_abs_diff(fast[i], built[i]) <= 1e-13, describe(c) << ": gradient " << i);
      }
    }
}

BOOST_AUTO_TEST_CASE(empty_sizes_under_create_graph) {
  // No queries, no keys, or zero-width heads: the composed backward gives the kernel's gradients
  // (zeros of the right shapes) and its hvp is finite.
  for (const auto& [T, S, dk, dv] : std::vector<std::array<std::int64_t, 4>>{
           {0, 3, 2, 2}, {3, 0, 2, 2}, {3, 4, 0, 2}, {3, 4, 2, 0}}) {
    const TensorList x = {randn64({1, 2, T, dk}, 1), randn64({1, 2, S, dk}, 2), randn64({1, 2, S, dv}, 3)};
    auto loss = [](const TensorList& in) {
      const auto r = ag::scaled_dot_product_attention(in[0], in[1], in[2]);
      return ag::sum(r.output * r.output) + ag::sum(r.weights * r.weights);
    };
    const TensorList fast = ag::grad({loss(x)}, x, {.allow_unused = true});
    const TensorList built = ag::grad({loss(x)}, x, {.create_graph = true, .allow_unused = true});
    const TensorList hv = ag::hvp(loss, x, random_like(x, 9));
    for (std::size_t i = 0; i < 3; ++i) {
      const std::string what = fmt::format("T {} S {} d_k {} d_v {}: input {}", T, S, dk, dv, i);
      BOOST_TEST(fast[i].defined() == built[i].defined(), what);
      if (fast[i].defined() && built[i].defined()) BOOST_TEST(max_abs_diff(fast[i], built[i]) <= 1e-13, what);
      BOOST_TEST(all_finite(hv[i]), what);
    }
  }
}

BOOST_AUTO_TEST_CASE(fully_blocked_rows_stay_zero_in_second_order) {
  // Batch 0 sees no key at all: its weights, output and every derivative of them are 0, never NaN.
  for (Layout l : {Layout::HeadsFirst, Layout::HeadsLast, Layout::Packed})
    for (bool causal : {false, true}) {
      const Case c{l, Mask::Blocked, causal, 0.0, Reach::Both, true};
      const Inputs in = make_inputs(c);
      const auto loss = loss_of(fused_attend(c, in.fixed_mask), 3);
      const TensorList hv = ag::hvp(loss, in.checked, random_like(in.checked, 30));
      const TensorList g = ag::grad({loss(in.checked)}, in.checked, {.create_graph = true});
      Tensor penalty = ag::sum(ag::square(g[0]));
      const TensorList gg = ag::grad({penalty}, in.checked);
      for (std::size_t i = 0; i < hv.size(); ++i) {
        BOOST_TEST(all_finite(hv[i]), describe(c) << ": hvp " << i);
        BOOST_TEST(all_finite(gg[i]), describe(c) << ": penalty gradient " << i);
      }
      // Nothing of batch 0 (its first half, in every layout) gets a second derivative: its rows see nothing.
      for (std::size_t i = 0; i < hv.size(); ++i) {
        const std::vector<double> h = hv[i].to_vector(), p = gg[i].to_vector();
        for (std::size_t j = 0; j < h.size() / 2; ++j) {
          BOOST_TEST(h[j] == 0.0, describe(c) << ": hvp of input " << i << " element " << j << " = " << h[j]);
          BOOST_TEST(p[j] == 0.0, describe(c) << ": penalty gradient of input " << i << " element " << j);
        }
      }
    }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(fused_agrees_with_composed)

BOOST_AUTO_TEST_CASE(hessian_vector_products) {
  for (const Case& c : comparison_cases()) {
    const Inputs in = make_inputs(c);
    const TensorList v = random_like(in.checked, 20);
    const TensorList fused = ag::hvp(loss_of(fused_attend(c, in.fixed_mask), 3), in.checked, v);
    const TensorList composed = ag::hvp(loss_of(composed_attend(c, in.fixed_mask), 3), in.checked, v);
    for (std::size_t i = 0; i < fused.size(); ++i) {
      BOOST_TEST(max_abs_diff(fused[i], composed[i]) <= 1e-12, describe(c) << ": Hv of input " << i);
      BOOST_TEST(max_abs_diff(fused[i], ag::zeros_like(fused[i])) > 1e-6, describe(c) << ": Hv of input " << i << " is 0");
    }
  }
}

// d/dx of the gradient penalty ||dL/dx||², and a third derivative (the gradient of an HVP's
// entries), through each path.
TensorList penalty_gradient(const ag::GradcheckFn& loss, const TensorList& x) {
  const TensorList g = ag::grad({loss(x)}, x, {.create_graph = true});
  Tensor penalty = ag::sum(ag::square(g[0]));
  for (std::size_t i = 1; i < g.size(); ++i) penalty = penalty + ag::sum(ag::square(g[i]));
  return ag::grad({penalty}, x);
}

TensorList third_derivative(const ag::GradcheckFn& loss, const TensorList& x, const TensorList& v,
                            const TensorList& w) {
  const TensorList g = ag::grad({loss(x)}, x, {.create_graph = true});
  Tensor gv = ag::sum(g[0] * v[0]);
  for (std::size_t i = 1; i < g.size(); ++i) gv = gv + ag::sum(g[i] * v[i]);
  const TensorList hv = ag::grad({gv}, x, {.create_graph = true});
  Tensor hvw = ag::sum(hv[0] * w[0]);
  for (std::size_t i = 1; i < hv.size(); ++i) hvw = hvw + ag::sum(hv[i] * w[i]);
  return ag::grad({hvw}, x);
}

BOOST_AUTO_TEST_CASE(gradient_penalty_gradients) {
  for (const Case& c : comparison_cases()) {
    const Inputs in = make_inputs(c);
    const TensorList fused = penalty_gradient(loss_of(fused_attend(c, in.fixed_mask), 4), in.checked);
    const TensorList composed = penalty_gradient(loss_of(composed_attend(c, in.fixed_mask), 4), in.checked);
    for (std::size_t i = 0; i < fused.size(); ++i)
      BOOST_TEST(max_abs_diff(fused[i], composed[i]) <= 1e-12, describe(c) << ": penalty gradient of input " << i);
  }
}

BOOST_AUTO_TEST_CASE(third_derivatives) {
  for (const Case& c : comparison_cases()) {
    const Inputs in = make_inputs(c);
    const TensorList v = random_like(in.checked, 40), w = random_like(in.checked, 60);
    const TensorList fused = third_derivative(loss_of(fused_attend(c, in.fixed_mask), 5), in.checked, v, w);
    const TensorList composed = third_derivative(loss_of(composed_attend(c, in.fixed_mask), 5), in.checked, v, w);
    for (std::size_t i = 0; i < fused.size(); ++i)
      BOOST_TEST(max_abs_diff(fused[i], composed[i]) <= 1e-12, describe(c) << ": third derivative of input " << i);
  }
}

BOOST_AUTO_TEST_SUITE_END()
