// Attention dropout on the tiled core (need_weights = false, T·S >= 2^20), the untiled kernel
// (need_weights = true) and the composed route (the weights of a dropout-free call, ag::dropout
// on them from the same generator state, times v): the same mask and results in float64, with
// gradients; p = 1 and p = 1 - 1e-9; the same bits at 1, 2 and 3 threads; reproducible from a seed.
#define BOOST_TEST_MODULE dropout_hostile
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <autograd/autograd.hpp>

namespace ag = autograd;

namespace {

struct Result {
  std::vector<double> out, gq, gk, gv;
  std::uint64_t state_after;
};

constexpr std::int64_t B = 1, H = 2, T = 1024, S = 1024, D = 4;

ag::Tensor blocked_mask() {
  std::vector<double> m(static_cast<std::size_t>(T * S), 0.0);
  for (std::int64_t j = 0; j < S; ++j) m[static_cast<std::size_t>(3 * S + j)] = -INFINITY;  // row 3 blocked
  for (std::size_t i = 0; i < m.size(); i += 7) m[i] = -INFINITY;
  return ag::tensor(m, {T, S}, ag::Dtype::Float64);
}

// route 0: tiled, 1: untiled, 2: composed
Result run(int route, double p, bool masked, std::uint64_t seed) {
  ag::Generator data(17);
  ag::Tensor q = ag::randn({B, H, T, D}, ag::Dtype::Float64, data).requires_grad_();
  ag::Tensor k = ag::randn({B, H, S, D}, ag::Dtype::Float64, data).requires_grad_();
  ag::Tensor v = ag::randn({B, H, S, D}, ag::Dtype::Float64, data).requires_grad_();
  const ag::Tensor g = ag::randn({B, H, T, D}, ag::Dtype::Float64, data);
  const ag::Tensor m = masked ? blocked_mask() : ag::Tensor();
  ag::Generator gen(seed);
  ag::Tensor out;
  if (route == 2) {
    const ag::Tensor w = ag::scaled_dot_product_attention(q, k, v, {.attn_mask = m}).weights;
    out = ag::matmul(ag::dropout(w, p, true, gen), v);
  } else {
    out = ag::scaled_dot_product_attention(
              q, k, v, {.need_weights = route == 1, .attn_mask = m, .dropout_p = p, .generator = &gen})
              .output;
  }
  ag::sum(ag::mul(out, g)).backward();
  return {out.to_vector(), q.grad().to_vector(), k.grad().to_vector(), v.grad().to_vector(), gen.state()};
}

double rel(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double d = 0, s = 1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    d = std::max(d, std::fabs(a[i] - b[i]));
    s = std::max(s, std::fabs(b[i]));
  }
  return d / s;
}

}  // namespace

BOOST_AUTO_TEST_CASE(tiled_untiled_and_composed_routes_drop_the_same_weights) {
  ag::set_num_threads(2);
  for (double p : {0.0, 0.1, 0.5, 0.9, 1.0 - 1e-9, 1.0})
    for (bool masked : {false, true}) {
      const Result untiled = run(1, p, masked, 99), tiled = run(0, p, masked, 99), composed = run(2, p, masked, 99);
      const double tol = p > 0.99 && p < 1.0 ? 1e-6 : 1e-12;  // 1/(1-p) = 1e9 magnifies rounding
      BOOST_TEST(rel(tiled.out, untiled.out) < tol, "out tiled p " << p << " masked " << masked);
      BOOST_TEST(rel(composed.out, untiled.out) < tol, "out composed p " << p << " masked " << masked);
      BOOST_TEST(rel(tiled.gq, untiled.gq) < tol, "dq tiled p " << p << " masked " << masked);
      BOOST_TEST(rel(tiled.gk, untiled.gk) < tol, "dk tiled p " << p << " masked " << masked);
      BOOST_TEST(rel(tiled.gv, untiled.gv) < tol, "dv tiled p " << p << " masked " << masked);
      BOOST_TEST(rel(composed.gq, untiled.gq) < tol, "dq composed p " << p << " masked " << masked);
      BOOST_TEST(rel(composed.gk, untiled.gk) < tol, "dk composed p " << p << " masked " << masked);
      BOOST_TEST(rel(composed.gv, untiled.gv) < tol, "dv composed p " << p << " masked " << masked);
      BOOST_TEST(tiled.state_after == untiled.state_after, "generator use p " << p);
      BOOST_TEST(composed.state_after == untiled.state_after, "generator use composed p " << p);
      if (p == 1.0) {
        BOOST_TEST(*std::max_element(tiled.out.begin(), tiled.out.end()) == 0.0);
        BOOST_TEST(*std::min_element(tiled.gq.begin(), tiled.gq.end()) == 0.0);
      }
    }
}

BOOST_AUTO_TEST_CASE(tiled_dropout_has_the_same_bits_at_every_thread_count_and_repeats_from_its_seed) {
  ag::set_num_threads(1);
  const Result one = run(0, 0.3, true, 5);
  for (int t : {1, 2, 3}) {
    ag::set_num_threads(t);
    const Result r = run(0, 0.3, true, 5);
    BOOST_TEST((r.out == one.out && r.gq == one.gq && r.gk == one.gk && r.gv == one.gv), "threads " << t);
  }
  const Result other = run(0, 0.3, true, 6);
  BOOST_TEST((other.out != one.out), "another seed drops other weights");
  ag::set_num_threads(2);
}
