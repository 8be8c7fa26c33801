// nn::TransformerBlock's bias option, as PyTorch's TransformerEncoderLayer(bias=False): without
// bias no layer of the block has one, the LayerNorms included. The parameter names for both
// settings, a float64 gradcheck of the block without bias (forward and backward), and a save and
// rebuild from the file's config that gives the same parameters and the same output.
#define BOOST_TEST_MODULE transformer_block_bias
#include "test_support.hpp"

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include <nn/nn.hpp>

using namespace test_support::prelude;

namespace {

std::vector<std::string> names_of(const nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& [name, t] : m.named_parameters()) out.push_back(name);
  return out;
}

nn::TransformerBlockOptions options(bool bias) {
  return {.d_model = 4, .num_heads = 2, .d_ff = 6, .bias = bias, .dtype = F64};
}

}  // namespace

BOOST_AUTO_TEST_CASE(bias_false_leaves_out_every_bias_the_layer_norms_included) {
  const nn::TransformerBlock with(options(true)), without(options(false));
  const std::vector<std::string> all = {"ln_1.weight", "ln_1.bias", "attn.W_Q",    "attn.W_K",    "attn.W_V",
                                        "attn.W_O",    "attn.b_Q",  "attn.b_K",    "attn.b_V",    "attn.b_O",
                                        "ln_2.weight", "ln_2.bias", "fc_1.weight", "fc_1.bias",   "fc_2.weight",
                                        "fc_2.bias"};
  BOOST_TEST(names_of(with) == all, boost::test_tools::per_element());
  const std::vector<std::string> weights = {"ln_1.weight", "attn.W_Q",    "attn.W_K",    "attn.W_V",
                                            "attn.W_O",    "ln_2.weight", "fc_1.weight", "fc_2.weight"};
  BOOST_TEST(names_of(without) == weights, boost::test_tools::per_element());
  BOOST_TEST(!without.ln_1().bias().defined());
  BOOST_TEST(!without.ln_2().bias().defined());
  BOOST_TEST(without.ln_1().weight().defined());
  // the parameter count follows: 4·E² + 2·E·d_ff (+ 4·E + d_ff + E + 4·E with bias)
  const std::int64_t E = 4, F = 6;
  BOOST_TEST(without.num_parameters() == 4 * E * E + 2 * E * F + 2 * E);
  BOOST_TEST(with.num_parameters() == 4 * E * E + 2 * E * F + 2 * E + 4 * E + F + E + 2 * E);
  // a LayerNorm on its own without bias, as PyTorch's LayerNorm(bias=False)
  const nn::LayerNorm ln(nn::LayerNormOptions{.normalized_shape = {3}, .bias = false, .dtype = F64});
  BOOST_TEST(names_of(ln) == std::vector<std::string>{"weight"}, boost::test_tools::per_element());
  BOOST_TEST(contains(ln.extra_repr(), "bias=false"));
}

BOOST_AUTO_TEST_CASE(a_block_without_bias_passes_a_float64_gradcheck) {
  ag::Generator gen(3);
  nn::TransformerBlock block(options(false), gen);
  // LayerNorm weights away from 1, so that their gradients are checked at a general point
  {
    ag::NoGradGuard no_grad;
    block.ln_1().weight().copy_(ag::add(ag::randn({4}, F64, gen), 1.0));
    block.ln_2().weight().copy_(ag::add(ag::randn({4}, F64, gen), 1.0));
  }
  const Tensor x = input({2, 3, 4}, 5);
  const Tensor c = ag::randn({2, 3, 4}, F64, gen);
  std::vector<Tensor> inputs = {x};
  for (const Tensor& p : block.parameters()) inputs.push_back(p);
  check_gradients(
      "block without bias", [&](const TensorList& in) { return ag::sum(ag::mul(block(in[0]), c)); }, inputs);
}

BOOST_AUTO_TEST_CASE(a_block_without_bias_is_saved_and_rebuilt_from_its_file_alone) {
  ag::Generator gen(4);
  const nn::TransformerBlock block(options(false), gen);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("headgrad_block_bias_" + std::to_string(::getpid()) + ".safetensors"))
          .string();
  nn::save_parameters(block, path);
  const std::shared_ptr<nn::Module> rebuilt = nn::load_module(path);
  std::filesystem::remove(path);
  BOOST_TEST(names_of(*rebuilt) == names_of(block), boost::test_tools::per_element());
  const auto* b = dynamic_cast<const nn::TransformerBlock*>(rebuilt.get());
  BOOST_REQUIRE(b != nullptr);
  BOOST_TEST(!b->options().bias);
  const Tensor x = ag::randn({1, 3, 4}, F64, gen);
  BOOST_TEST(test_support::max_abs_diff(block(x), (*b)(x)) == 0.0);
}

BOOST_AUTO_TEST_CASE(layer_norm_bias_keeps_the_layer_norms_bias_on_its_own) {
  nn::TransformerBlockOptions o = options(false);
  o.layer_norm_bias = true;
  const nn::TransformerBlock kept(o);
  const std::vector<std::string> names = {"ln_1.weight", "ln_1.bias", "attn.W_Q",    "attn.W_K",    "attn.W_V",
                                          "attn.W_O",    "ln_2.weight", "ln_2.bias", "fc_1.weight", "fc_2.weight"};
  BOOST_TEST(names_of(kept) == names, boost::test_tools::per_element());
  BOOST_TEST(kept.options().layer_norm_bias.value());
  BOOST_TEST(!nn::TransformerBlock(options(false)).options().layer_norm_bias.value());  // unset: as bias
  // the config records it, and rebuilds it
  const nn::ModuleConfig c = nn::module_config(kept);
  BOOST_TEST(c.flag("layer_norm_bias"));
  BOOST_TEST(names_of(*nn::build_module(c)) == names, boost::test_tools::per_element());
  // a config written before the option existed (no "layer_norm_bias": its LayerNorms had a bias)
  std::string json = nn::module_config_json(kept);
  const std::string key = ",\"layer_norm_bias\":true";
  BOOST_REQUIRE(json.find(key) != std::string::npos);
  json.erase(json.find(key), key.size());
  BOOST_TEST(names_of(*nn::build_module(nn::parse_module_config(json))) == names, boost::test_tools::per_element());
}
