// Rows whose every score carries the same large finite offset (every key masked by -1e9, or by
// the type's lowest value, as padding masks often do) on the tiled core (need_weights = false,
// T·S >= 1024²): the row's log-sum-exp m + log l rounds to m there, and backward, which forms
// the weights as exp(S − lse), would give exp(0) = 1 instead of 1/S. The core keeps the part the
// rounding lost, so output and gradients agree with the untiled kernel as on any other row.
#define BOOST_TEST_MODULE attention_flash_lse
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <autograd/autograd.hpp>

namespace ag = autograd;

namespace {

constexpr std::int64_t B = 2, T = 1024, D = 4;

struct Result {
  std::vector<double> out, dq, dk, dv, dmask, dout;  // dout: dL/d(out)
};

// Attention of B = 2 batches over T = S = 1024 keys with a (B, 1, 1, S) additive mask: batch 0
// random, batch 1 holds `offset` on every key but `open` keys (offset + 0 there: the same row).
Result attend(ag::Dtype dtype, double offset, bool need_weights) {
  ag::Generator g(5);
  ag::Tensor q = ag::randn({B, 1, T, D}, dtype, g).requires_grad_();
  ag::Tensor k = ag::randn({B, 1, T, D}, dtype, g).requires_grad_();
  ag::Tensor v = ag::randn({B, 1, T, D}, dtype, g).requires_grad_();
  std::vector<double> m = ag::randn({B, 1, 1, T}, ag::Dtype::Float64, g).to_vector();
  std::fill(m.begin() + T, m.end(), offset);
  ag::Tensor mask = ag::tensor(m, {B, 1, 1, T}, dtype).requires_grad_();
  const ag::Tensor out =
      ag::scaled_dot_product_attention(q, k, v, {.need_weights = need_weights, .attn_mask = mask}).output;
  ag::Generator gw(6);
  const ag::Tensor dout = ag::randn(out.shape(), dtype, gw);
  ag::sum(out * dout).backward();
  return {out.to_vector(),  q.grad().to_vector(),    k.grad().to_vector(), v.grad().to_vector(),
          mask.grad().to_vector(), dout.to_vector()};
}

// max |a − b| / max |b|.
double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

void check(ag::Dtype dtype, double offset, double tol) {
  const Result tiled = attend(dtype, offset, false), untiled = attend(dtype, offset, true);
  BOOST_TEST_CONTEXT("offset " << offset << (dtype == ag::Dtype::Float64 ? " float64" : " float32")) {
    BOOST_TEST(rel_diff(tiled.out, untiled.out) <= tol);
    BOOST_TEST(rel_diff(tiled.dq, untiled.dq) <= tol);
    BOOST_TEST(rel_diff(tiled.dk, untiled.dk) <= tol);
    BOOST_TEST(rel_diff(tiled.dv, untiled.dv) <= tol);
    BOOST_TEST(rel_diff(tiled.dmask, untiled.dmask) <= tol);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(large_offsets_on_every_key_float64) {
  for (double offset : {-1e4, -1e9, -1e300, -std::numeric_limits<double>::max(), 1e9})
    check(ag::Dtype::Float64, offset, 1e-12);
}

BOOST_AUTO_TEST_CASE(large_offsets_on_every_key_float32) {
  for (double offset : {-1e4, -1e9, static_cast<double>(std::numeric_limits<float>::lowest()), 1e9})
    check(ag::Dtype::Float32, offset, 1e-5);
}

// With the type's lowest value on every key of batch 1, its scores are all that value exactly:
// uniform weights 1/S, so every key's dL/dv is the same row, and the rows sum to Σ_i dL/dout_i
// (the weights of a query sum to 1). Checked on both cores; a gradient S times too large (what
// the rounded log-sum-exp gave) breaks the sum. Negative control for the comparison: one element
// off by one part in 10^10 is seen.
BOOST_AUTO_TEST_CASE(uniform_rows_give_the_gradient_worked_out_by_hand) {
  for (bool need_weights : {false, true}) {
    const Result r = attend(ag::Dtype::Float64, -std::numeric_limits<double>::max(), need_weights);
    for (std::int64_t c = 0; c < D; ++c) {
      double sum_dout = 0, sum_dv = 0, spread = 0;
      for (std::int64_t i = 0; i < T; ++i) {
        sum_dout += r.dout[(T + i) * D + c];
        sum_dv += r.dv[(T + i) * D + c];
        spread = std::max(spread, std::abs(r.dv[(T + i) * D + c] - r.dv[T * D + c]));
      }
      BOOST_TEST(std::abs(sum_dv - sum_dout) <= 1e-12 * std::abs(sum_dout), "need_weights " << need_weights);
      BOOST_TEST(spread <= 1e-15 * std::abs(sum_dout), "need_weights " << need_weights);
    }
  }
  const Result r = attend(ag::Dtype::Float64, -1e9, true);
  std::vector<double> off = r.dv;
  off[T * D + 7] *= 1 + 1e-10;
  BOOST_TEST(rel_diff(off, r.dv) > 1e-12);
}
