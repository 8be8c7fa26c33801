#include "heads_model.hpp"

#include <algorithm>
#include <iterator>
#include <utility>

namespace heads {

HeadsModel::HeadsModel(const HeadsModelOptions& o, ag::Generator& gen) : Module("HeadsModel") {
  tok = register_module("tok", std::make_shared<nn::Embedding>(nn::EmbeddingOptions{o.vocab, o.d_model}, gen));
  pos = register_module("pos", std::make_shared<nn::Embedding>(nn::EmbeddingOptions{o.seq_len, o.d_model}, gen));
  if (o.mlp) {
    block = register_module(
        "block", std::make_shared<nn::TransformerBlock>(
                     nn::TransformerBlockOptions{.d_model = o.d_model, .num_heads = o.heads, .d_ff = o.d_ff}, gen));
  } else {
    ln_1 = register_module("ln_1", std::make_shared<nn::LayerNorm>(o.d_model));
    nn::MultiHeadAttentionOptions mha;
    mha.embed_dim = o.d_model;
    mha.num_heads = o.heads;
    attn = register_module("attn", std::make_shared<nn::MultiHeadAttention>(mha, gen));
  }
  ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(o.d_model));
  readout = register_module("readout", std::make_shared<nn::Linear>(nn::LinearOptions{o.d_model, o.classes}, gen));
  positions = ag::arange(static_cast<double>(o.seq_len));
}

namespace {

HeadsModel::Output run(const HeadsModel& m, const ag::Tensor& tokens, bool need_weights) {
  const ag::Tensor x = ag::add(m.tok->forward(tokens), m.pos->forward(m.positions));  // (B, T, D) the residual stream
  nn::AttentionOptions opt;
  opt.is_causal = true;  // position t sees 0 .. t: the previous and the first token are both visible
  opt.need_weights = need_weights;
  opt.average_attn_weights = false;
  ag::Tensor r;
  ag::Tensor weights;
  if (m.block) {
    auto out = m.block->forward(x, opt);
    r = out.output;
    weights = out.weights;
  } else {
    const ag::Tensor h = m.ln_1->forward(x);  // (B, T, D)
    auto a = m.attn->forward(h, h, h, opt);   // (B, T, D), weights (B, H, T, T)
    r = ag::add(x, a.output);                 // added back into the residual stream
    weights = a.weights;
  }
  return {m.readout->forward(m.ln_f->forward(r)), weights};  // (B, T, classes)
}

}  // namespace

ag::Tensor HeadsModel::forward(const ag::Tensor& tokens) const { return run(*this, tokens, false).logits; }

HeadsModel::Output HeadsModel::forward_with_weights(const ag::Tensor& tokens) const { return run(*this, tokens, true); }

nn::MultiHeadAttention& HeadsModel::attention() const { return block ? block->attn() : *attn; }

std::string HeadsModel::attention_point(const std::string& point) const {
  return (block ? "block.attn." : "attn.") + point;
}

HeadsModelOptions heads_options_from_config(const nn::ModuleConfig& c) {
  if (c.type != "HeadsModel")
    throw nn::CheckpointError(fmt::format("the file holds a {}, not a model of train_heads (HeadsModel)", c.type));
  HeadsModelOptions o;
  o.vocab = c.child("tok").integer("num_embeddings");
  o.d_model = c.child("tok").integer("embedding_dim");
  o.seq_len = c.child("pos").integer("num_embeddings");
  o.classes = c.child("readout").integer("out_features");
  o.mlp = c.has_child("block");
  if (o.mlp) {
    o.heads = c.child("block").integer("num_heads");
    o.d_ff = c.child("block").integer("d_ff");
  } else {
    o.heads = c.child("attn").integer("num_heads");
  }
  return o;
}

std::unique_ptr<HeadsModel> load_heads_model(const std::string& path) {
  ag::Generator gen(0);  // the file's parameters replace these
  auto model = std::make_unique<HeadsModel>(heads_options_from_config(nn::read_module_config(path)), gen);
  const nn::Metadata metadata = nn::load_safetensors(path).metadata;
  const auto naming = metadata.find("headgrad.naming");
  if (naming != metadata.end() && naming->second == "torch") {
    nn::load_torch_state_dict(*model, path);
  } else {
    nn::load_parameters(*model, path);
  }
  return model;
}

std::vector<HeadFocus> measure_focus(const ag::Tensor& weights) {
  const std::int64_t B = weights.size(0), H = weights.size(1), T = weights.size(2), S = weights.size(3);
  const auto w = weights.to_vector();
  std::vector<HeadFocus> out(static_cast<std::size_t>(H));
  for (std::int64_t h = 0; h < H; ++h) {
    HeadFocus& f = out[static_cast<std::size_t>(h)];
    double n = 0;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 2; t < T; ++t) {
        const double* row = w.data() + ((b * H + h) * T + t) * S;
        f.previous += row[t - 1];
        f.first += row[0];
        f.current += row[t];
        n += 1;
      }
    f.previous /= n;
    f.first /= n;
    f.current /= n;
    const std::pair<double, const char*> options[] = {
        {f.previous, "previous token"}, {f.first, "first token"}, {f.current, "current token"}};
    const auto best = *std::max_element(std::begin(options), std::end(options),
                                        [](const auto& a, const auto& b) { return a.first < b.first; });
    f.mean_weight = best.first;
    f.label = best.first >= 0.5 ? best.second : "mixed";
  }
  return out;
}

}  // namespace heads
