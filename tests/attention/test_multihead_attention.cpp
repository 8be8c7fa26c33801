// nn::MultiHeadAttention: the API contract, the seed's numbers, masks, fully blocked rows, the
// two attention cores against each other, gradchecks, study mode, dropout and error messages.
// (Agreement with PyTorch is in test_mha_torch_parity.cpp.)
#define BOOST_TEST_MODULE multihead_attention
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include <Eigen/Dense>
#include <nn/nn.hpp>

#include "test_support.hpp"

namespace ag = autograd;
using test_support::all_finite;
using nn::AttentionCore;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
const ag::Dtype F64 = ag::Dtype::Float64;

void set(const ag::Tensor& param, const std::vector<double>& values) {
  ag::NoGradGuard no_grad;
  ag::Tensor p = param;
  p.copy_(ag::tensor(values, param.shape(), param.dtype()));
}

double max_abs_diff(const ag::Tensor& a, const ag::Tensor& b) {
  BOOST_REQUIRE(a.defined() && b.defined());
  BOOST_REQUIRE(a.shape() == b.shape());
  const auto x = a.to_vector(), y = b.to_vector();
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (x[i] == y[i]) continue;  // also equal infinities
    worst = std::max(worst, std::abs(x[i] - y[i]));
  }
  return worst;
}

using test_support::message_has;

Eigen::MatrixXd to_eigen(const ag::Tensor& t2d) {
  const auto v = t2d.to_vector();
  Eigen::MatrixXd m(t2d.size(0), t2d.size(1));
  for (Eigen::Index i = 0; i < m.rows(); ++i)
    for (Eigen::Index j = 0; j < m.cols(); ++j) m(i, j) = v[static_cast<std::size_t>(i * m.cols() + j)];
  return m;
}

// A configuration of the layer and its inputs, for the tests that run over many of them.
struct Case {
  std::string name;
  std::int64_t E = 4, H = 2, B = 2, T = 3, S = 3, kdim = 0, vdim = 0;
  bool bias = true, add_bias_kv = false, add_zero_attn = false;
  bool self_attention = false;
  bool padding = false;       // key S-1 of batch entry 0 is padding
  int attn_mask = 0;          // 0: none, 2: (T, S), 3: (B·H, T, S); random values, some -inf
  bool causal = false;
  bool blocked_rows = false;  // batch entry B-1 all padding, and query row 1 fully -inf in attn_mask
  bool average = false;
};

const std::vector<Case> kCases = [] {
  std::vector<Case> cs;
  Case c;
  c.name = "no_masks";                      cs.push_back(c);
  c.name = "one_head";   c.H = 1;           cs.push_back(c);
  c.name = "four_heads_of_width_1"; c.H = 4; c.average = true; cs.push_back(c);
  c = Case{}; c.name = "no_bias"; c.bias = false; cs.push_back(c);
  c = Case{}; c.name = "unbatched_self"; c.B = 0; c.self_attention = true; c.T = c.S = 4; cs.push_back(c);
  c = Case{}; c.name = "cross_kdim_vdim"; c.E = 6; c.H = 3; c.S = 5; c.kdim = 4; c.vdim = 2; c.padding = true; cs.push_back(c);
  c = Case{}; c.name = "padding"; c.S = 4; c.padding = true; cs.push_back(c);
  c = Case{}; c.name = "mask_2d"; c.S = 4; c.attn_mask = 2; cs.push_back(c);
  c = Case{}; c.name = "mask_3d_padding"; c.S = 4; c.attn_mask = 3; c.padding = true; cs.push_back(c);
  c = Case{}; c.name = "causal"; c.T = c.S = 4; c.causal = true; cs.push_back(c);
  c = Case{}; c.name = "causal_mask_3d"; c.T = c.S = 3; c.causal = true; c.attn_mask = 3; c.average = true; cs.push_back(c);
  c = Case{}; c.name = "bias_kv_zero_attn_causal"; c.causal = true; c.add_bias_kv = true; c.add_zero_attn = true; c.padding = true; cs.push_back(c);
  c = Case{}; c.name = "blocked_rows"; c.S = 4; c.attn_mask = 2; c.blocked_rows = true; cs.push_back(c);
  c = Case{}; c.name = "blocked_rows_unbatched_causal"; c.B = 0; c.T = c.S = 3; c.attn_mask = 3; c.causal = true; c.blocked_rows = true; cs.push_back(c);
  // Self-attention on the fused core takes the packed path (one projection by [W_Q | W_K | W_V]).
  c = Case{}; c.name = "self_causal_mask_3d_padding"; c.self_attention = true; c.T = c.S = 4; c.causal = true; c.attn_mask = 3; c.padding = true; cs.push_back(c);
  c = Case{}; c.name = "self_no_bias_mask_2d"; c.self_attention = true; c.T = c.S = 3; c.bias = false; c.attn_mask = 2; cs.push_back(c);
  return cs;
}();

const Case& case_named(const std::string& name) {
  for (const auto& c : kCases)
    if (c.name == name) return c;
  throw std::runtime_error("no case " + name);
}

struct Setup {
  std::unique_ptr<nn::MultiHeadAttention> mha;
  ag::Tensor query, key, value;
  nn::AttentionOptions ao;
};

Setup make_setup(const Case& c, std::uint64_t seed = 1) {
  ag::Generator gen(seed);
  nn::MultiHeadAttentionOptions opt{c.E, c.H, 0.0, c.bias, c.kdim, c.vdim, c.add_bias_kv, c.add_zero_attn};
  opt.dtype = F64;
  Setup s;
  s.mha = std::make_unique<nn::MultiHeadAttention>(opt, gen);
  // Nonzero biases, so that their gradients and the blocked rows' b_O output mean something.
  for (auto& [name, p] : s.mha->named_parameters()) set(p, ag::randn(p.shape(), F64, gen).mul_(0.5).to_vector());
  const bool batched = c.B > 0;
  auto lead = [&](ag::Shape rest) {
    if (batched) rest.insert(rest.begin(), c.B);
    return rest;
  };
  s.query = ag::randn(lead({c.T, c.E}), F64, gen).requires_grad_();
  if (c.self_attention) {
    s.key = s.value = s.query;
  } else {
    s.key = ag::randn(lead({c.S, c.kdim ? c.kdim : c.E}), F64, gen).requires_grad_();
    s.value = ag::randn(lead({c.S, c.vdim ? c.vdim : c.E}), F64, gen).requires_grad_();
  }
  const std::int64_t B = batched ? c.B : 1;
  if (c.padding || (c.blocked_rows && batched)) {
    std::vector<double> kpm(static_cast<std::size_t>(B * c.S), 0.0);
    if (c.padding) kpm[static_cast<std::size_t>(c.S - 1)] = 1.0;
    if (c.blocked_rows && batched)
      for (std::int64_t j = 0; j < c.S; ++j) kpm[static_cast<std::size_t>((B - 1) * c.S + j)] = 1.0;
    s.ao.key_padding_mask = ag::tensor(kpm, lead({c.S}), F64);
  }
  if (c.attn_mask) {
    const ag::Shape shape = c.attn_mask == 2 ? ag::Shape{c.T, c.S} : ag::Shape{B * c.H, c.T, c.S};
    std::vector<double> m = ag::randn(shape, F64, gen).to_vector();
    for (std::size_t i = 0; i < m.size(); ++i) {
      const std::int64_t j = static_cast<std::int64_t>(i) % c.S, row = (static_cast<std::int64_t>(i) / c.S) % c.T;
      if (j != 0 && gen.uniform() < 0.3) m[i] = -kInf;        // key 0 stays visible ...
      if (c.blocked_rows && row == 1) m[i] = -kInf;           // ... except in row 1 when asked
    }
    s.ao.attn_mask = ag::tensor(m, shape, F64);
  }
  s.ao.is_causal = c.causal;
  s.ao.average_attn_weights = c.average;
  return s;
}

struct Run {
  ag::Tensor out, weights;
  std::vector<std::pair<std::string, ag::Tensor>> grads;
};

// Forward with the given core, then backward of L = Σ out·G + Σ weights·G_w (fixed random G).
Run run(Setup& s, AttentionCore core, bool need_weights = true) {
  s.mha->set_core(core);
  s.mha->zero_grad(true);
  for (auto* t : {&s.query, &s.key, &s.value}) t->set_grad(ag::Tensor());
  nn::AttentionOptions ao = s.ao;
  ao.need_weights = need_weights;
  Run r;
  auto [out, weights] = (*s.mha)(s.query, s.key, s.value, ao);
  r.out = out;
  r.weights = weights;
  ag::Generator gen(99);
  ag::Tensor loss = ag::sum(out * ag::randn(out.shape(), F64, gen));
  if (weights.defined()) loss = loss + ag::sum(weights * ag::randn(weights.shape(), F64, gen));
  loss.backward();
  r.grads.emplace_back("query", s.query.grad());
  if (!s.key.is_same(s.query)) r.grads.emplace_back("key", s.key.grad());
  if (!s.value.is_same(s.query)) r.grads.emplace_back("value", s.value.grad());
  for (auto& [name, p] : s.mha->named_parameters()) r.grads.emplace_back(name, p.grad());
  return r;
}

// The seed's worked example: d_model = 4, 2 heads, W_Q = W_K = W_V = I, no biases, the seed's W_O,
// and the projected rows as inputs.
struct SeedExample {
  nn::MultiHeadAttention mha{nn::MultiHeadAttentionOptions{4, 2, 0.0, /*bias=*/false}};
  ag::Tensor query = ag::tensor({1, 0, 1, 0,    // t1: head 1 [1, 0], head 2 [1, 0]
                                 0, 1, 0, 1},   // t2: head 1 [0, 1], head 2 [0, 1]
                                {2, 4}, F64);
  ag::Tensor key = ag::tensor({1, 0, 0, 1,      // K-t1: head 1 [1, 0]
                               0, 1, 1, 0},     // K-t2: head 1 [0, 1]
                              {2, 4}, F64);
  ag::Tensor value = ag::tensor({2, 0, 1, 1,    // V-t1: head 1 [2, 0], head 2 [1, 1]
                                 0, 2, 1, 1},   // V-t2: head 1 [0, 2], head 2 [1, 1]
                                {2, 4}, F64);
  SeedExample() {
    mha.to(F64);
    const std::vector<double> I = {1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1};
    set(mha.W_Q(), I);
    set(mha.W_K(), I);
    set(mha.W_V(), I);
    set(mha.W_O(), {1, 0, 1, 0,
                    0, 1, 0, 1,
                    1, 0, 0, 1,
                    0, 1, 1, 0});
  }
};

}  // namespace

// ---------------------------------------------------------------- the API contract

BOOST_AUTO_TEST_CASE(parameters_are_named_and_shaped_as_the_api_says) {
  nn::MultiHeadAttentionOptions opt{6, 2, 0.0, true, 3, 5};
  nn::MultiHeadAttention mha(opt);
  const std::vector<std::pair<std::string, ag::Shape>> want = {
      {"W_Q", {6, 6}}, {"W_K", {3, 6}}, {"W_V", {5, 6}}, {"W_O", {6, 6}},
      {"b_Q", {6}},    {"b_K", {6}},    {"b_V", {6}},    {"b_O", {6}}};
  auto named = mha.named_parameters();
  BOOST_REQUIRE_EQUAL(named.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    BOOST_TEST(named[i].first == want[i].first);
    BOOST_TEST(ag::shape_str(named[i].second.shape()) == ag::shape_str(want[i].second));
    BOOST_TEST(named[i].second.requires_grad());
  }
  nn::MultiHeadAttentionOptions kv{4, 2};
  kv.add_bias_kv = true;
  auto named_kv = nn::MultiHeadAttention(kv).named_parameters();
  BOOST_REQUIRE_EQUAL(named_kv.size(), 10u);
  BOOST_TEST(named_kv[8].first == "bias_k");
  BOOST_TEST(named_kv[9].first == "bias_v");
}

BOOST_AUTO_TEST_CASE(parameter_count_is_4_d_squared_whatever_the_head_count) {
  for (std::int64_t heads : {1, 2, 4}) {
    nn::MultiHeadAttention with_bias(4, heads);
    BOOST_TEST(with_bias.num_parameters() == 4 * 16 + 4 * 4, heads << " heads");
    nn::MultiHeadAttention no_bias(nn::MultiHeadAttentionOptions{4, heads, 0.0, false});
    BOOST_TEST(no_bias.num_parameters() == 64, heads << " heads");
    BOOST_TEST(no_bias.head_dim() * heads == 4);
  }
}

BOOST_AUTO_TEST_CASE(to_float64_keeps_names_and_handles) {
  nn::MultiHeadAttention mha(4, 2);
  ag::Tensor handle = mha.named_parameters()[0].second;
  const auto before = handle.to_vector();
  mha.to(F64);
  BOOST_TEST((handle.dtype() == F64));
  BOOST_TEST(mha.named_parameters()[0].first == "W_Q");
  BOOST_TEST(mha.W_Q().is_same(handle));
  const auto after = handle.to_vector();
  for (std::size_t i = 0; i < before.size(); ++i) BOOST_TEST(after[i] == before[i]);  // float -> double exact
}

BOOST_AUTO_TEST_CASE(copy_into_a_named_parameter_changes_the_module) {
  nn::MultiHeadAttention mha(4, 2);
  mha.to(F64);
  ag::Tensor x = ag::randn({3, 4}, F64);
  const auto before = mha(x, x, x).output.to_vector();
  for (auto& [name, p] : mha.named_parameters())
    if (name == "b_O") set(p, {1, 1, 1, 1});
  const auto after = mha(x, x, x).output.to_vector();
  for (std::size_t i = 0; i < before.size(); ++i) BOOST_TEST(std::abs(after[i] - before[i] - 1.0) < 1e-12);
}

BOOST_AUTO_TEST_CASE(module_prints_its_settings_and_parameter_shapes) {
  nn::MultiHeadAttention mha(4, 2);
  const std::string s = fmt::format("{}", mha);
  BOOST_TEST(s.find("MultiHeadAttention(embed_dim=4, num_heads=2, head_dim=2") != std::string::npos, s);
  BOOST_TEST(s.find("[80 parameters]") != std::string::npos, s);
  BOOST_TEST(s.find("W_K [4, 4]") != std::string::npos, s);
  BOOST_TEST(s.find("core=fused") != std::string::npos, s);
}

BOOST_AUTO_TEST_CASE(same_seed_same_initialisation) {
  ag::Generator g1(3), g2(3);
  nn::MultiHeadAttention a(nn::MultiHeadAttentionOptions{8, 2}, g1), b(nn::MultiHeadAttentionOptions{8, 2}, g2);
  for (std::size_t i = 0; i < 4; ++i)
    BOOST_TEST(a.parameters()[i].to_vector() == b.parameters()[i].to_vector());
  // Xavier-uniform on the (3E x E) in-projection block: |w| <= √(6 / 4E); biases start at zero.
  for (double v : a.W_Q().to_vector()) BOOST_TEST(std::abs(v) <= std::sqrt(6.0 / 32.0));
  for (double v : a.b_Q().to_vector()) BOOST_TEST(v == 0.0);
}

BOOST_AUTO_TEST_CASE(output_and_weight_shapes_batched_unbatched_averaged_per_head) {
  nn::MultiHeadAttention mha(nn::MultiHeadAttentionOptions{6, 3, 0.0, true, 4, 5});
  ag::Tensor q = ag::randn({2, 3, 6}), k = ag::randn({2, 5, 4}), v = ag::randn({2, 5, 5});
  auto r = mha(q, k, v);
  BOOST_TEST(ag::shape_str(r.output.shape()) == "[2, 3, 6]");
  BOOST_TEST(ag::shape_str(r.weights.shape()) == "[2, 3, 5]");
  nn::AttentionOptions per_head;
  per_head.average_attn_weights = false;
  BOOST_TEST(ag::shape_str(mha(q, k, v, per_head).weights.shape()) == "[2, 3, 3, 5]");
  nn::AttentionOptions no_weights;
  no_weights.need_weights = false;
  BOOST_TEST(!mha(q, k, v, no_weights).weights.defined());
  // Using them anyway says why they are missing.
  test_support::check_message([&] { (void)ag::sum(mha(q, k, v, no_weights).weights); },
                              "need_weights = false: the attention weights were not asked for");
  auto u = mha(ag::randn({3, 6}), ag::randn({5, 4}), ag::randn({5, 5}), per_head);
  BOOST_TEST(ag::shape_str(u.output.shape()) == "[3, 6]");
  BOOST_TEST(ag::shape_str(u.weights.shape()) == "[3, 3, 5]");
}

BOOST_AUTO_TEST_CASE(unbatched_input_equals_a_batch_of_one) {
  for (auto core : {AttentionCore::Fused, AttentionCore::Composed}) {
    Case c;
    c.B = 0;
    c.S = 4;
    c.padding = true;
    Setup s = make_setup(c);
    s.mha->set_core(core);
    auto u = s.mha->forward(s.query, s.key, s.value, s.ao);
    nn::AttentionOptions ao = s.ao;
    ao.key_padding_mask = ag::unsqueeze(s.ao.key_padding_mask, 0);
    auto b = s.mha->forward(ag::unsqueeze(s.query, 0), ag::unsqueeze(s.key, 0), ag::unsqueeze(s.value, 0), ao);
    BOOST_TEST(max_abs_diff(u.output, ag::squeeze(b.output, 0)) == 0.0);
    BOOST_TEST(max_abs_diff(u.weights, ag::squeeze(b.weights, 0)) == 0.0);
  }
}

BOOST_AUTO_TEST_CASE(averaged_weights_are_the_mean_of_the_per_head_weights) {
  Case c;
  c.H = 4;
  c.E = 8;
  Setup s = make_setup(c);
  nn::AttentionOptions ao;
  ao.average_attn_weights = false;
  ag::Tensor per_head = s.mha->forward(s.query, s.key, s.value, ao).weights;
  ao.average_attn_weights = true;
  ag::Tensor averaged = s.mha->forward(s.query, s.key, s.value, ao).weights;
  BOOST_TEST(max_abs_diff(averaged, ag::mean(per_head, 1)) < 1e-15);
  // each row of weights sums to 1
  for (double v : ag::sum(per_head, -1).to_vector()) BOOST_TEST(std::abs(v - 1.0) < 1e-14);
}

BOOST_AUTO_TEST_CASE(head_h_reads_columns_h_dk_to_h_plus_1_dk_of_the_projections) {
  Case c;
  Setup s = make_setup(c);
  nn::AttentionOptions ao;
  ao.average_attn_weights = false;
  const ag::Tensor w0 = s.mha->forward(s.query, s.key, s.value, ao).weights;  // (B, 2, T, S)
  // Change only columns 2..3 of W_Q (head 2's slice): head 1's weights must not move, head 2's must.
  auto wq = s.mha->W_Q().to_vector();
  for (std::int64_t r = 0; r < 4; ++r) wq[static_cast<std::size_t>(r * 4 + 2)] += 0.7;
  set(s.mha->W_Q(), wq);
  const ag::Tensor w1 = s.mha->forward(s.query, s.key, s.value, ao).weights;
  BOOST_TEST(max_abs_diff(ag::narrow(w0, 1, 0, 1), ag::narrow(w1, 1, 0, 1)) == 0.0);
  BOOST_TEST(max_abs_diff(ag::narrow(w0, 1, 1, 1), ag::narrow(w1, 1, 1, 1)) > 1e-3);
}

// ---------------------------------------------------------------- the seed's numbers

BOOST_AUTO_TEST_CASE(worked_example_matches_the_seed_to_printed_precision) {
  SeedExample ex;
  nn::AttentionOptions ao;
  ao.average_attn_weights = false;
  auto [out, weights] = ex.mha(ex.query, ex.key, ex.value, ao);
  const auto w = weights.to_vector();  // (2 heads, 2, 2)
  BOOST_TEST(std::abs(w[0] - 0.670) < 1e-3);  // head 1, t1 -> t1
  BOOST_TEST(std::abs(w[1] - 0.330) < 1e-3);  // head 1, t1 -> t2
  const auto o = out.to_vector();
  const std::vector<double> seed_t1 = {2.340, 1.660, 2.340, 1.660};
  for (std::size_t j = 0; j < 4; ++j) BOOST_TEST(std::abs(o[j] - seed_t1[j]) < 1e-3, "out(t1)[" << j << "]");
}

BOOST_AUTO_TEST_CASE(worked_example_matches_the_formula_to_float64) {
  // Head 1, t1: scores [1, 0]/√2 -> weights [p, 1-p], p = 1 / (1 + e^{-1/√2});
  // head1-t1 = p·[2, 0] + (1-p)·[0, 2]; head 2 = [1, 1]; out = [2p + 1, 2(1-p) + 1, 2p + 1, 2(1-p) + 1].
  const double p = 1.0 / (1.0 + std::exp(-1.0 / std::sqrt(2.0)));
  const std::vector<double> want = {2 * p + 1, 2 * (1 - p) + 1, 2 * p + 1, 2 * (1 - p) + 1};
  for (auto core : {AttentionCore::Fused, AttentionCore::Composed}) {
    SeedExample ex;
    ex.mha.set_core(core);
    const auto o = ex.mha(ex.query, ex.key, ex.value).output.to_vector();
    for (std::size_t j = 0; j < 4; ++j) BOOST_TEST(std::abs(o[j] - want[j]) < 1e-15, "out(t1)[" << j << "]");
  }
}

// ---------------------------------------------------------------- masks

// Every weight that `blocked(n)` marks (n: row-major index into w) is exactly zero; every other
// is positive.
template <class Blocked>
void check_blocked(const ag::Tensor& weights, Blocked blocked) {
  const auto w = weights.to_vector();
  for (std::size_t n = 0; n < w.size(); ++n) {
    if (blocked(n)) BOOST_TEST(w[n] == 0.0, "weight " << n << " should be blocked");
    else BOOST_TEST(w[n] > 0.0, "weight " << n << " should be visible");
  }
}

BOOST_AUTO_TEST_CASE(causal_blocks_future_keys_and_equals_an_explicit_minus_inf_mask) {
  for (auto core : {AttentionCore::Fused, AttentionCore::Composed}) {
    Case c;
    c.T = c.S = 4;
    Setup s = make_setup(c);
    s.mha->set_core(core);
    // Designated initialisers name only what they set (compiles clean under -Wextra -Werror).
    const nn::AttentionOptions causal{.average_attn_weights = false, .is_causal = true};
    auto a = s.mha->forward(s.query, s.key, s.value, causal);
    std::vector<double> m(16, 0.0);
    for (int i = 0; i < 4; ++i)
      for (int j = i + 1; j < 4; ++j) m[static_cast<std::size_t>(i * 4 + j)] = -kInf;
    nn::AttentionOptions explicit_mask;
    explicit_mask.attn_mask = ag::tensor(m, {4, 4}, F64);
    explicit_mask.average_attn_weights = false;
    auto b = s.mha->forward(s.query, s.key, s.value, explicit_mask);
    BOOST_TEST(max_abs_diff(a.output, b.output) < 1e-15);
    // (2, 2, 4, 4): query i sees keys 0..i
    check_blocked(a.weights, [](std::size_t n) { return n % 4 > (n / 4) % 4; });
  }
}

BOOST_AUTO_TEST_CASE(any_nonzero_padding_entry_blocks_its_key) {
  Case c;
  c.S = 4;
  Setup s = make_setup(c);
  nn::AttentionOptions ao;
  // bool-like 1, float-mask-like -inf, and any other nonzero value all mean "padding".
  ao.key_padding_mask = ag::tensor({0, 1, 0, 0, 0, 0, -kInf, 5}, {2, 4}, F64);
  ao.average_attn_weights = false;
  const ag::Tensor w = s.mha->forward(s.query, s.key, s.value, ao).weights;  // (2, 2, 3, 4)
  check_blocked(w, [](std::size_t n) {
    const std::size_t b = n / 24, j = n % 4;
    return (b == 0 && j == 1) || (b == 1 && j >= 2);
  });
}

BOOST_AUTO_TEST_CASE(add_bias_kv_and_add_zero_attn_append_visible_keys) {
  Case c;
  c.add_bias_kv = true;
  c.add_zero_attn = true;
  c.T = c.S = 3;
  Setup s = make_setup(c);
  s.mha->set_study(true);
  nn::AttentionOptions ao;
  ao.is_causal = true;
  ao.average_attn_weights = false;
  auto r = s.mha->forward(s.query, s.key, s.value, ao);
  BOOST_TEST(ag::shape_str(r.weights.shape()) == "[2, 2, 3, 5]");  // S + bias_k + zero key
  const auto& st = s.mha->study();
  // key S is bias_k (head h's slice of it), key S+1 is zeros; neither is causally blocked.
  const auto bias_k = s.mha->bias_k().to_vector();
  for (std::int64_t h = 0; h < 2; ++h) {
    const Eigen::MatrixXd k = to_eigen(nn::AttentionStudy::head(st.k, h, 1));  // (5, 2)
    for (int d = 0; d < 2; ++d) {
      BOOST_TEST(k(3, d) == bias_k[static_cast<std::size_t>(h * 2 + d)]);
      BOOST_TEST(k(4, d) == 0.0);
    }
    const Eigen::MatrixXd w = to_eigen(nn::AttentionStudy::head(st.pattern, h, 1));  // (3, 5)
    BOOST_TEST(w(0, 1) == 0.0);  // causal among the real keys
    BOOST_TEST(w(0, 3) > 0.0);
    BOOST_TEST(w(0, 4) > 0.0);
    // the zero key scores exactly 0: its weight is 1 / Σ_j exp(score_j)
    const Eigen::MatrixXd sc = to_eigen(nn::AttentionStudy::head(st.attn_scores, h, 1));
    BOOST_TEST(sc(2, 4) == 0.0);
    BOOST_TEST(std::abs(w(2, 4) - 1.0 / sc.row(2).array().exp().sum()) < 1e-15);
  }
}

BOOST_AUTO_TEST_CASE(wrong_key_padding_mask_shape_throws_naming_the_shapes) {
  nn::MultiHeadAttention mha(4, 2);
  ag::Tensor q = ag::randn({2, 3, 4}), k = ag::randn({2, 5, 4});
  nn::AttentionOptions ao;
  ao.key_padding_mask = ag::zeros({2, 3});
  BOOST_CHECK_EXCEPTION(mha(q, k, k, ao), std::invalid_argument, [](const auto& e) {
    return message_has(e, {"MultiHeadAttention", "key_padding_mask", "[2, 3]", "[2, 5]"});
  });
}

BOOST_AUTO_TEST_CASE(wrong_attn_mask_shape_throws_naming_the_shapes) {
  nn::MultiHeadAttention mha(4, 2);
  ag::Tensor q = ag::randn({2, 3, 4}), k = ag::randn({2, 5, 4});
  nn::AttentionOptions ao;
  ao.attn_mask = ag::zeros({3, 4});
  BOOST_CHECK_EXCEPTION(mha(q, k, k, ao), std::invalid_argument, [](const auto& e) {
    return message_has(e, {"MultiHeadAttention", "attn_mask", "[3, 4]", "[3, 5]", "[4, 3, 5]"});
  });
  ao.attn_mask = ag::zeros({2, 3, 5});  // B, not B·num_heads
  BOOST_CHECK_EXCEPTION(mha(q, k, k, ao), std::invalid_argument,
                        [](const auto& e) { return message_has(e, {"[2, 3, 5]", "[4, 3, 5]"}); });
}

BOOST_AUTO_TEST_CASE(is_causal_with_t_not_s_throws_naming_the_shapes) {
  nn::MultiHeadAttention mha(4, 2);
  nn::AttentionOptions ao;
  ao.is_causal = true;
  for (auto core : {AttentionCore::Fused, AttentionCore::Composed}) {
    mha.set_core(core);
    BOOST_CHECK_EXCEPTION(mha(ag::randn({2, 3, 4}), ag::randn({2, 5, 4}), ag::randn({2, 5, 4}), ao),
                          std::invalid_argument, [](const auto& e) {
                            return message_has(e, {"MultiHeadAttention", "is_causal", "[2, 3, 4]", "[2, 5, 4]"});
                          });
  }
}

BOOST_AUTO_TEST_CASE(inconsistent_inputs_throw) {
  nn::MultiHeadAttention mha(nn::MultiHeadAttentionOptions{4, 2, 0.0, true, 3, 0});
  ag::Tensor q = ag::randn({2, 3, 4}), k = ag::randn({2, 5, 3}), v = ag::randn({2, 5, 4});
  BOOST_CHECK_NO_THROW(mha(q, k, v));
  BOOST_CHECK_EXCEPTION(mha(ag::randn({2, 3, 5}), k, v), std::invalid_argument,
                        [](const auto& e) { return message_has(e, {"query", "[2, 3, 5]", "embed_dim = 4"}); });
  BOOST_CHECK_EXCEPTION(mha(q, v, v), std::invalid_argument,
                        [](const auto& e) { return message_has(e, {"key", "[2, 5, 4]", "kdim = 3"}); });
  BOOST_CHECK_THROW(mha(q, ag::randn({3, 5, 3}), ag::randn({3, 5, 4})), std::invalid_argument);  // batch
  BOOST_CHECK_THROW(mha(q, k, ag::randn({2, 6, 4})), std::invalid_argument);                     // S differs
  BOOST_CHECK_THROW(mha(ag::randn({3, 4}), k, v), std::invalid_argument);                        // rank
  BOOST_CHECK_EXCEPTION(mha(q.to(F64), k.to(F64), v.to(F64)), std::invalid_argument,
                        [](const auto& e) { return message_has(e, {"Float64", "Float32"}); });
  BOOST_CHECK_EXCEPTION(nn::MultiHeadAttention(6, 4), std::invalid_argument,
                        [](const auto& e) { return message_has(e, {"embed_dim 6", "num_heads 4"}); });
  BOOST_CHECK_THROW(nn::MultiHeadAttention(nn::MultiHeadAttentionOptions{4, 2, 1.0}), std::invalid_argument);
}

// ---------------------------------------------------------------- fully blocked rows

BOOST_AUTO_TEST_CASE(fully_blocked_rows_are_zero_not_nan_on_every_path) {
  for (auto core : {AttentionCore::Fused, AttentionCore::Composed})
    for (bool need_weights : {true, false})
      for (bool study : {false, true}) {
        Case c;
        c.S = 4;
        c.padding = true;
        c.blocked_rows = true;  // batch 1: all keys padding; attn_mask row 1: all -inf
        c.attn_mask = 2;
        Setup s = make_setup(c);
        s.mha->set_study(study);
        s.ao.average_attn_weights = false;
        const std::string path = fmt::format("core={} need_weights={} study={}",
                                             core == AttentionCore::Fused ? "fused" : "composed", need_weights, study);
        Run r = run(s, core, need_weights);
        BOOST_TEST(all_finite(r.out), path);
        for (auto& [name, g] : r.grads) {
          BOOST_REQUIRE_MESSAGE(g.defined(), path << ": no gradient for " << name);
          BOOST_TEST(all_finite(g), path << ": " << name);
        }
        const auto out = r.out.to_vector();  // (2, 3, 4)
        const auto b_O = s.mha->b_O().to_vector();
        const auto dq = s.query.grad().to_vector(), dk = s.key.grad().to_vector(), dv = s.value.grad().to_vector();
        for (std::int64_t b = 0; b < 2; ++b)
          for (std::int64_t t = 0; t < 3; ++t) {
            if (b != 1 && t != 1) continue;  // a blocked row: zero context, so out = b_O, and no gradient
            for (std::int64_t e = 0; e < 4; ++e) {
              const std::size_t n = static_cast<std::size_t>((b * 3 + t) * 4 + e);
              BOOST_TEST(out[n] == b_O[static_cast<std::size_t>(e)], path << " out " << n);
              BOOST_TEST(dq[n] == 0.0, path << " d_query " << n);
            }
          }
        // Blocked keys (batch 0 key 3, every key of batch 1) get no gradient.
        for (std::size_t n = 0; n < dk.size(); ++n) {
          const std::size_t b = n / 16, j = (n / 4) % 4;
          if (b == 1 || j == 3) {
            BOOST_TEST(dk[n] == 0.0, path << " d_key " << n << " = " << dk[n]);
            BOOST_TEST(dv[n] == 0.0, path << " d_value " << n << " = " << dv[n]);
          }
        }
        if (need_weights) {
          const auto w = r.weights.to_vector();  // (2, 2, 3, 4)
          for (std::size_t n = 0; n < w.size(); ++n) {
            const std::size_t b = n / 24, t = (n / 4) % 3, j = n % 4;
            if (b == 1 || t == 1 || j == 3) BOOST_TEST(w[n] == 0.0, path << " weight " << n << " = " << w[n]);
          }
        }
        if (study) {
          const auto g = s.mha->study().attn_scores.grad().to_vector();  // (2, 2, 3, 4)
          for (std::size_t n = 0; n < g.size(); ++n) {
            const std::size_t b = n / 24, t = (n / 4) % 3;
            if (b == 1 || t == 1) BOOST_TEST(g[n] == 0.0, path << " dL/dscores " << n);
          }
        }
      }
}

// ---------------------------------------------------------------- the two cores

static void check_cores_agree(const Case& c) {
  for (bool need_weights : {true, false}) {
    Setup s = make_setup(c);
    const Run fused = run(s, AttentionCore::Fused, need_weights);
    const Run composed = run(s, AttentionCore::Composed, need_weights);
    BOOST_TEST(max_abs_diff(fused.out, composed.out) <= 1e-12, "out");
    if (need_weights) BOOST_TEST(max_abs_diff(fused.weights, composed.weights) <= 1e-12, "weights");
    BOOST_REQUIRE_EQUAL(fused.grads.size(), composed.grads.size());
    for (std::size_t i = 0; i < fused.grads.size(); ++i)
      BOOST_TEST(max_abs_diff(fused.grads[i].second, composed.grads[i].second) <= 1e-12, "d_" << fused.grads[i].first);
  }
}

BOOST_AUTO_TEST_CASE(fused_and_composed_draw_the_same_dropout) {
  Case c;
  c.attn_mask = 2;
  c.S = 4;
  Setup s = make_setup(c);
  nn::MultiHeadAttentionOptions opt = s.mha->options();
  opt.dropout = 0.4;
  nn::MultiHeadAttention mha(opt);
  for (std::size_t i = 0; i < mha.parameters().size(); ++i) set(mha.parameters()[i], s.mha->parameters()[i].to_vector());
  mha.dropout_generator().manual_seed(5);
  mha.set_core(AttentionCore::Fused);
  const auto a = mha(s.query, s.key, s.value, s.ao).output;
  mha.dropout_generator().manual_seed(5);
  mha.set_core(AttentionCore::Composed);
  const auto b = mha(s.query, s.key, s.value, s.ao).output;
  BOOST_TEST(max_abs_diff(a, b) <= 1e-12);
}

// ---------------------------------------------------------------- gradcheck

static void check_gradcheck(const Case& c) {
  for (auto core : {AttentionCore::Fused, AttentionCore::Composed}) {
    Setup s = make_setup(c);
    s.mha->set_core(core);
    std::vector<ag::Tensor> inputs = {s.query};
    if (!s.key.is_same(s.query)) inputs.push_back(s.key);
    if (!s.value.is_same(s.query)) inputs.push_back(s.value);
    for (auto& p : s.mha->parameters()) inputs.push_back(p);
    nn::AttentionOptions ao = s.ao;
    ao.average_attn_weights = false;
    // Output and per-head weights together, so both are checked.
    auto fn = [&](const std::vector<ag::Tensor>&) {
      auto [out, w] = s.mha->forward(s.query, s.key, s.value, ao);
      return ag::cat({ag::reshape(out, {-1}), ag::reshape(w, {-1})}, 0);
    };
    const ag::GradcheckResult r = ag::gradcheck(fn, inputs);
    BOOST_TEST(r.ok, (core == AttentionCore::Fused ? "fused: " : "composed: ") << fmt::format("{}", r));
    BOOST_TEST_MESSAGE(c.name << (core == AttentionCore::Fused ? " fused" : " composed") << ": max abs error "
                              << r.max_abs_error << ", max rel error " << r.max_rel_error);
  }
}

// One pair of test cases per configuration, e.g. "cores_agree_to_1e_12_mask_3d_padding" (forward
// and backward, need_weights on and off) and "gradcheck_every_input_and_parameter_mask_3d_padding"
// (both cores).
#define CASE_TESTS(name)                                                                          \
  BOOST_AUTO_TEST_CASE(cores_agree_to_1e_12_##name) { check_cores_agree(case_named(#name)); }     \
  BOOST_AUTO_TEST_CASE(gradcheck_every_input_and_parameter_##name) { check_gradcheck(case_named(#name)); }

CASE_TESTS(no_masks)
CASE_TESTS(one_head)
CASE_TESTS(four_heads_of_width_1)
CASE_TESTS(no_bias)
CASE_TESTS(unbatched_self)
CASE_TESTS(cross_kdim_vdim)
CASE_TESTS(padding)
CASE_TESTS(mask_2d)
CASE_TESTS(mask_3d_padding)
CASE_TESTS(causal)
CASE_TESTS(causal_mask_3d)
CASE_TESTS(bias_kv_zero_attn_causal)
CASE_TESTS(blocked_rows)
CASE_TESTS(blocked_rows_unbatched_causal)
CASE_TESTS(self_causal_mask_3d_padding)
CASE_TESTS(self_no_bias_mask_2d)

// Self-attention (query, key and value one tensor) projects once by [W_Q | W_K | W_V]; the same
// numbers given as three tensors take the separate projections. Same output, same gradients.
BOOST_AUTO_TEST_CASE(self_attention_packed_path_equals_separate_projections) {
  for (const char* name : {"self_causal_mask_3d_padding", "self_no_bias_mask_2d", "unbatched_self"}) {
    BOOST_TEST_CONTEXT("case " << name) {
      Setup s = make_setup(case_named(name));
      const Run packed = run(s, AttentionCore::Fused);
      std::vector<ag::Tensor> packed_grads;
      for (const auto& [n, g] : packed.grads) packed_grads.push_back(g.clone());
      // The same values as separate leaves: x's gradient is then the sum of the three.
      Setup t = make_setup(case_named(name));
      t.key = t.query.detach().clone().requires_grad_();
      t.value = t.query.detach().clone().requires_grad_();
      const Run separate = run(t, AttentionCore::Fused);
      BOOST_TEST(max_abs_diff(packed.out, separate.out) <= 1e-12);
      BOOST_TEST(max_abs_diff(packed.weights, separate.weights) <= 1e-12);
      BOOST_REQUIRE_EQUAL(separate.grads.size(), packed.grads.size() + 2);  // query, key, value, parameters
      const ag::Tensor dx = separate.grads[0].second + separate.grads[1].second + separate.grads[2].second;
      BOOST_TEST(max_abs_diff(packed_grads[0], dx) <= 1e-12, "d_query");
      for (std::size_t i = 1; i < packed.grads.size(); ++i)
        BOOST_TEST(max_abs_diff(packed_grads[i], separate.grads[i + 2].second) <= 1e-12, "d_" << packed.grads[i].first);
    }
  }
}

// ---------------------------------------------------------------- study mode

BOOST_AUTO_TEST_CASE(study_mode_keeps_per_head_tensors_and_their_gradients) {
  Case c;
  c.S = 4;
  c.attn_mask = 2;
  Setup s = make_setup(c);
  s.mha->set_study(true);
  BOOST_CHECK_THROW(s.mha->study(), std::invalid_argument);  // no forward yet
  auto [out, w] = s.mha->forward(s.query, s.key, s.value, s.ao);
  ag::Generator gen(4);
  const ag::Tensor G = ag::randn(out.shape(), F64, gen);
  ag::sum(out * G).backward();
  const auto& st = s.mha->study();
  BOOST_TEST(ag::shape_str(st.q.shape()) == "[2, 2, 3, 2]");
  BOOST_TEST(ag::shape_str(st.k.shape()) == "[2, 2, 4, 2]");
  BOOST_TEST(ag::shape_str(st.attn_scores.shape()) == "[2, 2, 3, 4]");
  BOOST_TEST(ag::shape_str(st.concat.shape()) == "[2, 3, 4]");
  for (const ag::Tensor* t : {&st.q, &st.k, &st.v, &st.raw_scores, &st.attn_scores, &st.pattern, &st.z, &st.concat})
    BOOST_REQUIRE(t->grad().defined());
  const double scale = 1.0 / std::sqrt(2.0);
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t h = 0; h < 2; ++h) {
      using nn::AttentionStudy;
      const Eigen::MatrixXd Q = to_eigen(AttentionStudy::head(st.q, h, b)), K = to_eigen(AttentionStudy::head(st.k, h, b)),
                            V = to_eigen(AttentionStudy::head(st.v, h, b)), P = to_eigen(AttentionStudy::head(st.pattern, h, b));
      const Eigen::MatrixXd dS = to_eigen(AttentionStudy::head(st.attn_scores.grad(), h, b));
      const Eigen::MatrixXd dRaw = to_eigen(AttentionStudy::head(st.raw_scores.grad(), h, b));
      const Eigen::MatrixXd dP = to_eigen(AttentionStudy::head(st.pattern.grad(), h, b));
      const Eigen::MatrixXd dO = to_eigen(AttentionStudy::head(st.z.grad(), h, b));
      const Eigen::MatrixXd dQ = to_eigen(AttentionStudy::head(st.q.grad(), h, b));
      // context = P·V  =>  dP = dO·Vᵀ
      BOOST_TEST((dP - dO * V.transpose()).cwiseAbs().maxCoeff() < 1e-13);
      // P = softmax(S) by rows  =>  dS = P ⊙ (dP - rowsum(P ⊙ dP))
      const Eigen::VectorXd rowsum = (P.array() * dP.array()).rowwise().sum();
      const Eigen::MatrixXd dS_want = (P.array() * (dP.colwise() - rowsum).array()).matrix();
      BOOST_TEST((dS - dS_want).cwiseAbs().maxCoeff() < 1e-13);
      // S = raw/√d_k + M  =>  d raw = dS/√d_k;   raw = Q·Kᵀ  =>  dQ = d raw·K
      BOOST_TEST((dRaw - scale * dS).cwiseAbs().maxCoeff() < 1e-14);
      BOOST_TEST((dQ - dRaw * K).cwiseAbs().maxCoeff() < 1e-13);
    }
  // out = concat · W_O + b_O  =>  dW_O = concatᵀ · dout,  dconcat = dout · W_Oᵀ   [(B·T) x E]
  const Eigen::MatrixXd concat = to_eigen(ag::reshape(st.concat.detach(), {6, 4}));
  const Eigen::MatrixXd dconcat = to_eigen(ag::reshape(st.concat.grad(), {6, 4}));
  const Eigen::MatrixXd dout = to_eigen(ag::reshape(G, {6, 4}));
  const Eigen::MatrixXd W_O = to_eigen(s.mha->W_O());
  BOOST_TEST((to_eigen(s.mha->W_O().grad()) - concat.transpose() * dout).cwiseAbs().maxCoeff() < 1e-13);
  BOOST_TEST((dconcat - dout * W_O.transpose()).cwiseAbs().maxCoeff() < 1e-13);
}

BOOST_AUTO_TEST_CASE(study_mode_runs_the_composed_core_and_gives_the_fused_result) {
  Case c;
  c.padding = true;
  Setup s = make_setup(c);
  const Run fused = run(s, AttentionCore::Fused);
  s.mha->set_study(true);  // core stays Fused; study switches to the composed path
  const Run studied = run(s, AttentionCore::Fused);
  BOOST_TEST(max_abs_diff(fused.out, studied.out) <= 1e-12);
  for (std::size_t i = 0; i < fused.grads.size(); ++i)
    BOOST_TEST(max_abs_diff(fused.grads[i].second, studied.grads[i].second) <= 1e-12);
  BOOST_TEST(s.mha->study().pattern.defined());
  s.mha->set_study(false);
  BOOST_CHECK_THROW(s.mha->study(), std::invalid_argument);
}

// ---------------------------------------------------------------- dropout

BOOST_AUTO_TEST_CASE(dropout_acts_in_training_only_and_follows_its_generator) {
  Case c;
  Setup s = make_setup(c);
  nn::MultiHeadAttentionOptions opt = s.mha->options();
  opt.dropout = 0.5;
  nn::MultiHeadAttention mha(opt);
  for (std::size_t i = 0; i < mha.parameters().size(); ++i) set(mha.parameters()[i], s.mha->parameters()[i].to_vector());
  const ag::Tensor no_dropout = s.mha->forward(s.query, s.key, s.value).output;

  mha.eval();
  BOOST_TEST(max_abs_diff(mha(s.query, s.key, s.value).output, no_dropout) == 0.0);

  mha.train();
  mha.dropout_generator().manual_seed(11);
  auto a = mha(s.query, s.key, s.value);
  const ag::Tensor b = mha(s.query, s.key, s.value).output;  // generator moved on
  mha.dropout_generator().manual_seed(11);
  const ag::Tensor a2 = mha(s.query, s.key, s.value).output;
  BOOST_TEST(max_abs_diff(a.output, no_dropout) > 1e-3);
  BOOST_TEST(max_abs_diff(a.output, b) > 1e-3);
  BOOST_TEST(max_abs_diff(a.output, a2) == 0.0);
  // the returned weights are the softmax before dropout: rows still sum to 1
  for (double v : ag::sum(a.weights, -1).to_vector()) BOOST_TEST(std::abs(v - 1.0) < 1e-14);
}

BOOST_AUTO_TEST_CASE(float32_agrees_with_float64) {
  Case c;
  c.padding = true;
  Setup s = make_setup(c);
  const ag::Tensor out64 = s.mha->forward(s.query, s.key, s.value, s.ao).output;
  s.mha->to(ag::Dtype::Float32);
  nn::AttentionOptions ao = s.ao;
  ao.key_padding_mask = s.ao.key_padding_mask.to(ag::Dtype::Float32);
  const ag::Tensor out32 = s.mha->forward(s.query.detach().to(ag::Dtype::Float32), s.key.detach().to(ag::Dtype::Float32),
                                          s.value.detach().to(ag::Dtype::Float32), ao).output;
  BOOST_TEST((out32.dtype() == ag::Dtype::Float32));
  BOOST_TEST(max_abs_diff(out32.to(F64), out64) < 1e-5);
}

BOOST_AUTO_TEST_CASE(scores_that_overflow_from_finite_inputs_are_refused_on_the_composed_core) {
  ag::Generator gen(2);
  nn::MultiHeadAttention mha(nn::MultiHeadAttentionOptions{.embed_dim = 8, .num_heads = 2, .dtype = ag::Dtype::Float64},
                             gen);
  mha.set_core(AttentionCore::Composed);
  const ag::Tensor x = ag::mul(ag::randn({1, 3, 8}, ag::Dtype::Float64, gen), 1e156);  // q·kᵀ beyond float64
  test_support::check_message([&] { (void)mha.forward(x); },
                              "MultiHeadAttention: the scores overflowed Float64 on the composed core: a product q·kᵀ");
  // A hook's own infinite scores are the user's: they pass as they are (NaN weights, no refusal).
  const ag::Tensor small = ag::randn({1, 3, 8}, ag::Dtype::Float64, gen);
  const auto handle = mha.add_hook("raw_scores", [](const ag::Tensor& v, const std::string&) {
    return ag::add(ag::mul(v, 0.0), std::numeric_limits<double>::infinity());
  });
  BOOST_TEST(!test_support::all_finite(mha.forward(small, small, small).weights));
}

BOOST_AUTO_TEST_CASE(a_tiny_nonzero_key_padding_entry_pads_in_a_float32_layer_too) {
  // 1e-320 is nonzero (padding) as a float64, though it would round to 0 as a float32.
  ag::Generator gen(5);
  nn::MultiHeadAttention mha(nn::MultiHeadAttentionOptions{.embed_dim = 4, .num_heads = 2}, gen);
  const ag::Tensor x = ag::randn({1, 3, 4}, ag::Dtype::Float32, gen);
  nn::AttentionOptions ao;
  ao.key_padding_mask = ag::tensor({0.0, 1e-320, 0.0}, {1, 3}, F64);
  const std::vector<double> w = mha.forward(x, x, x, ao).weights.to_vector();  // (1, 3, 3), averaged
  for (std::size_t t = 0; t < 3; ++t) BOOST_TEST(w[t * 3 + 1] == 0.0, "query " << t);
}
