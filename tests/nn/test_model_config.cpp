// Self-describing files: save_parameters, save_checkpoint and save_torch_state_dict write the
// module tree's configuration ("headgrad.config"), which reads back into a ModuleConfig, rebuilds
// nn's modules (build_module, load_module) and train_heads' model (load_heads_model) from the
// file alone, with the same outputs bit for bit.
#define BOOST_TEST_MODULE model_config
#include <boost/test/unit_test.hpp>

#include <memory>
#include <string>

#include <nlohmann/json.hpp>
#include <nn/nn.hpp>

#include "checkpoint_support.hpp"

#include "heads_model.hpp"  // train_heads' model (its source is compiled into this test)

namespace ag = autograd;
using checkpoint_support::same_bits;
using checkpoint_support::snapshot;
using checkpoint_support::TempDir;

namespace {

constexpr auto F64 = ag::Dtype::Float64;

ag::Tensor tokens(std::int64_t B, std::int64_t T, std::int64_t V, std::uint64_t seed) {
  ag::Generator gen(seed);
  std::vector<double> v;
  for (std::int64_t i = 0; i < B * T; ++i) v.push_back(static_cast<double>(gen.next_u64() % static_cast<std::uint64_t>(V)));
  return ag::tensor(v, {B, T});
}

}  // namespace

BOOST_AUTO_TEST_CASE(the_config_names_types_options_and_children_in_order) {
  nn::TransformerBlock block(nn::TransformerBlockOptions{.d_model = 8, .num_heads = 2, .d_ff = 20, .gelu = false,
                                                         .layer_norm_eps = 1e-6, .dtype = F64});
  const auto j = nlohmann::ordered_json::parse(nn::module_config_json(block));
  BOOST_TEST(j["type"] == "TransformerBlock");
  BOOST_TEST(j["dtype"] == "float64");
  BOOST_TEST(j["options"]["d_ff"] == 20);
  BOOST_TEST(j["options"]["gelu"] == false);
  BOOST_TEST(j["options"]["layer_norm_eps"].get<double>() == 1e-6);
  std::vector<std::string> children;
  for (const auto& [k, v] : j["children"].items()) children.push_back(k);
  BOOST_TEST(children == (std::vector<std::string>{"ln_1", "attn", "ln_2", "fc_1", "fc_2"}));
  BOOST_TEST(j["children"]["attn"]["options"]["num_heads"] == 2);
  const nn::ModuleConfig c = nn::module_config(block);
  BOOST_TEST(c.child("attn").integer("embed_dim") == 8);
  BOOST_TEST(c.child("fc_1").integer("out_features") == 20);
  BOOST_TEST(c.child("ln_2").shape("normalized_shape") == (ag::Shape{8}));
  BOOST_TEST(c.number("layer_norm_eps") == 1e-6);
  // Wrong names and kinds say what there is.
  checkpoint_support::Tiny tiny(1);
  const nn::ModuleConfig t = nn::module_config(tiny);
  BOOST_TEST(t.type == "Tiny");
  BOOST_CHECK_EXCEPTION(c.child("attn.nope"), nn::CheckpointError, [](const auto& e) {
    return std::string(e.what()).find("no child 'nope'") != std::string::npos;
  });
  BOOST_CHECK_EXCEPTION(c.child("fc_1").flag("in_features"), nn::CheckpointError, [](const auto& e) {
    return std::string(e.what()).find("option 'in_features' is 8, not true or false") != std::string::npos;
  });
  BOOST_CHECK_EXCEPTION(c.integer("heads"), nn::CheckpointError, [](const auto& e) {
    return std::string(e.what()).find("no option 'heads'") != std::string::npos;
  });
}

BOOST_AUTO_TEST_CASE(every_save_writes_the_config_and_its_naming) {
  TempDir dir;
  checkpoint_support::Tiny tiny(1);
  nn::Linear l(3, 2);
  nn::SGD sgd(tiny.parameters(), {.lr = 0.1});
  nn::save_parameters(tiny, dir.file("p.safetensors"), {{"headgrad.naming", "stale"}, {"note", "kept"}});
  nn::save_checkpoint(dir.file("c.safetensors"), tiny, sgd);
  nn::save_torch_state_dict(l, dir.file("t.safetensors"));
  const auto p = nn::load_safetensors(dir.file("p.safetensors")).metadata;
  BOOST_TEST(p.at("headgrad.naming") == "headgrad");  // the caller's value is replaced
  BOOST_TEST(p.at("note") == "kept");
  BOOST_TEST(p.at("headgrad.config") == nn::module_config_json(tiny));
  BOOST_TEST(nn::read_module_config(dir.file("c.safetensors")).type == "Tiny");
  const auto t = nn::load_safetensors(dir.file("t.safetensors")).metadata;
  BOOST_TEST(t.at("headgrad.naming") == "torch");
  BOOST_TEST(t.at("format") == "pt");
  BOOST_TEST(nn::read_module_config(dir.file("t.safetensors")).integer("in_features") == 3);
  nn::save_safetensors(dir.file("bare.safetensors"), {{"x", ag::zeros({1})}});
  BOOST_CHECK_EXCEPTION(nn::read_module_config(dir.file("bare.safetensors")), nn::CheckpointError, [](const auto& e) {
    return std::string(e.what()).find("has no \"headgrad.config\" metadata") != std::string::npos;
  });
}

BOOST_AUTO_TEST_CASE(nn_modules_are_rebuilt_from_the_file_alone) {
  TempDir dir;
  ag::Generator gen(5);
  auto seq = std::make_shared<nn::Sequential>();
  seq->push_back("block", std::make_shared<nn::TransformerBlock>(
                              nn::TransformerBlockOptions{.d_model = 6, .num_heads = 3, .d_ff = 10, .dtype = F64}, gen));
  seq->push_back("norm", std::make_shared<nn::LayerNorm>(nn::LayerNormOptions{.normalized_shape = {6}, .eps = 1e-3,
                                                                               .dtype = F64}));
  seq->push_back("act", std::make_shared<nn::GELU>(ag::GeluApproximation::Tanh));
  seq->push_back("out", std::make_shared<nn::Linear>(nn::LinearOptions{6, 2, false, F64}, gen));
  const ag::Tensor x = ag::randn({2, 4, 6}, F64, gen);
  const auto want = seq->forward(x).to_vector();
  for (const bool torch : {false, true}) {
    const std::string path = dir.file(torch ? "t.safetensors" : "p.safetensors");
    torch ? nn::save_torch_state_dict(*seq, path) : nn::save_parameters(*seq, path);
    const auto rebuilt = std::dynamic_pointer_cast<nn::Sequential>(nn::load_module(path));
    BOOST_REQUIRE(rebuilt);
    BOOST_TEST(rebuilt->to_string() == seq->to_string());
    BOOST_TEST(same_bits(snapshot(*rebuilt), snapshot(*seq)));
    BOOST_TEST(same_bits({rebuilt->forward(x).to_vector()}, {want}));
  }
  checkpoint_support::Tiny tiny(1);
  nn::save_parameters(tiny, dir.file("tiny.safetensors"));
  BOOST_CHECK_EXCEPTION(nn::load_module(dir.file("tiny.safetensors")), nn::CheckpointError, [](const auto& e) {
    return std::string(e.what()).find("type 'Tiny' is not one of nn's modules") != std::string::npos;
  });
}

BOOST_AUTO_TEST_CASE(train_heads_models_are_rebuilt_from_the_file_alone) {
  TempDir dir;
  for (const bool mlp : {true, false}) {
    ag::Generator gen(9);
    const heads::HeadsModelOptions o{.vocab = 7, .seq_len = 5, .d_model = 8, .d_ff = 12, .heads = 2, .classes = 13,
                                     .mlp = mlp};
    heads::HeadsModel model(o, gen);
    const ag::Tensor x = tokens(3, 5, 7, 2);
    const auto out = model.forward_with_weights(x);
    for (const bool torch : {false, true}) {
      BOOST_TEST_CONTEXT("mlp " << mlp << ", torch naming " << torch) {
        const std::string path = dir.file(torch ? "m.torch.safetensors" : "m.safetensors");
        torch ? nn::save_torch_state_dict(model, path) : nn::save_parameters(model, path);
        const auto back = heads::heads_options_from_config(nn::read_module_config(path));
        BOOST_TEST(back.vocab == o.vocab);
        BOOST_TEST(back.seq_len == o.seq_len);
        BOOST_TEST(back.d_model == o.d_model);
        BOOST_TEST(back.heads == o.heads);
        BOOST_TEST(back.classes == o.classes);
        BOOST_TEST(back.mlp == o.mlp);
        if (mlp) BOOST_TEST(back.d_ff == o.d_ff);
        const auto rebuilt = heads::load_heads_model(path);
        BOOST_TEST(same_bits(snapshot(*rebuilt), snapshot(model)));
        const auto again = rebuilt->forward_with_weights(x);
        BOOST_TEST(same_bits({again.logits.to_vector(), again.weights.to_vector()},
                             {out.logits.to_vector(), out.weights.to_vector()}));
      }
    }
  }
  nn::Linear l(2, 2);
  nn::save_parameters(l, dir.file("linear.safetensors"));
  BOOST_CHECK_EXCEPTION(heads::load_heads_model(dir.file("linear.safetensors")), nn::CheckpointError,
                        [](const auto& e) { return std::string(e.what()).find("holds a Linear") != std::string::npos; });
}
