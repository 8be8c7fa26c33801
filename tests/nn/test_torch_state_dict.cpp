// PyTorch state_dicts, both ways: files PyTorch wrote (tests/data/torch_interop, made by
// make_fixtures.py) load with nn::load_torch_state_dict and give PyTorch's outputs to 1e-10 in
// float64; headgrad's files of the same modules load back bit for bit, and (with
// HEADGRAD_TORCH_EXPORT_DIR set, as make_fixtures.py does) are written for PyTorch to check.
#define BOOST_TEST_MODULE torch_state_dict
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
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

using Inputs = std::map<std::string, ag::Tensor>;

// The user's tree of make_fixtures.py's Tree: embedding, two blocks in a Sequential, LayerNorm,
// attention added back into the stream, and a readout without bias.
struct Tree : nn::Module {
  std::shared_ptr<nn::Embedding> tok;
  std::shared_ptr<nn::Sequential> body;
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::MultiHeadAttention> attn;
  std::shared_ptr<nn::Linear> head;
  explicit Tree(ag::Generator& gen) : Module("Tree") {
    tok = register_module("tok", std::make_shared<nn::Embedding>(nn::EmbeddingOptions{9, 6, F64}, gen));
    body = register_module("body", std::make_shared<nn::Sequential>());
    body->push_back(std::make_shared<nn::TransformerBlock>(
        nn::TransformerBlockOptions{.d_model = 6, .num_heads = 2, .d_ff = 12, .dtype = F64}, gen));
    body->push_back(std::make_shared<nn::TransformerBlock>(
        nn::TransformerBlockOptions{.d_model = 6, .num_heads = 3, .d_ff = 8, .gelu = false, .dtype = F64}, gen));
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(nn::LayerNormOptions{.normalized_shape = {6},
                                                                                        .dtype = F64}));
    nn::MultiHeadAttentionOptions mha{6, 2};
    mha.dtype = F64;
    attn = register_module("attn", std::make_shared<nn::MultiHeadAttention>(mha, gen));
    head = register_module("head", std::make_shared<nn::Linear>(nn::LinearOptions{6, 4, false, F64}, gen));
  }
  ag::Tensor forward(const ag::Tensor& idx) {
    const ag::Tensor x = body->forward(tok->forward(idx));
    const ag::Tensor h = norm->forward(x);
    nn::AttentionOptions ao;
    ao.need_weights = false;
    return head->forward(ag::add(x, attn->forward(h, h, h, ao).output));
  }
};

nn::MultiHeadAttentionOptions mha_options(std::int64_t E, std::int64_t H) {
  nn::MultiHeadAttentionOptions o{E, H};
  o.dtype = F64;
  return o;
}

nn::NamedTensors attention_outputs(nn::Module& m, const Inputs& in) {
  auto r = dynamic_cast<nn::MultiHeadAttention&>(m).forward(in.at("q"), in.at("k"), in.at("v"));
  return {{"out", r.output}, {"weights", r.weights}};
}

template <class M>
std::function<nn::NamedTensors(nn::Module&, const Inputs&)> one_input(const char* input) {
  return [input](nn::Module& m, const Inputs& in) -> nn::NamedTensors {
    return {{"out", dynamic_cast<M&>(m).forward(in.at(input))}};
  };
}

// One module of make_fixtures.py's CASES, built in headgrad (float64, parameters from gen), and
// its forward on the case's inputs giving outputs under the fixture's names.
struct Case {
  std::string name;
  std::function<std::shared_ptr<nn::Module>(ag::Generator&)> make;
  std::function<nn::NamedTensors(nn::Module&, const Inputs&)> run;
};

std::vector<Case> cases() {
  using nn::TransformerBlockOptions;
  return {
      {"linear", [](ag::Generator& g) { return std::make_shared<nn::Linear>(nn::LinearOptions{4, 3, true, F64}, g); },
       one_input<nn::Linear>("x")},
      {"linear_no_bias",
       [](ag::Generator& g) { return std::make_shared<nn::Linear>(nn::LinearOptions{5, 2, false, F64}, g); },
       one_input<nn::Linear>("x")},
      {"embedding", [](ag::Generator& g) { return std::make_shared<nn::Embedding>(nn::EmbeddingOptions{7, 4, F64}, g); },
       one_input<nn::Embedding>("idx")},
      {"layer_norm",
       [](ag::Generator&) {
         return std::make_shared<nn::LayerNorm>(nn::LayerNormOptions{.normalized_shape = {3, 4}, .eps = 1e-6, .dtype = F64});
       },
       one_input<nn::LayerNorm>("x")},
      {"layer_norm_no_bias",
       [](ag::Generator&) {
         return std::make_shared<nn::LayerNorm>(nn::LayerNormOptions{.normalized_shape = {4}, .bias = false, .dtype = F64});
       },
       one_input<nn::LayerNorm>("x")},
      {"mha", [](ag::Generator& g) { return std::make_shared<nn::MultiHeadAttention>(mha_options(6, 2), g); },
       attention_outputs},
      {"mha_kdim_vdim",
       [](ag::Generator& g) {
         auto o = mha_options(6, 3);
         o.kdim = 5, o.vdim = 3;
         return std::make_shared<nn::MultiHeadAttention>(o, g);
       },
       attention_outputs},
      {"mha_bias_kv",
       [](ag::Generator& g) {
         auto o = mha_options(4, 2);
         o.bias = false, o.add_bias_kv = true, o.add_zero_attn = true;
         return std::make_shared<nn::MultiHeadAttention>(o, g);
       },
       attention_outputs},
      {"block_gelu",
       [](ag::Generator& g) {
         return std::make_shared<nn::TransformerBlock>(TransformerBlockOptions{.d_model = 6, .num_heads = 2, .d_ff = 10,
                                                                               .dtype = F64}, g);
       },
       one_input<nn::TransformerBlock>("x")},
      {"block_relu_causal",
       [](ag::Generator& g) {
         return std::make_shared<nn::TransformerBlock>(
             TransformerBlockOptions{.d_model = 6, .num_heads = 3, .d_ff = 8, .gelu = false, .layer_norm_eps = 1e-6,
                                     .dtype = F64}, g);
       },
       [](nn::Module& m, const Inputs& in) -> nn::NamedTensors {
         nn::AttentionOptions ao;
         ao.is_causal = true;
         ao.need_weights = false;
         return {{"out", dynamic_cast<nn::TransformerBlock&>(m).forward(in.at("x"), ao).output}};
       }},
      {"tree", [](ag::Generator& g) { return std::make_shared<Tree>(g); }, one_input<Tree>("idx")},
  };
}

Inputs read_io(const std::string& name) {
  Inputs io;
  for (auto& [k, t] : nn::load_safetensors(kDir + name + ".io.safetensors").tensors) io.emplace(k, t);
  return io;
}

// Every parameter drawn again, biases and LayerNorm weights too (they start as zeros and ones),
// so that a value put in the wrong place shows.
void randomize(nn::Module& m, ag::Generator& gen) {
  ag::NoGradGuard no_grad;
  for (auto& p : m.parameters()) p.copy_(ag::randn(p.shape(), F64, gen));
}

double max_abs_diff(const ag::Tensor& a, const ag::Tensor& b) {
  const auto x = a.to_vector(), y = b.to_vector();
  double m = 0;
  for (std::size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return std::isnan(m) ? INFINITY : m;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(pytorch_files)

BOOST_AUTO_TEST_CASE(load_and_give_pytorchs_outputs_to_1e_10) {
  for (const auto& c : cases()) {
    BOOST_TEST_CONTEXT("case " << c.name) {
      ag::Generator gen(3);
      const auto m = c.make(gen);
      nn::load_torch_state_dict(*m, kDir + c.name + ".safetensors");
      const Inputs io = read_io(c.name);
      ag::NoGradGuard no_grad;
      m->eval();
      for (const auto& [out, value] : c.run(*m, io)) {
        BOOST_TEST_CONTEXT("output " << out) {
          const ag::Tensor& want = io.at(out);
          BOOST_REQUIRE(value.defined());
          BOOST_TEST(value.shape() == want.shape());
          BOOST_TEST(max_abs_diff(value, want) <= 1e-10);
          BOOST_TEST(max_abs_diff(want, ag::zeros(want.shape(), F64)) > 0.01);  // a real output, not zeros
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(torch_state_dict_gives_the_files_tensors_back_bit_for_bit) {
  // Loading PyTorch's file and taking the state_dict again reproduces the file's tensors.
  for (const auto& c : cases()) {
    BOOST_TEST_CONTEXT("case " << c.name) {
      ag::Generator gen(4);
      const auto m = c.make(gen);
      const std::string path = kDir + c.name + ".safetensors";
      nn::load_torch_state_dict(*m, path);
      std::map<std::string, ag::Tensor> file;
      for (auto& [k, t] : nn::load_safetensors(path).tensors) file.emplace(k, t);
      const nn::NamedTensors ours = nn::torch_state_dict(*m);
      BOOST_TEST(ours.size() == file.size());
      for (const auto& [k, t] : ours) {
        BOOST_REQUIRE_MESSAGE(file.count(k), "key " << k << " is not in PyTorch's file");
        BOOST_TEST(t.shape() == file.at(k).shape());
        BOOST_TEST(same_bits({t.to_vector()}, {file.at(k).to_vector()}), "key " << k);
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(exports)

// Headgrad's own models of every case (their own parameters) saved in PyTorch's naming, with the
// fixture's inputs and headgrad's outputs ("headgrad_out", ...): into HEADGRAD_TORCH_EXPORT_DIR
// when it is set (make_fixtures.py loads them into PyTorch), else into a scratch directory. Each
// file loads back into a module of other parameters, giving the same parameters and outputs bit
// for bit. "tree_f32" is the tree in float32.
BOOST_AUTO_TEST_CASE(headgrad_files_round_trip_and_are_written_for_pytorch) {
  TempDir scratch;
  const char* env = std::getenv("HEADGRAD_TORCH_EXPORT_DIR");
  const std::string dir = env && *env ? std::string(env) + "/" : scratch.path.string() + "/";
  for (const auto& c : cases()) {
    for (const ag::Dtype dtype : {F64, F32}) {
      if (dtype == F32 && c.name != "tree") continue;
      const std::string name = c.name + (dtype == F32 ? "_f32" : "");
      BOOST_TEST_CONTEXT("case " << name) {
        ag::Generator gen(11), other(12);
        const auto m = c.make(gen), back = c.make(other);
        randomize(*m, gen), randomize(*back, other);
        m->to(dtype), back->to(dtype);
        Inputs io = read_io(c.name);
        for (auto& [k, t] : io) t = t.to(dtype);
        ag::NoGradGuard no_grad;
        m->eval(), back->eval();
        nn::NamedTensors written = {io.begin(), io.end()};
        const nn::NamedTensors outputs = c.run(*m, io);
        for (const auto& [k, t] : outputs) written.emplace_back("headgrad_" + k, t);
        nn::save_torch_state_dict(*m, dir + name + ".safetensors");
        nn::save_safetensors(dir + name + ".io.safetensors", written);

        BOOST_TEST(!same_bits(snapshot(*m), snapshot(*back)));
        nn::load_torch_state_dict(*back, dir + name + ".safetensors");
        BOOST_TEST(same_bits(snapshot(*m), snapshot(*back)));
        const nn::NamedTensors again = c.run(*back, io);
        for (std::size_t i = 0; i < outputs.size(); ++i)
          BOOST_TEST(same_bits({outputs[i].second.to_vector()}, {again[i].second.to_vector()}), outputs[i].first);
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
