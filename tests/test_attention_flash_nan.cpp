// NaN in q, k or the mask (or a +inf mask entry) reaches the output of the tiled core
// (need_weights = false, T·S >= 1024²) as it does on the untiled kernel: NaN is a value and flows
// into the outputs it touches, and into the gradients, in float64 and float32.
#define BOOST_TEST_MODULE attention_flash_nan
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include <autograd/autograd.hpp>

namespace ag = autograd;

namespace {

enum class Where { Q, K, MaskNaN, MaskInf };

struct Outcome {
  std::vector<double> out, q_grad;
};

// Attention over T = S = 1024, d = 4, with one bad value placed in q (element 0), k (key 2) or
// the additive mask (entry (0, 5)).
Outcome attend(Where where, ag::Dtype dtype, bool need_weights) {
  ag::Generator g(2);
  const ag::Tensor x = ag::randn({1, 1, 1024, 4}, dtype, g);
  std::vector<double> bad = x.to_vector();
  bad[where == Where::Q ? 0 : 8] = std::numeric_limits<double>::quiet_NaN();
  const ag::Tensor nan_x = ag::tensor(bad, {1, 1, 1024, 4}, dtype);
  std::vector<double> mv(1024 * 1024, 0.0);
  if (where == Where::MaskNaN) mv[5] = std::numeric_limits<double>::quiet_NaN();
  if (where == Where::MaskInf) mv[5] = std::numeric_limits<double>::infinity();
  const ag::Tensor m = ag::tensor(mv, {1024, 1024}, dtype);
  ag::Tensor q = (where == Where::Q ? nan_x : x).detach().requires_grad_();
  const ag::Tensor k = where == Where::K ? nan_x : x;
  const ag::Tensor out =
      ag::scaled_dot_product_attention(q, k, x, m, false, 0.0, 0.0, nullptr, need_weights).output;
  ag::sum(out).backward();
  return {out.to_vector(), q.grad().to_vector()};
}

std::size_t nans(const std::vector<double>& v) {
  std::size_t n = 0;
  for (double e : v) n += std::isnan(e) ? 1 : 0;
  return n;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_nan_or_inf_reaches_the_tiled_output_and_gradient_as_on_the_untiled_kernel) {
  for (ag::Dtype dtype : {ag::Dtype::Float64, ag::Dtype::Float32}) {
    for (Where where : {Where::Q, Where::K, Where::MaskNaN, Where::MaskInf}) {
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

BOOST_AUTO_TEST_CASE(finite_inputs_give_no_nan_on_the_tiled_core) {
  // Control: the NaN above comes from the bad value, not from the tiled core itself.
  ag::Generator g(3);
  const ag::Tensor x = ag::randn({1, 1, 1024, 4}, ag::Dtype::Float64, g);
  const ag::Tensor out = ag::scaled_dot_product_attention(x, x, x, ag::Tensor(), false, 0.0, 0.0, nullptr, false).output;
  BOOST_TEST(nans(out.to_vector()) == 0u);
}
