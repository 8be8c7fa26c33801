// Modules rebuilt from their saved configuration (nn/checkpoint.hpp): nn's own types from their
// options, then a file's parameters loaded into them.
#include <initializer_list>
#include <memory>
#include <string>

#include "nn/checkpoint.hpp"
#include "nn/layers.hpp"
#include "nn/linear.hpp"
#include "nn/multihead_attention.hpp"
#include "nn/torch_state_dict.hpp"
#include "nn/transformer_lm.hpp"
#include "parameter_budget.hpp"
#include "safetensors.hpp"

namespace nn {

namespace {

std::shared_ptr<Module> build_attention(const ModuleConfig& c) {
  MultiHeadAttentionOptions o;
  o.embed_dim = c.integer("embed_dim");
  o.num_heads = c.integer("num_heads");
  o.dropout = c.number("dropout");
  o.bias = c.flag("bias");
  o.kdim = c.integer("kdim");
  o.vdim = c.integer("vdim");
  o.add_bias_kv = c.flag("add_bias_kv");
  o.add_zero_attn = c.flag("add_zero_attn");
  o.core = c.text("core") == "composed" ? AttentionCore::Composed : AttentionCore::Fused;
  o.dtype = c.parameter_dtype();
  return std::make_shared<MultiHeadAttention>(o);
}

// A text option that must be one of `names`; returns its index. Throws naming the option.
std::size_t choice(const ModuleConfig& c, const std::string& key, std::initializer_list<const char*> names) {
  const std::string v = c.text(key);
  std::string listed;
  std::size_t i = 0;
  for (const char* n : names) {
    if (v == n) return i;
    listed += fmt::format("{}'{}'", i++ == 0 ? "" : ", ", n);
  }
  throw CheckpointError(fmt::format("build_module: {} option '{}' is {}; it must be one of {}",
                                    detail::printable_text(c.type), key, quote_name(v), listed));
}

// Options a file may lack because it was written before they existed take their old meaning:
// "layer_norm_bias" true, "gelu_tanh" false, "mlp" true, "normalization" LayerNorm.
std::shared_ptr<Module> build_block(const ModuleConfig& c) {
  const auto has = [&c](const char* key) { return c.options.count(key) != 0; };
  return std::make_shared<TransformerBlock>(TransformerBlockOptions{
      .d_model = c.integer("d_model"), .num_heads = c.integer("num_heads"), .d_ff = c.integer("d_ff"),
      .dropout = c.number("dropout"), .gelu = c.flag("gelu"), .gelu_tanh = has("gelu_tanh") && c.flag("gelu_tanh"),
      .mlp = !has("mlp") || c.flag("mlp"),
      .normalization = has("normalization") && choice(c, "normalization", {"layer_norm", "none"}) == 1
                           ? Normalization::None
                           : Normalization::LayerNorm,
      .bias = c.flag("bias"), .layer_norm_eps = c.number("layer_norm_eps"), .dtype = c.parameter_dtype(),
      .layer_norm_bias = has("layer_norm_bias") ? c.flag("layer_norm_bias") : true});
}

std::shared_ptr<Module> build_language_model(const ModuleConfig& c) {
  const Activation activations[] = {Activation::Gelu, Activation::GeluTanh, Activation::Relu};
  return std::make_shared<TransformerLM>(TransformerLMConfig{
      .n_layers = c.integer("n_layers"),
      .d_model = c.integer("d_model"),
      .n_heads = c.integer("n_heads"),
      .d_head = c.integer("d_head"),
      .d_mlp = c.integer("d_mlp"),
      .d_vocab = c.integer("d_vocab"),
      .n_ctx = c.integer("n_ctx"),
      .activation = activations[choice(c, "activation", {"gelu", "gelu_new", "relu"})],
      .normalization =
          choice(c, "normalization", {"layer_norm", "none"}) == 0 ? Normalization::LayerNorm : Normalization::None,
      .positional_embedding = choice(c, "positional_embedding", {"learned", "none"}) == 0
                                  ? PositionalEmbedding::Learned
                                  : PositionalEmbedding::None,
      .tied_embeddings = c.flag("tied_embeddings"),
      .layer_norm_eps = c.number("layer_norm_eps"),
      .dtype = c.parameter_dtype(),
      .d_vocab_out = c.options.count("d_vocab_out") != 0 ? c.integer("d_vocab_out") : 0});
}

std::shared_ptr<Module> build_module_list(const ModuleConfig& c) {
  auto list = std::make_shared<ModuleList>();
  for (std::size_t i = 0; i < c.children.size(); ++i) {
    const auto& [name, child] = c.children[i];
    if (name != std::to_string(i))
      throw CheckpointError(fmt::format("build_module: ModuleList child {} should be named '{}' (children are "
                                        "numbered from 0 in order)",
                                        quote_name(name), i));
    const detail::BuildScope scope(name, "");
    list->push_back(build_module(child));
  }
  return list;
}

// A Sequential's child: any of nn's types with a one-tensor forward.
template <class... Ms>
bool push_as(Sequential& s, const std::string& name, const std::shared_ptr<Module>& m) {
  return ((std::dynamic_pointer_cast<Ms>(m) ? (s.push_back(name, std::dynamic_pointer_cast<Ms>(m)), true) : false) ||
          ...);
}

std::shared_ptr<Module> build_sequential(const ModuleConfig& c) {
  auto s = std::make_shared<Sequential>();
  for (const auto& [name, child] : c.children) {
    const detail::BuildScope scope(name, "");
    const std::shared_ptr<Module> m = build_module(child);
    if (!push_as<Linear, Embedding, LayerNorm, ReLU, GELU, TransformerBlock, Sequential>(*s, name, m))
      throw CheckpointError(fmt::format("build_module: Sequential child {} ({}) has no one-tensor forward",
                                        quote_name(name), detail::printable_text(child.type)));
  }
  return s;
}

}  // namespace

std::shared_ptr<Module> build_module(const ModuleConfig& c) {
  const detail::BuildScope scope("", c.type);
  const ag::Dtype dtype = c.parameter_dtype();
  if (c.type == "Linear")
    return std::make_shared<Linear>(
        LinearOptions{c.integer("in_features"), c.integer("out_features"), c.flag("bias"), dtype});
  if (c.type == "Embedding")
    return std::make_shared<Embedding>(EmbeddingOptions{c.integer("num_embeddings"), c.integer("embedding_dim"), dtype});
  if (c.type == "LayerNorm")
    return std::make_shared<LayerNorm>(LayerNormOptions{.normalized_shape = c.shape("normalized_shape"),
                                                        .eps = c.number("eps"),
                                                        .elementwise_affine = c.flag("elementwise_affine"),
                                                        .bias = c.flag("bias"),
                                                        .dtype = dtype});
  if (c.type == "MultiHeadAttention") return build_attention(c);
  if (c.type == "TransformerBlock") return build_block(c);
  if (c.type == "ReLU") return std::make_shared<ReLU>();
  if (c.type == "GELU")
    return std::make_shared<GELU>(c.text("approximate") == "tanh" ? ag::GeluApproximation::Tanh
                                                                 : ag::GeluApproximation::None);
  if (c.type == "Sequential") return build_sequential(c);
  if (c.type == "ModuleList") return build_module_list(c);
  if (c.type == "TransformerLM") return build_language_model(c);
  throw CheckpointError(fmt::format(
      "build_module: type {} is not one of nn's modules (Linear, Embedding, LayerNorm, MultiHeadAttention, "
      "TransformerBlock, TransformerLM, ReLU, GELU, Sequential, ModuleList); rebuild it with its own code from its config's options and "
      "children",
      quote_name(c.type)));
}

// The module is built under a bound (parameter_budget.hpp): its parameters cannot hold more
// elements than the file's tensors, whose header is read first, so a small file whose config asks
// for a huge module is refused before the memory is allocated; then its tensors load as usual.
std::shared_ptr<Module> load_module(const std::string& path) {
  const ModuleConfig config = read_module_config(path);
  const detail::Header header = detail::read_header(path);
  std::int64_t elements = 0;  // fits: the file holds the tensors' bytes
  for (const auto& e : header.entries) elements += ag::shape_numel(e.shape);
  std::shared_ptr<Module> m;
  try {
    const detail::ParameterBudget budget(elements);
    m = build_module(config);
  } catch (const std::invalid_argument& e) {  // options no constructor accepts
    throw CheckpointError(fmt::format("load_module: {}: headgrad.config: {}", path, e.what()));
  } catch (const CheckpointError& e) {  // a config build_module refuses, or one the file cannot hold
    throw CheckpointError(fmt::format("load_module: {}: {}", path, e.what()));
  }
  const Metadata& metadata = header.metadata;
  const auto naming = metadata.find(detail::kNamingKey);
  if (naming != metadata.end() && naming->second == "torch") {
    load_torch_state_dict(*m, path);
  } else {
    load_parameters(*m, path);
  }
  return m;
}

}  // namespace nn
