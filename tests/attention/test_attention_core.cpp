// The fused scaled-dot-product-attention op: its forward against hand-computed numbers, its
// hand-derived backward against finite differences (gradcheck, float64) and against the same
// computation composed from autograd ops, fully blocked rows, dropout, determinism, errors.
#define BOOST_TEST_MODULE attention_core
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include <autograd/autograd.hpp>

#include "test_support.hpp"

using namespace test_support::prelude;
using test_support::all_finite;
using test_support::max_abs_diff;

namespace {

Tensor randn64(const ag::Shape& shape, std::uint64_t seed, bool grad = true) {
  ag::Generator gen(seed);
  Tensor t = ag::randn(shape, F64, gen);
  if (grad) t.requires_grad_(true);
  return t;
}

Tensor flat(const Tensor& t) { return ag::reshape(t, {-1}); }

// Both results in one vector, so that gradcheck's Jacobian covers gradients reaching the
// output and gradients reaching the weights.
Tensor both(const ag::SdpaResult& r) { return ag::cat({flat(r.output), flat(r.weights)}, 0); }

// (T, S) with 1 above the diagonal: the keys a causal query may not see.
Tensor causal_blocked(std::int64_t n) {
  std::vector<double> m(static_cast<std::size_t>(n * n), 0.0);
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t j = i + 1; j < n; ++j) m[static_cast<std::size_t>(i * n + j)] = 1.0;
  return ag::tensor(m, {n, n}, F64);
}

// The same attention composed from ops: scores = scale·q·kᵀ (+ mask), softmax, weighted sum.
ag::SdpaResult composed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool causal,
                        double scale) {
  Tensor scores = ag::matmul(q, ag::transpose(k, -2, -1)) * scale;  // [B, H, T, S]
  if (mask.defined()) scores = scores + mask;
  if (causal) scores = ag::masked_fill(scores, causal_blocked(q.size(2)), -kInf);
  Tensor weights = ag::softmax(scores, -1);  // [B, H, T, S]
  return {ag::matmul(weights, v), weights};  // [B, H, T, d_v]
}

bool all_zero(const Tensor& t) {
  for (double x : t.to_vector())
    if (x != 0.0) return false;
  return true;
}

// Gradients of L = Σ out ⊙ R1 + Σ weights ⊙ R2 with respect to `inputs`.
std::vector<Tensor> grads_of(const ag::SdpaResult& r, const Tensor& r1, const Tensor& r2,
                             const std::vector<Tensor>& inputs) {
  for (auto t : inputs) t.set_grad(Tensor());
  Tensor loss = ag::sum(r.output * r1) + ag::sum(r.weights * r2);
  loss.backward();
  std::vector<Tensor> g;
  for (const auto& t : inputs) g.push_back(t.grad());
  return g;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Forward values

BOOST_AUTO_TEST_CASE(seed_head_one_weights_and_output) {
  // The seed's head 1: q_t1 = [1, 0] against keys [1, 0], [0, 1]: raw scores 1 and 0, scaled by
  // 1/√2; values [2, 0], [0, 2]. q_t2 = [0, 1] is the mirror image.
  Tensor q = ag::tensor({1, 0, 0, 1}, {1, 1, 2, 2}, F64);
  Tensor k = ag::tensor({1, 0, 0, 1}, {1, 1, 2, 2}, F64);
  Tensor v = ag::tensor({2, 0, 0, 2}, {1, 1, 2, 2}, F64);
  auto r = ag::scaled_dot_product_attention(q, k, v);
  const double w1 = 1.0 / (1.0 + std::exp(-1.0 / std::sqrt(2.0)));  // e^a / (e^a + e^0), a = 1/√2
  const std::vector<double> weights{w1, 1 - w1, 1 - w1, w1};
  const std::vector<double> out{2 * w1, 2 * (1 - w1), 2 * (1 - w1), 2 * w1};
  for (std::size_t i = 0; i < 4; ++i) {
    BOOST_TEST(r.weights.to_vector()[i] == weights[i], boost::test_tools::tolerance(1e-15));
    BOOST_TEST(r.output.to_vector()[i] == out[i], boost::test_tools::tolerance(1e-15));
  }
  // The seed's printed numbers: weights 0.670 / 0.330, head1-t1 = [1.340, 0.660].
  BOOST_TEST(std::abs(r.weights.to_vector()[0] - 0.670) < 1e-3);
  BOOST_TEST(std::abs(r.output.to_vector()[0] - 1.340) < 1e-3);
  BOOST_TEST(std::abs(r.output.to_vector()[1] - 0.660) < 1e-3);
}

BOOST_AUTO_TEST_CASE(weights_rows_sum_to_one) {
  auto r = ag::scaled_dot_product_attention(randn64({2, 3, 4, 5}, 1), randn64({2, 3, 5, 5}, 2),
                                            randn64({2, 3, 5, 2}, 3));
  Tensor sums = ag::sum(r.weights, -1);
  for (double s : sums.to_vector()) BOOST_TEST(s == 1.0, boost::test_tools::tolerance(1e-14));
  BOOST_TEST(r.output.shape() == (ag::Shape{2, 3, 4, 2}));
  BOOST_TEST(r.weights.shape() == (ag::Shape{2, 3, 4, 5}));
}

BOOST_AUTO_TEST_CASE(scale_zero_means_one_over_sqrt_dk) {
  Tensor q = randn64({1, 2, 3, 4}, 1), k = randn64({1, 2, 3, 4}, 2), v = randn64({1, 2, 3, 4}, 3);
  auto by_default = ag::scaled_dot_product_attention(q, k, v);
  auto explicit_scale = ag::scaled_dot_product_attention(q, k, v, {.scale = 0.5});
  auto other_scale = ag::scaled_dot_product_attention(q, k, v, {.scale = 0.25});
  BOOST_TEST(max_abs_diff(by_default.weights, explicit_scale.weights) == 0.0);
  BOOST_TEST(max_abs_diff(by_default.weights, other_scale.weights) > 1e-3);
}

BOOST_AUTO_TEST_CASE(causal_query_sees_only_earlier_keys) {
  auto r = ag::scaled_dot_product_attention(randn64({1, 2, 4, 3}, 1), randn64({1, 2, 4, 3}, 2),
                                            randn64({1, 2, 4, 3}, 3), {.is_causal = true});
  const auto w = r.weights.to_vector();
  for (std::int64_t h = 0; h < 2; ++h)
    for (std::int64_t i = 0; i < 4; ++i)
      for (std::int64_t j = 0; j < 4; ++j) {
        const double x = w[static_cast<std::size_t>((h * 4 + i) * 4 + j)];
        if (j > i) {
          BOOST_TEST(x == 0.0);
        } else {
          BOOST_TEST(x > 0.0);
        }
      }
  BOOST_TEST(w[0] == 1.0);  // query 0 sees key 0 only
}

BOOST_AUTO_TEST_CASE(no_keys_give_zero_output) {
  auto r = ag::scaled_dot_product_attention(randn64({1, 1, 3, 2}, 1), randn64({1, 1, 0, 2}, 2),
                                            randn64({1, 1, 0, 4}, 3));
  BOOST_TEST(r.output.shape() == (ag::Shape{1, 1, 3, 4}));
  BOOST_TEST(all_zero(r.output));
}

BOOST_AUTO_TEST_CASE(float32_agrees_with_float64) {
  Tensor q = randn64({2, 2, 5, 4}, 1, false), k = randn64({2, 2, 6, 4}, 2, false), v = randn64({2, 2, 6, 3}, 3, false);
  Tensor mask = randn64({5, 6}, 4, false);
  auto r64 = ag::scaled_dot_product_attention(q, k, v, {.attn_mask = mask});
  auto r32 = ag::scaled_dot_product_attention(q.to(ag::Dtype::Float32), k.to(ag::Dtype::Float32),
                                              v.to(ag::Dtype::Float32), {.attn_mask = mask.to(ag::Dtype::Float32)});
  BOOST_TEST((r32.output.dtype() == ag::Dtype::Float32));
  BOOST_TEST(max_abs_diff(r32.output, r64.output) < 1e-5);
  BOOST_TEST(max_abs_diff(r32.weights, r64.weights) < 1e-6);
  // And the float32 backward agrees with the float64 one.
  Tensor q32 = q.to(ag::Dtype::Float32).requires_grad_(true), k32 = k.to(ag::Dtype::Float32).requires_grad_(true),
         v32 = v.to(ag::Dtype::Float32).requires_grad_(true);
  q.requires_grad_(true);
  k.requires_grad_(true);
  v.requires_grad_(true);
  Tensor r1 = randn64({2, 2, 5, 3}, 5, false), r2 = randn64({2, 2, 5, 6}, 6, false);
  const auto g64 = grads_of(ag::scaled_dot_product_attention(q, k, v, {.attn_mask = mask}), r1, r2, {q, k, v});
  const auto g32 = grads_of(ag::scaled_dot_product_attention(q32, k32, v32, {.attn_mask = mask.to(ag::Dtype::Float32)}),
                            r1.to(ag::Dtype::Float32), r2.to(ag::Dtype::Float32), {q32, k32, v32});
  for (std::size_t i = 0; i < 3; ++i) BOOST_TEST(max_abs_diff(g32[i], g64[i]) < 1e-5);
}

BOOST_AUTO_TEST_CASE(no_graph_without_grad) {
  Tensor q = randn64({1, 1, 2, 2}, 1, false), k = randn64({1, 1, 2, 2}, 2, false), v = randn64({1, 1, 2, 2}, 3);
  {
    ag::NoGradGuard guard;
    auto r = ag::scaled_dot_product_attention(q, k, v);
    BOOST_TEST(!r.output.requires_grad());
    BOOST_TEST(!r.weights.requires_grad());
  }
  auto r = ag::scaled_dot_product_attention(q, k, v);
  BOOST_TEST(r.output.requires_grad());
  BOOST_TEST(r.weights.requires_grad());
  BOOST_TEST(r.output.grad_fn() == r.weights.grad_fn());  // one node, two outputs
}

// ---------------------------------------------------------------------------------------------
// Gradients against finite differences (float64)

BOOST_AUTO_TEST_CASE(gradcheck_q_k_v_without_mask) {
  Tensor q = randn64({2, 2, 3, 3}, 11), k = randn64({2, 2, 4, 3}, 12), v = randn64({2, 2, 4, 2}, 13);
  check_gradients([](const std::vector<Tensor>& x) { return both(ag::scaled_dot_product_attention(x[0], x[1], x[2])); },
                  {q, k, v});
}

BOOST_AUTO_TEST_CASE(gradcheck_dv_differs_from_dk_and_t_from_s) {
  // d_k = 2, d_v = 5, T = 4, S = 2, explicit scale.
  Tensor q = randn64({1, 2, 4, 2}, 21), k = randn64({1, 2, 2, 2}, 22), v = randn64({1, 2, 2, 5}, 23);
  check_gradients(
      [](const std::vector<Tensor>& x) {
        return both(ag::scaled_dot_product_attention(x[0], x[1], x[2], {.scale = 0.7}));
      },
      {q, k, v});
}

BOOST_AUTO_TEST_CASE(gradcheck_through_output_only) {
  Tensor q = randn64({2, 1, 3, 2}, 31), k = randn64({2, 1, 4, 2}, 32), v = randn64({2, 1, 4, 3}, 33);
  check_gradients([](const std::vector<Tensor>& x) { return ag::scaled_dot_product_attention(x[0], x[1], x[2]).output; },
                  {q, k, v});
}

BOOST_AUTO_TEST_CASE(gradcheck_through_weights_only) {
  Tensor q = randn64({2, 1, 3, 2}, 41), k = randn64({2, 1, 4, 2}, 42), v = randn64({2, 1, 4, 3}, 43);
  check_gradients([](const std::vector<Tensor>& x) { return ag::scaled_dot_product_attention(x[0], x[1], x[2]).weights; },
                  {q, k, v});
}

BOOST_AUTO_TEST_CASE(gradcheck_with_full_mask_and_blocked_entries) {
  // (B, H, T, S) float mask, a few entries -inf (no row fully blocked).
  Tensor q = randn64({1, 2, 3, 2}, 51), k = randn64({1, 2, 4, 2}, 52), v = randn64({1, 2, 4, 3}, 53);
  Tensor mask = randn64({1, 2, 3, 4}, 54, false);
  for (int i : {1, 6, 14, 19}) mask.data<double>()[i] = -kInf;
  check_gradients(
      [mask](const std::vector<Tensor>& x) {
        return both(ag::scaled_dot_product_attention(x[0], x[1], x[2], {.attn_mask = mask}));
      },
      {q, k, v});
}

BOOST_AUTO_TEST_CASE(gradcheck_with_broadcast_masks) {
  Tensor q = randn64({2, 2, 3, 2}, 61), k = randn64({2, 2, 4, 2}, 62), v = randn64({2, 2, 4, 2}, 63);
  // (T, S): one mask for every batch and head.
  Tensor ts = randn64({3, 4}, 64, false);
  ts.data<double>()[5] = -kInf;
  // (B, 1, 1, S): key padding, the last key of batch 1 is padding.
  Tensor pad = ag::tensor({0, 0, 0, 0, 0, 0, 0, -kInf}, {2, 1, 1, 4}, F64);
  // (1, H, T, 1): a per-head, per-query offset (softmax-invariant, but must still broadcast).
  Tensor row = randn64({1, 2, 3, 1}, 65, false);
  for (const Tensor& mask : {ts, pad, row})
    check_gradients(
        [mask](const std::vector<Tensor>& x) {
          return both(ag::scaled_dot_product_attention(x[0], x[1], x[2], {.attn_mask = mask}));
        },
        {q, k, v});
}

BOOST_AUTO_TEST_CASE(gradcheck_causal) {
  Tensor q = randn64({2, 2, 4, 3}, 71), k = randn64({2, 2, 4, 3}, 72), v = randn64({2, 2, 4, 2}, 73);
  check_gradients(
      [](const std::vector<Tensor>& x) {
        return both(ag::scaled_dot_product_attention(x[0], x[1], x[2], {.is_causal = true}));
      },
      {q, k, v});
}

BOOST_AUTO_TEST_CASE(gradcheck_causal_with_mask) {
  Tensor q = randn64({1, 2, 4, 2}, 81), k = randn64({1, 2, 4, 2}, 82), v = randn64({1, 2, 4, 2}, 83);
  Tensor mask = randn64({4, 4}, 84, false);
  check_gradients(
      [mask](const std::vector<Tensor>& x) {
        return both(ag::scaled_dot_product_attention(x[0], x[1], x[2], {.attn_mask = mask, .is_causal = true}));
      },
      {q, k, v});
}

BOOST_AUTO_TEST_CASE(gradcheck_mask_is_differentiable) {
  // A learned additive score bias: the mask's gradient is dL/dS summed to its shape.
  Tensor q = randn64({2, 2, 3, 2}, 91), k = randn64({2, 2, 4, 2}, 92), v = randn64({2, 2, 4, 2}, 93);
  Tensor full_bias = randn64({2, 2, 3, 4}, 94);
  Tensor shared_bias = randn64({3, 4}, 95);
  Tensor padding_bias = randn64({2, 1, 1, 4}, 96);
  for (const Tensor& bias : {full_bias, shared_bias, padding_bias})
    check_gradients(
        [](const std::vector<Tensor>& x) {
          return both(ag::scaled_dot_product_attention(x[0], x[1], x[2], {.attn_mask = x[3]}));
        },
        {q, k, v, bias});
}

// ---------------------------------------------------------------------------------------------
// Agreement with the same computation composed from ops (float64, 1e-12)

BOOST_AUTO_TEST_CASE(fused_matches_composed_forward_and_backward) {
  struct Case {
    const char* name;
    ag::Shape q, k, v;
    int mask;  // 0 none, 1 (T, S), 2 (B, 1, 1, S) padding, 3 (B, H, T, S) with -inf
    bool causal;
    double scale;
  };
  const Case cases[] = {
      {"plain", {2, 3, 4, 5}, {2, 3, 6, 5}, {2, 3, 6, 3}, 0, false, 0.0},
      {"ts_mask", {2, 3, 4, 5}, {2, 3, 6, 5}, {2, 3, 6, 7}, 1, false, 0.0},
      {"padding", {2, 2, 5, 4}, {2, 2, 3, 4}, {2, 2, 3, 4}, 2, false, 0.3},
      {"full_mask", {1, 4, 3, 2}, {1, 4, 5, 2}, {1, 4, 5, 1}, 3, false, 0.0},
      {"causal", {2, 2, 6, 4}, {2, 2, 6, 4}, {2, 2, 6, 4}, 0, true, 0.0},
      {"causal_ts_mask", {2, 2, 5, 3}, {2, 2, 5, 3}, {2, 2, 5, 2}, 1, true, 1.5},
      // Long enough for the kernel's causal blocks of query rows (32): three blocks, the last short.
      {"causal_row_blocks", {1, 2, 70, 8}, {1, 2, 70, 8}, {1, 2, 70, 5}, 1, true, 0.0},
      // Blocks large enough for the BLAS path of the matrix products.
      {"causal_row_blocks_large", {1, 1, 96, 64}, {1, 1, 96, 64}, {1, 1, 96, 48}, 0, true, 0.0},
  };
  std::uint64_t seed = 100;
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT("case " << c.name) {
      Tensor q = randn64(c.q, seed++), k = randn64(c.k, seed++), v = randn64(c.v, seed++);
      const std::int64_t B = c.q[0], H = c.q[1], T = c.q[2], S = c.k[2];
      Tensor mask;
      if (c.mask == 1) mask = randn64({T, S}, seed++);
      if (c.mask == 2) {
        std::vector<double> m(static_cast<std::size_t>(B * S), 0.0);
        m[static_cast<std::size_t>(S - 1)] = -kInf;  // batch 0: last key is padding
        mask = ag::tensor(m, {B, 1, 1, S}, F64);
      }
      if (c.mask == 3) {
        mask = randn64({B, H, T, S}, seed++, false);
        for (std::int64_t i = 0; i < mask.numel(); i += 4) mask.data<double>()[i] = -kInf;  // never a whole row
        mask.requires_grad_(true);
      }
      const double scale = c.scale == 0.0 ? 1.0 / std::sqrt(static_cast<double>(c.q[3])) : c.scale;
      Tensor r1 = randn64({B, H, T, c.v[3]}, seed++, false), r2 = randn64({B, H, T, S}, seed++, false);
      std::vector<Tensor> inputs{q, k, v};
      if (mask.defined() && mask.requires_grad()) inputs.push_back(mask);

      auto fused =
          ag::scaled_dot_product_attention(q, k, v, {.attn_mask = mask, .is_causal = c.causal, .scale = c.scale});
      auto reference = composed(q, k, v, mask, c.causal, scale);
      BOOST_TEST(max_abs_diff(fused.output, reference.output) < 1e-12);
      BOOST_TEST(max_abs_diff(fused.weights, reference.weights) < 1e-12);
      const auto g_fused = grads_of(fused, r1, r2, inputs);
      const auto g_ref = grads_of(reference, r1, r2, inputs);
      for (std::size_t i = 0; i < inputs.size(); ++i) BOOST_TEST(max_abs_diff(g_fused[i], g_ref[i]) < 1e-12);
    }
  }
}

BOOST_AUTO_TEST_CASE(composed_comparison_detects_a_wrong_scale) {
  // Negative control for the agreement test above: a 1e-6 change of scale is seen.
  Tensor q = randn64({1, 2, 3, 4}, 1), k = randn64({1, 2, 3, 4}, 2), v = randn64({1, 2, 3, 4}, 3);
  auto fused = ag::scaled_dot_product_attention(q, k, v, {.scale = 0.5});
  auto reference = composed(q, k, v, Tensor(), false, 0.5 + 1e-6);
  BOOST_TEST(max_abs_diff(fused.weights, reference.weights) > 1e-12);
}

// ---------------------------------------------------------------------------------------------
// Fully blocked rows

BOOST_AUTO_TEST_CASE(fully_masked_row_is_zero_not_nan) {
  const std::int64_t B = 2, H = 2, T = 3, S = 4;
  Tensor q = randn64({B, H, T, 2}, 201), k = randn64({B, H, S, 2}, 202), v = randn64({B, H, S, 3}, 203);
  // Row 1 of every (b, h) is fully blocked; batch 1 also blocks all of row 2 via key padding.
  Tensor mask = randn64({B, H, T, S}, 204, false);
  double* m = mask.data<double>();
  for (std::int64_t bh = 0; bh < B * H; ++bh)
    for (std::int64_t j = 0; j < S; ++j) {
      m[(bh * T + 1) * S + j] = -kInf;
      if (bh >= H) m[(bh * T + 2) * S + j] = -kInf;
    }
  auto blocked = [&](std::int64_t bh, std::int64_t i) { return i == 1 || (bh >= H && i == 2); };

  auto r = ag::scaled_dot_product_attention(q, k, v, {.attn_mask = mask});
  Tensor r1 = randn64({B, H, T, 3}, 205, false), r2 = randn64({B, H, T, S}, 206, false);
  const auto g = grads_of(r, r1, r2, {q, k, v});
  BOOST_TEST(all_finite(r.output));
  BOOST_TEST(all_finite(r.weights));
  for (const auto& t : g) BOOST_TEST(all_finite(t));

  const auto w = r.weights.to_vector(), o = r.output.to_vector(), dq = g[0].to_vector();
  for (std::int64_t bh = 0; bh < B * H; ++bh)
    for (std::int64_t i = 0; i < T; ++i) {
      if (!blocked(bh, i)) continue;
      for (std::int64_t j = 0; j < S; ++j) BOOST_TEST(w[static_cast<std::size_t>((bh * T + i) * S + j)] == 0.0);
      for (std::int64_t j = 0; j < 3; ++j) BOOST_TEST(o[static_cast<std::size_t>((bh * T + i) * 3 + j)] == 0.0);
      for (std::int64_t j = 0; j < 2; ++j) BOOST_TEST(dq[static_cast<std::size_t>((bh * T + i) * 2 + j)] == 0.0);
    }

  // The blocked rows send nothing to k and v: zeroing their upstream gradients changes nothing.
  double* a = r1.data<double>();
  double* b = r2.data<double>();
  for (std::int64_t bh = 0; bh < B * H; ++bh)
    for (std::int64_t i = 0; i < T; ++i) {
      if (!blocked(bh, i)) continue;
      for (std::int64_t j = 0; j < 3; ++j) a[(bh * T + i) * 3 + j] = 0.0;
      for (std::int64_t j = 0; j < S; ++j) b[(bh * T + i) * S + j] = 0.0;
    }
  auto r_again = ag::scaled_dot_product_attention(q, k, v, {.attn_mask = mask});
  const auto g_again = grads_of(r_again, r1, r2, {q, k, v});
  BOOST_TEST(max_abs_diff(g[1], g_again[1]) == 0.0);
  BOOST_TEST(max_abs_diff(g[2], g_again[2]) == 0.0);
}

BOOST_AUTO_TEST_CASE(causal_with_first_key_blocked_leaves_row_zero) {
  // Causal query 0 sees only key 0; blocking key 0 blocks its whole row.
  Tensor q = randn64({1, 1, 3, 2}, 211), k = randn64({1, 1, 3, 2}, 212), v = randn64({1, 1, 3, 2}, 213);
  Tensor mask = ag::tensor({-kInf, 0, 0}, {3}, F64);
  auto r = ag::scaled_dot_product_attention(q, k, v, {.attn_mask = mask, .is_causal = true});
  const auto w = r.weights.to_vector(), o = r.output.to_vector();
  BOOST_TEST(w[0] == 0.0);
  BOOST_TEST(w[1] == 0.0);
  BOOST_TEST(w[2] == 0.0);
  BOOST_TEST(o[0] == 0.0);
  BOOST_TEST(o[1] == 0.0);
  BOOST_TEST(w[4] == 1.0);  // query 1 sees key 1 only
  ag::sum(r.output).backward();
  BOOST_TEST(all_finite(q.grad()));
  BOOST_TEST(q.grad().to_vector()[0] == 0.0);
  BOOST_TEST(q.grad().to_vector()[1] == 0.0);
}

BOOST_AUTO_TEST_CASE(gradcheck_with_fully_masked_rows) {
  Tensor q = randn64({2, 1, 3, 2}, 221), k = randn64({2, 1, 4, 2}, 222), v = randn64({2, 1, 4, 2}, 223);
  Tensor pad = ag::tensor({-kInf, -kInf, -kInf, -kInf, 0, 0, -kInf, 0}, {2, 1, 1, 4}, F64);  // batch 0: all padding
  check_gradients(
      [pad](const std::vector<Tensor>& x) {
        return both(ag::scaled_dot_product_attention(x[0], x[1], x[2], {.attn_mask = pad}));
      },
      {q, k, v});
}

// ---------------------------------------------------------------------------------------------
// Dropout

BOOST_AUTO_TEST_CASE(dropout_is_deterministic_per_seed) {
  Tensor q = randn64({2, 2, 5, 3}, 301), k = randn64({2, 2, 6, 3}, 302), v = randn64({2, 2, 6, 3}, 303);
  ag::Generator g1(7), g2(7), g3(8);
  auto a = ag::scaled_dot_product_attention(q, k, v, {.dropout_p = 0.4, .generator = &g1});
  auto b = ag::scaled_dot_product_attention(q, k, v, {.dropout_p = 0.4, .generator = &g2});
  auto c = ag::scaled_dot_product_attention(q, k, v, {.dropout_p = 0.4, .generator = &g3});
  auto plain = ag::scaled_dot_product_attention(q, k, v);
  BOOST_TEST(max_abs_diff(a.output, b.output) == 0.0);
  BOOST_TEST(max_abs_diff(a.output, c.output) > 1e-3);
  BOOST_TEST(max_abs_diff(a.output, plain.output) > 1e-3);
  // The weights returned are those before dropout.
  BOOST_TEST(max_abs_diff(a.weights, plain.weights) == 0.0);
  BOOST_TEST(g1.state() == g2.state());
  ag::Generator one_draw(7);  // one seed drawn for the whole call
  one_draw.next_u64();
  BOOST_TEST(g1.state() == one_draw.state());
}

BOOST_AUTO_TEST_CASE(dropout_zeroes_or_rescales_each_weight) {
  // With V = identity (S = d_v) the output row is the dropped weight row itself.
  const std::int64_t B = 2, H = 4, T = 20, S = 25;
  const double p = 0.3;
  Tensor q = randn64({B, H, T, 4}, 311, false), k = randn64({B, H, S, 4}, 312, false);
  std::vector<double> eye(static_cast<std::size_t>(B * H * S * S), 0.0);
  for (std::int64_t bh = 0; bh < B * H; ++bh)
    for (std::int64_t j = 0; j < S; ++j) eye[static_cast<std::size_t>((bh * S + j) * S + j)] = 1.0;
  Tensor v = ag::tensor(eye, {B, H, S, S}, F64);
  ag::Generator gen(5);
  auto r = ag::scaled_dot_product_attention(q, k, v, {.dropout_p = p, .generator = &gen});
  const auto o = r.output.to_vector(), w = r.weights.to_vector();
  std::size_t dropped = 0;
  for (std::size_t i = 0; i < o.size(); ++i) {
    if (o[i] == 0.0) {
      ++dropped;
    } else {
      BOOST_TEST(o[i] == w[i] / (1 - p), boost::test_tools::tolerance(1e-14));
    }
  }
  const double fraction = static_cast<double>(dropped) / static_cast<double>(o.size());
  BOOST_TEST(std::abs(fraction - p) < 0.03);  // 4000 draws: standard deviation ≈ 0.007
}

BOOST_AUTO_TEST_CASE(dropout_matches_composed_dropout_op) {
  // The fused op draws like ag::dropout (one seed per call; weight n of the row-major (B, H, T, S)
  // dropped when its Philox uniform is < p), so from the same generator state both paths drop
  // the same weights.
  Tensor q = randn64({2, 2, 4, 3}, 331), k = randn64({2, 2, 5, 3}, 332), v = randn64({2, 2, 5, 2}, 333);
  Tensor r1 = randn64({2, 2, 4, 2}, 334, false), r2 = randn64({2, 2, 4, 5}, 335, false);
  ag::Generator g_fused(12), g_composed(12);
  auto fused = ag::scaled_dot_product_attention(q, k, v, {.dropout_p = 0.25, .generator = &g_fused});
  auto plain = composed(q, k, v, Tensor(), false, 1.0 / std::sqrt(3.0));
  ag::SdpaResult reference{ag::matmul(ag::dropout(plain.weights, 0.25, true, g_composed), v), plain.weights};
  BOOST_TEST(max_abs_diff(fused.output, reference.output) < 1e-12);
  const auto g1 = grads_of(fused, r1, r2, {q, k, v});
  const auto g2 = grads_of(reference, r1, r2, {q, k, v});
  for (std::size_t i = 0; i < 3; ++i) BOOST_TEST(max_abs_diff(g1[i], g2[i]) < 1e-12);
}

BOOST_AUTO_TEST_CASE(dropout_p_one_drops_everything) {
  ag::Generator gen(1);
  auto r = ag::scaled_dot_product_attention(randn64({1, 1, 2, 2}, 1), randn64({1, 1, 2, 2}, 2),
                                            randn64({1, 1, 2, 2}, 3), {.dropout_p = 1.0, .generator = &gen});
  BOOST_TEST(all_zero(r.output));
  BOOST_TEST(!all_zero(r.weights));
}

BOOST_AUTO_TEST_CASE(gradcheck_with_dropout_and_fixed_generator) {
  Tensor q = randn64({2, 2, 3, 2}, 321), k = randn64({2, 2, 4, 2}, 322), v = randn64({2, 2, 4, 3}, 323);
  Tensor mask = randn64({3, 4}, 324, false);
  auto gen = std::make_shared<ag::Generator>();
  check_gradients(
      [gen, mask](const std::vector<Tensor>& x) {
        gen->manual_seed(99);  // the same dropout mask at every evaluation
        return both(ag::scaled_dot_product_attention(x[0], x[1], x[2],
                                                     {.attn_mask = mask, .dropout_p = 0.5, .generator = gen.get()}));
      },
      {q, k, v});
}

// ---------------------------------------------------------------------------------------------
// Determinism, saved tensors

BOOST_AUTO_TEST_CASE(results_do_not_depend_on_thread_count) {
  const int threads = ag::get_num_threads();
  auto run = [](int n) {
    ag::set_num_threads(n);
    Tensor q = randn64({3, 4, 33, 16}, 401), k = randn64({3, 4, 40, 16}, 402), v = randn64({3, 4, 40, 8}, 403);
    Tensor mask = randn64({33, 40}, 404, false);
    auto r = ag::scaled_dot_product_attention(q, k, v, {.attn_mask = mask});
    auto g = grads_of(r, randn64({3, 4, 33, 8}, 405, false), randn64({3, 4, 33, 40}, 406, false), {q, k, v});
    g.push_back(r.output);
    g.push_back(r.weights);
    return g;
  };
  const auto one = run(1);
  const auto several = run(4);
  ag::set_num_threads(threads);
  for (std::size_t i = 0; i < one.size(); ++i) BOOST_TEST(max_abs_diff(one[i], several[i]) == 0.0);
}

BOOST_AUTO_TEST_CASE(changing_a_saved_input_in_place_is_caught) {
  Tensor q = randn64({1, 1, 2, 2}, 1), k = randn64({1, 1, 2, 2}, 2), v = randn64({1, 1, 2, 2}, 3);
  auto r = ag::scaled_dot_product_attention(q, k, v);
  {
    ag::NoGradGuard guard;
    k.mul_(2.0);
  }
  std::string message;
  try {
    ag::sum(r.output).backward();
  } catch (const std::runtime_error& e) {
    message = e.what();
  }
  BOOST_TEST(message.find("scaled_dot_product_attention: a tensor of shape [1, 1, 2, 2] saved for backward") == 0u,
             message);
}

// ---------------------------------------------------------------------------------------------
// Errors name the op and the shapes

BOOST_AUTO_TEST_CASE(head_dim_mismatch_names_shapes) {
  Tensor q = ag::zeros({1, 2, 3, 4}, F64), k = ag::zeros({1, 2, 5, 3}, F64), v = ag::zeros({1, 2, 5, 3}, F64);
  BOOST_TEST(error_of([&] { ag::scaled_dot_product_attention(q, k, v); }) ==
             "scaled_dot_product_attention: q and k head dims differ: [1, 2, 3, 4] and [1, 2, 5, 3]");
}

BOOST_AUTO_TEST_CASE(rank_other_than_four_is_rejected) {
  Tensor q3 = ag::zeros({2, 3, 4}, F64), q4 = ag::zeros({1, 2, 3, 4}, F64);
  const std::string e = error_of([&] { ag::scaled_dot_product_attention(q3, q4, q4); });
  BOOST_TEST(e.find("scaled_dot_product_attention:") == 0u);
  BOOST_TEST(e.find("4-D") != std::string::npos);
  BOOST_TEST(e.find("[2, 3, 4]") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(dtype_mismatch_is_rejected) {
  Tensor q = ag::zeros({1, 1, 2, 2}, F64), k32 = ag::zeros({1, 1, 2, 2}, ag::Dtype::Float32);
  BOOST_TEST(error_of([&] { ag::scaled_dot_product_attention(q, k32, q); }) ==
             "scaled_dot_product_attention: dtypes differ: q Float64, k Float32, v Float64");
  Tensor mask32 = ag::zeros({2, 2}, ag::Dtype::Float32);
  BOOST_TEST(error_of([&] { ag::scaled_dot_product_attention(q, q, q, {.attn_mask = mask32}); }) ==
             "scaled_dot_product_attention: attn_mask dtype Float32 "
             "differs from q's Float64");
}

BOOST_AUTO_TEST_CASE(mask_that_does_not_broadcast_is_rejected) {
  Tensor q = ag::zeros({2, 3, 4, 2}, F64), k = ag::zeros({2, 3, 5, 2}, F64);
  BOOST_TEST(error_of([&] {
               ag::scaled_dot_product_attention(q, k, k, {.attn_mask = ag::zeros({5, 4}, F64)});
             }) ==
             "scaled_dot_product_attention: attn_mask of shape [5, 4] "
             "does not broadcast to (B, H, T, S) = "
             "[2, 3, 4, 5]");
  BOOST_CHECK_THROW(ag::scaled_dot_product_attention(q, k, k, {.attn_mask = ag::zeros({3, 1, 1, 5}, F64)}),
                    std::invalid_argument);
  BOOST_CHECK_THROW(ag::scaled_dot_product_attention(q, k, k, {.attn_mask = ag::zeros({1, 2, 3, 4, 5}, F64)}),
                    std::invalid_argument);
  // These do broadcast.
  BOOST_CHECK_NO_THROW(ag::scaled_dot_product_attention(q, k, k, {.attn_mask = ag::zeros({5}, F64)}));
  BOOST_CHECK_NO_THROW(ag::scaled_dot_product_attention(q, k, k, {.attn_mask = ag::zeros({2, 1, 1, 5}, F64)}));
  BOOST_CHECK_NO_THROW(ag::scaled_dot_product_attention(q, k, k, {.attn_mask = ag::zeros({3, 4, 1}, F64)}));
}

BOOST_AUTO_TEST_CASE(causal_needs_square_scores) {
  Tensor q = ag::zeros({1, 1, 3, 2}, F64), k = ag::zeros({1, 1, 4, 2}, F64);
  BOOST_TEST(error_of([&] { ag::scaled_dot_product_attention(q, k, k, {.is_causal = true}); }) ==
             "scaled_dot_product_attention: is_causal needs as many "
             "queries as keys (T == S); got q [1, 1, 3, 2] "
             "and k [1, 1, 4, 2]");
}

BOOST_AUTO_TEST_CASE(other_shape_and_argument_errors) {
  Tensor q = ag::zeros({1, 2, 3, 2}, F64);
  BOOST_TEST(error_of([&] { ag::scaled_dot_product_attention(q, q, ag::zeros({1, 2, 4, 2}, F64)); }) ==
             "scaled_dot_product_attention: k and v sequence lengths differ: [1, 2, 3, 2] and [1, 2, 4, 2]");
  BOOST_TEST(error_of([&] { ag::scaled_dot_product_attention(q, ag::zeros({2, 2, 3, 2}, F64), q); }) ==
             "scaled_dot_product_attention: batch and head dims differ: q [1, 2, 3, 2], k [2, 2, 3, 2], v [1, 2, 3, 2]");
  BOOST_CHECK_THROW(ag::scaled_dot_product_attention(q, Tensor(), q), std::invalid_argument);
  BOOST_CHECK_THROW(ag::scaled_dot_product_attention(q, q, q, {.dropout_p = 1.5}), std::invalid_argument);
  BOOST_CHECK_THROW(ag::scaled_dot_product_attention(q, q, q, {.dropout_p = -0.1}), std::invalid_argument);
  BOOST_CHECK_THROW(ag::scaled_dot_product_attention(q, q, q, {.scale = kInf}), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// Heads-last storage (B, L, H·d): the same op without the split into heads and the merge after

namespace {

// (B, L, H·d) -> (B, H, L, d) with plain ops: the reference for the heads-last entry point.
Tensor split_heads(const Tensor& x, std::int64_t H) {
  return ag::transpose(ag::reshape(x, {x.size(0), x.size(1), H, x.size(2) / H}), 1, 2);
}
Tensor merge_heads(const Tensor& x) {
  return ag::reshape(ag::transpose(x, 1, 2), {x.size(0), x.size(2), x.size(1) * x.size(3)});
}

}  // namespace

BOOST_AUTO_TEST_CASE(heads_last_matches_split_heads_forward_and_backward) {
  struct Case {
    const char* name;
    std::int64_t B, H, T, S, d_k, d_v;
    bool mask, causal;
    double dropout;
  };
  const Case cases[] = {
      {"plain_with_mask", 2, 3, 5, 7, 4, 3, true, false, 0.0},
      {"causal_row_blocks", 1, 2, 70, 70, 8, 5, true, true, 0.0},
      {"dropout", 2, 2, 6, 4, 3, 2, false, false, 0.3},
  };
  std::uint64_t seed = 700;
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT("case " << c.name) {
      Tensor q = randn64({c.B, c.T, c.H * c.d_k}, seed++), k = randn64({c.B, c.S, c.H * c.d_k}, seed++);
      Tensor v = randn64({c.B, c.S, c.H * c.d_v}, seed++);
      Tensor mask = c.mask ? randn64({c.T, c.S}, seed++) : Tensor();
      Tensor r1 = randn64({c.B, c.T, c.H * c.d_v}, seed++, false), r2 = randn64({c.B, c.H, c.T, c.S}, seed++, false);
      std::vector<Tensor> inputs{q, k, v};
      if (mask.defined()) inputs.push_back(mask);
      auto grads = [&](const Tensor& out, const Tensor& weights) {
        for (auto t : inputs) t.set_grad(Tensor());
        (ag::sum(out * r1) + ag::sum(weights * r2)).backward();
        std::vector<Tensor> g;
        for (const auto& t : inputs) g.push_back(t.grad());
        return g;
      };
      ag::Generator gen_last(seed), gen_first(seed);
      ++seed;
      auto last = ag::scaled_dot_product_attention_heads_last(
          q, k, v, c.H, {.attn_mask = mask, .dropout_p = c.dropout, .is_causal = c.causal, .generator = &gen_last});
      auto first = ag::scaled_dot_product_attention(
          split_heads(q, c.H), split_heads(k, c.H), split_heads(v, c.H),
          {.attn_mask = mask, .dropout_p = c.dropout, .is_causal = c.causal, .generator = &gen_first});
      BOOST_TEST(last.output.shape() == (ag::Shape{c.B, c.T, c.H * c.d_v}));
      BOOST_TEST(max_abs_diff(last.output, merge_heads(first.output)) < 1e-12);
      BOOST_TEST(max_abs_diff(last.weights, first.weights) < 1e-12);
      const auto g_last = grads(last.output, last.weights);
      const auto g_first = grads(merge_heads(first.output), first.weights);
      for (std::size_t i = 0; i < inputs.size(); ++i) BOOST_TEST(max_abs_diff(g_last[i], g_first[i]) < 1e-12);
    }
  }
}

BOOST_AUTO_TEST_CASE(gradcheck_heads_last) {
  Tensor q = randn64({2, 3, 4}, 801), k = randn64({2, 5, 4}, 802), v = randn64({2, 5, 6}, 803);
  Tensor mask = randn64({3, 5}, 804, false);
  check_gradients(
      [mask](const std::vector<Tensor>& x) {
        return both(ag::scaled_dot_product_attention_heads_last(x[0], x[1], x[2], 2, {.attn_mask = mask}));
      },
      {q, k, v});
}

BOOST_AUTO_TEST_CASE(heads_last_argument_errors_name_the_op_and_shapes) {
  Tensor q = ag::zeros({1, 3, 4}, F64);
  BOOST_TEST(error_of([&] { ag::scaled_dot_product_attention_heads_last(ag::zeros({1, 1, 3, 4}, F64), q, q, 2); }) ==
             "scaled_dot_product_attention_heads_last: q, k and v must be 3-D (B, seq, heads * head_dim); got q "
             "[1, 1, 3, 4], k [1, 3, 4], v [1, 3, 4]");
  BOOST_TEST(error_of([&] { ag::scaled_dot_product_attention_heads_last(q, q, q, 3); }) ==
             "scaled_dot_product_attention_heads_last: the last dims of q [1, 3, 4], k [1, 3, 4], v [1, 3, 4] must "
             "be divisible by num_heads = 3");
  BOOST_TEST(error_of([&] { ag::scaled_dot_product_attention_heads_last(q, q, q, 0); }) ==
             "scaled_dot_product_attention_heads_last: num_heads must be positive, got 0");
  const std::string causal = error_of([&] {
    ag::scaled_dot_product_attention_heads_last(q, ag::zeros({1, 5, 4}, F64), ag::zeros({1, 5, 4}, F64), 2,
                                                {.is_causal = true});
  });
  BOOST_TEST(causal.find("scaled_dot_product_attention_heads_last: is_causal needs as many queries as keys") == 0);
  BOOST_CHECK_THROW(ag::scaled_dot_product_attention_heads_last(q, q, q, 2, {.attn_mask = ag::zeros({2, 3}, F64)}),
                    std::invalid_argument);
  BOOST_CHECK_THROW(ag::scaled_dot_product_attention_heads_last(q, Tensor(), q, 2), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------
// Packed self-attention: q, k, v as the three column blocks of one (B, T, 3·H·d) tensor

BOOST_AUTO_TEST_CASE(packed_matches_heads_last_forward_and_backward) {
  struct Case {
    const char* name;
    std::int64_t B, H, T, d;
    bool mask, causal;
    double dropout;
  };
  const Case cases[] = {
      {"plain_with_mask", 2, 3, 5, 4, true, false, 0.0},
      {"causal_row_blocks", 1, 2, 70, 8, true, true, 0.0},
      {"dropout", 2, 2, 6, 3, false, false, 0.3},
  };
  std::uint64_t seed = 900;
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT("case " << c.name) {
      const std::int64_t E = c.H * c.d;
      Tensor qkv = randn64({c.B, c.T, 3 * E}, seed++);
      Tensor mask = c.mask ? randn64({c.T, c.T}, seed++) : Tensor();
      Tensor r1 = randn64({c.B, c.T, E}, seed++, false), r2 = randn64({c.B, c.H, c.T, c.T}, seed++, false);
      // The same numbers as three separate tensors (leaves of their own).
      Tensor q = ag::narrow(qkv, 2, 0, E).detach().clone().requires_grad_(true);
      Tensor k = ag::narrow(qkv, 2, E, E).detach().clone().requires_grad_(true);
      Tensor v = ag::narrow(qkv, 2, 2 * E, E).detach().clone().requires_grad_(true);
      ag::Generator gen_packed(seed), gen_last(seed);
      ++seed;
      auto packed = ag::scaled_dot_product_attention_packed(
          qkv, c.H, {.attn_mask = mask, .dropout_p = c.dropout, .is_causal = c.causal, .generator = &gen_packed});
      auto last = ag::scaled_dot_product_attention_heads_last(
          q, k, v, c.H, {.attn_mask = mask, .dropout_p = c.dropout, .is_causal = c.causal, .generator = &gen_last});
      BOOST_TEST(packed.output.shape() == (ag::Shape{c.B, c.T, E}));
      BOOST_TEST(max_abs_diff(packed.output, last.output) < 1e-12);
      BOOST_TEST(max_abs_diff(packed.weights, last.weights) < 1e-12);
      Tensor mask_grad_packed, mask_grad_last;
      if (mask.defined()) mask.set_grad(Tensor());
      (ag::sum(packed.output * r1) + ag::sum(packed.weights * r2)).backward();
      if (mask.defined()) {
        mask_grad_packed = mask.grad();
        mask.set_grad(Tensor());
      }
      (ag::sum(last.output * r1) + ag::sum(last.weights * r2)).backward();
      if (mask.defined()) mask_grad_last = mask.grad();
      // d qkv = [dq | dk | dv]
      BOOST_TEST(qkv.grad().shape() == qkv.shape());
      BOOST_TEST(max_abs_diff(ag::narrow(qkv.grad(), 2, 0, E), q.grad()) < 1e-12);
      BOOST_TEST(max_abs_diff(ag::narrow(qkv.grad(), 2, E, E), k.grad()) < 1e-12);
      BOOST_TEST(max_abs_diff(ag::narrow(qkv.grad(), 2, 2 * E, E), v.grad()) < 1e-12);
      if (mask.defined()) BOOST_TEST(max_abs_diff(mask_grad_packed, mask_grad_last) < 1e-12);
    }
  }
}

BOOST_AUTO_TEST_CASE(gradcheck_packed) {
  Tensor qkv = randn64({2, 3, 12}, 951);
  Tensor mask = randn64({3, 3}, 952, false);
  check_gradients(
      [mask](const std::vector<Tensor>& x) {
        return both(ag::scaled_dot_product_attention_packed(x[0], 2, {.attn_mask = mask}));
      },
      {qkv});
}

BOOST_AUTO_TEST_CASE(gradcheck_packed_causal_and_mask) {
  Tensor qkv = randn64({1, 4, 6}, 953), mask = randn64({1, 1, 4, 4}, 954);
  check_gradients(
      [](const std::vector<Tensor>& x) {
        return both(ag::scaled_dot_product_attention_packed(x[0], 1, {.attn_mask = x[1], .is_causal = true}));
      },
      {qkv, mask});
}

BOOST_AUTO_TEST_CASE(packed_argument_errors_name_the_op_and_shapes) {
  BOOST_TEST(error_of([&] { ag::scaled_dot_product_attention_packed(ag::zeros({1, 1, 3, 6}, F64), 1); }) ==
             "scaled_dot_product_attention_packed: qkv must be 3-D (B, seq, 3 * heads * head_dim); got [1, 1, 3, 6]");
  BOOST_TEST(error_of([&] { ag::scaled_dot_product_attention_packed(ag::zeros({1, 3, 8}, F64), 2); }) ==
             "scaled_dot_product_attention_packed: the last dim of qkv [1, 3, 8] must be divisible by 3 * num_heads = 6");
  BOOST_TEST(error_of([&] { ag::scaled_dot_product_attention_packed(ag::zeros({1, 3, 6}, F64), 0); }) ==
             "scaled_dot_product_attention_packed: num_heads must be positive, got 0");
  BOOST_TEST(error_of([&] { ag::scaled_dot_product_attention_packed(Tensor(), 1); }) ==
             "scaled_dot_product_attention_packed: qkv is an undefined tensor (default-constructed: no value)");
  BOOST_CHECK_THROW(
      ag::scaled_dot_product_attention_packed(ag::zeros({1, 3, 6}, F64), 1, {.attn_mask = ag::zeros({2, 3}, F64)}),
      std::invalid_argument);
}
