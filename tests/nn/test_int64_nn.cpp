// Int64 in nn: Embedding and the cross-entropy loss with Int64 indices, I64 entries in
// safetensors files (exact round trip, never loaded into a float parameter), the layers and
// register_parameter refusing Int64 parameters, and MultiHeadAttention's writable parameter handles.
#define BOOST_TEST_MODULE int64_nn
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <nn/nn.hpp>

#include "checkpoint_support.hpp"
#include "int64_support.hpp"
#include "test_support.hpp"

using namespace test_support::prelude;
using test_support::I64;
using test_support::int_values;
using test_support::ints;

namespace {

// A module with one float parameter "weight" [2, 3].
struct Holder : nn::Module {
  Holder() : nn::Module("Holder") { w = register_parameter("weight", ag::zeros({2, 3}, Dtype::Float64)); }
  Tensor w;
};

}  // namespace

BOOST_AUTO_TEST_CASE(embedding_module_takes_int64_indices) {
  ag::Generator gen(5);
  nn::Embedding emb(nn::EmbeddingOptions{.num_embeddings = 6, .embedding_dim = 3, .dtype = Dtype::Float64}, gen);
  const Tensor ids = ints({5, 0, 5, 2}, {2, 2});
  const Tensor a = emb(ids), b = emb(ids.to(Dtype::Float32));
  BOOST_TEST(ag::shape_str(a.shape()) == "[2, 2, 3]");
  BOOST_TEST(a.to_vector() == b.to_vector());
  // row k of the output is row ids[k] of the weight
  const std::vector<double> w = emb.weight().to_vector(), out = a.to_vector();
  const I64 idv = {5, 0, 5, 2};
  for (std::size_t k = 0; k < idv.size(); ++k)
    for (std::size_t d = 0; d < 3; ++d) BOOST_TEST(out[k * 3 + d] == w[static_cast<std::size_t>(idv[k]) * 3 + d]);
  // the module's gradient: the weight's .grad from a backward through emb, against the
  // central differences of the same sum(out · c) computed through the module
  const Tensor c = test_support::iota({2, 2, 3});
  ag::sum(emb(ids) * c).backward();
  const std::vector<double> g = emb.weight().grad().to_vector();
  std::vector<double> numeric;
  for (std::int64_t k = 0; k < 18; ++k) {
    const double h = 1e-6;
    auto loss_at = [&](double delta) {
      ag::NoGradGuard no_grad;
      Tensor flat = ag::reshape(emb.weight(), {18});
      std::vector<double> v = flat.to_vector();
      v[static_cast<std::size_t>(k)] += delta;
      Tensor moved = ag::tensor(v, {6, 3}, Dtype::Float64);
      const Tensor saved = emb.weight().clone();
      emb.weight().copy_(moved);
      const double l = ag::sum(emb(ids) * c).item();
      emb.weight().copy_(saved);
      return l;
    };
    numeric.push_back((loss_at(h) - loss_at(-h)) / (2 * h));
  }
  for (std::size_t k = 0; k < 18; ++k)
    BOOST_TEST(std::abs(g[k] - numeric[k]) <= 1e-6 * (1 + std::abs(numeric[k])), "weight element " << k);
  check_gradients("embedding with Int64 ids", [&](const TensorList& in) { return ag::embedding(in[0], ids); },
                  {input({6, 3}, 7)});
  check_throws<std::invalid_argument>([&] { emb(ints({6}, {1})); },
                                      {"embedding: index 6 (at position 0) is out of range for dim 0 of size 6"});
}

BOOST_AUTO_TEST_CASE(loss_takes_int64_targets) {
  const Tensor logits = input({4, 5}, 8);
  const Tensor t = ints({4, 0, 3, 3}, {4});
  const Tensor a = nn::cross_entropy(logits, t), b = nn::cross_entropy(logits, t.to(Dtype::Float64));
  BOOST_TEST(a.item() == b.item());
  check_gradients("nn::cross_entropy", [&](const TensorList& in) { return nn::cross_entropy(in[0], t); }, {logits});
  check_throws<std::invalid_argument>([&] { nn::mse_loss(t, t); },
                                      {"mse_loss: needs Float32 or Float64 tensors, got Int64 (shape [4])"});
}

BOOST_AUTO_TEST_CASE(layers_and_parameters_refuse_int64) {
  check_throws<std::invalid_argument>([] { nn::Embedding(nn::EmbeddingOptions{4, 2, Dtype::Int64}); },
                                      {"Embedding: dtype must be Float32 or Float64", "got Int64"});
  check_throws<std::invalid_argument>([] { nn::Linear(nn::LinearOptions{.in_features = 2, .out_features = 2, .dtype = Dtype::Int64}); },
                                      {"Linear: dtype must be Float32 or Float64, got Int64"});
  check_throws<std::invalid_argument>(
      [] { nn::LayerNorm(nn::LayerNormOptions{.normalized_shape = {2}, .dtype = Dtype::Int64}); },
      {"LayerNorm: dtype must be Float32 or Float64, got Int64"});
  check_throws<std::invalid_argument>(
      [] { nn::MultiHeadAttention(nn::MultiHeadAttentionOptions{.embed_dim = 4, .dtype = Dtype::Int64}); },
      {"MultiHeadAttention: dtype must be Float32 or Float64, got Int64"});
  nn::Module m;
  check_throws<std::invalid_argument>([&] { m.register_parameter("steps", ints({1, 2}, {2})); },
                                      {"register_parameter: parameter 'steps' is Int64 [2]"});
  const Tensor kept = m.register_parameter("steps", ints({1, 2}, {2}), /*requires_grad=*/false);  // allowed
  BOOST_TEST(!kept.requires_grad());
  Holder h;
  check_throws<std::invalid_argument>([&] { h.to(Dtype::Int64); },
                                      {"Module::to: parameters must be Float32 or Float64, got Int64"});
}

BOOST_AUTO_TEST_CASE(safetensors_store_int64_as_i64_exactly) {
  const I64 v = {std::numeric_limits<std::int64_t>::min(), -1, 0, (std::int64_t{1} << 53) + 1,
                 std::numeric_limits<std::int64_t>::max(), 42};
  const nn::NamedTensors tensors = {{"ids", ints(v, {2, 3})}, {"w", ag::ones({2}, Dtype::Float32)}};
  const std::string bytes = nn::serialize_safetensors(tensors);
  BOOST_TEST(contains(bytes, "\"ids\":{\"dtype\":\"I64\",\"shape\":[2,3],\"data_offsets\":[0,48]}"));
  const nn::SafetensorsData back = nn::parse_safetensors(bytes);
  BOOST_REQUIRE_EQUAL(back.tensors.size(), 2u);
  BOOST_TEST(back.tensors[0].first == "ids");
  const Tensor& ids = back.tensors[0].second;
  BOOST_TEST((ids.dtype() == Dtype::Int64));
  BOOST_TEST(I64(ids.data<std::int64_t>(), ids.data<std::int64_t>() + 6) == v, boost::test_tools::per_element());
  BOOST_TEST(nn::serialize_safetensors(back.tensors) == bytes);  // the same bytes again
  // the same through a file
  checkpoint_support::TempDir dir;
  nn::save_safetensors(dir.file("i.safetensors"), tensors);
  const nn::SafetensorsData loaded = nn::load_safetensors(dir.file("i.safetensors"));
  BOOST_TEST(loaded.tensors[0].second.to_vector() == ids.to_vector());
}

BOOST_AUTO_TEST_CASE(an_i64_entry_never_loads_into_a_float_parameter) {
  checkpoint_support::TempDir dir;
  const std::string path = dir.file("ids.safetensors");
  nn::save_safetensors(path, {{"weight", ints({1, 2, 3, 4, 5, 6}, {2, 3})}});
  Holder h;
  for (bool convert : {false, true}) {
    const std::string msg = test_support::message_of<nn::CheckpointError>(
        [&] { nn::load_parameters(h, path, {.convert_dtype = convert}); }, "a CheckpointError");
    BOOST_TEST(contains(msg, "'weight' is I64 in the file but the parameter is F64"), msg);
    BOOST_TEST(contains(msg, "no parameter was changed"), msg);
  }
  check_values(h.w, {2, 3}, {0, 0, 0, 0, 0, 0}, 0.0);
  // a float entry of the same name and shape loads (the control)
  nn::save_safetensors(path, {{"weight", ag::ones({2, 3}, Dtype::Float64)}});
  nn::load_parameters(h, path);
  check_values(h.w, {2, 3}, {1, 1, 1, 1, 1, 1}, 0.0);
}

BOOST_AUTO_TEST_CASE(multihead_attention_parameters_are_writable_through_their_accessors) {
  nn::MultiHeadAttention mha(nn::MultiHeadAttentionOptions{.embed_dim = 4, .num_heads = 2, .add_bias_kv = true,
                                                           .dtype = Dtype::Float64});
  static_assert(std::is_same_v<decltype(mha.W_Q()), nn::Parameter&>);
  static_assert(std::is_same_v<decltype(std::as_const(mha).W_Q()), const Tensor&>);
  const Tensor x = input({1, 3, 4}, 9).detach();
  const Tensor before = mha.forward(x);
  {
    ag::NoGradGuard g;
    for (nn::Parameter* p : {&mha.W_Q(), &mha.W_K(), &mha.W_V(), &mha.W_O()}) p->copy_(test_support::iota({4, 4}) * 0.01);
    for (nn::Parameter* p : {&mha.b_Q(), &mha.b_K(), &mha.b_V(), &mha.b_O(), &mha.bias_k(), &mha.bias_v()})
      p->fill_(0.5);
  }
  // the module's registered parameters saw the writes
  for (const auto& [name, p] : mha.named_parameters()) {
    const std::vector<double> v = p.to_vector();
    if (name.rfind("W_", 0) == 0) {
      for (std::size_t i = 0; i < v.size(); ++i) BOOST_TEST(v[i] == static_cast<double>(i) * 0.01, name);
    } else {
      for (double e : v) BOOST_TEST(e == 0.5, name);
    }
  }
  // and the forward uses them: the same as the functional form on hand-made weights
  const Tensor w = test_support::iota({4, 4}) * 0.01, b = ag::full({4}, 0.5, Dtype::Float64);
  nn::functional::MultiHeadAttentionWeights fw = mha.functional_weights();
  const Tensor after = mha.forward(x);
  BOOST_TEST(test_support::max_abs_diff(after, before) > 1e-3);
  BOOST_TEST(fw.W_Q.to_vector() == w.to_vector());
  BOOST_TEST(fw.b_O.to_vector() == b.to_vector());
}
