// Dropout on the tiled attention core: the mask is the call's Philox stream, element
// ((b·H + h)·T + i)·S + j, whatever the tile sizes and the thread count; the tiled core, the
// untiled kernel and the composition softmax -> ag::dropout -> matmul agree to 1e-12 in float64,
// forward and every gradient, masked and causal, in every layout; gradcheck with the mask fixed
// by its seed (and a control that changes it); p = 0, p = 1, the one generator draw per call and
// the bad-p message; the nn layer's composed core against the tiled one.
#define BOOST_TEST_MODULE attention_flash_dropout
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

#include "../autograd/src/kernels/philox.hpp"
#include "test_attention_flash_support.hpp"
#include "test_support.hpp"

using namespace test_support::prelude;
using namespace flash_test;
using test_support::all_finite;
using test_support::max_abs_diff;

namespace {

// The case's op with dropout p, its generator made afresh from `seed` (the same mask every call).
ag::SdpaResult call_drop(const Case& c, const std::vector<Tensor>& in, bool need_weights, double p,
                         ag::Generator& gen) {
  const std::size_t n = c.layout == Layout::Packed ? 1 : 3;
  const Tensor mask = in.size() > n ? in[n] : Tensor();
  const ag::SdpaOptions options{.need_weights = need_weights,
                                .attn_mask = mask,
                                .dropout_p = p,
                                .is_causal = c.causal,
                                .scale = c.scale,
                                .generator = &gen};
  switch (c.layout) {
    case Layout::HeadsFirst:
      return ag::scaled_dot_product_attention(in[0], in[1], in[2], options);
    case Layout::HeadsLast:
      return ag::scaled_dot_product_attention_heads_last(in[0], in[1], in[2], c.H, options);
    case Layout::Packed:
      break;
  }
  return ag::scaled_dot_product_attention_packed(in[0], c.H, options);
}

// (B, H, L, d) of an operand laid out as the case's layout (packed: `which` of q, k, v).
Tensor heads_of(const Case& c, const std::vector<Tensor>& in, int which) {
  if (c.layout == Layout::HeadsFirst) return in[static_cast<std::size_t>(which)];
  Tensor x = c.layout == Layout::Packed ? ag::split(in[0], c.H * c.d_k, 2)[static_cast<std::size_t>(which)]
                                         : in[static_cast<std::size_t>(which)];
  return ag::transpose(ag::reshape(x, {x.size(0), x.size(1), c.H, x.size(2) / c.H}), 1, 2);
}

// The reference from autograd ops: softmax(scale·q·kᵀ + mask (+ causal -inf)), ag::dropout on
// the (B, H, T, S) weights from the same generator state, times v; laid out as the case's output.
Tensor composed(const Case& c, const std::vector<Tensor>& in, double p, ag::Generator& gen) {
  const Tensor q = heads_of(c, in, 0), k = heads_of(c, in, 1), v = heads_of(c, in, 2);
  const double scale = c.scale != 0.0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  Tensor scores = ag::matmul(q, ag::transpose(k, -2, -1)) * scale;
  const std::size_t n = c.layout == Layout::Packed ? 1 : 3;
  if (in.size() > n) scores = scores + in[n];
  if (c.causal) {
    std::vector<double> m(static_cast<std::size_t>(c.T * c.T), 0.0);
    for (std::int64_t i = 0; i < c.T; ++i)
      for (std::int64_t j = i + 1; j < c.T; ++j) m[static_cast<std::size_t>(i * c.T + j)] = -kInf;
    scores = scores + ag::tensor(m, {c.T, c.T}, F64);
  }
  const Tensor out = ag::matmul(ag::dropout(ag::softmax(scores, -1), p, true, gen), v);
  if (c.layout == Layout::HeadsFirst) return out;
  return ag::reshape(ag::transpose(out, 1, 2), {out.size(0), out.size(2), out.size(1) * out.size(3)});
}

enum class Path { Composed, Untiled, Tiled };

// The output and the gradients of L = Σ output ⊙ R on one path, dropout p from Generator(seed).
Run run_path(Path path, const Case& c, const std::vector<Tensor>& in, const Tensor& r, double p, std::uint64_t seed) {
  for (auto t : in) t.set_grad(Tensor());
  ag::Generator gen(seed);
  const std::int64_t before = ag::sdpa::tiled_calls();
  const Tensor out = path == Path::Composed ? composed(c, in, p, gen) : call_drop(c, in, path == Path::Untiled, p, gen).output;
  BOOST_TEST(ag::sdpa::tiled_calls() == before + (path == Path::Tiled ? 1 : 0));
  ag::sum(out * r).backward();
  Run res{out.detach(), Tensor(), {}};
  for (const auto& t : in)
    if (t.requires_grad()) res.grads.push_back(t.grad());
  return res;
}

void check_close(const Run& a, const Run& b, const std::string& what) {
  BOOST_TEST(max_abs_diff(a.output, b.output) <= 1e-12, what << ": output");
  BOOST_TEST(all_finite(b.output), what);
  BOOST_REQUIRE_EQUAL(a.grads.size(), b.grads.size());
  for (std::size_t i = 0; i < a.grads.size(); ++i)
    BOOST_TEST(max_abs_diff(a.grads[i], b.grads[i]) <= 1e-12, what << ": gradient of input " << i);
}

// A mask of random finite values.
Tensor finite_mask(const ag::Shape& shape, std::uint64_t seed) {
  ag::Generator gen(seed);
  return ag::randn(shape, F64, gen);
}

// A (B, 1, 1, S) key padding mask (-inf on the last `pad` keys of batch 0) plus finite values.
Tensor padding(std::int64_t B, std::int64_t S, std::int64_t pad, std::uint64_t seed) {
  std::vector<double> m(static_cast<std::size_t>(B * S), 0.0);
  for (std::int64_t j = S - pad; j < S; ++j) m[static_cast<std::size_t>(j)] = -kInf;
  return ag::tensor(m, {B, 1, 1, S}, F64) + finite_mask({B, 1, 1, S}, seed);
}

std::vector<Case> cases() {
  return {
      Case{Layout::HeadsFirst, 2, 2, 5, 7, 3, 2},
      Case{Layout::HeadsFirst, 1, 2, 7, 9, 3, 2, finite_mask({7, 9}, 2), false, true},
      Case{Layout::HeadsFirst, 2, 3, 9, 9, 2, 3, finite_mask({2, 3, 9, 9}, 3), true, true},
      Case{Layout::HeadsLast, 2, 2, 8, 8, 3, 3, padding(2, 8, 3, 4), true, true},
      Case{Layout::HeadsLast, 2, 2, 1, 6, 2, 2, finite_mask({2, 1, 1, 6}, 5), false, true},  // T = 1
      Case{Layout::Packed, 1, 2, 10, 10, 2, 2, finite_mask({2, 10, 10}, 6), true, true},       // (H, T, S)
      Case{Layout::Packed, 2, 1, 6, 6, 3, 3},
  };
}

bool all_zero(const Tensor& t) {
  for (double e : t.to_vector())
    if (e != 0.0) return false;
  return true;
}

}  // namespace

BOOST_AUTO_TEST_CASE(composed_untiled_and_tiled_agree_at_every_tile_size) {
  std::int64_t n = 0;
  for (const Case& c : cases()) {
    const std::vector<Tensor> in = make_inputs(c, 40 + static_cast<std::uint64_t>(n));
    const Tensor r = readout(c, 60 + static_cast<std::uint64_t>(n));
    const double p = n % 2 == 0 ? 0.3 : 0.55;
    const std::uint64_t seed = 80 + static_cast<std::uint64_t>(n++);
    BOOST_TEST_CONTEXT("case " << n << ", p = " << p) {
      const Run ref = run_path(Path::Composed, c, in, r, p, seed);
      check_close(ref, run_path(Path::Untiled, c, in, r, p, seed), "untiled");
      for (auto [bq, bk] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {3, 4}, {64, 128}}) {
        SmallTiles tiles(bq, bk);
        check_close(ref, run_path(Path::Tiled, c, in, r, p, seed), fmt::format("tiled {}x{}", bq, bk));
      }
      // Without dropout the three differ from it: the mask is really there.
      SmallTiles tiles;
      BOOST_TEST(max_abs_diff(ref.output, run_path(Path::Tiled, c, in, r, 0.0, seed).output) > 1e-3);
    }
  }
}

BOOST_AUTO_TEST_CASE(larger_shapes_cross_the_default_tiles) {
  // T = 150, S = 200 at the default 64 x 128 tiles (tiled at every size): partial tiles in both
  // directions; and causal 130 x 130.
  SmallTiles tiles(64, 128);
  for (const Case& c : {Case{Layout::HeadsLast, 1, 2, 150, 200, 4, 3, padding(1, 200, 0, 7), false, true},
                        Case{Layout::Packed, 1, 2, 130, 130, 4, 4, Tensor(), true}}) {
    const std::vector<Tensor> in = make_inputs(c, 90);
    const Tensor r = readout(c, 91);
    const Run ref = run_path(Path::Untiled, c, in, r, 0.2, 92);
    check_close(ref, run_path(Path::Tiled, c, in, r, 0.2, 92), "tiled");
    check_close(ref, run_path(Path::Composed, c, in, r, 0.2, 92), "composed");
  }
}

BOOST_AUTO_TEST_CASE(the_mask_is_the_stream_at_any_tile_size_and_thread_count) {
  // With V = I (S = d_v) the output row is the dropped weight row: O_bhij = P_bhij · Z_bhij, and
  // P > 0 everywhere (no mask), so O is 0 exactly where the stream drops element
  // ((b·H + h)·T + i)·S + j.
  const std::int64_t B = 2, H = 3, T = 13, S = 11;
  const double p = 0.4;
  ag::Generator init(1);
  const Tensor q = ag::randn({B, H, T, 3}, F64, init), k = ag::randn({B, H, S, 3}, F64, init);
  std::vector<double> eye(static_cast<std::size_t>(B * H * S * S), 0.0);
  for (std::int64_t bh = 0; bh < B * H; ++bh)
    for (std::int64_t j = 0; j < S; ++j) eye[static_cast<std::size_t>((bh * S + j) * S + j)] = 1.0;
  const Tensor v = ag::tensor(eye, {B, H, S, S}, F64);
  ag::Generator seed_gen(33);
  const ag::philox::DropoutStream stream(seed_gen.next_u64(), p);
  for (auto [bq, bk] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {3, 4}, {64, 128}, {5, 2}}) {
    SmallTiles tiles(bq, bk);
    std::vector<std::uint64_t> first;
    for (int threads : {1, 2, 3}) {
      test_support::ThreadCount tc(threads);
      ag::Generator gen(33);
      const std::int64_t before = ag::sdpa::tiled_calls();
      const Tensor o =
          ag::scaled_dot_product_attention(q, k, v, {.need_weights = false, .dropout_p = p, .generator = &gen}).output;
      BOOST_TEST(ag::sdpa::tiled_calls() == before + 1);
      BOOST_TEST(gen.state() == seed_gen.state());  // one draw for the whole call
      const std::vector<double> ov = o.to_vector();
      bool follows = true;
      for (std::size_t e = 0; e < ov.size(); ++e) follows = follows && (ov[e] != 0.0) == stream.kept(e);
      BOOST_TEST(follows, "tiles " << bq << "x" << bk << ", " << threads << " threads");
      if (first.empty()) first = bits(o);
      BOOST_TEST((bits(o) == first), "same tiles, same bits at " << threads << " threads");
    }
  }
}

BOOST_AUTO_TEST_CASE(same_bits_at_one_two_and_three_threads) {
  SmallTiles tiles(8, 16);
  const Case c{Layout::HeadsLast, 2, 3, 40, 40, 8, 8, finite_mask({40, 40}, 8), true, true};
  const std::vector<Tensor> in = make_inputs(c, 9);
  const Tensor r = readout(c, 10);
  std::vector<std::vector<std::uint64_t>> first;
  for (int threads : {1, 2, 3}) {
    test_support::ThreadCount tc(threads);
    const Run run_n = run_path(Path::Tiled, c, in, r, 0.3, 11);
    std::vector<std::vector<std::uint64_t>> now{bits(run_n.output)};
    for (const Tensor& g : run_n.grads) now.push_back(bits(g));
    if (first.empty()) first = now;
    for (std::size_t i = 0; i < now.size(); ++i)
      BOOST_TEST((now[i] == first[i]), "result " << i << " differs at " << threads << " threads");
  }
}

BOOST_FIXTURE_TEST_SUITE(tiled_dropout_gradients, SmallTiles)

// The op's output, flattened, on the tiled core, the dropout mask fixed by a fresh generator.
ag::GradcheckFn tiled_fn(const Case& c, double p, std::uint64_t seed) {
  return [c, p, seed](const std::vector<Tensor>& in) {
    ag::Generator gen(seed);
    const ag::SdpaResult r = call_drop(c, in, false, p, gen);
    BOOST_REQUIRE(!r.weights.defined());
    return ag::reshape(r.output, {-1});
  };
}

BOOST_AUTO_TEST_CASE(gradcheck_with_the_mask_fixed_by_its_seed) {
  for (const Case& c : {Case{Layout::HeadsFirst, 2, 2, 5, 7, 3, 2, finite_mask({5, 7}, 12), false, true},
                        Case{Layout::HeadsLast, 1, 2, 7, 7, 3, 3, finite_mask({1, 2, 7, 7}, 13), true, true},
                        Case{Layout::Packed, 1, 2, 8, 8, 2, 2, Tensor(), true}}) {
    const std::int64_t before = ag::sdpa::tiled_calls();
    const ag::GradcheckResult r = ag::gradcheck(tiled_fn(c, 0.35, 14), make_inputs(c, 15));
    BOOST_TEST(ag::sdpa::tiled_calls() > before);
    BOOST_TEST(r.ok, fmt::format("{}", r));
  }
}

BOOST_AUTO_TEST_CASE(gradcheck_rejects_a_mask_that_changes_between_evaluations) {
  // One generator for every evaluation: each draws a new seed, so a new mask; the function is
  // then not the one whose gradient backward computes, and the checker must see it.
  const Case c{Layout::HeadsFirst, 1, 2, 5, 7, 3, 2};
  auto gen = std::make_shared<ag::Generator>(16);
  const ag::GradcheckFn moving = [c, gen](const std::vector<Tensor>& in) {
    return ag::reshape(call_drop(c, in, false, 0.35, *gen).output, {-1});
  };
  BOOST_TEST(!ag::gradcheck(moving, make_inputs(c, 17)).ok);
}

BOOST_AUTO_TEST_CASE(second_derivatives_with_dropout) {
  const Case c{Layout::HeadsLast, 2, 1, 5, 5, 2, 3, finite_mask({2, 1, 1, 5}, 18), true, true};
  const ag::GradcheckResult r = ag::gradgradcheck(tiled_fn(c, 0.4, 19), make_inputs(c, 20));
  BOOST_TEST(r.ok, fmt::format("{}", r));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_CASE(p_zero_is_no_dropout_and_p_one_gives_zeros) {
  SmallTiles tiles;
  const Case c{Layout::HeadsFirst, 2, 2, 6, 7, 3, 2, padding(2, 7, 2, 21), false, true};
  const std::vector<Tensor> in = make_inputs(c, 22);
  const Tensor r = readout(c, 23);
  // p = 0: the same bits as a call without a generator, and nothing drawn.
  const Run plain = run(c, in, r, false);
  ag::Generator gen(24);
  const std::uint64_t before = gen.state();
  for (auto t : in) t.set_grad(Tensor());
  const Tensor out0 = call_drop(c, in, false, 0.0, gen).output;
  ag::sum(out0 * r).backward();
  BOOST_TEST(gen.state() == before);
  BOOST_TEST((bits(out0) == bits(plain.output)));
  for (std::size_t i = 0; i < in.size(); ++i) BOOST_TEST((bits(in[i].grad()) == bits(plain.grads[i])));
  // p = 1: every weight dropped; zero output and gradients of q, k, v, the mask's too, no NaN.
  const Run none = run_path(Path::Tiled, c, in, r, 1.0, 25);
  BOOST_TEST(all_zero(none.output));
  for (const Tensor& g : none.grads) BOOST_TEST(all_zero(g));
}

BOOST_AUTO_TEST_CASE(bad_p_is_rejected_naming_the_op) {
  SmallTiles tiles;
  const Case c{Layout::HeadsLast, 1, 2, 4, 4, 2, 2};
  const std::vector<Tensor> in = make_inputs(c, 26);
  ag::Generator gen(27);
  BOOST_TEST(error_of([&] { call_drop(c, in, false, 1.5, gen); }) ==
             "scaled_dot_product_attention_heads_last: dropout_p must be in [0, 1], got 1.5");
  BOOST_TEST(error_of([&] { call_drop(c, in, false, -0.25, gen); }) ==
             "scaled_dot_product_attention_heads_last: dropout_p must be in [0, 1], got -0.25");
  BOOST_TEST(error_of([&] { call_drop(c, in, false, std::nan(""), gen); }).find("dropout_p must be in [0, 1]") !=
             std::string::npos);
}

BOOST_AUTO_TEST_CASE(layer_with_dropout_draws_alike_on_the_composed_and_the_tiled_core) {
  SmallTiles tiles(3, 4);
  ag::Generator init(28);
  nn::MultiHeadAttentionOptions opt{.embed_dim = 8, .num_heads = 2, .dropout = 0.3};
  opt.dtype = F64;
  nn::MultiHeadAttention mha(opt, init);
  mha.train();
  const Tensor x = ag::randn({2, 9, 8}, F64, init);
  nn::AttentionOptions o;
  o.need_weights = false;
  o.is_causal = true;
  std::vector<Tensor> outs;
  for (auto core : {nn::AttentionCore::Composed, nn::AttentionCore::Fused}) {
    mha.set_core(core);
    mha.dropout_generator().manual_seed(29);
    const std::int64_t before = ag::sdpa::tiled_calls();
    outs.push_back(mha(x, x, x, o).output);
    BOOST_TEST(ag::sdpa::tiled_calls() == before + (core == nn::AttentionCore::Fused ? 1 : 0));
  }
  BOOST_TEST(max_abs_diff(outs[0], outs[1]) <= 1e-12);
}
