// nn::MultiHeadAttention against torch.nn.MultiheadAttention: outputs, per-head (or averaged)
// weights and every gradient (inputs, W_Q, W_K, W_V, W_O, biases, bias_k/bias_v), in float64, to
// 1e-9 relative, on both attention cores. The reference files in tests/data/ were written once
// by tests/data/make_mha_reference.py (see there for the layout mapping); torch is not needed here.
#define BOOST_TEST_MODULE mha_torch_parity
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <nn/nn.hpp>

namespace ag = autograd;

namespace {

constexpr double kRelTol = 1e-9;

struct Reference {
  std::map<std::string, std::int64_t> config;
  std::map<std::string, ag::Tensor> tensors;

  std::int64_t cfg(const std::string& key) const {
    auto it = config.find(key);
    if (it == config.end()) throw std::runtime_error("reference file lacks config " + key);
    return it->second;
  }
  bool has(const std::string& name) const { return tensors.count(name) != 0; }
  const ag::Tensor& at(const std::string& name) const {
    auto it = tensors.find(name);
    if (it == tensors.end()) throw std::runtime_error("reference file lacks tensor " + name);
    return it->second;
  }
};

Reference load(const std::string& config_name) {
  const std::string path = std::string(HEADGRAD_TEST_DATA_DIR) + "/mha_" + config_name + ".txt";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path + " (run tests/data/make_mha_reference.py)");
  Reference ref;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    std::string kind, name;
    ss >> kind >> name;
    if (kind == "config") {
      std::int64_t v;
      ss >> v;
      ref.config[name] = v;
    } else if (kind == "tensor") {
      std::int64_t ndim;
      ss >> ndim;
      ag::Shape shape(static_cast<std::size_t>(ndim));
      for (auto& d : shape) ss >> d;
      std::vector<double> values(static_cast<std::size_t>(ag::shape_numel(shape)));
      for (auto& v : values) {
        std::string token;  // strtod, unlike operator>>, reads "-inf"
        ss >> token;
        v = std::strtod(token.c_str(), nullptr);
      }
      if (!ss) throw std::runtime_error("short tensor line for " + name + " in " + path);
      ref.tensors[name] = ag::tensor(values, shape, ag::Dtype::Float64);
    }
  }
  return ref;
}

// Worst |got - want| / max(|want|, floor) over the elements. The floor, max(1e-3 · max|want|, 1e-4),
// holds elements that are (nearly) zero to an absolute bound instead: d_b_K, for one, is zero in
// exact arithmetic (adding b_K to every key adds q·b_K to a whole row of scores, which softmax
// ignores), so both sides hold rounding noise of order 1e-16 there.
double relative_error(const ag::Tensor& got, const ag::Tensor& want, const std::string& what) {
  BOOST_REQUIRE_MESSAGE(got.defined(), what << " is undefined");
  BOOST_REQUIRE_MESSAGE(got.shape() == want.shape(),
                        what << ": shape " << ag::shape_str(got.shape()) << " vs torch " << ag::shape_str(want.shape()));
  const auto g = got.to_vector(), w = want.to_vector();
  double scale = 0;
  for (double v : w) scale = std::max(scale, std::abs(v));
  const double floor = std::max(1e-3 * scale, 1e-4);
  double worst = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    BOOST_REQUIRE_MESSAGE(std::isfinite(g[i]), what << "[" << i << "] is not finite");
    worst = std::max(worst, std::abs(g[i] - w[i]) / std::max(std::abs(w[i]), floor));
  }
  return worst;
}

double g_worst = 0;  // over every configuration, core and tensor
std::string g_worst_where;

void compare_with_torch(const std::string& config_name, nn::AttentionCore core) {
  const Reference ref = load(config_name);
  nn::MultiHeadAttentionOptions opt;
  opt.embed_dim = ref.cfg("embed_dim");
  opt.num_heads = ref.cfg("num_heads");
  opt.bias = ref.cfg("bias") != 0;
  opt.kdim = ref.cfg("kdim");
  opt.vdim = ref.cfg("vdim");
  opt.add_bias_kv = ref.cfg("add_bias_kv") != 0;
  opt.add_zero_attn = ref.cfg("add_zero_attn") != 0;
  opt.core = core;
  opt.dtype = ag::Dtype::Float64;
  nn::MultiHeadAttention mha(opt);
  {
    ag::NoGradGuard no_grad;
    for (auto& [name, p] : mha.named_parameters()) p.copy_(ref.at(name));
  }
  const bool self_attention = ref.cfg("self_attention") != 0;
  ag::Tensor query = ref.at("query").clone().requires_grad_();
  ag::Tensor key = self_attention ? query : ref.at("key").clone().requires_grad_();
  ag::Tensor value = self_attention ? query : ref.at("value").clone().requires_grad_();

  nn::AttentionOptions ao;
  if (ref.has("key_padding_mask")) ao.key_padding_mask = ref.at("key_padding_mask");
  if (ref.has("attn_mask")) ao.attn_mask = ref.at("attn_mask");
  ao.need_weights = ref.cfg("need_weights") != 0;
  ao.average_attn_weights = ref.cfg("average_attn_weights") != 0;
  ao.is_causal = ref.cfg("is_causal") != 0;

  auto [out, weights] = mha(query, key, value, ao);
  ag::Tensor loss = ag::sum(out * ref.at("grad_out"));
  if (ao.need_weights) loss = loss + ag::sum(weights * ref.at("grad_weights"));
  else BOOST_TEST(!weights.defined());
  loss.backward();

  const std::string where = config_name + (core == nn::AttentionCore::Fused ? " (fused)" : " (composed)");
  auto check = [&](const std::string& what, const ag::Tensor& got, const ag::Tensor& want) {
    const double err = relative_error(got, want, where + ": " + what);
    BOOST_TEST(err <= kRelTol, where << ": " << what << " relative error " << err);
    if (err > g_worst) {
      g_worst = err;
      g_worst_where = where + ": " + what;
    }
  };
  check("out", out, ref.at("out"));
  if (ao.need_weights) check("weights", weights, ref.at("weights"));
  check("d_query", query.grad(), ref.at("d_query"));
  if (!self_attention) {
    check("d_key", key.grad(), ref.at("d_key"));
    check("d_value", value.grad(), ref.at("d_value"));
  }
  int n_params = 0;
  for (auto& [name, p] : mha.named_parameters()) {
    check("d_" + name, p.grad(), ref.at("d_" + name));
    ++n_params;
  }
  BOOST_TEST(n_params == 4 + (opt.bias ? 4 : 0) + (opt.add_bias_kv ? 2 : 0));
}

}  // namespace

// One test case per configuration and core, e.g. "matches_torch_key_padding_fused".
#define MATCHES_TORCH(config)                                                                  \
  BOOST_AUTO_TEST_CASE(matches_torch_##config##_fused) {                                       \
    compare_with_torch(#config, nn::AttentionCore::Fused);                                     \
  }                                                                                            \
  BOOST_AUTO_TEST_CASE(matches_torch_##config##_composed) {                                    \
    compare_with_torch(#config, nn::AttentionCore::Composed);                                  \
  }

MATCHES_TORCH(unbatched)
MATCHES_TORCH(batched)
MATCHES_TORCH(causal)
MATCHES_TORCH(cross_kdim_vdim)
MATCHES_TORCH(key_padding)
MATCHES_TORCH(float_mask_2d)
MATCHES_TORCH(float_mask_3d)
MATCHES_TORCH(one_head)
MATCHES_TORCH(heads_of_width_1)
MATCHES_TORCH(no_bias)
MATCHES_TORCH(causal_padding_unbatched)
MATCHES_TORCH(add_bias_kv)
MATCHES_TORCH(add_zero_attn)
MATCHES_TORCH(bias_kv_zero_attn_causal)
MATCHES_TORCH(no_weights)

// Runs after the cases above (Boost.Test runs cases in declaration order).
BOOST_AUTO_TEST_CASE(report_worst_relative_error_against_torch) {
  BOOST_TEST_MESSAGE("worst relative error against torch: " << g_worst << " at " << g_worst_where);
  BOOST_TEST(g_worst <= kRelTol);
}

// Negative control: the comparison must notice a wrong parameter mapping, e.g. torch's (out x in)
// weight used without the transpose.
BOOST_AUTO_TEST_CASE(comparison_detects_an_untransposed_weight) {
  const Reference ref = load("batched");
  nn::MultiHeadAttentionOptions opt{ref.cfg("embed_dim"), ref.cfg("num_heads")};
  opt.dtype = ag::Dtype::Float64;
  nn::MultiHeadAttention mha(opt);
  {
    ag::NoGradGuard no_grad;
    for (auto& [name, p] : mha.named_parameters())
      p.copy_(name == "W_Q" ? ag::transpose(ref.at(name), 0, 1) : ref.at(name));
  }
  ag::Tensor query = ref.at("query");
  auto [out, weights] = mha(query, query, query);
  BOOST_TEST(relative_error(out, ref.at("out"), "out") > 1e-3);
}
