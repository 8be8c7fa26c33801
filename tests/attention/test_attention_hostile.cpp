// The tiled attention core (need_weights = false, T·S >= 2^20) against the untiled kernel
// (need_weights = true) in float64: outputs and gradients to q, k, v and the mask, for self- and
// cross-attention, masks of every broadcast shape, fully blocked rows, the three layouts;
// the same bits at 1, 2 and 3 threads, when calls of different shapes and dtypes alternate, and
// when two threads of the program call the core at once.
#define BOOST_TEST_MODULE attention_hostile
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <autograd/autograd.hpp>

namespace ag = autograd;

namespace {

struct Case {
  std::int64_t B, H, T, S, d;
  ag::Shape mask;  // empty vector of size 0 with mask_rank -1 means none
  bool has_mask;
  bool causal;
};

struct Result {
  std::vector<double> out, gq, gk, gv, gm;
};

// A mask with -inf in about a tenth of its entries and in every entry of its first row (when it
// has rows), so that some query rows are fully blocked.
ag::Tensor make_mask(const ag::Shape& s, ag::Dtype dt, std::uint64_t seed) {
  ag::Generator gen(seed);
  std::vector<double> v = ag::randn(s, ag::Dtype::Float64, gen).to_vector();
  const std::int64_t last = s.empty() ? 1 : s.back();
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (static_cast<std::int64_t>(i) < last && s.size() >= 2) v[i] = -std::numeric_limits<double>::infinity();
    else if ((i * 2654435761u) % 10 == 0) v[i] = -std::numeric_limits<double>::infinity();
  }
  return ag::tensor(v, s, dt);
}

Result run(const Case& c, ag::Dtype dt, bool need_weights, int layout, std::uint64_t seed = 5) {
  ag::Generator gen(seed);
  const double scale = 0.0;
  ag::Tensor q = ag::randn({c.B, c.H, c.T, c.d}, dt, gen).requires_grad_();
  ag::Tensor k = ag::randn({c.B, c.H, c.S, c.d}, dt, gen).requires_grad_();
  ag::Tensor v = ag::randn({c.B, c.H, c.S, c.d}, dt, gen).requires_grad_();
  ag::Tensor g = ag::randn({c.B, c.H, c.T, c.d}, dt, gen);
  ag::Tensor m;
  if (c.has_mask) m = make_mask(c.mask, dt, seed + 1).requires_grad_();
  ag::Tensor out;
  if (layout == 0) {
    out = ag::scaled_dot_product_attention(
              q, k, v, {.need_weights = need_weights, .attn_mask = m, .is_causal = c.causal, .scale = scale})
              .output;
  } else {
    // heads last: (B, L, H·d) from (B, H, L, d)
    auto hl = [&](const ag::Tensor& x) {
      return ag::reshape(ag::permute(x, {0, 2, 1, 3}), {x.size(0), x.size(2), x.size(1) * x.size(3)});
    };
    ag::Tensor o;
    if (layout == 1) {
      o = ag::scaled_dot_product_attention_heads_last(
              hl(q), hl(k), hl(v), c.H,
              {.need_weights = need_weights, .attn_mask = m, .is_causal = c.causal, .scale = scale})
              .output;
    } else {
      const ag::TensorList parts = {hl(q), hl(k), hl(v)};
      o = ag::scaled_dot_product_attention_packed(
              ag::cat(parts, 2), c.H,
              {.need_weights = need_weights, .attn_mask = m, .is_causal = c.causal, .scale = scale})
              .output;
    }
    out = ag::permute(ag::reshape(o, {c.B, c.T, c.H, c.d}), {0, 2, 1, 3});
  }
  ag::sum(ag::mul(out, g)).backward();
  Result r{out.to_vector(), q.grad().to_vector(), k.grad().to_vector(), v.grad().to_vector(), {}};
  if (c.has_mask) r.gm = m.grad().to_vector();
  return r;
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double d = 0, scale = 1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) return std::numeric_limits<double>::infinity();
    d = std::max(d, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return d / scale;
}

bool bits(const Result& a, const Result& b) {
  return a.out == b.out && a.gq == b.gq && a.gk == b.gk && a.gv == b.gv && a.gm == b.gm;
}

std::string name(const Case& c) {
  std::ostringstream o;
  o << "B" << c.B << " H" << c.H << " T" << c.T << " S" << c.S << " d" << c.d;
  if (c.has_mask) o << " mask " << ag::shape_str(c.mask);
  if (c.causal) o << " causal";
  return o.str();
}

const std::vector<Case> kCases = {
    {1, 2, 1024, 1024, 8, {}, false, false},
    {1, 2, 1024, 1024, 8, {}, false, true},
    {1, 2, 1024, 1024, 5, {1024, 1024}, true, false},
    {1, 2, 1024, 1024, 8, {1024, 1024}, true, true},
    {2, 1, 256, 4096, 7, {4096}, true, false},
    {2, 1, 256, 4096, 7, {2, 1, 1, 4096}, true, false},
    {1, 2, 4099, 257, 3, {1, 2, 4099, 257}, true, false},
    {1, 2, 4099, 257, 3, {4099, 1}, true, false},
    {1, 3, 1100, 1000, 16, {3, 1, 1000}, true, false},
    {1, 1, 1, 1048576, 4, {}, false, false},
    {1, 1, 1048576, 1, 4, {1048576, 1}, true, false},
};

}  // namespace

BOOST_AUTO_TEST_CASE(tiled_core_agrees_with_the_untiled_kernel_in_float64) {
  ag::set_num_threads(2);
  for (const Case& c : kCases) {
    const Result ref = run(c, ag::Dtype::Float64, true, 0);
    for (int layout = 0; layout < 3; ++layout) {
      if (layout == 2 && c.T != c.S) continue;
      const Result r = run(c, ag::Dtype::Float64, false, layout);
      const std::string w = name(c) + " layout " + std::to_string(layout);
      BOOST_TEST(max_diff(r.out, ref.out) < 1e-12, "out " << w);
      BOOST_TEST(max_diff(r.gq, ref.gq) < 1e-12, "dq " << w);
      BOOST_TEST(max_diff(r.gk, ref.gk) < 1e-12, "dk " << w);
      BOOST_TEST(max_diff(r.gv, ref.gv) < 1e-12, "dv " << w);
      BOOST_TEST(max_diff(r.gm, ref.gm) < 1e-12, "dmask " << w);
    }
  }
}

BOOST_AUTO_TEST_CASE(tiled_core_has_the_same_bits_at_every_thread_count_and_across_alternating_calls) {
  std::vector<Result> first;
  for (int t : {1, 2, 3}) {
    ag::set_num_threads(t);
    std::size_t i = 0;
    for (int rep = 0; rep < 2; ++rep)
      for (const Case& c : kCases)
        for (ag::Dtype dt : {ag::Dtype::Float32, ag::Dtype::Float64}) {
          const int layout = static_cast<int>(i % 3) == 2 && c.T != c.S ? 1 : static_cast<int>(i % 3);
          const Result r = run(c, dt, false, layout);
          if (t == 1 && rep == 0) {
            first.push_back(r);
          } else {
            BOOST_TEST(bits(r, first[i % first.size()]), name(c) << " threads " << t << " rep " << rep);
          }
          ++i;
        }
  }
  ag::set_num_threads(2);
}

BOOST_AUTO_TEST_CASE(two_program_threads_calling_the_tiled_core_at_once_get_their_own_results) {
  ag::set_num_threads(2);
  const Case a = kCases[3], b = kCases[4];
  const Result ra = run(a, ag::Dtype::Float64, false, 0), rb = run(b, ag::Dtype::Float32, false, 1);
  bool ok_a = true, ok_b = true;
  std::thread ta([&] {
    for (int i = 0; i < 3; ++i) ok_a = ok_a && bits(run(a, ag::Dtype::Float64, false, 0), ra);
  });
  std::thread tb([&] {
    for (int i = 0; i < 3; ++i) ok_b = ok_b && bits(run(b, ag::Dtype::Float32, false, 1), rb);
  });
  ta.join();
  tb.join();
  BOOST_TEST(ok_a);
  BOOST_TEST(ok_b);
}
