// NaN in q or k, or a score that overflows to +inf, reaches the output of the tiled core
// (need_weights = false, T·S >= 1024²) as it does on the untiled kernel: NaN is a value and flows
// into the outputs it touches, and into the gradients, in float64 and float32. A mask holding NaN
// or +inf is refused by every entry point before either core runs (an additive mask holds finite
// numbers and -inf), naming the op, the mask's shape and the first bad entry.
#define BOOST_TEST_MODULE attention_flash_nan
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

namespace ag = autograd;

namespace {

// NaN in q (element 0) or k (key 2), or q's row 0 and key 5 finite but so large that their
// score overflows to +inf (what a +inf mask entry at (0, 5) would give).
enum class Where { Q, K, ScoreInf };

struct Outcome {
  std::vector<double> out, q_grad;
};

// Attention over T = S = 1024, d = 4, with a zero additive mask and the bad values of `where`.
Outcome attend(Where where, ag::Dtype dtype, bool need_weights) {
  ag::Generator g(2);
  const ag::Tensor x = ag::randn({1, 1, 1024, 4}, dtype, g);
  std::vector<double> qv = x.to_vector(), kv = qv;
  const double big = dtype == ag::Dtype::Float32 ? 1e30 : 1e200;  // big² overflows
  if (where == Where::Q) qv[0] = std::numeric_limits<double>::quiet_NaN();
  if (where == Where::K) kv[8] = std::numeric_limits<double>::quiet_NaN();
  if (where == Where::ScoreInf) qv[0] = kv[5 * 4] = big;
  const ag::Tensor m = ag::zeros({1024, 1024}, dtype);
  ag::Tensor q = ag::tensor(qv, {1, 1, 1024, 4}, dtype).requires_grad_();
  const ag::Tensor k = ag::tensor(kv, {1, 1, 1024, 4}, dtype);
  const ag::Tensor out =
      ag::scaled_dot_product_attention(q, k, x, {.need_weights = need_weights, .attn_mask = m}).output;
  ag::sum(out).backward();
  return {out.to_vector(), q.grad().to_vector()};
}

// The message of the std::invalid_argument f throws ("" when it throws none).
template <class F>
std::string test_message(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

std::size_t nans(const std::vector<double>& v) {
  std::size_t n = 0;
  for (double e : v) n += std::isnan(e) ? 1 : 0;
  return n;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_nan_reaches_the_tiled_output_and_gradient_as_on_the_untiled_kernel) {
  for (ag::Dtype dtype : {ag::Dtype::Float64, ag::Dtype::Float32}) {
    for (Where where : {Where::Q, Where::K}) {
      const Outcome untiled = attend(where, dtype, true), tiled = attend(where, dtype, false);
      const int w = static_cast<int>(where);
      BOOST_TEST(nans(untiled.out) > 0u, "where " << w);
      BOOST_TEST(nans(tiled.out) == nans(untiled.out), "where " << w << ", " << ag::dtype_name(dtype) << ": tiled "
                                                                << nans(tiled.out) << " NaN outputs, untiled "
                                                                << nans(untiled.out));
      BOOST_TEST(nans(tiled.q_grad) > 0u, "where " << w << ", " << ag::dtype_name(dtype));
      // the rows the bad value does not touch agree
      for (std::size_t i = 0; i < tiled.out.size(); ++i) {
        if (std::isnan(untiled.out[i])) continue;
        BOOST_REQUIRE(!std::isnan(tiled.out[i]));
        BOOST_REQUIRE(std::abs(tiled.out[i] - untiled.out[i]) <= 1e-5 * (1 + std::abs(untiled.out[i])));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(finite_inputs_whose_score_overflows_are_refused_on_both_cores) {
  // Not a NaN out of finite inputs: both cores name the overflow.
  for (ag::Dtype dtype : {ag::Dtype::Float64, ag::Dtype::Float32})
    for (bool need_weights : {true, false}) {
      const std::string msg = test_message([&] { attend(Where::ScoreInf, dtype, need_weights); });
      BOOST_TEST(msg.find("scaled_dot_product_attention: the scaled scores overflowed " +
                          std::string(ag::dtype_name(dtype))) == 0u, msg);
    }
}

BOOST_AUTO_TEST_CASE(finite_inputs_give_no_nan_on_the_tiled_core) {
  // Control: the NaN above comes from the bad value, not from the tiled core itself.
  ag::Generator g(3);
  const ag::Tensor x = ag::randn({1, 1, 1024, 4}, ag::Dtype::Float64, g);
  const ag::Tensor out = ag::scaled_dot_product_attention(x, x, x, {.need_weights = false}).output;
  BOOST_TEST(nans(out.to_vector()) == 0u);
}

BOOST_AUTO_TEST_CASE(a_mask_holding_nan_or_plus_inf_is_refused_on_both_cores_naming_the_first_entry) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (ag::Dtype dtype : {ag::Dtype::Float64, ag::Dtype::Float32}) {
    ag::Generator g(4);
    const ag::Tensor x = ag::randn({1, 1, 1024, 4}, dtype, g).requires_grad_();
    for (double bad : {inf, nan}) {
      std::vector<double> mv(1024 * 1024, 0.0);
      mv[3 * 1024 + 5] = bad;
      mv[7 * 1024 + 1] = bad;  // a later one is not the one named
      mv[9] = -inf;            // -inf blocks: allowed
      const ag::Tensor m = ag::tensor(mv, {1024, 1024}, dtype);
      const std::string what = std::isnan(bad) ? "NaN" : "+inf";
      for (bool need_weights : {true, false}) {  // the untiled and the tiled core
        const std::string msg = test_message(
            [&] { ag::scaled_dot_product_attention(x, x, x, {.need_weights = need_weights, .attn_mask = m}); });
        BOOST_TEST(msg == "scaled_dot_product_attention: attn_mask of shape [1024, 1024] holds " + what +
                              " at index [3, 5]; it may hold finite numbers and -inf (blocked)");
      }
      // a (B, H, T, S) mask names its 4-D index; the heads-last and packed entry points check alike
      const ag::Tensor m4 = ag::reshape(m, {1, 1, 1024, 1024});
      BOOST_TEST(test_message([&] {
                   ag::scaled_dot_product_attention(x, x, x, {.need_weights = false, .attn_mask = m4});
                 }).find("[1, 1, 1024, 1024] holds " + what + " at index [0, 0, 3, 5]") != std::string::npos);
      const ag::Tensor rows = ag::reshape(x, {1, 1024, 4});
      BOOST_TEST(
          test_message([&] { ag::scaled_dot_product_attention_heads_last(rows, rows, rows, 2, {.attn_mask = m}); })
              .find("scaled_dot_product_attention_heads_last: attn_mask "
                    "of shape [1024, 1024] holds " +
                    what) != std::string::npos);
      const ag::Tensor qkv = ag::cat({rows, rows, rows}, 2);
      BOOST_TEST(test_message([&] { ag::scaled_dot_product_attention_packed(qkv, 2, {.attn_mask = m}); })
                     .find("scaled_dot_product_attention_packed: attn_mask of "
                           "shape [1024, 1024] holds " +
                           what) != std::string::npos);
    }
    // a mask of finite values and -inf passes (control)
    std::vector<double> ok(1024 * 1024, 0.5);
    ok[5] = -inf;
    const ag::Tensor out =
        ag::scaled_dot_product_attention(x, x, x, {.attn_mask = ag::tensor(ok, {1024, 1024}, dtype)}).output;
    BOOST_TEST(nans(out.to_vector()) == 0u);
  }
}

BOOST_AUTO_TEST_CASE(the_mask_check_finds_a_bad_entry_anywhere_in_the_mask) {
  // every position of a (3, 2, 5, 7) mask, 210 entries (less than one block of the scan), and a
  // (2, 1, 16, 40) one, 1280 entries (several blocks and a partial last one)
  for (const ag::Shape& shape : {ag::Shape{3, 2, 5, 7}, ag::Shape{2, 1, 16, 40}}) {
    const std::int64_t B = shape[0], H = shape[1], T = shape[2], S = shape[3], n = B * H * T * S;
    const ag::Tensor q = ag::zeros({B, H, T, 4}, ag::Dtype::Float64), k = ag::zeros({B, H, S, 4}, ag::Dtype::Float64);
    for (std::int64_t at = 0; at < n; at += shape[3] == 7 ? 1 : 37) {
      std::vector<double> mv(static_cast<std::size_t>(n), -std::numeric_limits<double>::infinity());
      mv[static_cast<std::size_t>(at)] = std::numeric_limits<double>::infinity();
      const ag::Tensor m = ag::tensor(mv, shape, ag::Dtype::Float64);
      const std::string index = fmt::format("[{}, {}, {}, {}]", at / (H * T * S), at / (T * S) % H, at / S % T, at % S);
      const std::string msg = test_message([&] { ag::scaled_dot_product_attention(q, k, k, {.attn_mask = m}); });
      BOOST_REQUIRE_MESSAGE(msg.find("holds +inf at index " + index) != std::string::npos, at << ": " << msg);
    }
  }
}
