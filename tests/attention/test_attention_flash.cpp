// The tiled attention core (need_weights = false) against the untiled kernel (need_weights =
// true, the reference): forward and every gradient agree to 1e-12 in float64, for every mask
// kind, causal, cross-attention, T = 1, shapes that are not multiples of the tile, fully blocked
// rows and all three layouts; float32 close to float64; argument errors unchanged; the nn layer
// routing need_weights = false to it.
#define BOOST_TEST_MODULE attention_flash
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

#include "../autograd/src/kernels/attention_flash_tiles.hpp"
#include "test_attention_flash_support.hpp"
#include "test_support.hpp"

using namespace test_support::prelude;
using namespace flash_test;
using test_support::all_finite;
using test_support::max_abs_diff;

namespace {

// Runs `c` on both cores and checks that they agree: the output and the gradients of every
// input that requires grad (the mask's included), and that the tiled core did run.
void check_agrees(const Case& c, double tol = 1e-12) {
  const std::vector<Tensor> in = make_inputs(c, 11);
  const Tensor r = readout(c, 12);
  const Run ref = run(c, in, r, true);
  const std::int64_t before = ag::sdpa::tiled_calls();
  const Run tiled = run(c, in, r, false);
  BOOST_TEST(ag::sdpa::tiled_calls() == before + 1);
  BOOST_TEST(!tiled.weights.defined());
  BOOST_TEST(max_abs_diff(ref.output, tiled.output) <= tol);
  BOOST_TEST(all_finite(tiled.output));
  BOOST_REQUIRE_EQUAL(ref.grads.size(), tiled.grads.size());
  for (std::size_t i = 0; i < ref.grads.size(); ++i) {
    BOOST_TEST_CONTEXT("gradient of input " << i) {
      BOOST_REQUIRE(tiled.grads[i].defined());
      BOOST_TEST(all_finite(tiled.grads[i]));
      BOOST_TEST(max_abs_diff(ref.grads[i], tiled.grads[i]) <= tol);
    }
  }
}

// A (rows, cols) mask of random finite values with -inf at the flat positions `blocked`.
Tensor mask_with(const ag::Shape& shape, const std::vector<std::int64_t>& blocked, std::uint64_t seed) {
  ag::Generator gen(seed);
  std::vector<double> m = ag::randn(shape, F64, gen).to_vector();
  for (std::int64_t i : blocked) m[static_cast<std::size_t>(i)] = -kInf;
  return ag::tensor(m, shape, F64);
}

const Layout kLayouts[] = {Layout::HeadsFirst, Layout::HeadsLast, Layout::Packed};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(tiled_vs_untiled, SmallTiles)

BOOST_AUTO_TEST_CASE(no_mask_every_layout) {
  for (Layout l : kLayouts) {
    BOOST_TEST_CONTEXT("layout " << static_cast<int>(l)) {
      check_agrees(Case{l, 2, 2, 7, 7, 5, 5});
      if (l != Layout::Packed) check_agrees(Case{l, 2, 3, 7, 9, 5, 3});  // S != T, d_v != d_k
    }
  }
}

BOOST_AUTO_TEST_CASE(causal_every_layout) {
  for (Layout l : kLayouts) {
    BOOST_TEST_CONTEXT("layout " << static_cast<int>(l)) {
      check_agrees(Case{l, 2, 2, 10, 10, 4, 4, Tensor(), true});
      check_agrees(Case{l, 1, 1, 13, 13, 3, 3, Tensor(), true});
    }
  }
}

BOOST_AUTO_TEST_CASE(single_query_and_single_key) {
  check_agrees(Case{Layout::HeadsFirst, 2, 2, 1, 9, 4, 3});
  check_agrees(Case{Layout::HeadsLast, 2, 2, 1, 1, 4, 3});
  check_agrees(Case{Layout::Packed, 1, 2, 1, 1, 4, 4, Tensor(), true});
  check_agrees(Case{Layout::HeadsFirst, 1, 1, 5, 1, 2, 2});
}

BOOST_AUTO_TEST_CASE(two_d_mask_with_gradient) {
  for (Layout l : kLayouts) {
    const std::int64_t S = l == Layout::Packed ? 7 : 9;
    BOOST_TEST_CONTEXT("layout " << static_cast<int>(l)) {
      check_agrees(Case{l, 2, 2, 7, S, 4, 4, mask_with({7, S}, {0, 5, 13, 20}, 3), false, true});
      check_agrees(Case{l, 2, 2, 7, S, 4, 4, mask_with({7, S}, {3}, 4), l == Layout::Packed, true});
    }
  }
}

BOOST_AUTO_TEST_CASE(key_padding_mask) {
  // (B, 1, 1, S): batch 0 pads its last three keys, batch 1 its first.
  const Tensor pad = mask_with({2, 1, 1, 9}, {6, 7, 8, 9}, 5);
  check_agrees(Case{Layout::HeadsFirst, 2, 3, 7, 9, 4, 3, pad, false, true});
  check_agrees(Case{Layout::HeadsLast, 2, 3, 7, 9, 4, 3, pad, false, false});
  const Tensor pad_self = mask_with({2, 1, 1, 9}, {8, 9, 10}, 6);
  check_agrees(Case{Layout::Packed, 2, 2, 9, 9, 4, 4, pad_self, true, true});
}

BOOST_AUTO_TEST_CASE(per_head_masks) {
  check_agrees(Case{Layout::HeadsFirst, 2, 2, 7, 9, 4, 3, mask_with({2, 2, 7, 9}, {1, 40, 77, 200}, 7), false, true});
  check_agrees(Case{Layout::HeadsLast, 2, 2, 7, 9, 4, 3, mask_with({2, 7, 9}, {2, 64}, 8), false, true});
  check_agrees(Case{Layout::Packed, 2, 2, 8, 8, 3, 3, mask_with({2, 1, 8, 8}, {9, 100}, 9), true, true});
  check_agrees(Case{Layout::HeadsFirst, 2, 2, 7, 9, 4, 3, mask_with({1, 2, 7, 1}, {3}, 10), false, true});
}

BOOST_AUTO_TEST_CASE(fully_blocked_rows_are_zero) {
  // Row 2 of batch 1 sees no key at all; so does row 0 of every batch in the 2-D mask.
  std::vector<std::int64_t> row;
  for (std::int64_t j = 0; j < 9; ++j) row.push_back(7 * 9 + 2 * 9 + j);
  const Tensor m = mask_with({2, 1, 7, 9}, row, 11);
  for (Layout l : {Layout::HeadsFirst, Layout::HeadsLast}) check_agrees(Case{l, 2, 2, 7, 9, 4, 3, m, false, true});
  const Tensor m2 = mask_with({8, 8}, {0, 1, 2, 3, 4, 5, 6, 7}, 12);
  check_agrees(Case{Layout::Packed, 1, 2, 8, 8, 3, 3, m2, true, true});

  const Case c{Layout::HeadsFirst, 2, 2, 7, 9, 4, 3, m, false, true};
  const std::vector<Tensor> in = make_inputs(c, 13);
  const Run tiled = run(c, in, readout(c, 14), false);
  const std::vector<double> out = tiled.output.to_vector();
  for (std::int64_t h = 0; h < 2; ++h)
    for (std::int64_t j = 0; j < 3; ++j)  // output (1, h, 2, j) of (2, 2, 7, 3)
      BOOST_TEST(out[static_cast<std::size_t>(((1 * 2 + h) * 7 + 2) * 3 + j)] == 0.0);
}

BOOST_AUTO_TEST_CASE(other_tile_shapes) {
  // Tiles taller than wide, one-row tiles, and tiles larger than the sequence.
  for (auto [bq, bk] : {std::pair<std::int64_t, std::int64_t>{5, 2}, {1, 1}, {64, 128}, {4, 4}}) {
    ag::sdpa::flash_tiles().block_q = bq;
    ag::sdpa::flash_tiles().block_k = bk;
    BOOST_TEST_CONTEXT("tiles " << bq << " x " << bk) {
      check_agrees(Case{Layout::HeadsFirst, 1, 2, 11, 11, 3, 3, mask_with({11, 11}, {5}, 15), true, true});
      check_agrees(Case{Layout::HeadsLast, 2, 1, 6, 10, 3, 2, mask_with({2, 1, 1, 10}, {0, 19}, 16), false, true});
    }
  }
}

BOOST_AUTO_TEST_CASE(consecutive_calls_read_their_own_operands) {
  // Each thread keeps its copy of a slice's operands between calls. Two forwards with the same
  // shapes and other values, then the backward of the first and of the second: each reads its own.
  for (Layout l : kLayouts) {
    BOOST_TEST_CONTEXT("layout " << static_cast<int>(l)) {
      const Case c{l, 1, 1, 9, 9, 3, 3, Tensor(), true};  // one slice: the same slice every call
      const std::vector<Tensor> a = make_inputs(c, 40), b = make_inputs(c, 41);
      const Tensor r = readout(c, 42);
      const Run ref_a = run(c, a, r, true), ref_b = run(c, b, r, true);
      for (auto t : a) t.set_grad(Tensor());
      for (auto t : b) t.set_grad(Tensor());
      const ag::SdpaResult out_a = call(c, a, false), out_b = call(c, b, false);
      ag::sum(out_a.output * r).backward();
      ag::sum(out_b.output * r).backward();
      BOOST_TEST(max_abs_diff(ref_a.output, out_a.output.detach()) <= 1e-12);
      BOOST_TEST(max_abs_diff(ref_b.output, out_b.output.detach()) <= 1e-12);
      for (std::size_t i = 0; i < a.size(); ++i) {
        BOOST_TEST(max_abs_diff(ref_a.grads[i], a[i].grad()) <= 1e-12, "first call, input " << i);
        BOOST_TEST(max_abs_diff(ref_b.grads[i], b[i].grad()) <= 1e-12, "second call, input " << i);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(float32_close_to_float64) {
  const Case c{Layout::HeadsLast, 2, 2, 13, 13, 8, 8, mask_with({13, 13}, {4}, 17), true, true};
  const std::vector<Tensor> in = make_inputs(c, 18);
  const Tensor r = readout(c, 19);
  const Run f64 = run(c, in, r, false);
  std::vector<Tensor> in32;
  for (const Tensor& t : in) in32.push_back(t.detach().to(ag::Dtype::Float32).requires_grad_(true));
  const Run f32 = run(c, in32, r.to(ag::Dtype::Float32), false);
  BOOST_TEST((f32.output.dtype() == ag::Dtype::Float32));
  BOOST_TEST(max_abs_diff(f64.output, f32.output.to(F64)) <= 1e-5);
  for (std::size_t i = 0; i < f64.grads.size(); ++i)
    BOOST_TEST(max_abs_diff(f64.grads[i], f32.grads[i].to(F64)) <= 2e-5, "gradient " << i);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_CASE(small_calls_keep_the_untiled_kernel) {
  // Below min_tiled_scores the untiled kernel runs (faster there); the weights are not returned.
  const Case c{Layout::HeadsFirst, 1, 1, 4, 4, 2, 2};
  const std::vector<Tensor> in = make_inputs(c, 20);
  const std::int64_t before = ag::sdpa::tiled_calls();
  const Run r = run(c, in, readout(c, 21), false);
  BOOST_TEST(ag::sdpa::tiled_calls() == before);
  BOOST_TEST(!r.weights.defined());
}

BOOST_AUTO_TEST_CASE(errors_are_those_of_the_untiled_op) {
  SmallTiles tiles;
  const Tensor q = ag::zeros({1, 2, 3, 4}, F64), k = ag::zeros({1, 2, 5, 4}, F64), v = ag::zeros({1, 2, 5, 3}, F64);
  const Tensor bad_k = ag::zeros({1, 2, 5, 3}, F64), bad_mask = ag::zeros({4, 5}, F64);
  auto both_fail_alike = [](const std::function<void(bool)>& f) {
    const std::string with = test_support::error_of([&] { f(true); }, "none");
    const std::string without = test_support::error_of([&] { f(false); }, "none");
    BOOST_TEST(with != "none");
    BOOST_TEST(with == without);
  };
  both_fail_alike([&](bool w) { ag::scaled_dot_product_attention(q, bad_k, v, {.need_weights = w}); });
  both_fail_alike(
      [&](bool w) { ag::scaled_dot_product_attention(q, k, v, {.need_weights = w, .attn_mask = bad_mask}); });
  both_fail_alike([&](bool w) { ag::scaled_dot_product_attention(q, k, v, {.need_weights = w, .is_causal = true}); });
  both_fail_alike([&](bool w) { ag::scaled_dot_product_attention(q, k, v, {.need_weights = w, .scale = NAN}); });
  both_fail_alike([&](bool w) { ag::scaled_dot_product_attention(q, k, v, {.need_weights = w, .dropout_p = 1.5}); });
  const Tensor qkv = ag::zeros({1, 3, 10}, F64);
  both_fail_alike([&](bool w) { ag::scaled_dot_product_attention_packed(qkv, 2, {.need_weights = w}); });
  const Tensor ql = ag::zeros({1, 3, 4}, F64), kl = ag::zeros({1, 5, 6}, F64);
  both_fail_alike([&](bool w) { ag::scaled_dot_product_attention_heads_last(ql, kl, kl, 2, {.need_weights = w}); });
}

BOOST_AUTO_TEST_CASE(multihead_attention_without_weights_runs_tiled) {
  SmallTiles tiles;
  ag::Generator gen(30);
  nn::MultiHeadAttentionOptions o;
  o.embed_dim = 8;
  o.num_heads = 2;
  o.dtype = F64;
  nn::MultiHeadAttention mha(o, gen);
  const Tensor x = ag::randn({2, 9, 8}, F64, gen).requires_grad_(true);
  const Tensor kv = ag::randn({2, 6, 8}, F64, gen).requires_grad_(true);
  const Tensor pad = ag::tensor({0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0}, {2, 6}, F64);
  for (bool self : {true, false}) {
    BOOST_TEST_CONTEXT("self-attention " << self) {
      nn::AttentionOptions with;
      with.is_causal = self;
      if (!self) with.key_padding_mask = pad;
      nn::AttentionOptions without = with;
      without.need_weights = false;
      const Tensor& key = self ? x : kv;
      auto step = [&](const nn::AttentionOptions& opt, Tensor& out) {
        x.set_grad(Tensor());
        kv.set_grad(Tensor());
        out = mha(x, key, key, opt).output;
        ag::sum(out * out).backward();
        return std::vector<Tensor>{x.grad(), self ? Tensor() : kv.grad()};
      };
      Tensor out_ref, out_tiled;
      const auto g_ref = step(with, out_ref);
      const std::int64_t before = ag::sdpa::tiled_calls();
      const auto g_tiled = step(without, out_tiled);
      BOOST_TEST(ag::sdpa::tiled_calls() == before + 1);
      BOOST_TEST(max_abs_diff(out_ref, out_tiled) <= 1e-12);
      BOOST_TEST(max_abs_diff(g_ref[0], g_tiled[0]) <= 1e-12);
      if (!self) BOOST_TEST(max_abs_diff(g_ref[1], g_tiled[1]) <= 1e-12);
    }
  }
}
