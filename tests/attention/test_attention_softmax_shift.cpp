// The float32 softmax of the untiled attention kernel (autograd/src/kernels/attention_core.cpp):
// without a mask, rows whose maxima lie within 16 of each other share one shift and one
// exponential pass; rows further apart, masked slices (a blocked key, a fully blocked row) and
// causal ones take the row-by-row path (so a float mask equal to causality gives the bits of
// is_causal, checked below). Every weight is checked against the softmax computed here in long
// double from the float inputs, within a bound derived from the float arithmetic: the score
// q·k·scale carries at most (d + 2)·u·Σ|q·k·scale| of error, a weight's relative error is its
// own score's error plus its row's largest, plus 16 roundings (exponential, sum, reciprocal).
// Odd sizes, one and several rows, both paths in one slice and across slices; output and
// gradients compared with the float64 op; NaN and infinite scores (which take the row-by-row
// path) give what the float64 op gives. Each under every kernel variant the CPU has (the shared
// shift and the backward's slopes are vector kernels). Negative control: the check sees a weight
// 1e-5 off.
#define BOOST_TEST_MODULE attention_softmax_shift
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "isa_support.hpp"

namespace ag = autograd;

namespace {

struct Case {
  std::int64_t B, H, T, S, d;
  double spread;      // row r of every slice gets its q multiplied by 1 + spread·r (spread-out maxima)
  bool block_key;     // key 0 blocked for every query (-inf in the mask)
  bool block_row;     // every key blocked for query 1
  bool causal;
  std::string name;
};

std::vector<float> values(std::size_t n, std::uint64_t seed, double amplitude) {
  std::vector<float> v(n);
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ull + 7;
  for (float& x : v) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x = static_cast<float>(amplitude * (static_cast<double>(s >> 11) / 4503599627370496.0 - 1.0));
  }
  return v;
}

struct Inputs {
  std::vector<float> q, k, v, mask;  // mask (T, S); empty: none
};

Inputs inputs(const Case& c, std::uint64_t seed) {
  Inputs in;
  in.q = values(static_cast<std::size_t>(c.B * c.H * c.T * c.d), seed, 1.5);
  in.k = values(static_cast<std::size_t>(c.B * c.H * c.S * c.d), seed + 1, 1.5);
  in.v = values(static_cast<std::size_t>(c.B * c.H * c.S * c.d), seed + 2, 1.0);
  for (std::int64_t s = 0; s < c.B * c.H; ++s)
    for (std::int64_t r = 0; r < c.T; ++r)
      for (std::int64_t j = 0; j < c.d; ++j) in.q[(s * c.T + r) * c.d + j] *= static_cast<float>(1.0 + c.spread * r);
  if (c.block_key || c.block_row) {
    in.mask.assign(static_cast<std::size_t>(c.T * c.S), 0.f);
    const float neg_inf = -std::numeric_limits<float>::infinity();
    for (std::int64_t i = 0; i < c.T; ++i) {
      if (c.block_key) in.mask[i * c.S] = neg_inf;
      if (c.block_row && i == 1)
        for (std::int64_t j = 0; j < c.S; ++j) in.mask[i * c.S + j] = neg_inf;
    }
  }
  return in;
}

// The float values (exactly) as a tensor of `dtype`.
ag::Tensor make(const std::vector<float>& x, const ag::Shape& shape, ag::Dtype dtype) {
  return ag::tensor(std::vector<double>(x.begin(), x.end()), shape, dtype);
}

// The weights of the op at `dtype` (float32 or float64), as float64 values.
std::vector<double> weights(const Case& c, const Inputs& in, ag::Dtype dtype) {
  const ag::Tensor q = make(in.q, {c.B, c.H, c.T, c.d}, dtype), k = make(in.k, {c.B, c.H, c.S, c.d}, dtype);
  const ag::Tensor v = make(in.v, {c.B, c.H, c.S, c.d}, dtype);
  const ag::Tensor mask = in.mask.empty() ? ag::Tensor() : make(in.mask, {c.T, c.S}, dtype);
  const ag::Tensor w = ag::scaled_dot_product_attention(q, k, v, {.attn_mask = mask, .is_causal = c.causal})
                           .weights.to(ag::Dtype::Float64);
  const double* p = w.data<double>();
  return {p, p + w.numel()};
}

// Weights off the long double softmax by more than their bound (see the top of the file).
int wrong_weights(const Case& c, const Inputs& in, const std::vector<double>& got) {
  const long double u = std::numeric_limits<float>::epsilon() / 2.0L;
  const long double scale = 1.0L / std::sqrt(static_cast<long double>(c.d));
  int wrong = 0;
  std::vector<long double> s(static_cast<std::size_t>(c.S)), err(static_cast<std::size_t>(c.S));
  for (std::int64_t sl = 0; sl < c.B * c.H; ++sl)
    for (std::int64_t i = 0; i < c.T; ++i) {
      long double mx = -std::numeric_limits<long double>::infinity(), worst_err = 0;
      for (std::int64_t j = 0; j < c.S; ++j) {
        long double dot = 0, abs_dot = 0;
        for (std::int64_t t = 0; t < c.d; ++t) {
          const long double x = static_cast<long double>(in.q[(sl * c.T + i) * c.d + t]) *
                                static_cast<long double>(in.k[(sl * c.S + j) * c.d + t]);
          dot += x;
          abs_dot += std::fabs(x);
        }
        const long double m = in.mask.empty() ? 0.0L : static_cast<long double>(in.mask[i * c.S + j]);
        s[j] = (c.causal && j > i) ? -std::numeric_limits<long double>::infinity() : scale * dot + m;
        err[j] = (c.d + 2) * u * scale * abs_dot;
        if (s[j] > mx) mx = s[j];
      }
      for (std::int64_t j = 0; j < c.S; ++j)
        if (std::isfinite(static_cast<double>(s[j])) && err[j] > worst_err) worst_err = err[j];
      long double sum = 0;
      for (std::int64_t j = 0; j < c.S; ++j) sum += std::isinf(static_cast<double>(mx)) ? 0.0L : std::exp(s[j] - mx);
      for (std::int64_t j = 0; j < c.S; ++j) {
        const long double want = sum == 0 ? 0.0L : std::exp(s[j] - mx) / sum;
        const long double bound = want * (err[j] + worst_err + 16 * u) + 1e-35L;
        const double g = got[static_cast<std::size_t>((sl * c.T + i) * c.S + j)];
        if (!(std::fabs(static_cast<long double>(g) - want) <= bound)) ++wrong;
      }
    }
  return wrong;
}

const std::vector<Case> kCases = {
    {1, 1, 7, 13, 5, 0.0, false, false, false, "7x13 close maxima"},
    {2, 3, 32, 32, 16, 0.0, false, false, false, "toy slice 32x32"},
    {1, 2, 33, 17, 9, 0.0, false, false, false, "33x17"},
    {1, 1, 1, 19, 4, 0.0, false, false, false, "one row"},
    {1, 2, 20, 24, 8, 3.0, false, false, false, "spread-out maxima"},
    {2, 1, 12, 15, 6, 0.0, true, false, false, "key 0 blocked"},
    {1, 2, 9, 11, 7, 0.0, false, true, false, "row 1 fully blocked"},
    {1, 1, 19, 19, 5, 0.0, false, false, true, "causal"},
};

// One op of each kind of slice; float32 against float64, relative to the float64 scale.
void check_output_and_gradients(const std::string& isa) {
  std::uint64_t seed = 70;
  for (const Case& c : kCases) {
    const Inputs in = inputs(c, seed++);
    std::vector<std::vector<double>> results[2];
    for (int t = 0; t < 2; ++t) {
      const ag::Dtype dt = t == 0 ? ag::Dtype::Float32 : ag::Dtype::Float64;
      ag::Tensor q = make(in.q, {c.B, c.H, c.T, c.d}, dt).requires_grad_();
      ag::Tensor k = make(in.k, {c.B, c.H, c.S, c.d}, dt).requires_grad_();
      ag::Tensor v = make(in.v, {c.B, c.H, c.S, c.d}, dt).requires_grad_();
      const ag::Tensor mask = in.mask.empty() ? ag::Tensor() : make(in.mask, {c.T, c.S}, dt);
      const ag::Tensor out =
          ag::scaled_dot_product_attention(q, k, v, {.attn_mask = mask, .is_causal = c.causal}).output;
      ag::sum(out * out).backward();
      for (const ag::Tensor& x : {out, q.grad(), k.grad(), v.grad()}) {
        const ag::Tensor x64 = x.to(ag::Dtype::Float64);
        results[t].emplace_back(x64.data<double>(), x64.data<double>() + x64.numel());
      }
    }
    for (std::size_t r = 0; r < results[0].size(); ++r) {
      double scale = 1e-30, worst = 0;
      for (double x : results[1][r]) scale = std::max(scale, std::fabs(x));
      for (std::size_t i = 0; i < results[0][r].size(); ++i)
        worst = std::max(worst, std::fabs(results[0][r][i] - results[1][r][i]));
      BOOST_TEST(worst <= 2e-5 * scale, c.name << " " << isa << " result " << r << ": " << worst << " against " << scale);
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(float32_weights_against_long_double) {
  for (const std::string& isa : test_support::available_isas()) {
    const test_support::IsaScope scope(isa);
    std::uint64_t seed = 11;
    for (const Case& c : kCases) {
      const Inputs in = inputs(c, seed++);
      BOOST_TEST(wrong_weights(c, in, weights(c, in, ag::Dtype::Float32)) == 0, c.name << " " << isa);
      BOOST_TEST(wrong_weights(c, in, weights(c, in, ag::Dtype::Float64)) == 0, c.name << " (float64) " << isa);
    }
  }
}

BOOST_AUTO_TEST_CASE(nan_and_infinite_scores_give_what_float64_gives) {
  // A NaN or ±inf in one q entry (row 5 of slice 0: that row's scores are NaN or infinite) or in
  // one k entry (key 7: that score of every row), so the slice must leave the shared shift for
  // the row-by-row path; the float32 weights then have NaN where the float64 op's have, and the
  // other weights agree.
  const Case c{1, 2, 32, 32, 16, 0.0, false, false, false, "special"};
  for (const std::string& isa : test_support::available_isas()) {
    const test_support::IsaScope scope(isa);
    for (float special : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()})
      for (bool in_q : {true, false}) {
      Inputs in = inputs(c, 21);
      (in_q ? in.q[5 * c.d + 3] : in.k[7 * c.d + 3]) = special;
      const std::vector<double> w32 = weights(c, in, ag::Dtype::Float32), w64 = weights(c, in, ag::Dtype::Float64);
      int differ = 0, nan_rows = 0;
      for (std::size_t i = 0; i < w32.size(); ++i) {
        if (std::isnan(w64[i]) != std::isnan(w32[i])) ++differ;
        else if (!std::isnan(w64[i]) && !(std::fabs(w32[i] - w64[i]) <= 1e-5)) ++differ;
        if (std::isnan(w64[i]) && i % c.S == 0) ++nan_rows;
      }
      BOOST_TEST(differ == 0, isa << " special " << special << (in_q ? " in q" : " in k"));
      BOOST_TEST(nan_rows >= 1, isa << " special " << special << (in_q ? " in q" : " in k") << ": NaN in float64 too");
    }
  }
}

BOOST_AUTO_TEST_CASE(float32_output_and_gradients_follow_float64) {
  for (const std::string& isa : test_support::available_isas()) {
    const test_support::IsaScope scope(isa);
    check_output_and_gradients(isa);
  }
}

BOOST_AUTO_TEST_CASE(a_causal_float_mask_gives_the_bits_of_is_causal) {
  const Case c{2, 2, 24, 24, 8, 0.0, false, false, true, "causal"};
  const Inputs in = inputs(c, 31);
  const ag::Tensor q = make(in.q, {c.B, c.H, c.T, c.d}, ag::Dtype::Float32);
  const ag::Tensor k = make(in.k, {c.B, c.H, c.S, c.d}, ag::Dtype::Float32);
  const ag::Tensor v = make(in.v, {c.B, c.H, c.S, c.d}, ag::Dtype::Float32);
  std::vector<double> mask(static_cast<std::size_t>(c.T * c.S), 0.0);
  for (std::int64_t i = 0; i < c.T; ++i)
    for (std::int64_t j = i + 1; j < c.S; ++j) mask[i * c.S + j] = -std::numeric_limits<double>::infinity();
  const ag::SdpaResult flag = ag::scaled_dot_product_attention(q, k, v, {.is_causal = true});
  const ag::SdpaResult masked = ag::scaled_dot_product_attention(q, k, v, {.attn_mask = ag::tensor(mask, {c.T, c.S})});
  BOOST_TEST(ag::max(ag::abs(flag.output - masked.output)).item<float>() == 0.f);
  BOOST_TEST(ag::max(ag::abs(flag.weights - masked.weights)).item<float>() == 0.f);
}

BOOST_AUTO_TEST_CASE(negative_control_a_weight_off_by_1e_5_is_seen) {
  const Case& c = kCases[1];
  const Inputs in = inputs(c, 5);
  std::vector<double> w = weights(c, in, ag::Dtype::Float32);
  BOOST_TEST(wrong_weights(c, in, w) == 0);
  w[37] *= 1.0 + 1e-5;
  BOOST_TEST(wrong_weights(c, in, w) == 1);
  // Tiny weights flushed to zero (what a shared shift over rows far apart would do) are seen too.
  const Case spread = kCases[4];
  const Inputs sin = inputs(spread, 9);
  std::vector<double> sw = weights(spread, sin, ag::Dtype::Float32);
  BOOST_TEST(wrong_weights(spread, sin, sw) == 0);
  int zeroed = 0;
  for (double& x : sw)
    if (x > 1e-30 && x < 1e-13) {
      x = 0.0;
      ++zeroed;
    }
  if (zeroed > 0) BOOST_TEST(wrong_weights(spread, sin, sw) == zeroed);
}
