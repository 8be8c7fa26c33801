// The residual-stream functions of nn::circuits against TransformerLens 3.9, in float64: on config B
// of tests/data/transformer_lens/make_lm_reference.py (2 layers, d_mlp 32, gelu, LayerNorm), the
// clean tokens' accumulated_resid(apply_ln, incl_mid), decompose_resid(apply_ln) and
// stack_head_results(apply_ln), labels and values, to 1e-9.
#define BOOST_TEST_MODULE circuits_lens_parity
#include <boost/test/unit_test.hpp>

#include <map>
#include <string>
#include <vector>

#include <nn/nn.hpp>

#include "test_support.hpp"

namespace ag = autograd;
namespace circuits = nn::circuits;
using namespace test_support;

namespace {

struct Fixture {
  std::map<std::string, ag::Tensor> t;
  nn::SafetensorsData data;
  Fixture() : data(nn::load_safetensors(HEADGRAD_TEST_DATA_DIR "/transformer_lens/lm_reference.safetensors")) {
    for (auto& [name, v] : data.tensors) t.emplace(name, v);
  }
  const ag::Tensor& at(const std::string& name) const {
    const auto it = t.find(name);
    BOOST_REQUIRE_MESSAGE(it != t.end(), "the fixture has no " << name);
    return it->second;
  }
  std::vector<std::string> labels(const std::string& name) const {
    std::vector<std::string> out;
    std::string s = data.metadata.at("B.lens." + name + ".labels"), item;
    for (char c : s + ",") {
      if (c == ',') out.push_back(item), item.clear();
      else item += c;
    }
    return out;
  }
};

nn::TransformerLM model_b(const Fixture& f) {
  nn::TransformerLM m({.n_layers = 2, .d_model = 16, .n_heads = 4, .d_mlp = 32, .d_vocab = 12, .n_ctx = 16,
                       .dtype = ag::Dtype::Float64});
  nn::NamedTensors sd;
  for (const auto& [name, v] : f.t)
    if (name.rfind("B.sd.", 0) == 0) sd.emplace_back(name.substr(5), v);
  nn::load_transformer_lens_state_dict(m, sd);
  return m;
}

// Largest |a - b| relative to the largest |b|.
double relative_error(const ag::Tensor& a, const ag::Tensor& b) {
  BOOST_REQUIRE(ag::shape_str(a.shape()) == ag::shape_str(b.shape()));
  const auto x = a.to_vector(), y = b.to_vector();
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < x.size(); ++i) err = std::max(err, std::abs(x[i] - y[i])), scale = std::max(scale, std::abs(y[i]));
  return err / scale;
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_residual_stacks_equal_transformer_lens) {
  const Fixture f;
  nn::TransformerLM m = model_b(f);
  const ag::Tensor tokens = f.at("tokens");
  const nn::ActivationCache cache = nn::run_with_cache(m, [&] { return m.forward(tokens); });
  const std::vector<std::pair<std::string, circuits::ResidualStack>> ours = {
      {"accumulated_resid", circuits::accumulated_resid(m, cache, -1, true, true)},
      {"decompose_resid", circuits::decompose_resid(m, cache, -1, true)},
      {"stack_head_results", circuits::stack_head_results(m, cache, -1, true)}};
  for (const auto& [name, s] : ours) {
    BOOST_TEST(s.labels == f.labels(name), name);
    const double e = relative_error(s.stack, f.at("B.lens." + name));
    BOOST_TEST(e <= 1e-9, name << ": relative error " << e);
  }
  // Negative control: without apply_ln the stacks differ from TL's normalised ones.
  BOOST_TEST(relative_error(circuits::decompose_resid(m, cache).stack, f.at("B.lens.decompose_resid")) > 1e-2);
}
