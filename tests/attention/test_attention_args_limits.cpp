// Arguments at the limits of the attention ops: a scale finite as a double but not in float32,
// a head count whose 3·H does not fit in 64 bits, and empty tensors whose T·S would not.
#define BOOST_TEST_MODULE attention_args_limits
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "test_support.hpp"

namespace ag = autograd;

BOOST_AUTO_TEST_CASE(a_scale_beyond_float32_is_refused_for_float32_tensors) {
  for (bool need_weights : {false, true}) {
    const ag::Tensor q = ag::ones({1, 1, 2, 2});
    test_support::check_throws<std::invalid_argument>(
        [&] { (void)ag::scaled_dot_product_attention(q, q, q, {.need_weights = need_weights, .scale = 1e39}); },
        {"scaled_dot_product_attention", "scale", "float32"});
    // The same scale is finite in float64: accepted, and the output finite.
    const ag::Tensor q64 = ag::ones({1, 1, 2, 2}, ag::Dtype::Float64);
    const ag::Tensor out =
        ag::scaled_dot_product_attention(q64, q64, q64, {.need_weights = need_weights, .scale = 1e39}).output;
    BOOST_TEST(test_support::all_finite(out));
  }
}

BOOST_AUTO_TEST_CASE(a_head_count_whose_triple_overflows_is_refused_with_its_value) {
  const std::int64_t H = std::numeric_limits<std::int64_t>::max() / 3 + 1;
  const ag::Tensor qkv = ag::ones({1, 2, 6});
  test_support::check_throws<std::invalid_argument>(
      [&] { (void)ag::scaled_dot_product_attention_packed(qkv, H, {.need_weights = false}); },
      {"scaled_dot_product_attention_packed", "num_heads = " + std::to_string(H), "[1, 2, 6]"});
}

BOOST_AUTO_TEST_CASE(empty_batches_with_huge_lengths_give_empty_outputs) {
  // T·S = 2^64 + 2^31 would wrap; the batch is empty, so nothing is computed.
  const ag::Tensor q = ag::zeros({0, 1, (std::int64_t{1} << 33) + 1, 1}), k = ag::zeros({0, 1, std::int64_t{1} << 31, 1});
  for (bool need_weights : {false}) {
    const ag::Tensor out = ag::scaled_dot_product_attention(q, k, k, {.need_weights = need_weights}).output;
    BOOST_TEST(ag::shape_str(out.shape()) == "[0, 1, 8589934593, 1]");
  }
}

BOOST_AUTO_TEST_CASE(a_finite_scale_that_overflows_the_scores_is_refused_on_every_core) {
  // q·kᵀ = 200 per score; times 1e37 it is beyond float32, and the softmax would be NaN. Small
  // shapes run the fused core (with and without weights), T = S = 1024 without weights the tiled one.
  for (const std::int64_t T : {2, 1024}) {
    for (bool need_weights : {false, true}) {
      if (T == 1024 && need_weights) continue;
      const ag::Tensor q = ag::full({1, 1, T, 2}, 10.0);
      const ag::SdpaOptions options{.need_weights = need_weights, .scale = 1e37};
      BOOST_TEST_CONTEXT("T " << T << ", need_weights " << need_weights) {
        BOOST_TEST(ag::core_name(ag::sdpa_path(T, T, options).core) == (T == 2 ? "fused" : "tiled"));
        test_support::check_throws<std::invalid_argument>(
            [&] { (void)ag::scaled_dot_product_attention(q, q, q, options); },
            {"scaled_dot_product_attention", "overflowed Float32", "(scale = 1e+37)"});
        // The same inputs at a scale that keeps the scores finite give a finite output.
        BOOST_TEST(test_support::all_finite(
            ag::scaled_dot_product_attention(q, q, q, {.need_weights = need_weights, .scale = 1e30}).output));
      }
    }
  }
  // A NaN in the inputs is not an overflow: it propagates, as in PyTorch.
  const ag::Tensor nan_q = ag::full({1, 1, 2, 2}, std::numeric_limits<double>::quiet_NaN());
  BOOST_TEST(!test_support::all_finite(ag::scaled_dot_product_attention(nan_q, nan_q, nan_q).output));
}

BOOST_AUTO_TEST_CASE(scores_that_overflow_to_minus_inf_are_refused_on_every_core) {
  // q·kᵀ = -200 per score; times 1e37 every score of every row is -inf: without a mask the row
  // would see no key and come out as 0, silently. Refused as the +inf overflow is; with a mask
  // that blocks every key of a row, such a row is 0 as documented (not refused).
  for (const std::int64_t T : {2, 1024}) {
    for (bool causal : {false, true}) {
      const ag::Tensor q = ag::full({1, 1, T, 2}, 10.0), k = ag::full({1, 1, T, 2}, -10.0);
      const ag::SdpaOptions options{.is_causal = causal, .scale = 1e37};
      BOOST_TEST_CONTEXT("T " << T << ", causal " << causal) {
        test_support::check_throws<std::invalid_argument>(
            [&] { (void)ag::scaled_dot_product_attention(q, k, q, options); },
            {"scaled_dot_product_attention", "overflowed Float32", "(scale = 1e+37)", "see no key"});
        BOOST_TEST(test_support::all_finite(
            ag::scaled_dot_product_attention(q, k, q, {.is_causal = causal, .scale = 1e30}).output));
      }
    }
  }
  // The negative control: a mask blocking every key of row 0 is no overflow.
  std::vector<double> blocked(4, 0.0);
  blocked[0] = blocked[1] = -std::numeric_limits<double>::infinity();
  const ag::Tensor q = ag::full({1, 1, 2, 2}, 1.0);
  const ag::SdpaResult r = ag::scaled_dot_product_attention(q, q, q, {.attn_mask = ag::tensor(blocked, {2, 2})});
  BOOST_TEST(r.output.to_vector()[0] == 0.0);
}
