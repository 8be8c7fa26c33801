// nn::per_example_gradients: each example's gradient of every parameter equals a backward of that
// example's loss alone (the model run on that example only), on the fast path and on the fallback;
// the per-example gradients sum to the batch gradient; tied weights, a hooked weight, a weight used
// outside its layer and examples that interact take the fallback and stay right; bad requests are
// refused naming the function and the shapes.
#define BOOST_TEST_MODULE per_example
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

namespace ag = autograd;
using ag::Dtype;
using ag::Tensor;

namespace {

constexpr std::int64_t kVocab = 7, kE = 8, kT = 5, kB = 4;

// Embedding, a pre-LayerNorm TransformerBlock (LayerNorm, packed self-attention, MLP), a
// cross-attention (separate projections), a final LayerNorm and an unembedding Linear.
class Toy : public nn::Module {
 public:
  explicit Toy(ag::Generator& gen) : nn::Module("Toy") {
    embed_ = register_module("embed", std::make_shared<nn::Embedding>(
                                          nn::EmbeddingOptions{kVocab, kE, Dtype::Float64}, gen));
    block_ = register_module("block", std::make_shared<nn::TransformerBlock>(
                                          nn::TransformerBlockOptions{.d_model = kE, .num_heads = 2,
                                                                      .dtype = Dtype::Float64},
                                          gen));
    cross_ = register_module("cross", std::make_shared<nn::MultiHeadAttention>(
                                          nn::MultiHeadAttentionOptions{.embed_dim = kE, .num_heads = 2,
                                                                        .dtype = Dtype::Float64},
                                          gen));
    ln_ = register_module("ln", std::make_shared<nn::LayerNorm>(
                                    nn::LayerNormOptions{.normalized_shape = {kE}, .dtype = Dtype::Float64}));
    unembed_ = register_module("unembed", std::make_shared<nn::Linear>(
                                              nn::LinearOptions{kE, kVocab, true, Dtype::Float64}, gen));
    // LayerNorm's gains start at one and its biases at zero: move them off, so their gradients
    // are not special.
    ag::NoGradGuard no_grad;
    for (auto& [name, p] : named_parameters())
      if (name.find("ln") != std::string::npos) {
        std::vector<double> v(static_cast<std::size_t>(p.numel()));
        for (auto& x : v) x = gen.normal();
        p.add_(ag::tensor(v, p.shape(), Dtype::Float64), 0.3);
      }
  }
  Tensor forward(const Tensor& tokens) const {
    const Tensor e = embed_->forward(tokens);                                      // (B, T, E)
    const Tensor h = block_->forward(e, {.is_causal = true}).output;               // (B, T, E)
    const Tensor c = cross_->forward(h, e, e, {.need_weights = false}).output;     // (B, T, E)
    return unembed_->forward(ln_->forward(ag::add(h, c)));                        // (B, T, V)
  }

 private:
  std::shared_ptr<nn::Embedding> embed_;
  std::shared_ptr<nn::TransformerBlock> block_;
  std::shared_ptr<nn::MultiHeadAttention> cross_;
  std::shared_ptr<nn::LayerNorm> ln_;
  std::shared_ptr<nn::Linear> unembed_;
};

Tensor tokens(std::int64_t B, std::int64_t T, std::int64_t vocab, std::int64_t salt = 0) {
  std::vector<std::int64_t> v;
  for (std::int64_t i = 0; i < B * T; ++i) v.push_back((i * 5 + i / 3 + salt) % vocab);
  return ag::tensor(v, ag::Shape{B, T});
}

// Each example's mean cross entropy of predicting the next token: (B).
template <class Model>
nn::PerExampleLoss next_token_loss(const Model& model, const Tensor& targets) {
  return [&model, targets](const Tensor& batch) {
    const Tensor ce = ag::cross_entropy(model.forward(batch), ag::narrow(targets, 0, 0, batch.size(0)),
                                        {.reduction = ag::Reduction::None});  // (B, T)
    return ag::mean(ce, 1);                                                  // (B)
  };
}

// The largest |a - b| over the largest |b| (at least 1): a relative worst element.
double worst(const Tensor& a, const Tensor& b) {
  const std::vector<double> va = a.to_vector(), vb = b.to_vector();
  if (va.size() != vb.size()) return INFINITY;
  double diff = 0.0, scale = 1.0;
  for (std::size_t i = 0; i < va.size(); ++i) {
    diff = std::max(diff, std::abs(va[i] - vb[i]));
    scale = std::max(scale, std::abs(vb[i]));
  }
  return diff / scale;
}

// Example b's gradients from a forward and backward of that example alone (the batch narrowed to row b).
template <class Model>
std::vector<ag::TensorList> alone(Model& model, const Tensor& batch, const Tensor& targets) {
  ag::TensorList params;
  for (auto& [name, p] : model.named_parameters()) params.push_back(p);
  std::vector<ag::TensorList> out;
  for (std::int64_t b = 0; b < batch.size(0); ++b) {
    const Tensor ce = ag::cross_entropy(model.forward(ag::narrow(batch, 0, b, 1)), ag::narrow(targets, 0, b, 1),
                                        {.reduction = ag::Reduction::None});
    out.push_back(ag::grad({ag::mean(ce)}, params, {.allow_unused = true}));
  }
  return out;
}

// Every parameter's per-example gradient against `reference` (example b, parameter k); returns the
// worst relative element and the parameter it is in.
double compare(const nn::PerExampleGrads& g, const std::vector<ag::TensorList>& reference, std::string* where) {
  double w = 0.0;
  for (std::size_t k = 0; k < g.grads.size(); ++k)
    for (std::size_t b = 0; b < reference.size(); ++b) {
      const Tensor& want = reference[b][k];
      const Tensor got = ag::squeeze(ag::narrow(g.grads[k].second, 0, static_cast<std::int64_t>(b), 1), 0);
      const double d = want.defined() ? worst(got, want) : worst(got, ag::zeros_like(got));
      if (d > w) {
        w = d;
        *where = g.grads[k].first;
      }
    }
  return w;
}

// Five examples of three features, sin(step·i + phase) for i = 0 .. 14 (float64).
Tensor wave(double step, double phase) {
  std::vector<double> v;
  for (int i = 0; i < 15; ++i) v.push_back(std::sin(step * i + phase));
  return ag::tensor(v, {5, 3}, Dtype::Float64);
}

auto message_has(std::vector<std::string> parts) {
  return [parts](const std::exception& e) {
    const std::string m = e.what();
    for (const auto& p : parts)
      if (m.find(p) == std::string::npos) return false;
    return true;
  };
}

}  // namespace

BOOST_AUTO_TEST_CASE(fast_path_equals_each_example_alone) {
  ag::Generator gen(11);
  Toy model(gen);
  const Tensor x = tokens(kB, kT, kVocab), y = tokens(kB, kT, kVocab, 3);
  const nn::PerExampleGrads g = nn::per_example_gradients(model, x, next_token_loss(model, y));
  for (const auto& f : g.fallback) BOOST_TEST_MESSAGE("fallback: " << f.name << ": " << f.reason);
  BOOST_TEST(g.fallback.empty());
  BOOST_TEST(g.fast.size() == model.named_parameters().size());
  for (const auto& [name, t] : g.grads) {
    const Tensor p = model.parameter(name);
    BOOST_TEST(t.dim() == p.dim() + 1);
    BOOST_TEST(t.size(0) == kB);
  }
  std::string where;
  const double w = compare(g, alone(model, x, y), &where);
  BOOST_TEST_MESSAGE("fast path, worst relative element " << w << " in " << where);
  BOOST_TEST(w < 1e-12);
}

BOOST_AUTO_TEST_CASE(fallback_equals_fast_path) {
  ag::Generator gen(12);
  Toy model(gen);
  const Tensor x = tokens(kB, kT, kVocab), y = tokens(kB, kT, kVocab, 1);
  const auto fast = nn::per_example_gradients(model, x, next_token_loss(model, y));
  const auto slow = nn::per_example_gradients(model, x, next_token_loss(model, y),
                                              {.method = nn::PerExampleMethod::Fallback});
  BOOST_TEST(slow.fast.empty());
  BOOST_TEST(slow.fallback.size() == fast.grads.size());
  double w = 0.0;
  for (std::size_t k = 0; k < fast.grads.size(); ++k) w = std::max(w, worst(fast.grads[k].second, slow.grads[k].second));
  BOOST_TEST_MESSAGE("fast against fallback, worst relative element " << w);
  BOOST_TEST(w < 1e-12);
}

BOOST_AUTO_TEST_CASE(per_example_gradients_sum_to_the_batch_gradient) {
  ag::Generator gen(13);
  Toy model(gen);
  const Tensor x = tokens(kB, kT, kVocab), y = tokens(kB, kT, kVocab, 2);
  const auto g = nn::per_example_gradients(model, x, next_token_loss(model, y));
  ag::TensorList params;
  for (auto& [name, p] : model.named_parameters()) params.push_back(p);
  const ag::TensorList batch = ag::grad({ag::sum(next_token_loss(model, y)(x))}, params);
  double w = 0.0;
  for (std::size_t k = 0; k < params.size(); ++k) w = std::max(w, worst(ag::sum(g.grads[k].second, 0), batch[k]));
  BOOST_TEST_MESSAGE("sum over the batch against the batch gradient, worst relative element " << w);
  BOOST_TEST(w < 1e-12);
}

BOOST_AUTO_TEST_CASE(the_comparison_detects_a_wrong_gradient) {
  ag::Generator gen(14);
  Toy model(gen);
  const Tensor x = tokens(kB, kT, kVocab), y = tokens(kB, kT, kVocab, 4);
  nn::PerExampleGrads g = nn::per_example_gradients(model, x, next_token_loss(model, y));
  std::vector<ag::TensorList> reference = alone(model, x, y);
  std::string where;
  BOOST_TEST(compare(g, reference, &where) < 1e-12);
  // Example 2's gradient of W_K off by 1e-9 in one element: the comparison must fail, naming it.
  const std::size_t k = static_cast<std::size_t>(std::find_if(g.grads.begin(), g.grads.end(), [](const auto& e) {
                                                   return e.first == "block.attn.W_K";
                                                 }) - g.grads.begin());
  BOOST_REQUIRE(k < g.grads.size());
  {
    ag::NoGradGuard no_grad;
    Tensor& t = g.grads[k].second;
    t.data<double>()[2 * t.numel() / kB + 3] += 1e-9;
  }
  const bool still_matches = compare(g, reference, &where) < 1e-12;
  BOOST_CHECK_EQUAL(still_matches, false);
  BOOST_TEST(where == "block.attn.W_K");
}

BOOST_AUTO_TEST_CASE(transformer_lm_equals_each_example_alone) {
  ag::Generator gen(15);
  nn::TransformerLM model({.n_layers = 2, .d_model = kE, .n_heads = 2, .d_mlp = 16, .d_vocab = kVocab,
                           .n_ctx = kT, .dtype = Dtype::Float64},
                          gen);
  const Tensor x = tokens(kB, kT, kVocab), y = tokens(kB, kT, kVocab, 5);
  const auto g = nn::per_example_gradients(model, x, next_token_loss(model, y));
  for (const auto& f : g.fallback) BOOST_TEST_MESSAGE("fallback: " << f.name << ": " << f.reason);
  // Every parameter on the fast path (the positions are looked up per example while recording).
  BOOST_TEST(g.fallback.empty());
  BOOST_TEST(!g.took_fallback("blocks.1.attn.W_Q"));
  std::string where;
  const double w = compare(g, alone(model, x, y), &where);
  BOOST_TEST_MESSAGE("TransformerLM, worst relative element " << w << " in " << where);
  BOOST_TEST(w < 1e-12);
}

BOOST_AUTO_TEST_CASE(tied_embeddings_take_the_fallback_and_stay_right) {
  ag::Generator gen(16);
  nn::TransformerLM model({.n_layers = 1, .d_model = kE, .n_heads = 2, .d_vocab = kVocab, .n_ctx = kT,
                           .tied_embeddings = true, .dtype = Dtype::Float64},
                          gen);
  const Tensor x = tokens(kB, kT, kVocab), y = tokens(kB, kT, kVocab, 6);
  const auto g = nn::per_example_gradients(model, x, next_token_loss(model, y));
  BOOST_TEST(g.took_fallback("embed.weight"));
  std::string where;
  BOOST_TEST(compare(g, alone(model, x, y), &where) < 1e-12);
}

// x -> l1 -> l2, each example's loss its sum of squares plus a weight penalty on l1's weight (a
// use of the weight outside its layer, in every example's loss); l3 is never used.
class Penalised : public nn::Module {
 public:
  explicit Penalised(ag::Generator& gen) : nn::Module("Penalised") {
    l1_ = register_module("l1", std::make_shared<nn::Linear>(nn::LinearOptions{3, 4, true, Dtype::Float64}, gen));
    l2_ = register_module("l2", std::make_shared<nn::Linear>(nn::LinearOptions{4, 2, true, Dtype::Float64}, gen));
    l3_ = register_module("l3", std::make_shared<nn::Linear>(nn::LinearOptions{2, 2, true, Dtype::Float64}, gen));
  }
  Tensor losses(const Tensor& x) const {
    const Tensor fit = ag::sum(ag::square(l2_->forward(ag::tanh(l1_->forward(x)))), 1);  // (B)
    return ag::add(fit, ag::mul(ag::sum(ag::square(l1_->weight())), 0.5));                // (B)
  }

 private:
  std::shared_ptr<nn::Linear> l1_, l2_, l3_;
};

BOOST_AUTO_TEST_CASE(a_weight_used_outside_its_layer_takes_the_fallback_and_an_unused_one_is_zero) {
  ag::Generator gen(18);
  Penalised model(gen);
  const Tensor x = wave(1.3, 0.5);
  const auto g = nn::per_example_gradients(model, x, [&](const Tensor& b) { return model.losses(b); });
  for (const auto& f : g.fallback) BOOST_TEST_MESSAGE("fallback: " << f.name << ": " << f.reason);
  BOOST_TEST(g.took_fallback("l1.weight"));
  BOOST_TEST_REQUIRE(g.fallback.size() == 1u);
  BOOST_TEST(g.fallback[0].reason.find("also used outside") != std::string::npos);
  BOOST_TEST(!g.took_fallback("l3.weight"));
  BOOST_TEST(worst(g["l3.weight"], ag::zeros({5, 2, 2}, Dtype::Float64)) == 0.0);
  // Against each example alone.
  ag::TensorList params;
  for (auto& [name, p] : model.named_parameters()) params.push_back(p);
  double w = 0.0;
  for (std::int64_t b = 0; b < 5; ++b) {
    const ag::TensorList want = ag::grad({ag::sum(model.losses(ag::narrow(x, 0, b, 1)))}, params, {.allow_unused = true});
    for (std::size_t k = 0; k < params.size(); ++k) {
      const Tensor got = ag::squeeze(ag::narrow(g.grads[k].second, 0, b, 1), 0);
      w = std::max(w, worst(got, want[k].defined() ? want[k] : ag::zeros_like(got)));
    }
  }
  BOOST_TEST(w < 1e-12);
  // Without the checks the penalty's share is missed: the fast path alone is wrong here.
  const auto unchecked = nn::per_example_gradients(model, x, [&](const Tensor& b) { return model.losses(b); },
                                                   {.verify = false});
  BOOST_TEST(!unchecked.took_fallback("l1.weight"));
  const ag::TensorList want0 = ag::grad({ag::sum(model.losses(ag::narrow(x, 0, 0, 1)))}, params, {.allow_unused = true});
  BOOST_TEST(worst(ag::squeeze(ag::narrow(unchecked["l1.weight"], 0, 0, 1), 0), want0[0]) > 1e-3);
}

// A Linear(3, 3) whose weight has a gradient hook, or that also runs on its own weight (the
// weight's rows as three more inputs, one per example of a batch of three).
BOOST_AUTO_TEST_CASE(a_hooked_weight_and_a_layer_run_on_its_own_weight_take_the_fallback) {
  ag::Generator gen(19);
  for (const bool on_itself : {false, true}) {
    BOOST_TEST_CONTEXT((on_itself ? "run on its own weight" : "hooked weight")) {
      nn::Linear lin(nn::LinearOptions{3, 3, true, Dtype::Float64}, gen);
      if (!on_itself) lin.weight().register_hook([](const Tensor& g) { return ag::mul(g, 2.0); });
      const auto losses = [&](const Tensor& b) {
        Tensor y = lin.forward(b);                                       // (3, 3)
        if (on_itself) y = ag::add(y, lin.forward(lin.weight()));        // row b: example b's
        return ag::sum(ag::square(ag::tanh(y)), 1);                      // (3)
      };
      const Tensor x = ag::narrow(wave(0.9, 0.2), 0, 0, 3);
      const auto g = nn::per_example_gradients(lin, x, losses);
      for (const auto& f : g.fallback) BOOST_TEST_MESSAGE("fallback: " << f.name << ": " << f.reason);
      BOOST_TEST(g.took_fallback("weight"));
      BOOST_TEST(!g.took_fallback("bias"));
      const auto ref = nn::per_example_gradients(lin, x, losses, {.method = nn::PerExampleMethod::Fallback});
      for (std::size_t k = 0; k < g.grads.size(); ++k) BOOST_TEST(worst(g.grads[k].second, ref.grads[k].second) < 1e-12);
    }
  }
}

// x -> l1 -> minus the batch mean (examples interact) -> l2 -> per-example sum of squares.
class Mixing : public nn::Module {
 public:
  explicit Mixing(ag::Generator& gen) : nn::Module("Mixing") {
    l1_ = register_module("l1", std::make_shared<nn::Linear>(nn::LinearOptions{3, 4, true, Dtype::Float64}, gen));
    l2_ = register_module("l2", std::make_shared<nn::Linear>(nn::LinearOptions{4, 2, true, Dtype::Float64}, gen));
  }
  Tensor forward(const Tensor& x) const {
    const Tensor h = l1_->forward(x);                                  // (B, 4)
    const Tensor centred = ag::sub(h, ag::mean(h, 0, true));           // (B, 4): every example's row moves
    return ag::sum(ag::square(l2_->forward(ag::tanh(centred))), 1);     // (B)
  }

 private:
  std::shared_ptr<nn::Linear> l1_, l2_;
};

BOOST_AUTO_TEST_CASE(examples_that_interact_take_the_fallback_where_needed) {
  ag::Generator gen(17);
  Mixing model(gen);
  const Tensor x = wave(1.7, 0.0);
  const auto loss = [&](const Tensor& batch) { return model.forward(batch); };
  const auto g = nn::per_example_gradients(model, x, loss);
  for (const auto& f : g.fallback) BOOST_TEST_MESSAGE("fallback: " << f.name << ": " << f.reason);
  BOOST_TEST(g.took_fallback("l1.weight"));
  BOOST_TEST(g.took_fallback("l1.bias"));
  BOOST_TEST(!g.took_fallback("l2.weight"));  // after the mixing, each row's gradient is its example's
  const auto slow = nn::per_example_gradients(model, x, loss, {.method = nn::PerExampleMethod::Fallback});
  double w = 0.0;
  for (std::size_t k = 0; k < g.grads.size(); ++k) w = std::max(w, worst(g.grads[k].second, slow.grads[k].second));
  BOOST_TEST(w < 1e-12);
  // Without the checks the fast path is wrong here: that is what the checks are for.
  const auto unchecked = nn::per_example_gradients(model, x, loss, {.verify = false});
  BOOST_TEST(worst(unchecked["l1.weight"], slow["l1.weight"]) > 1e-6);
}

BOOST_AUTO_TEST_CASE(bad_requests_are_refused_naming_the_function_and_the_shapes) {
  ag::Generator gen(18);
  Mixing model(gen);
  const Tensor x = ag::zeros({4, 3}, Dtype::Float64);
  BOOST_CHECK_EXCEPTION(
      nn::per_example_gradients(model, x, [&](const Tensor& b) { return ag::unsqueeze(model.forward(b), 1); }),
      std::invalid_argument, message_has({"per_example_gradients", "[4, 1]", "[4]"}));
  BOOST_CHECK_EXCEPTION(
      nn::per_example_gradients(model, x, [&](const Tensor& b) { return ag::narrow(model.forward(b), 0, 0, 3); }),
      std::invalid_argument, message_has({"per_example_gradients", "[3]", "[4]", "[4, 3]"}));
  BOOST_CHECK_EXCEPTION(
      nn::per_example_gradients(model, x, [&](const Tensor& b) { return model.forward(b).to(Dtype::Int64); }),
      std::invalid_argument, message_has({"per_example_gradients", "Int64", "[4]"}));
  BOOST_CHECK_EXCEPTION(nn::per_example_gradients(model, ag::scalar_tensor(1.0, Dtype::Float64),
                                                  [&](const Tensor& b) { return model.forward(b); }),
                        std::invalid_argument, message_has({"per_example_gradients", "[]"}));
  BOOST_CHECK_EXCEPTION(
      nn::per_example_gradients(model, x, [&](const Tensor&) { return ag::zeros({4}, Dtype::Float64); }),
      std::invalid_argument, message_has({"per_example_gradients", "[4]", "do not depend"}));
  nn::Sequential empty;
  BOOST_CHECK_EXCEPTION(nn::per_example_gradients(empty, x, [&](const Tensor& b) { return ag::sum(b, 1); }),
                        std::invalid_argument, message_has({"per_example_gradients", "no parameter"}));
  nn::PerExampleGrads g = nn::per_example_gradients(model, x, [&](const Tensor& b) { return model.forward(b); });
  BOOST_CHECK_EXCEPTION(g["l3.weight"], std::invalid_argument, message_has({"'l3.weight'", "'l1.weight'"}));
}
