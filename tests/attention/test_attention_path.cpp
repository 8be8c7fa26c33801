// Which attention core a call ran on, and why: SdpaResult::path of the three fused ops, ag::sdpa_path
// (the same rule without running), nn::functional's config.path and MultiHeadAttention::attention_path.
// Each report is checked against what ran (the tiled core's call counter, the weights returned).
#define BOOST_TEST_MODULE attention_path
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

#include "test_attention_flash_support.hpp"  // ag::sdpa::tiled_calls, SmallTiles

namespace ag = autograd;
using ag::SdpaCore;
using ag::Tensor;

namespace {

constexpr auto F32 = ag::Dtype::Float32;

// Runs `call` and says whether it ran the tiled core (by its call counter).
template <class F>
bool ran_tiled(F&& call) {
  const std::int64_t before = ag::sdpa::tiled_calls();
  call();
  return ag::sdpa::tiled_calls() == before + 1;
}

// q, k, v (1, 2, L, 4) and their heads-last (1, L, 8) and packed (1, L, 24) forms.
struct Inputs {
  Tensor q, k, v, ql, kl, vl, qkv;
  explicit Inputs(std::int64_t L, ag::Dtype dtype = F32) {
    ag::Generator g(7);
    q = ag::randn({1, 2, L, 4}, dtype, g).requires_grad_(true);
    k = ag::randn({1, 2, L, 4}, dtype, g);
    v = ag::randn({1, 2, L, 4}, dtype, g);
    ql = ag::randn({1, L, 8}, dtype, g);
    kl = ag::randn({1, L, 8}, dtype, g);
    vl = ag::randn({1, L, 8}, dtype, g);
    qkv = ag::randn({1, L, 24}, dtype, g);
  }
};

void check_path(const ag::SdpaPath& got, SdpaCore core, std::string_view reason) {
  BOOST_TEST(ag::core_name(got.core) == ag::core_name(core));
  BOOST_TEST(std::string(got.reason) == std::string(reason));
}

}  // namespace

BOOST_AUTO_TEST_CASE(core_names) {
  BOOST_TEST(ag::core_name(SdpaCore::Fused) == "fused");
  BOOST_TEST(ag::core_name(SdpaCore::Tiled) == "tiled");
  BOOST_TEST(ag::core_name(SdpaCore::Composed) == "composed");
}

BOOST_AUTO_TEST_CASE(sdpa_path_refuses_what_the_ops_refuse) {
  auto message = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "(no exception)";
  };
  BOOST_TEST(message([] { ag::sdpa_path(-1, 4); }) == "sdpa_path: T and S must be non-negative, got T = -1, S = 4");
  BOOST_TEST(message([] { ag::sdpa_path(3, 5, {.is_causal = true}); }) ==
             "sdpa_path: is_causal needs as many queries as keys (T == S); got T = 3, S = 5");
  BOOST_TEST(message([] { ag::sdpa_path(2, 2, {.scale = std::numeric_limits<double>::quiet_NaN()}); }) ==
             "sdpa_path: scale must be finite, got nan");
  BOOST_TEST(message([] { ag::sdpa_path(2, 2, {.dropout_p = 2.0}); }) ==
             "sdpa_path: dropout_p must be in [0, 1], got 2");
  // the masks the ops refuse, as far as T and S tell
  BOOST_TEST(message([] { ag::sdpa_path(5, 5, {.attn_mask = ag::zeros({3, 3})}); }) ==
             "sdpa_path: attn_mask of shape [3, 3] does not broadcast to (B, H, T, S) with T = 5, S = 5");
  BOOST_TEST(message([] { ag::sdpa_path(2, 2, {.attn_mask = ag::zeros({2, 2}, ag::Dtype::Int64)}); }).find(
                 "sdpa_path: attn_mask is Int64") == 0u);
  BOOST_TEST(message([] {
               ag::sdpa_path(1, 2, {.attn_mask = ag::tensor({0.0, std::numeric_limits<double>::infinity()}, {1, 2})});
             }) == "sdpa_path: attn_mask of shape [1, 2] holds +inf at index [0, 1]; it may hold finite numbers and -inf "
                   "(blocked)");
  BOOST_TEST(message([] { ag::sdpa_path(4, 2, {.attn_mask = ag::zeros({1, 2})}); }) == "(no exception)");
  // and the ops give the same verdict on the same arguments
  Inputs in(3);
  BOOST_TEST(message([&] { ag::scaled_dot_product_attention(in.q, in.k, in.v, {.dropout_p = 2.0}); }) ==
             "scaled_dot_product_attention: dropout_p must be in [0, 1], got 2");
}

BOOST_AUTO_TEST_CASE(an_int64_mask_is_refused_saying_what_the_op_takes) {
  Inputs in(3);
  const Tensor blocked = ag::gt(ag::randn({3, 3}), ag::zeros({3, 3}));  // Int64 0 / 1
  try {
    ag::scaled_dot_product_attention(in.q, in.k, in.v, {.attn_mask = blocked});
    BOOST_ERROR("an Int64 mask was accepted");
  } catch (const std::invalid_argument& e) {
    const std::string msg = e.what();
    BOOST_TEST(msg.find("scaled_dot_product_attention: attn_mask is Int64: this op takes an additive float mask of "
                        "q's dtype (Float32; -inf blocks)") == 0, msg);
    BOOST_TEST(msg.find("masked_fill(zeros(shape), blocked, -inf)") != std::string::npos, msg);
  }
}

BOOST_AUTO_TEST_CASE(a_small_call_runs_the_untiled_kernel_with_no_reason) {
  // T·S = 64, far below the threshold: the untiled kernel is the op's own choice, weights or not.
  const Inputs in(8);
  for (const bool need_weights : {true, false}) {
    ag::SdpaResult r;
    BOOST_TEST(!ran_tiled([&] { r = ag::scaled_dot_product_attention(in.q, in.k, in.v, {.need_weights = need_weights}); }));
    check_path(r.path, SdpaCore::Fused, "");
    check_path(ag::sdpa_path(8, 8, {.need_weights = need_weights}), SdpaCore::Fused, "");
    BOOST_TEST(r.weights.defined() == need_weights);
  }
}

BOOST_AUTO_TEST_CASE(weights_asked_for_keep_a_large_call_off_the_tiled_core) {
  // T·S = 2^20 reaches the threshold: without weights the tiled core would run.
  const Inputs in(1024);
  ag::SdpaResult r;
  BOOST_TEST(!ran_tiled([&] { r = ag::scaled_dot_product_attention(in.q, in.k, in.v, {.is_causal = true}); }));
  check_path(r.path, SdpaCore::Fused, "need_weights");
  BOOST_TEST(r.weights.defined());
  BOOST_TEST(!ran_tiled([&] { r = ag::scaled_dot_product_attention_heads_last(in.ql, in.kl, in.vl, 2); }));
  check_path(r.path, SdpaCore::Fused, "need_weights");
  BOOST_TEST(!ran_tiled([&] { r = ag::scaled_dot_product_attention_packed(in.qkv, 2); }));
  check_path(r.path, SdpaCore::Fused, "need_weights");
  check_path(ag::sdpa_path(1024, 1024), SdpaCore::Fused, "need_weights");
  // One key fewer is below the threshold: no reason then.
  check_path(ag::sdpa_path(1024, 1023), SdpaCore::Fused, "");
}

BOOST_AUTO_TEST_CASE(a_large_call_without_weights_runs_tiled_on_every_entry_point) {
  const Inputs in(1024);
  ag::SdpaResult r;
  const ag::SdpaOptions no_weights{.need_weights = false};
  BOOST_TEST(ran_tiled([&] { r = ag::scaled_dot_product_attention(in.q, in.k, in.v, no_weights); }));
  check_path(r.path, SdpaCore::Tiled, "");
  BOOST_TEST(!r.weights.defined());
  BOOST_TEST(ran_tiled([&] { r = ag::scaled_dot_product_attention_heads_last(in.ql, in.kl, in.vl, 2, no_weights); }));
  check_path(r.path, SdpaCore::Tiled, "");
  BOOST_TEST(ran_tiled([&] { r = ag::scaled_dot_product_attention_packed(in.qkv, 2, no_weights); }));
  check_path(r.path, SdpaCore::Tiled, "");
  check_path(ag::sdpa_path(1024, 1024, no_weights), SdpaCore::Tiled, "");
}

BOOST_AUTO_TEST_CASE(dropout_float64_a_mask_and_a_graph_do_not_change_the_core) {
  // The tiled core takes all of these: only need_weights and the size decide.
  const Inputs in(1024, ag::Dtype::Float64);
  ag::Generator gen(3);
  const Tensor mask = ag::zeros({1024, 1024}, ag::Dtype::Float64);
  ag::SdpaResult r;
  BOOST_TEST(ran_tiled([&] {
    r = ag::scaled_dot_product_attention(
        in.q, in.k, in.v, {.need_weights = false, .attn_mask = mask, .dropout_p = 0.25, .generator = &gen});
  }));
  check_path(r.path, SdpaCore::Tiled, "");
  BOOST_TEST(r.output.requires_grad());
}

BOOST_AUTO_TEST_CASE(the_tiling_threshold_moves_the_choice) {
  // With min_tiled_scores = 0 every call without weights tiles, however small.
  flash_test::SmallTiles tiles(4, 4);
  const Inputs in(8);
  ag::SdpaResult r;
  BOOST_TEST(ran_tiled([&] { r = ag::scaled_dot_product_attention(in.q, in.k, in.v, {.need_weights = false}); }));
  check_path(r.path, SdpaCore::Tiled, "");
  BOOST_TEST(!ran_tiled([&] { r = ag::scaled_dot_product_attention(in.q, in.k, in.v); }));
  check_path(r.path, SdpaCore::Fused, "need_weights");
}

namespace {

nn::MultiHeadAttention make_mha(nn::AttentionCore core = nn::AttentionCore::Fused, bool study = false) {
  ag::Generator g(5);
  nn::MultiHeadAttentionOptions o{8, 2};
  o.core = core;
  o.study = study;
  return nn::MultiHeadAttention(o, g);
}

ag::Tensor input(std::int64_t T) {
  ag::Generator g(9);
  return ag::randn({1, T, 8}, F32, g);
}

// The path functional::multi_head_attention_forward reports for the module's parameters.
ag::SdpaPath functional_path(const nn::MultiHeadAttention& mha, const ag::Tensor& x, const nn::AttentionOptions& ao,
                             nn::AttentionCore core = nn::AttentionCore::Fused) {
  ag::SdpaPath path{SdpaCore::Composed, "not written"};
  nn::functional::MultiHeadAttentionConfig config;
  config.num_heads = mha.num_heads();
  config.core = core;
  config.path = &path;
  (void)nn::functional::multi_head_attention_forward(x, x, x, mha.functional_weights(), config, ao);
  return path;
}

}  // namespace

BOOST_AUTO_TEST_CASE(multi_head_attention_reports_the_fused_ops_path) {
  nn::MultiHeadAttention mha = make_mha();
  const ag::Tensor small = input(16), large = input(1024);
  const nn::AttentionOptions no_weights{.need_weights = false};
  check_path(mha.attention_path(small, small, small), SdpaCore::Fused, "");
  check_path(mha.attention_path(large, large, large), SdpaCore::Fused, "need_weights");
  check_path(mha.attention_path(large, large, large, no_weights), SdpaCore::Tiled, "");
  // What the forward reports is what it ran, and what attention_path predicted.
  ag::SdpaPath path;
  BOOST_TEST(ran_tiled([&] { path = functional_path(mha, large, no_weights); }));
  check_path(path, SdpaCore::Tiled, "");
  BOOST_TEST(!ran_tiled([&] { path = functional_path(mha, large, {}); }));
  check_path(path, SdpaCore::Fused, "need_weights");
  BOOST_TEST(ran_tiled([&] { (void)mha(large, large, large, no_weights); }));
}

BOOST_AUTO_TEST_CASE(multi_head_attention_says_what_forces_the_composed_core) {
  const ag::Tensor large = input(1024);
  const nn::AttentionOptions no_weights{.need_weights = false};
  nn::MultiHeadAttention composed = make_mha(nn::AttentionCore::Composed);
  check_path(composed.attention_path(large, large, large, no_weights), SdpaCore::Composed, "AttentionCore::Composed");
  nn::MultiHeadAttention studied = make_mha(nn::AttentionCore::Fused, /*study=*/true);
  check_path(studied.attention_path(large, large, large, no_weights), SdpaCore::Composed, "study mode");
  BOOST_TEST(!ran_tiled([&] { (void)studied(large, large, large, no_weights); }));

  nn::MultiHeadAttention hooked = make_mha();
  nn::HookHandle h = hooked.add_hook("pattern", [](const ag::Tensor&, const std::string&) { return ag::Tensor(); });
  check_path(hooked.attention_path(large, large, large, no_weights), SdpaCore::Composed, "hook on pattern");
  BOOST_TEST(!ran_tiled([&] { (void)hooked(large, large, large, no_weights); }));
  h.remove();
  // A hook on out alone keeps the fused op.
  h = hooked.add_hook("out", [](const ag::Tensor&, const std::string&) { return ag::Tensor(); });
  check_path(hooked.attention_path(large, large, large, no_weights), SdpaCore::Tiled, "");
  BOOST_TEST(ran_tiled([&] { (void)hooked(large, large, large, no_weights); }));
  h.remove();

  nn::MultiHeadAttention plain = make_mha();
  check_path(functional_path(plain, input(16), no_weights, nn::AttentionCore::Composed), SdpaCore::Composed,
             "AttentionCore::Composed");
}
