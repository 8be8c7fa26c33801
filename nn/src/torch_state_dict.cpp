// PyTorch state_dicts in safetensors files (nn/torch_state_dict.hpp): saving under torch's names
// and layouts, and loads that check every key before they change any parameter.
#include "nn/torch_state_dict.hpp"

#include <cstring>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "safetensors.hpp"
#include "torch_state_dict_layout.hpp"

namespace nn {

namespace {

using detail::TorchTensor;

// Each parameter with the value a load copies into it (in the parameter's dtype), and the key
// it came from (a tied parameter may come from several).
struct PlannedCopy {
  ag::Tensor param;
  ag::Tensor value;
  std::string key;
  const std::string* name;  // the parameter's headgrad name, in the layout
};

bool same_bits(const ag::Tensor& a, const ag::Tensor& b) {
  const auto x = a.to_vector(), y = b.to_vector();
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0;
}

std::string part_names(const TorchTensor& entry) {
  std::string s;
  for (const auto& part : entry.parts) s += (s.empty() ? "" : ", ") + quote_name(part.name);
  return s;
}

// Checks the file's tensors against the torch layout: every key (strict), no other (strict),
// torch's shape, the parameters' dtype unless converting, and one value per tied parameter.
// Every problem goes into one message.
std::vector<PlannedCopy> plan_torch_load(const std::vector<TorchTensor>& layout, const NamedTensors& stored,
                                         const LoadOptions& options, const std::string& where) {
  std::map<std::string_view, const ag::Tensor*> in_file;
  for (const auto& [name, t] : stored) in_file.emplace(name, &t);
  std::set<std::string_view> keys;
  std::vector<PlannedCopy> plan;
  std::unordered_map<const void*, std::size_t> planned;  // parameter -> its entry in plan
  std::vector<std::string> missing, extra, problems;
  for (const auto& entry : layout) {
    keys.insert(entry.key);
    const auto it = in_file.find(entry.key);
    if (it == in_file.end()) {
      missing.push_back(quote_name(entry.key));
      continue;
    }
    const ag::Tensor& t = *it->second;
    const ag::Dtype want = entry.parts.front().param.dtype();
    if (t.shape() != entry.shape) {
      problems.push_back(fmt::format("{} has shape {} in the file but torch's layout of {} is {}", quote_name(entry.key),
                                     ag::shape_str(t.shape()), part_names(entry), ag::shape_str(entry.shape)));
      continue;
    }
    if (t.dtype() != want && ag::is_floating(t.dtype()) != ag::is_floating(want)) {
      problems.push_back(fmt::format("{} is {} in the file but the parameters ({}) are {}: integer and "
                                     "floating-point tensors do not convert into each other on load",
                                     quote_name(entry.key),
                                     detail::safetensors_dtype(t.dtype()), part_names(entry),
                                     detail::safetensors_dtype(want)));
      continue;
    }
    if (t.dtype() != want && !options.convert_dtype) {
      problems.push_back(fmt::format("{} is {} in the file but the parameters ({}) are {}", quote_name(entry.key),
                                     detail::safetensors_dtype(t.dtype()), part_names(entry),
                                     detail::safetensors_dtype(want)));
      continue;
    }
    const std::vector<ag::Tensor> values = detail::split_torch_value(entry, t);
    for (std::size_t i = 0; i < values.size(); ++i) {
      const ag::Tensor& p = entry.parts[i].param;
      const auto [at, fresh] = planned.emplace(p.impl().get(), plan.size());
      if (fresh) {
        plan.push_back({p, values[i], entry.key, &entry.parts[i].name});
      } else if (!same_bits(plan[at->second].value, values[i])) {
        problems.push_back(fmt::format("{} and {} give different values to the tied parameter {}",
                                       quote_name(plan[at->second].key), quote_name(entry.key),
                                       quote_name(*plan[at->second].name)));
      }
    }
  }
  for (const auto& [name, t] : stored)
    if (!keys.count(name)) extra.push_back(quote_name(name));
  std::string message;
  auto add = [&](const std::string& part) { message += (message.empty() ? "" : "; ") + part; };
  if (options.strict && !missing.empty()) add("missing tensors " + detail::join_names(missing));
  if (options.strict && !extra.empty()) add("unexpected tensors " + detail::join_names(extra));
  for (const auto& p : problems) add(p);
  if (!message.empty()) throw CheckpointError(fmt::format("{}: {}; no parameter was changed", where, message));
  return plan;
}

std::string metadata_value(const Metadata& metadata, const char* key) {
  const auto it = metadata.find(key);
  return it == metadata.end() ? std::string() : it->second;
}

// The tensors have the names and shapes of the module's own parameters (named_parameters()).
bool matches_own_layout(const Module& module, const NamedTensors& tensors) {
  const NamedTensors params = module.named_parameters();
  if (params.empty() || params.size() != tensors.size()) return false;
  std::map<std::string_view, const ag::Tensor*> shapes;
  for (const auto& [name, p] : params) shapes.emplace(name, &p);
  for (const auto& [name, t] : tensors) {
    const auto it = shapes.find(name);
    if (it == shapes.end() || it->second->shape() != t.shape()) return false;
  }
  return true;
}

bool looks_like_checkpoint(const NamedTensors& tensors) {
  if (tensors.empty()) return false;
  for (const auto& [name, t] : tensors)
    if (!name.starts_with("model.") && !name.starts_with("optimizer.")) return false;
  return true;
}

}  // namespace

namespace detail {

Metadata describe_file(std::string_view op, const Module& module, const Metadata& metadata, const char* naming) {
  Metadata meta = metadata;
  meta[kConfigKey] = config_json(op, module);
  meta[kNamingKey] = naming;
  return meta;
}

std::string wrong_loader_hint(std::string_view op, const Module& module, const SafetensorsData& file) {
  constexpr const char* kCheckpoint = "a training checkpoint (save_checkpoint: model.* and optimizer.* tensors)";
  constexpr const char* kTorch =
      "the parameters under PyTorch's names and layouts (save_torch_state_dict, or a PyTorch state_dict)";
  constexpr const char* kOwn = "the parameters under headgrad's own names (save_parameters)";
  const std::string naming = metadata_value(file.metadata, kNamingKey);
  const char* kind = nullptr;
  const char* loader = nullptr;
  if (metadata_value(file.metadata, "format") == kCheckpointFormat) {
    kind = kCheckpoint, loader = "load_checkpoint";
  } else if (naming == "torch") {
    kind = kTorch, loader = "load_torch_state_dict";
  } else if (naming == "headgrad") {
    kind = kOwn, loader = "load_parameters";
  } else if (op != "load_checkpoint" && looks_like_checkpoint(file.tensors)) {
    kind = kCheckpoint, loader = "load_checkpoint";
  } else if (op != "load_torch_state_dict" && matches_torch_layout(module, file.tensors) &&
             !matches_own_layout(module, file.tensors)) {
    kind = kTorch, loader = "load_torch_state_dict";
  } else if (op != "load_parameters" && matches_own_layout(module, file.tensors) &&
             !matches_torch_layout(module, file.tensors)) {
    kind = kOwn, loader = "load_parameters";
  }
  if (loader == nullptr || op == loader) return {};
  const char* args = std::string_view(loader) == "load_checkpoint" ? "(path, module, optimizer)" : "(module, path)";
  return fmt::format("this file holds {}: load it with {}{}, not {}", kind, loader, args, op);
}

}  // namespace detail

NamedTensors torch_state_dict(const Module& module) {
  NamedTensors out;
  for (const auto& entry : detail::torch_layout(module, "torch_state_dict"))
    out.emplace_back(entry.key, detail::torch_value(entry));
  return out;
}

void save_torch_state_dict(const Module& module, const std::string& path, const Metadata& metadata) {
  NamedTensors tensors;
  for (const auto& entry : detail::torch_layout(module, "save_torch_state_dict"))
    tensors.emplace_back(entry.key, detail::torch_value(entry));
  Metadata meta = detail::describe_file("save_torch_state_dict", module, metadata, "torch");
  meta.emplace("format", "pt");  // kept when the caller gave one
  detail::write_safetensors("save_torch_state_dict", path, tensors, meta);
}

void load_torch_state_dict(Module& module, const std::string& path, const LoadOptions& options) {
  const std::string where = fmt::format("load_torch_state_dict: {}", path);
  const std::vector<TorchTensor> layout = detail::torch_layout(module, where);
  const SafetensorsData data = load_safetensors(path);
  const std::string hint = detail::wrong_loader_hint("load_torch_state_dict", module, data);
  if (!hint.empty()) throw CheckpointError(fmt::format("{}: {}; no parameter was changed", where, hint));
  const std::vector<PlannedCopy> plan = plan_torch_load(layout, data.tensors, options, where);
  ag::NoGradGuard no_grad;
  for (const auto& copy : plan) {
    ag::Tensor p = copy.param;
    p.copy_(copy.value);
  }
}

}  // namespace nn
