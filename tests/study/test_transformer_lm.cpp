// nn::TransformerLM and the blocks it is made of: the forward against the same model written by
// hand from its modules, the attention-only and normalisation-free forms, the q/k/v input,
// result and LayerNorm hook points, partial runs, TransformerLens's state-dict layout and the
// errors of each. (tests/study/test_transformer_lens_parity.cpp compares the same model with
// TransformerLens itself.)
#define BOOST_TEST_MODULE transformer_lm
#include <boost/test/unit_test.hpp>

#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include <nn/nn.hpp>

#include "checkpoint_support.hpp"
#include "test_support.hpp"

namespace ag = autograd;
using namespace test_support;
using checkpoint_support::TempDir;

namespace {

nn::TransformerLMConfig small_config(std::int64_t d_mlp = 0) {
  nn::TransformerLMConfig c;
  c.n_layers = 2;
  c.d_model = 8;
  c.n_heads = 2;
  c.d_mlp = d_mlp;
  c.d_vocab = 7;
  c.n_ctx = 6;
  c.dtype = ag::Dtype::Float64;
  return c;
}

// Every parameter moved off its initial value (biases 0 and gains 1 would hide layout mistakes).
void randomise(nn::Module& m, std::uint64_t seed) {
  ag::Generator gen(seed);
  ag::NoGradGuard g;
  for (auto& [name, p] : m.named_parameters()) {
    ag::Tensor t = p;
    t.copy_(ag::add(ag::mul(ag::randn(p.shape(), p.dtype(), gen), 0.5), name.find("ln") != std::string::npos ? 1.0 : 0.0));
  }
}

const ag::Tensor kTokens = ag::tensor(std::vector<std::int64_t>{1, 2, 3, 1, 2, 4, 0, 6, 5, 0, 6, 5}, {2, 6});

bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// The model's forward written out from its modules: embed + positions, x += attn(ln_1(x)) per
// block (and the MLP), then ln_final and the unembedding.
ag::Tensor by_hand(const nn::TransformerLM& m, const ag::Tensor& tokens) {
  const std::int64_t T = tokens.size(1);
  ag::Tensor x = m.embed().forward(tokens);
  if (m.config().positional_embedding == nn::PositionalEmbedding::Learned)
    x = ag::add(x, m.pos_embed().forward(ag::arange(std::int64_t{0}, T, std::int64_t{1}, ag::Dtype::Int64)));
  const bool norm = m.config().normalization == nn::Normalization::LayerNorm;
  nn::AttentionOptions o;
  o.is_causal = true;
  for (std::int64_t i = 0; i < m.config().n_layers; ++i) {
    auto& b = m.block(i);
    const ag::Tensor h = norm ? b.ln_1().forward(x) : x;
    x = ag::add(x, b.attn().forward(h, h, h, o).output);
    if (b.has_mlp()) {
      const ag::Tensor f = b.fc_1().forward(norm ? b.ln_2().forward(x) : x);
      const auto approximate = m.config().activation == nn::Activation::GeluTanh ? ag::GeluApproximation::Tanh
                                                                                  : ag::GeluApproximation::None;
      x = ag::add(x, b.fc_2().forward(m.config().activation == nn::Activation::Relu ? ag::relu(f)
                                                                                 : ag::gelu(f, approximate)));
    }
  }
  if (norm) x = m.ln_final().forward(x);
  return ag::add(ag::matmul(x, m.W_U()), m.b_U().defined() ? m.b_U() : ag::zeros({m.config().d_vocab}, x.dtype()));
}

}  // namespace

BOOST_AUTO_TEST_CASE(an_attention_only_model_has_no_mlp_parameters_nor_points) {
  nn::TransformerLM m(small_config());
  std::vector<std::string> names;
  for (const auto& [n, p] : m.named_parameters()) names.push_back(n);
  BOOST_TEST(has(names, "blocks.1.attn.W_Q"));
  BOOST_TEST(has(names, "blocks.0.ln_1.weight"));
  BOOST_TEST(has(names, "unembed.bias"));
  for (const auto& n : names) BOOST_TEST((n.find("fc_") == std::string::npos && n.find("ln_2") == std::string::npos), n);
  const auto points = m.hook_point_names();
  for (const char* p : {"embed_out", "pos_embed_out", "blocks.0.resid_pre", "blocks.0.q_input", "blocks.0.k_input",
                        "blocks.0.v_input", "blocks.0.attn_out", "blocks.1.attn.result", "blocks.1.attn.pattern",
                        "blocks.1.resid_post", "ln_final.scale", "ln_final.normalized", "logits"})
    BOOST_TEST(has(points, p), p);
  BOOST_TEST(!has(points, "blocks.0.resid_mid"));
  BOOST_TEST(!has(points, "blocks.0.mlp_pre"));
  BOOST_CHECK_THROW(m.block(0).fc_1(), std::invalid_argument);
  check_message([&] { m.block(0).ln_2(); }, "attention-only");
}

BOOST_AUTO_TEST_CASE(forward_is_the_model_written_by_hand_in_each_form) {
  for (const auto& [d_mlp, act, norm, pos, tied] :
       std::vector<std::tuple<int, nn::Activation, nn::Normalization, nn::PositionalEmbedding, bool>>{
           {0, nn::Activation::Gelu, nn::Normalization::LayerNorm, nn::PositionalEmbedding::Learned, false},
           {12, nn::Activation::Gelu, nn::Normalization::LayerNorm, nn::PositionalEmbedding::Learned, false},
           {12, nn::Activation::GeluTanh, nn::Normalization::None, nn::PositionalEmbedding::None, true},
           {12, nn::Activation::Relu, nn::Normalization::LayerNorm, nn::PositionalEmbedding::Learned, true}}) {
    nn::TransformerLMConfig c = small_config(d_mlp);
    c.activation = act;
    c.normalization = norm;
    c.positional_embedding = pos;
    c.tied_embeddings = tied;
    nn::TransformerLM m(c);
    randomise(m, 7);
    const ag::Tensor logits = m.forward(kTokens);
    BOOST_TEST(ag::shape_str(logits.shape()) == "[2, 6, 7]");
    BOOST_TEST(max_abs_diff(logits, by_hand(m, kTokens)) <= 1e-12, m.extra_repr());
    // One sequence unbatched gives its row of the batch.
    BOOST_TEST(max_abs_diff(m.forward(ag::reshape(ag::narrow(kTokens, 0, 1, 1), {6})), ag::reshape(ag::narrow(logits, 0, 1, 1), {6, 7})) <= 1e-12);
  }
}

BOOST_AUTO_TEST_CASE(loss_is_the_mean_next_token_cross_entropy) {
  nn::TransformerLM m(small_config(12));
  randomise(m, 3);
  const ag::Tensor logits = m.forward(kTokens);
  const ag::Tensor lp = ag::log_softmax(logits, -1);
  const auto v = lp.to_vector();
  const auto t = kTokens.to_vector();
  double sum = 0;
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 5; ++i) sum -= v[(b * 6 + i) * 7 + static_cast<int>(t[b * 6 + i + 1])];
  BOOST_TEST(std::abs(m.loss(kTokens).item() - sum / 10) <= 1e-13);
  check_message([&] { m.loss(ag::narrow(kTokens, 1, 0, 1)); }, "T >= 2");
}

BOOST_AUTO_TEST_CASE(a_hook_on_one_input_changes_that_input_alone) {
  nn::TransformerLM m(small_config());
  randomise(m, 11);
  const ag::Tensor delta = input({2, 6, 8}, 5);
  const ag::Tensor x = m.residual_at(kTokens, 1);
  nn::AttentionOptions o;
  o.is_causal = true;
  auto& b = m.block(1);
  const auto ln = [&](const ag::Tensor& v) { return b.ln_1().forward(v); };
  const std::vector<std::string> inputs = {"q_input", "k_input", "v_input"};
  for (std::size_t which = 0; which < 3; ++which) {
    nn::HookHandle h = m.add_hook("blocks.1." + inputs[which],
                                  [&](const ag::Tensor& v, const std::string&) { return ag::add(v, delta); });
    const ag::Tensor got = m.forward(kTokens);
    h.remove();
    const ag::Tensor xd = ag::add(x, delta);
    const ag::Tensor a = b.attn().forward(ln(which == 0 ? xd : x), ln(which == 1 ? xd : x), ln(which == 2 ? xd : x), o).output;
    const ag::Tensor want = m.forward_from(2, ag::add(x, a));
    BOOST_TEST(max_abs_diff(got, want) <= 1e-12, inputs[which]);
    BOOST_TEST(max_abs_diff(got, m.forward(kTokens)) > 1e-3, inputs[which] << " changed nothing");
  }
}

BOOST_AUTO_TEST_CASE(the_result_point_holds_each_heads_share_of_the_output) {
  nn::TransformerLM m(small_config());
  randomise(m, 13);
  const ag::Tensor plain = m.forward(kTokens);
  const nn::ActivationCache cache = nn::run_with_cache(
      m, [&] { return m.forward(kTokens); }, {.names = {"blocks.0.attn.z", "blocks.0.attn.result", "blocks.0.attn_out"}});
  const ag::Tensor r = cache["blocks.0.attn.result"];
  BOOST_TEST(ag::shape_str(r.shape()) == "[2, 2, 6, 8]");
  BOOST_TEST(max_abs_diff(r, nn::study::head_results(m.attn(0), cache["blocks.0.attn.z"])) <= 1e-13);
  BOOST_TEST(max_abs_diff(ag::add(ag::sum(r, 1), m.attn(0).b_O()), cache["blocks.0.attn_out"]) <= 1e-12);
  BOOST_TEST(max_abs_diff(cache.output, plain) <= 1e-12);  // equal to rounding with the point hooked
  // Removing head 1's result is zero-ablating its z.
  nn::HookHandle h = m.add_hook("blocks.0.attn.result", [](const ag::Tensor& v, const std::string&) {
    return ag::cat({ag::narrow(v, 1, 0, 1), ag::zeros_like(ag::narrow(v, 1, 1, 1))}, 1);
  });
  const ag::Tensor by_result = m.forward(kTokens);
  h.remove();
  h = m.add_hook("blocks.0.attn.z", nn::study::zero_ablate_head(1));
  const ag::Tensor by_z = m.forward(kTokens);
  h.remove();
  BOOST_TEST(max_abs_diff(by_result, by_z) <= 1e-12);
  BOOST_TEST(max_abs_diff(by_result, plain) > 1e-3);
}

BOOST_AUTO_TEST_CASE(a_hooked_layer_norm_is_the_fused_one_and_its_scale_divides_the_output) {
  nn::LayerNorm ln(nn::LayerNormOptions{.normalized_shape = {5}, .dtype = ag::Dtype::Float64});
  randomise(ln, 2);
  const ag::Tensor x = input({3, 5}, 9);
  const ag::Tensor fused = ln.forward(x);
  const nn::ActivationCache c = nn::run_with_cache(ln, [&] { return ln.forward(x); });
  BOOST_TEST(max_abs_diff(c.output, fused) <= 1e-13);
  BOOST_TEST(ag::shape_str(c["scale"].shape()) == "[3, 1]");
  const ag::Tensor var = ag::mean(ag::square(ag::sub(x, ag::mean(x, -1, true))), -1, true);
  BOOST_TEST(max_abs_diff(c["scale"], ag::sqrt(ag::add(var, 1e-5))) <= 1e-14);
  // Doubling the scale halves the normalised part.
  nn::HookHandle h = ln.add_hook("scale", [](const ag::Tensor& v, const std::string&) { return ag::mul(v, 2.0); });
  const ag::Tensor halved = ln.forward(x);
  h.remove();
  const ag::Tensor want = ag::add(ag::mul(ag::sub(fused, ln.bias()), 0.5), ln.bias());
  BOOST_TEST(max_abs_diff(halved, want) <= 1e-13);
}

BOOST_AUTO_TEST_CASE(partial_runs_compose_to_the_forward_and_their_gradients_check) {
  nn::TransformerLM m(small_config(12));
  randomise(m, 17);
  const ag::Tensor full = m.forward(kTokens);
  for (std::int64_t l = 0; l <= 2; ++l)
    BOOST_TEST(max_abs_diff(m.forward_from(l, m.residual_at(kTokens, l)), full) <= 1e-12, "layer " << l);
  ag::Tensor r0 = m.residual_at(kTokens, 0).detach();
  r0.requires_grad_(true);
  check_gradients("forward_from(0, residual)", [&](const ag::TensorList& in) { return ag::sum(ag::square(m.forward_from(0, in[0]))); },
                  {r0});
  check_message([&] { m.forward_from(3, r0); }, "out of range");
  check_message([&] { m.residual_at(kTokens, -1); }, "out of range");
}

BOOST_AUTO_TEST_CASE(bad_configs_and_tokens_are_refused_naming_the_setting) {
  nn::TransformerLMConfig c = small_config();
  c.n_heads = 3;
  check_message([&] { nn::TransformerLM m(c); }, "d_model 8 is not divisible by n_heads 3");
  c = small_config();
  c.d_head = 2;
  check_message([&] { nn::TransformerLM m(c); }, "d_head 2");
  c = small_config();
  c.n_heads = 4, c.d_head = (std::int64_t{1} << 62) + 2;  // d_head · n_heads wraps around to 8
  check_message([&] { nn::TransformerLM m(c); }, "d_head 4611686018427387906 times n_heads 4 is not d_model 8");
  c = small_config();
  c.d_vocab = 0;
  check_message([&] { nn::TransformerLM m(c); }, "d_vocab must be positive");
  c = small_config();
  c.dtype = ag::Dtype::Int64;
  check_message([&] { nn::TransformerLM m(c); }, "dtype");
  c = small_config();
  c.d_vocab_out = -2;
  check_message([&] { nn::TransformerLM m(c); }, "TransformerLM: d_vocab_out must be positive, or 0 for d_vocab, got -2");
  c = small_config();
  c.d_vocab_out = 5, c.tied_embeddings = true;
  check_message([&] { nn::TransformerLM m(c); },
                "TransformerLM: tied embeddings need d_vocab_out = d_vocab, got d_vocab_out 5 and d_vocab 7");
  c = small_config();
  c.activation = static_cast<nn::Activation>(77);
  check_message([&] { nn::TransformerLM m(c); }, "TransformerLM: unknown activation 77");
  c = small_config();
  c.normalization = static_cast<nn::Normalization>(5);
  check_message([&] { nn::TransformerLM m(c); }, "TransformerLM: unknown normalization 5");
  c = small_config();
  c.positional_embedding = static_cast<nn::PositionalEmbedding>(-1);
  check_message([&] { nn::TransformerLM m(c); }, "TransformerLM: unknown positional_embedding -1");
  // Sizes no machine holds are refused before any allocation (not std::bad_alloc, not a hang).
  for (auto [layers, width, mlp] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{std::int64_t{1} << 40, 8, 0},
                                    {2, std::int64_t{1} << 40, 0}, {2, 8, std::int64_t{1} << 40},
                                    {2, std::int64_t{1} << 31, 0}, {2, std::int64_t{1} << 61, 0},
                                    {2, 8, std::numeric_limits<std::int64_t>::max()}}) {
    c = small_config();
    c.n_layers = layers, c.d_model = width, c.n_heads = 1, c.d_mlp = mlp;
    check_message([&] { nn::TransformerLM m(c); }, "need more than 2^40 parameters");
  }
  nn::TransformerLM m(small_config());
  check_message([&] { m.forward(ag::zeros({1, 7}, ag::Dtype::Int64)); }, "n_ctx = 6");
  check_message([&] { m.loss(ag::zeros({0, 4}, ag::Dtype::Int64)); },
                "TransformerLM::loss: tokens of shape [0, 4]: an empty batch has no loss");
  check_message([&] { m.forward(ag::zeros({1, 2, 3}, ag::Dtype::Int64)); }, "(B, T) or (T)");
  BOOST_CHECK_THROW(m.forward(ag::full({1, 3}, 7.0, ag::Dtype::Int64)), std::invalid_argument);
  BOOST_CHECK_THROW(m.block(2), std::invalid_argument);
  check_message([&] { m.forward_from(1, ag::zeros({1, 3, 8}, ag::Dtype::Float32)); },
                "TransformerLM::forward_from: residual is Float32 but the model's parameters are Float64");
}

BOOST_AUTO_TEST_CASE(the_transformer_lens_layout_round_trips_and_refusals_change_nothing) {
  for (bool tied : {false, true}) {
    nn::TransformerLMConfig c = small_config(12);
    c.tied_embeddings = tied;
    nn::TransformerLM a(c), b(c);
    randomise(a, 21);
    const nn::NamedTensors sd = nn::transformer_lens_state_dict(a);
    for (const auto& [name, t] : sd)
      if (name == "blocks.0.attn.W_Q") BOOST_TEST(ag::shape_str(t.shape()) == "[2, 8, 4]");
      else if (name == "blocks.0.attn.W_O") BOOST_TEST(ag::shape_str(t.shape()) == "[2, 4, 8]");
      else if (name == "blocks.0.attn.b_K") BOOST_TEST(ag::shape_str(t.shape()) == "[2, 4]");
    nn::load_transformer_lens_state_dict(b, sd);
    BOOST_TEST(max_abs_diff(a.forward(kTokens), b.forward(kTokens)) == 0.0);
    // Head 1's query weights are columns 4..7 of W_Q: TL's W_Q[1].
    for (const auto& [name, t] : sd)
      if (name == "blocks.1.attn.W_Q")
        BOOST_TEST(max_abs_diff(ag::reshape(ag::narrow(t, 0, 1, 1), {8, 4}), ag::narrow(a.attn(1).W_Q(), 1, 4, 4)) == 0.0);
  }
  nn::TransformerLM a(small_config(12)), b(small_config(12));
  randomise(a, 1);
  randomise(b, 2);
  const ag::Tensor before = b.forward(kTokens);
  const auto refused = [&](nn::NamedTensors sd, const std::string& fragment) {
    check_message([&] { nn::load_transformer_lens_state_dict(b, sd); }, fragment);
    BOOST_TEST(max_abs_diff(b.forward(kTokens), before) == 0.0, fragment);
  };
  nn::NamedTensors sd = nn::transformer_lens_state_dict(a);
  auto wrong = sd;
  for (auto& [n, t] : wrong)
    if (n == "blocks.1.mlp.W_out") t = ag::zeros({12, 9}, ag::Dtype::Float64);
  refused(wrong, "'blocks.1.mlp.W_out' has shape [12, 9], the model needs [12, 8]");
  auto missing = sd;
  missing.pop_back();
  refused(missing, "is missing");
  auto extra = sd;
  extra.emplace_back("blocks.0.attn.W_X", ag::zeros({1}, ag::Dtype::Float64));
  refused(extra, "'blocks.0.attn.W_X' is not a parameter");
  extra = sd;
  extra.emplace_back("blocks.7.attn.mask", ag::zeros({1}, ag::Dtype::Float64));  // a buffer of no layer here
  refused(extra, "'blocks.7.attn.mask' is not a parameter of this model (2 layers");
  extra = sd;
  extra.emplace_back("blocks.0.attn.IGNORE", ag::zeros({1}, ag::Dtype::Float64));  // TL's buffers are skipped
  nn::load_transformer_lens_state_dict(b, extra);
  BOOST_TEST(max_abs_diff(b.forward(kTokens), a.forward(kTokens)) == 0.0);
}

// d_vocab_out below d_vocab (TransformerLens's d_vocab_out: the grokking model reads tokens 0 .. p
// and predicts 0 .. p-1): the logits have d_vocab_out columns, the unembedding is that wide, the
// loss refuses a target past it, and the TL layout and config carry it.
BOOST_AUTO_TEST_CASE(an_output_vocabulary_narrower_than_the_input_one) {
  nn::TransformerLMConfig c = small_config(12);
  c.d_vocab_out = 5;
  nn::TransformerLM a(c), b(c);
  randomise(a, 31);
  BOOST_TEST(a.config().d_vocab_out == 5);
  BOOST_TEST(ag::shape_str(a.forward(kTokens).shape()) == ag::shape_str({kTokens.size(0), kTokens.size(1), 5}));
  BOOST_TEST(ag::shape_str(a.W_U().shape()) == "[8, 5]");
  BOOST_TEST(contains(a.extra_repr(), "d_vocab_out=5"));
  // Inputs may use every token of d_vocab; targets only those below d_vocab_out.
  const ag::Tensor tokens = ag::tensor(std::vector<std::int64_t>{6, 1, 4, 0}, {1, 4});
  BOOST_TEST(a.forward(tokens).size(2) == 5);
  BOOST_CHECK_THROW(a.loss(ag::tensor(std::vector<std::int64_t>{0, 6, 1}, {1, 3})), std::invalid_argument);
  BOOST_TEST(std::isfinite(a.loss(ag::tensor(std::vector<std::int64_t>{6, 4, 1}, {1, 3})).item()));
  nn::load_transformer_lens_state_dict(b, nn::transformer_lens_state_dict(a));
  BOOST_TEST(max_abs_diff(a.forward(kTokens), b.forward(kTokens)) == 0.0);
  const std::string j = nn::transformer_lens_config_json(c);
  BOOST_TEST(contains(j, "\"d_vocab\":7,\"d_vocab_out\":5"), j);
  BOOST_TEST(!contains(nn::transformer_lens_config_json(small_config()), "d_vocab_out"));
  check_message([&] { nn::circuits::logit_directions(a, {5}); }, "logit_directions: token 5 is out of range for d_vocab_out 5");
}

// forward_last is forward's last row in every form of the model, and so are its gradients; a
// hooked model takes the full forward (its hooks see the whole sequence), and a hooked block
// refuses the partial one.
BOOST_AUTO_TEST_CASE(forward_last_is_the_last_row_of_forward_with_the_same_gradients) {
  for (int form = 0; form < 6; ++form) {
    nn::TransformerLMConfig c = small_config(form == 0 ? 0 : 12);
    if (form == 2) c.activation = nn::Activation::Relu, c.normalization = nn::Normalization::None, c.d_vocab_out = 4;
    if (form == 3) c.activation = nn::Activation::GeluTanh, c.tied_embeddings = true;
    if (form == 4) c.positional_embedding = nn::PositionalEmbedding::None;
    if (form == 5) c.n_layers = 1;
    nn::TransformerLM m(c);
    randomise(m, 60 + static_cast<std::uint64_t>(form));
    const std::int64_t T = kTokens.size(1), V = m.config().d_vocab_out;
    const ag::Tensor full = m.forward(kTokens);
    const ag::Tensor last = m.forward_last(kTokens);
    BOOST_TEST(ag::shape_str(last.shape()) == ag::shape_str({kTokens.size(0), V}), "form " << form);
    const ag::Tensor want = ag::reshape(ag::narrow(full, 1, T - 1, 1), {kTokens.size(0), V});
    BOOST_TEST(max_abs_diff(last, want) < 1e-12, "form " << form);
    // The negative control: the row before differs.
    BOOST_TEST(max_abs_diff(last, ag::reshape(ag::narrow(full, 1, T - 2, 1), {kTokens.size(0), V})) > 1e-3);
    // Unbatched tokens give an unbatched row.
    const ag::Tensor one = ag::narrow(kTokens, 0, 1, 1);
    BOOST_TEST(max_abs_diff(m.forward_last(ag::reshape(one, {T})), ag::reshape(ag::narrow(want, 0, 1, 1), {V})) < 1e-12);
    // The same gradient for every parameter, of a weighted sum of the last logits.
    const ag::Tensor w = ag::randn({kTokens.size(0), V}, ag::Dtype::Float64);
    std::vector<ag::Tensor> params;
    for (const auto& [n, p] : m.named_parameters()) params.push_back(p);
    const auto a = ag::grad({ag::sum(ag::mul(m.forward_last(kTokens), w))}, params);
    const auto b = ag::grad({ag::sum(ag::mul(ag::reshape(ag::narrow(m.forward(kTokens), 1, T - 1, 1),
                                                         {kTokens.size(0), V}), w))}, params);
    for (std::size_t i = 0; i < params.size(); ++i) BOOST_TEST(max_abs_diff(a[i], b[i]) < 1e-12, "form " << form);
  }
  nn::TransformerLM m(small_config(12));
  randomise(m, 70);
  const ag::Tensor want = m.forward_last(kTokens);
  std::int64_t calls = 0;
  const nn::HookHandle h = m.add_hook("blocks.1.attn_out", [&](const ag::Tensor& v, const std::string&) {
    BOOST_TEST(v.size(1) == kTokens.size(1));  // the whole sequence
    ++calls;
    return v;
  });
  BOOST_TEST(max_abs_diff(m.forward_last(kTokens), want) < 1e-12);
  BOOST_TEST(calls == 1);
  check_message([&] { m.block(1).forward_last(ag::zeros({1, 3, 8}, ag::Dtype::Float64)); },
                "TransformerBlock::forward_last: the block has 1 hook(s)");
  m.remove_hooks();
  check_message([&] { m.block(1).forward_last(ag::zeros({8}, ag::Dtype::Float64)); },
                "TransformerBlock::forward_last: x must be (B, T, d_model = 8) or (T, d_model) with T >= 1, got [8]");
}

BOOST_AUTO_TEST_CASE(the_transformer_lens_config_names_every_setting) {
  nn::TransformerLMConfig c = small_config();
  const std::string j = nn::transformer_lens_config_json(c);
  for (const char* part : {"\"n_layers\":2", "\"d_model\":8", "\"n_heads\":2", "\"d_head\":4", "\"attn_only\":true",
                           "\"d_vocab\":7", "\"n_ctx\":6", "\"normalization_type\":\"LN\"", "\"act_fn\":\"gelu\""})
    BOOST_TEST(contains(j, part), part << " in " << j);
  c.d_mlp = 16;
  c.activation = nn::Activation::Relu;
  c.normalization = nn::Normalization::None;
  const std::string k = nn::transformer_lens_config_json(c);
  BOOST_TEST(contains(k, "\"d_mlp\":16"));
  BOOST_TEST(contains(k, "\"act_fn\":\"relu\""));
  BOOST_TEST(contains(k, "\"normalization_type\":null"));
}

// config_from_transformer_lens_json reads back every form transformer_lens_config_json writes, and
// refuses, naming the key, what TransformerLM cannot represent.
BOOST_AUTO_TEST_CASE(the_transformer_lens_config_reads_back) {
  const auto same = [](const nn::TransformerLMConfig& a, const nn::TransformerLMConfig& b) {
    return a.n_layers == b.n_layers && a.d_model == b.d_model && a.n_heads == b.n_heads && a.d_mlp == b.d_mlp &&
           a.d_vocab == b.d_vocab && a.n_ctx == b.n_ctx && a.activation == b.activation &&
           a.normalization == b.normalization && a.layer_norm_eps == b.layer_norm_eps &&
           (a.d_vocab_out == 0 ? a.d_vocab : a.d_vocab_out) == (b.d_vocab_out == 0 ? b.d_vocab : b.d_vocab_out);
  };
  for (int form = 0; form < 4; ++form) {
    nn::TransformerLMConfig c = small_config(form == 0 ? 0 : 12);
    if (form == 2) c.activation = nn::Activation::Relu, c.normalization = nn::Normalization::None, c.d_vocab_out = 4;
    if (form == 3) c.activation = nn::Activation::GeluTanh, c.n_layers = 1, c.layer_norm_eps = 1e-6;
    const nn::TransformerLMConfig back = nn::config_from_transformer_lens_json(nn::transformer_lens_config_json(c));
    BOOST_TEST(same(back, c), "form " << form << ": " << nn::transformer_lens_config_json(c));
    // The negative control: another configuration is not the same.
    nn::TransformerLMConfig other = c;
    other.n_ctx += 1;
    BOOST_TEST(!same(back, other));
  }
  // A TransformerLens config's keys with values of its own: d_vocab_out -1 is d_vocab; extra keys are ignored.
  const nn::TransformerLMConfig tl = nn::config_from_transformer_lens_json(
      R"({"n_layers": 1, "d_model": 8, "n_heads": 2, "d_head": 4, "d_vocab": 5, "d_vocab_out": -1, "n_ctx": 3,
          "d_mlp": 16, "act_fn": "relu", "normalization_type": null, "seed": 7, "device": "cpu"})");
  BOOST_TEST(tl.d_vocab_out == 0);
  BOOST_TEST((tl.activation == nn::Activation::Relu && tl.normalization == nn::Normalization::None));
  const std::string base = R"("n_layers": 1, "d_model": 8, "n_heads": 2, "d_vocab": 5, "n_ctx": 3)";
  const std::pair<std::string, std::string> refused[] = {
      {"{" + base + R"(, "d_mlp": 16, "act_fn": "silu"})", "'act_fn' \"silu\" has no counterpart here"},
      {"{" + base + R"(, "d_mlp": 16, "act_fn": "gelu", "normalization_type": "RMS"})",
       "'normalization_type' \"RMS\" has no counterpart here"},
      {"{" + base + R"(, "attn_only": true, "positional_embedding_type": "rotary"})",
       "'positional_embedding_type' \"rotary\" has no counterpart here"},
      {"{" + base + R"(, "act_fn": "gelu"})", "'d_mlp' is missing"},
      {"{" + base + R"(, "attn_only": true, "d_head": 3})", "TransformerLM: d_head 3 times n_heads 2 is not d_model 8"},
      {R"({"n_layers": 1, "n_heads": 2, "d_vocab": 5, "n_ctx": 3, "attn_only": true})", "'d_model' is missing"},
      {"{" + base + R"(, "attn_only": true, "d_vocab_out": 0})", "'d_vocab_out' must be positive or -1"},
      {R"({"n_layers": 1, "d_model": 8, "n_heads": 2, "d_vocab": 5, "n_ctx": 2.5, "attn_only": true})",
       "'n_ctx' must be an integer, got 2.5"},
      {R"({"n_layers": 18446744073709551615, "d_model": 8, "n_heads": 2, "d_vocab": 5, "n_ctx": 3, "attn_only": true})",
       "'n_layers' 18446744073709551615 is too large"},
      {"{" + base + R"(, "d_mlp": 16, "act_fn": "\u001b[31m"})", "'act_fn' \"\\x1b[31m\" has no counterpart"},
      {"{" + base + R"(, "d_mlp": [[[[1]]]]})", "'d_mlp' must be an integer, got an array"},
      {"[1, 2]", "the text is not a JSON object"},
      {"{not json", "the text is not a JSON object"}};
  // A value nested 100,000 deep is named by its kind (printing it would recurse as deep).
  const std::string deep = "{" + base + R"(, "attn_only": true, "d_head": )" + std::string(100000, '[') +
                           std::string(100000, ']') + "}";
  check_message([&] { nn::config_from_transformer_lens_json(deep); },
                "config_from_transformer_lens_json: 'd_head' must be an integer, got an array");
  for (const auto& [json, message] : refused)
    check_message([&] { nn::config_from_transformer_lens_json(json); },
                  message.starts_with("TransformerLM") ? message : "config_from_transformer_lens_json: " + message);
}

BOOST_AUTO_TEST_CASE(module_list_keeps_order_and_refuses_bad_access) {
  nn::ModuleList list;
  list.push_back(std::make_shared<nn::Linear>(2, 3)).push_back(std::make_shared<nn::ReLU>());
  BOOST_TEST(list.size() == 2u);
  BOOST_TEST(list.at<nn::Linear>(0).weight().size(1) == 3);
  std::vector<std::string> names;
  for (const auto& [n, p] : list.named_parameters()) names.push_back(n);
  BOOST_TEST(names == (std::vector<std::string>{"0.weight", "0.bias"}));
  check_message([&] { list.at<nn::Linear>(1); }, "module 1 is a ReLU");
  check_message([&] { list[2]; }, "index 2 is out of range for 2 modules");
  check_message([&] { list.push_back(std::shared_ptr<nn::Linear>()); }, "module 2 is null");
}

BOOST_AUTO_TEST_CASE(load_module_rebuilds_the_model_in_every_form) {
  const TempDir dir;
  const std::string path = dir.file("transformer_lm_module.safetensors");
  for (int form = 0; form < 6; ++form) {
    nn::TransformerLMConfig c = small_config(form == 0 ? 0 : 12);
    if (form == 5) c.d_vocab_out = 5;
    if (form == 2) c.activation = nn::Activation::Relu, c.normalization = nn::Normalization::None;
    if (form == 3) c.activation = nn::Activation::GeluTanh, c.tied_embeddings = true;
    if (form == 4) c.positional_embedding = nn::PositionalEmbedding::None, c.layer_norm_eps = 1e-3;
    nn::TransformerLM a(c);
    randomise(a, 40 + static_cast<std::uint64_t>(form));
    nn::save_parameters(a, path);
    const std::shared_ptr<nn::Module> m = nn::load_module(path);
    const auto* b = dynamic_cast<const nn::TransformerLM*>(m.get());
    BOOST_TEST_REQUIRE(b != nullptr, "form " << form << " rebuilt as " << m->type_name());
    BOOST_TEST(b->extra_repr() == a.extra_repr(), "form " << form);
    BOOST_TEST(max_abs_diff(b->forward(kTokens), a.forward(kTokens)) == 0.0, "form " << form);
    BOOST_TEST(b->block(1).has_mlp() == (c.d_mlp != 0), "form " << form);
  }
  // A config whose choice is not one of the names is refused, naming the option and the value.
  nn::TransformerLM a(small_config());
  nn::ModuleConfig config = nn::module_config(a);
  config.options["activation"] = "\"swish\"";
  check_throws<nn::CheckpointError>([&] { nn::build_module(config); },
                                    {"TransformerLM option 'activation' is 'swish'; it must be one of 'gelu', "
                                     "'gelu_new', 'relu'"});
  // A ModuleList rebuilds with its children in order; an attention-only block keeps its form.
  nn::ModuleList list;
  list.push_back(std::make_shared<nn::TransformerBlock>(nn::TransformerBlockOptions{
      .d_model = 8, .num_heads = 2, .mlp = false, .normalization = nn::Normalization::None,
      .dtype = ag::Dtype::Float64}));
  list.push_back(std::make_shared<nn::Linear>(nn::LinearOptions{8, 3, true, ag::Dtype::Float64}));
  randomise(list, 7);
  nn::save_parameters(list, path);
  const std::shared_ptr<nn::Module> l = nn::load_module(path);
  const auto& rebuilt = dynamic_cast<const nn::ModuleList&>(*l);
  BOOST_TEST(rebuilt.size() == 2u);
  const ag::Tensor x = ag::randn({1, 3, 8}, ag::Dtype::Float64);
  BOOST_TEST(max_abs_diff(rebuilt.at<nn::TransformerBlock>(0).forward(x), list.at<nn::TransformerBlock>(0).forward(x)) ==
             0.0);
  BOOST_TEST(!rebuilt.at<nn::TransformerBlock>(0).has_mlp());
}

BOOST_AUTO_TEST_CASE(the_torch_layout_takes_blocks_torch_has_and_refuses_the_others_by_name) {
  // With an MLP, LayerNorm and exact GELU every block is a torch TransformerEncoderLayer.
  nn::TransformerLM a(small_config(12));
  const nn::NamedTensors sd = nn::torch_state_dict(a);
  BOOST_TEST(std::any_of(sd.begin(), sd.end(), [](const auto& e) { return e.first == "blocks.1.self_attn.in_proj_weight"; }));
  const auto refused = [](nn::TransformerLMConfig c, const std::string& fragment) {
    nn::TransformerLM m(c);
    check_throws<nn::CheckpointError>([&] { nn::torch_state_dict(m); }, {fragment, "save_transformer_lens_state_dict"});
  };
  refused(small_config(0), "module 'blocks.0' (TransformerBlock) is attention-only");
  nn::TransformerLMConfig c = small_config(12);
  c.normalization = nn::Normalization::None;
  refused(c, "module 'blocks.0' (TransformerBlock) has no LayerNorm");
  c = small_config(12);
  c.activation = nn::Activation::GeluTanh;
  refused(c, "module 'blocks.0' (TransformerBlock) uses GELU's tanh approximation");
}

BOOST_AUTO_TEST_CASE(transformer_lens_hook_names_translate_to_points_of_the_model) {
  nn::TransformerLM m(small_config(12));
  const std::vector<std::string> points = m.hook_point_names();
  // TransformerLens 3.9's run_with_cache names of a 2-layer model with an MLP and LayerNorm
  // (use_split_qkv_input and use_attn_result on), and ours.
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"hook_embed", "embed_out"}, {"hook_pos_embed", "pos_embed_out"},
      {"blocks.0.hook_resid_pre", "blocks.0.resid_pre"}, {"blocks.0.hook_q_input", "blocks.0.q_input"},
      {"blocks.0.ln1.hook_scale", "blocks.0.ln_1.scale"}, {"blocks.0.ln1.hook_normalized", "blocks.0.ln_1.normalized"},
      {"blocks.0.attn.hook_q", "blocks.0.attn.q"}, {"blocks.0.attn.hook_attn_scores", "blocks.0.attn.attn_scores"},
      {"blocks.0.attn.hook_pattern", "blocks.0.attn.pattern"}, {"blocks.0.attn.hook_z", "blocks.0.attn.z"},
      {"blocks.0.attn.hook_result", "blocks.0.attn.result"}, {"blocks.0.hook_attn_out", "blocks.0.attn_out"},
      {"blocks.1.hook_resid_mid", "blocks.1.resid_mid"}, {"blocks.1.ln2.hook_scale", "blocks.1.ln_2.scale"},
      {"blocks.1.mlp.hook_pre", "blocks.1.mlp_pre"}, {"blocks.1.mlp.hook_post", "blocks.1.mlp_hidden"},
      {"blocks.1.hook_mlp_out", "blocks.1.mlp_out"}, {"blocks.1.hook_resid_post", "blocks.1.resid_post"},
      {"ln_final.hook_scale", "ln_final.scale"}, {"ln_final.hook_normalized", "ln_final.normalized"}};
  for (const auto& [tl, ours] : pairs) {
    BOOST_TEST(nn::transformer_lens_point_name(tl) == ours, tl);
    BOOST_TEST(has(points, ours), ours);
  }
  BOOST_TEST(nn::transformer_lens_point_name("blocks.0.attn.pattern").empty());
  // A TransformerLens name given to add_hook gets our name in the refusal.
  check_message([&] { m.add_hook("blocks.1.attn.hook_pattern", [](const ag::Tensor&, const std::string&) { return ag::Tensor(); }); },
                "no hook point named 'blocks.1.attn.hook_pattern' in TransformerLM (TransformerLens's "
                "'blocks.1.attn.hook_pattern' is 'blocks.1.attn.pattern' here)");
}
