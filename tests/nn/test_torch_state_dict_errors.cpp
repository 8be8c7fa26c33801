// PyTorch state_dicts that must be refused: missing, extra, misshaped and mistyped tensors, files
// meant for another loader (each message says which loader to use), modules with no torch.nn
// equivalent; each with a clear message and no parameter changed. And parameter handles that
// take in-place writes.
#define BOOST_TEST_MODULE torch_state_dict_errors
#include <boost/test/unit_test.hpp>

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nn/nn.hpp>

#include "checkpoint_support.hpp"

namespace ag = autograd;
using checkpoint_support::same_bits;
using checkpoint_support::snapshot;
using checkpoint_support::TempDir;

namespace {

const std::string kDir = std::string(HEADGRAD_TEST_DATA_DIR) + "/torch_interop/";
constexpr auto F32 = ag::Dtype::Float32;
constexpr auto F64 = ag::Dtype::Float64;

std::shared_ptr<nn::MultiHeadAttention> attention(std::uint64_t seed, ag::Dtype dtype = F64) {
  ag::Generator gen(seed);
  nn::MultiHeadAttentionOptions o{6, 2};
  o.dtype = dtype;
  return std::make_shared<nn::MultiHeadAttention>(o, gen);
}

// A container of a Linear and an attention layer: a module tree of torch-mappable modules.
struct Net : nn::Module {
  std::shared_ptr<nn::Linear> fc;
  std::shared_ptr<nn::MultiHeadAttention> attn;
  explicit Net(std::uint64_t seed) : Module("Net") {
    ag::Generator gen(seed);
    fc = register_module("fc", std::make_shared<nn::Linear>(nn::LinearOptions{6, 5, true, F64}, gen));
    attn = register_module("attn", attention(seed + 1));
  }
};

// `load` must throw CheckpointError with every fragment in its message and change nothing in m.
void expect_refused(nn::Module& m, const std::function<void()>& load, const std::vector<std::string>& fragments) {
  const auto before = snapshot(m);
  try {
    load();
    BOOST_ERROR("no error; expected one mentioning: " << fragments.front());
  } catch (const nn::CheckpointError& e) {
    const std::string what = e.what();
    BOOST_TEST_MESSAGE("  -> " << what);
    for (const auto& f : fragments) BOOST_TEST(what.find(f) != std::string::npos, "message lacks '" << f << "': " << what);
  }
  BOOST_TEST(same_bits(snapshot(m), before), "a failed load changed a parameter");
}

// Net's torch state_dict from another seed, edited by `edit`, saved as a file.
std::string torch_file(const TempDir& dir, const std::function<void(nn::NamedTensors&)>& edit) {
  static int count = 0;
  Net source(50);
  nn::NamedTensors tensors = nn::torch_state_dict(source);
  edit(tensors);
  const std::string path = dir.file(fmt::format("edited_{}.safetensors", count++));
  nn::save_safetensors(path, tensors);
  return path;
}

}  // namespace

BOOST_AUTO_TEST_CASE(missing_extra_misshaped_and_mistyped_tensors_are_named) {
  TempDir dir;
  Net m(1);
  auto load = [&](const std::string& path) { return [&m, path] { nn::load_torch_state_dict(m, path); }; };
  const std::string missing = torch_file(dir, [](nn::NamedTensors& t) { std::erase_if(t, [](auto& e) {
    return e.first == "attn.out_proj.bias"; }); });
  expect_refused(m, load(missing), {"load_torch_state_dict", missing, "missing tensors 'attn.out_proj.bias'",
                                    "no parameter was changed"});
  const std::string extra = torch_file(dir, [](nn::NamedTensors& t) { t.emplace_back("attn.bias_k", ag::zeros({1, 1, 6}, F64)); });
  expect_refused(m, load(extra), {"unexpected tensors 'attn.bias_k'"});
  const std::string shape = torch_file(dir, [](nn::NamedTensors& t) {
    for (auto& [k, v] : t)
      if (k == "attn.in_proj_weight") v = ag::zeros({6, 18}, F64);  // headgrad's (in, out) orientation
  });
  expect_refused(m, load(shape), {"'attn.in_proj_weight' has shape [6, 18] in the file but torch's layout of 'attn.W_Q', "
                                  "'attn.W_K', 'attn.W_V' is [18, 6]"});
  const std::string dtype = torch_file(dir, [](nn::NamedTensors& t) {
    for (auto& [k, v] : t)
      if (k == "fc.weight") v = v.to(F32);
  });
  expect_refused(m, load(dtype), {"'fc.weight' is F32 in the file but the parameters ('fc.weight') are F64"});
  nn::load_torch_state_dict(m, dtype, {.convert_dtype = true});  // converting was asked for
  BOOST_CHECK(m.fc->weight().dtype() == F64);
  // Not strict: the missing key is skipped, everything else loads.
  Net fresh(2);
  const auto bias_before = fresh.attn->b_O().to_vector();
  nn::load_torch_state_dict(fresh, missing, {.strict = false});
  BOOST_TEST(fresh.attn->b_O().to_vector() == bias_before);
  BOOST_TEST(fresh.fc->bias().to_vector() == Net(50).fc->bias().to_vector());
}

BOOST_AUTO_TEST_CASE(every_problem_is_in_one_message) {
  TempDir dir;
  Net m(1);
  const std::string path = torch_file(dir, [](nn::NamedTensors& t) {
    std::erase_if(t, [](auto& e) { return e.first == "fc.bias"; });
    t.emplace_back("fc.scale", ag::ones({5}, F64));
    for (auto& [k, v] : t)
      if (k == "attn.out_proj.weight") v = ag::zeros({6, 5}, F64);
  });
  expect_refused(m, [&] { nn::load_torch_state_dict(m, path); },
                 {"missing tensors 'fc.bias'", "unexpected tensors 'fc.scale'", "'attn.out_proj.weight' has shape [6, 5]"});
}

BOOST_AUTO_TEST_CASE(each_loader_names_the_right_one_for_a_file_it_cannot_load) {
  TempDir dir;
  Net m(1), source(2);
  nn::SGD sgd(source.parameters(), {.lr = 0.1});
  const std::string own = dir.file("own.safetensors"), torch = dir.file("torch.safetensors"),
                    ckpt = dir.file("ckpt.safetensors");
  nn::save_parameters(source, own);
  nn::save_torch_state_dict(source, torch);
  nn::save_checkpoint(ckpt, source, sgd);
  nn::SGD opt(m.parameters(), {.lr = 0.1});
  expect_refused(m, [&] { nn::load_torch_state_dict(m, own); },
                 {"load_torch_state_dict: " + own, "headgrad's own names", "load it with load_parameters(module, path)"});
  expect_refused(m, [&] { nn::load_parameters(m, torch); },
                 {"load_parameters: " + torch, "PyTorch's names", "load it with load_torch_state_dict(module, path)"});
  expect_refused(m, [&] { nn::load_parameters(m, ckpt); },
                 {"training checkpoint", "load it with load_checkpoint(path, module, optimizer)"});
  expect_refused(m, [&] { nn::load_torch_state_dict(m, ckpt); }, {"load it with load_checkpoint"});
  expect_refused(m, [&] { nn::load_checkpoint(own, m, opt); }, {"load_checkpoint: ", "load it with load_parameters"});
  expect_refused(m, [&] { nn::load_checkpoint(torch, m, opt); }, {"load it with load_torch_state_dict"});
  // The messages say which loader, not every name.
  try {
    nn::load_parameters(m, torch);
  } catch (const nn::CheckpointError& e) {
    BOOST_TEST(std::string(e.what()).find("in_proj_weight") == std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_CASE(a_pytorch_written_file_is_recognised_by_its_names_and_shapes) {
  // PyTorch's own file has no headgrad metadata: its names and shapes tell.
  auto m = attention(1);
  const std::string path = kDir + "mha.safetensors";
  BOOST_TEST(nn::load_safetensors(path).metadata.count("headgrad.naming") == 0u);
  expect_refused(*m, [&] { nn::load_parameters(*m, path); }, {"load it with load_torch_state_dict"});
  // A lone Linear has the same names in both namings; the transposed shape tells.
  ag::Generator gen(1);
  nn::Linear l(nn::LinearOptions{4, 3, true, F64}, gen);
  expect_refused(l, [&] { nn::load_parameters(l, kDir + "linear.safetensors"); }, {"load it with load_torch_state_dict"});
  nn::load_torch_state_dict(l, kDir + "linear.safetensors");
}

// A user's layer with a parameter of its own.
struct Scale : nn::Module {
  ag::Tensor gain;
  Scale() : Module("Scale") { gain = register_parameter("gain", ag::ones({3}, F64)); }
  ag::Tensor forward(const ag::Tensor& x) const { return ag::mul(x, gain); }
};

BOOST_AUTO_TEST_CASE(modules_without_a_torch_equivalent_are_named_with_their_path_and_type) {
  TempDir dir;
  Scale lone;
  checkpoint_support::Tiny tiny(1);
  auto expect = [&](nn::Module& m, std::vector<std::string> fragments) {
    fragments.push_back("save_torch_state_dict: ");
    expect_refused(m, [&] { nn::save_torch_state_dict(m, dir.file("x.safetensors")); }, fragments);
    fragments.back() = "load_torch_state_dict: " + kDir + "linear.safetensors: ";
    expect_refused(m, [&] { nn::load_torch_state_dict(m, kDir + "linear.safetensors"); }, fragments);
    BOOST_TEST(dir.entries() == 0u);  // nothing written
  };
  expect(lone, {"the root module (Scale) holds parameters 'gain'", "save_parameters"});
  expect(tiny, {"the root module (Tiny) holds parameters 'scale'"});
  nn::Sequential seq(std::make_shared<nn::Linear>(3, 3), std::make_shared<nn::GELU>());
  seq.push_back("scale", std::make_shared<Scale>());
  expect(seq, {"module 'scale' (Scale)"});
  nn::Sequential blocks;
  blocks.push_back(std::make_shared<nn::TransformerBlock>(nn::TransformerBlockOptions{.d_model = 4, .bias = false}));
  expect(blocks, {"module '0' (TransformerBlock) has bias=false", "nn.TransformerEncoderLayer"});
}

BOOST_AUTO_TEST_CASE(tied_parameters_are_saved_under_each_name_and_must_agree_on_load) {
  // One Linear registered under two names, as PyTorch lists a shared module's keys twice.
  struct Tied : nn::Module {
    std::shared_ptr<nn::Linear> fc = std::make_shared<nn::Linear>(nn::LinearOptions{3, 2, true, F64});
    Tied() : Module("Tied") {
      register_module("a", fc);
      register_module("b", fc);
    }
  } m;
  std::vector<std::string> keys;
  for (const auto& [k, t] : nn::torch_state_dict(m)) keys.push_back(k);
  BOOST_TEST(keys == (std::vector<std::string>{"a.weight", "a.bias", "b.weight", "b.bias"}));
  TempDir dir;
  nn::save_torch_state_dict(m, dir.file("tied.safetensors"));
  nn::load_torch_state_dict(m, dir.file("tied.safetensors"));
  nn::NamedTensors t = nn::torch_state_dict(m);
  t[2].second = ag::zeros({2, 3}, F64);
  nn::save_safetensors(dir.file("disagree.safetensors"), t);
  expect_refused(m, [&] { nn::load_torch_state_dict(m, dir.file("disagree.safetensors")); },
                 {"'a.weight' and 'b.weight' give different values to the tied parameter 'a.weight'"});
}

// ---- parameter handles ----

// Assigning another tensor to a layer's parameter handle would leave the module on the old one:
// it does not compile. A const layer gives read-only handles, as before.
static_assert(!std::is_assignable_v<nn::Parameter&, ag::Tensor>);
static_assert(!std::is_assignable_v<decltype(std::declval<nn::Linear&>().weight()), ag::Tensor>);
static_assert(std::is_same_v<decltype(std::declval<const nn::Linear&>().weight()), const ag::Tensor&>);
static_assert(std::is_convertible_v<decltype(&std::declval<nn::LayerNorm&>().bias()), const ag::Tensor*>);

BOOST_AUTO_TEST_CASE(parameter_accessors_take_in_place_writes_like_pytorch) {
  ag::Generator gen(1);
  nn::Linear l(nn::LinearOptions{2, 3, true, F64}, gen);
  const ag::Tensor w = ag::tensor({1, 2, 3, 4, 5, 6}, {2, 3}, F64);
  {
    ag::NoGradGuard g;
    l.weight().copy_(w);
    l.bias().fill_(0.5);
  }
  BOOST_TEST(l.parameter("weight").to_vector() == w.to_vector());
  BOOST_TEST(l.forward(ag::tensor({1, 0}, {2}, F64)).to_vector() == (std::vector<double>{1.5, 2.5, 3.5}));
  BOOST_TEST(l.weight().is_same(l.named_parameters().front().second));
  ag::Tensor handle = l.weight();  // an ordinary handle to the same parameter
  handle = ag::zeros({2, 3}, F64);  // rebinding the copy leaves the layer alone
  BOOST_TEST(l.parameter("weight").to_vector() == w.to_vector());
  nn::TransformerBlock block(nn::TransformerBlockOptions{.d_model = 4, .dtype = F64});
  nn::LayerNorm n(3);
  nn::Embedding e(4, 3);
  {
    ag::NoGradGuard g;
    block.fc_1().weight().zero_();
    block.ln_2().bias().fill_(-1.0);
    n.weight().fill_(2.0);
    e.weight().fill_(1.0);
  }
  BOOST_TEST(block.parameter("fc_1.weight").to_vector() == std::vector<double>(64, 0.0));
  BOOST_TEST(block.parameter("ln_2.bias").to_vector() == std::vector<double>(4, -1.0));
  BOOST_TEST(n.parameter("weight").to_vector() == std::vector<double>(3, 2.0));
  BOOST_TEST(e.parameter("weight").to_vector() == std::vector<double>(12, 1.0));
}
