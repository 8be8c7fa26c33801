// Files and modules the checkpoint functions refuse, each with a CheckpointError naming the file
// (or the module) and what is wrong: bytes after the header's JSON that are not padding, configs
// that ask for more parameters than their file holds, integers a config cannot hold, repeated
// config keys, and TransformerBlocks torch's encoder layer cannot load.
#define BOOST_TEST_MODULE checkpoint_refusals
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include <nn/nn.hpp>

#include "checkpoint_support.hpp"

namespace ag = autograd;
namespace fs = std::filesystem;
using namespace checkpoint_support;
using namespace std::string_literals;

namespace {

// f throws CheckpointError showing every fragment.
void expect_error(const std::function<void()>& f, std::initializer_list<std::string> fragments) {
  try {
    f();
    BOOST_ERROR("no error");
  } catch (const nn::CheckpointError& e) {
    const std::string what = e.what();
    BOOST_TEST_MESSAGE(what);
    for (const auto& f : fragments) BOOST_TEST(what.find(f) != std::string::npos, "no " << f << " in: " << what);
  }
}

// A file of one small tensor "weight" whose config is `config` (headgrad naming).
std::string small_file_with_config(const TempDir& dir, const std::string& config,
                                   const std::string& naming = "headgrad") {
  const std::string path = dir.file("small.safetensors");
  nn::save_safetensors(path, {{"weight", ag::zeros({1}, F32)}},
                       {{"headgrad.config", config}, {"headgrad.naming", naming}});
  return path;
}

std::string padded(std::string header) { return header.append((8 - header.size() % 8) % 8, ' '); }

nn::TransformerBlockOptions biased_block_without_layer_norm_bias() {
  return {.d_model = 4, .num_heads = 2, .d_ff = 8, .bias = true, .dtype = F32, .layer_norm_bias = false};
}

}  // namespace

// ---- the header's padding ----

BOOST_AUTO_TEST_CASE(a_nul_byte_and_garbage_after_the_header_json_are_refused_naming_the_offset) {
  const GoodFile good = good_file();
  const std::string json = good.header.substr(0, good.header.find_last_of('}') + 1);
  const std::string header = padded(json + "\0garbage}"s);
  expect_rejected(make_file(header, good.data), fmt::format("byte 0x00 at file offset {}", 8 + json.size()));
}

BOOST_AUTO_TEST_CASE(a_line_break_after_the_header_json_is_refused_naming_the_offset) {
  const GoodFile good = good_file();
  const std::string json = good.header.substr(0, good.header.find_last_of('}') + 1);
  const std::string header = padded(json + "  \n");
  expect_rejected(make_file(header, good.data), fmt::format("byte 0x0a at file offset {}", 8 + json.size() + 2));
}

BOOST_AUTO_TEST_CASE(spaces_after_the_header_json_are_accepted) {
  const GoodFile good = good_file();
  TempDir dir;
  const std::string path = dir.file("spaces.safetensors");
  write_bytes(path, make_file(good.header + std::string(16, ' '), good.data));
  Tiny model(1);
  BOOST_CHECK_NO_THROW(nn::load_parameters(model, path));
  BOOST_TEST(same_bits(snapshot(model), snapshot(Tiny(99))));
}

// ---- load_module: the file holds what the config asks for, checked before building ----

BOOST_AUTO_TEST_CASE(load_module_refuses_a_huge_linear_in_a_tiny_file_before_allocating_it) {
  TempDir dir;
  const std::string path = small_file_with_config(
      dir, R"({"type":"Linear","dtype":"float32","options":{"in_features":65536,"out_features":65536,"bias":false}})");
  BOOST_TEST(fs::file_size(path) < 512u);  // a few hundred bytes asking for 16 GiB
  expect_error([&] { nn::load_module(path); }, {"load_module", path, "Linear", "weight", "[65536, 65536]"});
}

BOOST_AUTO_TEST_CASE(load_module_refuses_a_huge_embedding_in_a_tiny_file_before_allocating_it) {
  TempDir dir;
  const std::string path = small_file_with_config(
      dir, R"({"type":"Embedding","dtype":"float32","options":{"num_embeddings":1048576,"embedding_dim":65536}})");
  expect_error([&] { nn::load_module(path); }, {"load_module", path, "Embedding", "weight", "[1048576, 65536]"});
}

BOOST_AUTO_TEST_CASE(load_module_refuses_a_huge_attention_layer_in_a_tiny_file_before_allocating_it) {
  TempDir dir;
  const std::string path = small_file_with_config(
      dir, R"({"type":"MultiHeadAttention","dtype":"float32","options":{"embed_dim":65536,"num_heads":1,)"
           R"("dropout":0.0,"bias":true,"kdim":65536,"vdim":65536,"add_bias_kv":false,"add_zero_attn":false,)"
           R"("core":"fused"}})",
      "torch");
  expect_error([&] { nn::load_module(path); }, {"load_module", path, "MultiHeadAttention", "W_Q", "[65536, 65536]"});
}

BOOST_AUTO_TEST_CASE(load_module_refuses_a_huge_block_whose_config_lists_no_children) {
  TempDir dir;
  const std::string path = small_file_with_config(
      dir, R"({"type":"Sequential","children":{"0":{"type":"TransformerBlock","dtype":"float32","options":{)"
           R"("d_model":65536,"num_heads":1,"d_ff":65536,"dropout":0.0,"gelu":true,"bias":true,)"
           R"("layer_norm_eps":1e-05,"layer_norm_bias":true}}}})");
  expect_error([&] { nn::load_module(path); }, {"load_module", path, "module '0' (TransformerBlock)", "weight"});
}

BOOST_AUTO_TEST_CASE(load_module_still_loads_a_file_that_holds_its_parameters) {
  TempDir dir;
  const std::string path = dir.file("ok.safetensors");
  nn::Sequential s;
  s.push_back(std::make_shared<nn::Linear>(nn::LinearOptions{3, 2, true, F64}));
  s.push_back(std::make_shared<nn::TransformerBlock>(nn::TransformerBlockOptions{.d_model = 2, .num_heads = 1}));
  nn::save_parameters(s, path);
  const std::shared_ptr<nn::Module> m = nn::load_module(path);
  BOOST_TEST(same_bits(snapshot(*m), snapshot(s)));
  nn::save_torch_state_dict(s, path);
  BOOST_TEST(same_bits(snapshot(*nn::load_module(path)), snapshot(s)));
}

// ---- module configs: integers as written, keys once ----

BOOST_AUTO_TEST_CASE(module_config_integer_refuses_2_to_the_64_minus_1_naming_it_as_written) {
  const nn::ModuleConfig c = nn::parse_module_config(R"({"type":"Linear","options":{"in_features":18446744073709551615}})");
  expect_error([&] { c.integer("in_features"); }, {"in_features", "18446744073709551615", "Linear"});
}

BOOST_AUTO_TEST_CASE(module_config_integer_refuses_2_to_the_63_naming_it_as_written) {
  const nn::ModuleConfig c = nn::parse_module_config(R"({"type":"Linear","options":{"in_features":9223372036854775808}})");
  expect_error([&] { c.integer("in_features"); }, {"in_features", "9223372036854775808"});
}

BOOST_AUTO_TEST_CASE(module_config_shape_refuses_a_dim_past_int64_naming_it_as_written) {
  const nn::ModuleConfig c =
      nn::parse_module_config(R"({"type":"LayerNorm","options":{"normalized_shape":[2,9223372036854775808]}})");
  expect_error([&] { c.shape("normalized_shape"); }, {"normalized_shape", "9223372036854775808"});
}

BOOST_AUTO_TEST_CASE(a_config_integer_past_64_bits_is_refused_naming_it_as_written) {
  expect_error([] { nn::parse_module_config(R"({"type":"Linear","options":{"in_features":18446744073709551616}})"); },
               {"headgrad.config", "18446744073709551616"});
  expect_error([] { nn::parse_module_config(R"({"type":"Linear","options":{"in_features":-9223372036854775809}})"); },
               {"headgrad.config", "-9223372036854775809"});
}

BOOST_AUTO_TEST_CASE(load_module_reports_an_out_of_range_integer_as_written) {
  TempDir dir;
  const std::string path = small_file_with_config(
      dir, R"({"type":"Linear","dtype":"float32","options":{"in_features":18446744073709551615,"out_features":1,)"
           R"("bias":false}})");
  expect_error([&] { nn::load_module(path); }, {path, "18446744073709551615"});
}

BOOST_AUTO_TEST_CASE(a_config_that_repeats_a_module_key_is_refused) {
  expect_error([] { nn::parse_module_config(R"({"type":"Linear","type":"Embedding"})"); },
               {"headgrad.config", "\"type\"", "twice"});
}

BOOST_AUTO_TEST_CASE(a_config_that_repeats_an_option_is_refused) {
  expect_error(
      [] { nn::parse_module_config(R"({"type":"Linear","options":{"in_features":2,"in_features":65536}})"); },
      {"headgrad.config", "\"in_features\"", "twice"});
}

BOOST_AUTO_TEST_CASE(a_config_that_repeats_a_child_is_refused) {
  expect_error([] {
    nn::parse_module_config(R"({"type":"Sequential","children":{"0":{"type":"ReLU"},"0":{"type":"GELU"}}})");
  }, {"headgrad.config", "\"0\"", "twice"});
}

// ---- torch state_dicts of TransformerBlocks ----

BOOST_AUTO_TEST_CASE(save_torch_state_dict_refuses_a_biased_block_whose_layer_norms_have_no_bias) {
  TempDir dir;
  const std::string path = dir.file("block.safetensors");
  nn::Sequential s;
  s.push_back(std::make_shared<nn::TransformerBlock>(biased_block_without_layer_norm_bias()));
  expect_error([&] { nn::save_torch_state_dict(s, path); },
               {"save_torch_state_dict", "module '0' (TransformerBlock)", "layer_norm_bias", "norm1.bias"});
  BOOST_TEST(!fs::exists(path));
}

BOOST_AUTO_TEST_CASE(load_torch_state_dict_refuses_a_biased_block_whose_layer_norms_have_no_bias) {
  TempDir dir;
  const std::string path = dir.file("block.safetensors");
  nn::TransformerBlock source(nn::TransformerBlockOptions{.d_model = 4, .num_heads = 2, .d_ff = 8, .dtype = F32});
  nn::NamedTensors tensors;
  for (auto& [key, t] : nn::torch_state_dict(source))
    if (key != "norm1.bias" && key != "norm2.bias") tensors.emplace_back(key, t);
  nn::save_safetensors(path, tensors);
  nn::TransformerBlock block(biased_block_without_layer_norm_bias());
  const auto before = snapshot(block);
  expect_error([&] { nn::load_torch_state_dict(block, path); },
               {"load_torch_state_dict", "TransformerBlock", "layer_norm_bias"});
  BOOST_TEST(same_bits(snapshot(block), before));
}
