// A module tree's configuration as JSON (the "headgrad.config" metadata of saved files, see
// nn/checkpoint.hpp): nn's module types with their constructor options, any other module with
// its type and children; and the parsed form with typed accessors.
#include <limits>
#include <utility>

#include <nlohmann/json.hpp>

#include "nn/checkpoint.hpp"
#include "nn/layers.hpp"
#include "nn/linear.hpp"
#include "nn/multihead_attention.hpp"
#include "nn/transformer_lm.hpp"
#include "safetensors.hpp"
#include "strict_json.hpp"

namespace nn {

ModuleConfig::ModuleConfig() = default;
ModuleConfig::ModuleConfig(const ModuleConfig&) = default;
ModuleConfig::ModuleConfig(ModuleConfig&&) noexcept = default;
ModuleConfig& ModuleConfig::operator=(const ModuleConfig&) = default;
ModuleConfig& ModuleConfig::operator=(ModuleConfig&&) noexcept = default;
ModuleConfig::~ModuleConfig() = default;

namespace {

using json = nlohmann::ordered_json;

const char* dtype_text(ag::Dtype d) { return d == ag::Dtype::Float64 ? "float64" : "float32"; }

// The constructor options of nn's module types; null for any other type.
json known_options(const Module& m) {
  if (const auto* l = dynamic_cast<const Linear*>(&m))
    return {{"in_features", l->in_features()}, {"out_features", l->out_features()}, {"bias", l->bias().defined()}};
  if (const auto* e = dynamic_cast<const Embedding*>(&m))
    return {{"num_embeddings", e->options().num_embeddings}, {"embedding_dim", e->options().embedding_dim}};
  if (const auto* n = dynamic_cast<const LayerNorm*>(&m)) {
    const auto& o = n->options();
    return {{"normalized_shape", std::vector<std::int64_t>(o.normalized_shape.begin(), o.normalized_shape.end())},
            {"eps", o.eps}, {"elementwise_affine", o.elementwise_affine}, {"bias", n->bias().defined()}};
  }
  if (const auto* a = dynamic_cast<const MultiHeadAttention*>(&m)) {
    const auto& o = a->options();
    return {{"embed_dim", o.embed_dim},     {"num_heads", o.num_heads},         {"dropout", o.dropout},
            {"bias", o.bias},               {"kdim", o.kdim},                   {"vdim", o.vdim},
            {"add_bias_kv", o.add_bias_kv}, {"add_zero_attn", o.add_zero_attn},
            {"core", o.core == AttentionCore::Fused ? "fused" : "composed"}};
  }
  if (const auto* b = dynamic_cast<const TransformerBlock*>(&m)) {
    const auto& o = b->options();
    const bool norm = o.normalization == Normalization::LayerNorm;
    return {{"d_model", o.d_model},
            {"num_heads", o.num_heads},
            {"d_ff", o.d_ff},
            {"dropout", o.dropout},
            {"gelu", o.gelu},
            {"gelu_tanh", o.gelu_tanh},
            {"mlp", o.mlp},
            {"normalization", norm ? "layer_norm" : "none"},
            {"bias", o.bias},
            {"layer_norm_eps", o.layer_norm_eps},
            {"layer_norm_bias", norm ? b->ln_1().bias().defined() : o.layer_norm_bias.value_or(o.bias)}};
  }
  if (const auto* lm = dynamic_cast<const TransformerLM*>(&m)) {
    const auto& c = lm->config();
    const char* activation = c.activation == Activation::Relu ? "relu" : c.activation == Activation::Gelu ? "gelu"
                                                                                                           : "gelu_new";
    return {{"n_layers", c.n_layers},
            {"d_model", c.d_model},
            {"n_heads", c.n_heads},
            {"d_head", c.d_head},
            {"d_mlp", c.d_mlp},
            {"d_vocab", c.d_vocab},
            {"d_vocab_out", c.d_vocab_out},
            {"n_ctx", c.n_ctx},
            {"activation", activation},
            {"normalization", c.normalization == Normalization::LayerNorm ? "layer_norm" : "none"},
            {"positional_embedding", c.positional_embedding == PositionalEmbedding::Learned ? "learned" : "none"},
            {"tied_embeddings", c.tied_embeddings},
            {"layer_norm_eps", c.layer_norm_eps}};
  }
  if (const auto* g = dynamic_cast<const GELU*>(&m))
    return {{"approximate", g->approximate() == ag::GeluApproximation::Tanh ? "tanh" : "none"}};
  return nullptr;
}

// `where` names m in messages ("the root module", "module 'block.attn'"), `path` is its dotted name.
json describe(const Module& m, std::string_view op, const std::string& path) {
  const std::string where = path.empty() ? "the root module" : "module " + quote_name(path);
  // The config is JSON text in the file's metadata, which is UTF-8.
  detail::check_utf8(op, where + ": type name", m.type_name());
  json out = {{"type", m.type_name()}};
  const NamedTensors params = m.named_parameters();
  if (!params.empty()) out["dtype"] = dtype_text(params.front().second.dtype());
  json options = known_options(m);
  if (!options.is_null()) {
    out["options"] = std::move(options);
  } else if (const std::string repr = m.extra_repr(); !repr.empty()) {
    detail::check_utf8(op, fmt::format("{} ({}): extra_repr()", where, detail::printable_text(m.type_name())), repr);
    out["repr"] = repr;
  }
  const auto children = m.named_children();
  if (!children.empty()) {
    json c = json::object();
    for (const auto& [name, child] : children) c[name] = describe(*child, op, path.empty() ? name : path + "." + name);
    out["children"] = std::move(c);
  }
  return out;
}

[[noreturn]] void bad_config(std::string_view source, const std::string& message) {
  throw CheckpointError(fmt::format("{}: headgrad.config: {}", source, message));
}

ModuleConfig parse_node(const json& v, std::string_view source, const std::string& path, int depth) {
  const std::string where = path.empty() ? "the root module" : "module " + quote_name(path);
  if (depth > 64) bad_config(source, "nested more than 64 modules deep");
  if (!v.is_object()) bad_config(source, where + " is not a JSON object");
  ModuleConfig c;
  for (const auto& [key, value] : v.items()) {
    if (key == "type" || key == "dtype" || key == "repr") {
      if (!value.is_string()) bad_config(source, fmt::format("{}: \"{}\" is not a string", where, key));
      (key == "type" ? c.type : key == "dtype" ? c.dtype : c.repr) = value.get<std::string>();
    } else if (key == "options") {
      if (!value.is_object()) bad_config(source, where + ": \"options\" is not an object");
      for (const auto& [name, option] : value.items()) c.options[name] = option.dump();
    } else if (key == "children") {
      if (!value.is_object()) bad_config(source, where + ": \"children\" is not an object");
      for (const auto& [name, child] : value.items())
        c.children.emplace_back(name, parse_node(child, source, path.empty() ? name : path + "." + name, depth + 1));
    }
  }
  if (c.type.empty()) bad_config(source, where + " has no \"type\"");
  if (!c.dtype.empty() && c.dtype != "float32" && c.dtype != "float64")
    bad_config(source, fmt::format("{}: dtype {} is not float32 or float64", where, quote_name(c.dtype)));
  return c;
}

// An option's JSON value, parsed; throws naming the type and the option when it is absent.
json option_value(const ModuleConfig& c, const std::string& key, const char* kind) {
  const auto it = c.options.find(key);
  if (it == c.options.end()) {
    std::string names;
    for (const auto& [name, v] : c.options) names += (names.empty() ? "" : ", ") + detail::printable_text(name);
    throw CheckpointError(fmt::format("module config ({}): no option '{}' ({} wanted); it has: {}",
                                      detail::printable_text(c.type), key, kind, names.empty() ? "none" : names));
  }
  return json::parse(it->second);
}

[[noreturn]] void wrong_kind(const ModuleConfig& c, const std::string& key, const char* kind, const json& v) {
  throw CheckpointError(
      fmt::format("module config ({}): option '{}' is {}, not {}", detail::printable_text(c.type), key, v.dump(), kind));
}

// An integer of the JSON text that int64 holds; the JSON's unsigned integers past INT64_MAX are
// refused, naming the value as the text writes it (a cast would report -1 for 18446744073709551615).
std::int64_t to_int64(const ModuleConfig& c, const std::string& key, const json& d, const json& whole) {
  if (d.is_number_unsigned() && d.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    throw CheckpointError(fmt::format("module config ({}): option '{}' is {}, which is past the largest integer an option "
                                      "holds ({})", detail::printable_text(c.type), key, whole.dump(),
                                      std::numeric_limits<std::int64_t>::max()));
  return d.get<std::int64_t>();
}

}  // namespace

const ModuleConfig& ModuleConfig::child(const std::string& dotted_name) const {
  const ModuleConfig* at = this;
  std::size_t start = 0;
  while (start <= dotted_name.size()) {
    const std::size_t dot = std::min(dotted_name.find('.', start), dotted_name.size());
    const std::string name = dotted_name.substr(start, dot - start);
    const ModuleConfig* next = nullptr;
    for (const auto& [n, c] : at->children)
      if (n == name) next = &c;
    if (!next) {
      std::string names;
      for (const auto& [n, c] : at->children) names += (names.empty() ? "" : ", ") + quote_name(n);
      throw CheckpointError(fmt::format("module config ({}): no child {}; its children are: {}",
                                        detail::printable_text(at->type), quote_name(name), names.empty() ? "none" : names));
    }
    at = next;
    start = dot + 1;
  }
  return *at;
}

bool ModuleConfig::has_child(const std::string& name) const {
  for (const auto& [n, c] : children)
    if (n == name) return true;
  return false;
}

std::int64_t ModuleConfig::integer(const std::string& key) const {
  const json v = option_value(*this, key, "an integer");
  if (!v.is_number_integer()) wrong_kind(*this, key, "an integer", v);
  return to_int64(*this, key, v, v);
}

double ModuleConfig::number(const std::string& key) const {
  const json v = option_value(*this, key, "a number");
  if (!v.is_number()) wrong_kind(*this, key, "a number", v);
  return v.get<double>();
}

bool ModuleConfig::flag(const std::string& key) const {
  const json v = option_value(*this, key, "true or false");
  if (!v.is_boolean()) wrong_kind(*this, key, "true or false", v);
  return v.get<bool>();
}

std::string ModuleConfig::text(const std::string& key) const {
  const json v = option_value(*this, key, "a string");
  if (!v.is_string()) wrong_kind(*this, key, "a string", v);
  return v.get<std::string>();
}

ag::Shape ModuleConfig::shape(const std::string& key) const {
  const json v = option_value(*this, key, "a list of integers");
  ag::Shape out;
  if (!v.is_array()) wrong_kind(*this, key, "a list of integers", v);
  for (const auto& d : v) {
    if (!d.is_number_integer()) wrong_kind(*this, key, "a list of integers", v);
    out.push_back(to_int64(*this, key, d, v));
  }
  return out;
}

ag::Dtype ModuleConfig::parameter_dtype() const {
  return dtype == "float64" ? ag::Dtype::Float64 : ag::Dtype::Float32;
}

namespace detail {

std::string config_json(std::string_view op, const Module& module) { return describe(module, op, "").dump(); }

}  // namespace detail

std::string module_config_json(const Module& module) { return detail::config_json("module_config_json", module); }

ModuleConfig module_config(const Module& module) {
  return parse_module_config(detail::config_json("module_config", module));
}

// Read strictly (strict_json.hpp): a key given twice, an integer past 64 bits or a NUL byte is
// refused rather than read as something the text does not say.
ModuleConfig parse_module_config(std::string_view text, std::string_view source) {
  detail::StrictJsonReader<json> reader(fmt::format("{}: headgrad.config: ", source), "config", 200);
  const json v = reader.read(text);
  return parse_node(v, source, "", 0);
}

ModuleConfig read_module_config(const std::string& path) {
  const detail::Header data = detail::read_header(path);  // the metadata: no tensor's bytes are read
  const auto it = data.metadata.find(detail::kConfigKey);
  if (it == data.metadata.end())
    throw CheckpointError(fmt::format("read_module_config: {}: the file has no \"{}\" metadata (it was not written by "
                                      "save_parameters, save_checkpoint or save_torch_state_dict)",
                                      path, detail::kConfigKey));
  return parse_module_config(it->second, path);
}

}  // namespace nn
