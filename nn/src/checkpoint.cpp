// Modules and optimizers in safetensors files (nn/checkpoint.hpp): which tensors are saved under
// which names, and loads that check everything before they change anything.
#include "nn/checkpoint.hpp"

#include <cmath>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "safetensors.hpp"

namespace nn {

namespace {

using detail::join_names;
constexpr const char* kFormat = detail::kCheckpointFormat;

// Each parameter with the value a load copies into it (already in the parameter's dtype).
using LoadPlan = std::vector<std::pair<ag::Tensor, ag::Tensor>>;

// Pairs each parameter with its tensor from the file after checking names, shapes and dtypes;
// every problem goes into one message.
LoadPlan plan_parameter_load(const NamedTensors& params, const NamedTensors& stored, const LoadOptions& options,
                             const std::string& where, const std::string& prefix = "") {
  std::map<std::string_view, const ag::Tensor*> in_file;
  for (const auto& [name, t] : stored) in_file.emplace(name, &t);
  std::set<std::string_view> param_names;
  LoadPlan plan;
  std::vector<std::string> missing, extra, problems;
  for (const auto& [name, p] : params) {
    param_names.insert(name);
    const auto it = in_file.find(name);
    if (it == in_file.end()) {
      missing.push_back(quote_name(prefix + name));
      continue;
    }
    const ag::Tensor& t = *it->second;
    if (t.shape() != p.shape()) {
      problems.push_back(fmt::format("{} has shape {} in the file but the parameter is {}", quote_name(prefix + name),
                                     ag::shape_str(t.shape()), ag::shape_str(p.shape())));
    } else if (t.dtype() != p.dtype() && ag::is_floating(t.dtype()) != ag::is_floating(p.dtype())) {
      problems.push_back(fmt::format("{} is {} in the file but the parameter is {}: integer and floating-point "
                                     "tensors do not convert into each other on load (not even with convert_dtype)",
                                     quote_name(prefix + name), detail::safetensors_dtype(t.dtype()),
                                     detail::safetensors_dtype(p.dtype())));
    } else if (t.dtype() != p.dtype() && !options.convert_dtype) {
      problems.push_back(fmt::format("{} is {} in the file but the parameter is {}", quote_name(prefix + name),
                                     detail::safetensors_dtype(t.dtype()), detail::safetensors_dtype(p.dtype())));
    } else {
      // Converted here, so that applying the plan allocates nothing and cannot fail half-way.
      plan.emplace_back(p, t.dtype() == p.dtype() ? t : t.to(p.dtype()));
    }
  }
  for (const auto& [name, t] : stored)
    if (!param_names.count(name)) extra.push_back(quote_name(prefix + name));
  std::string message;
  auto add = [&](const std::string& part) { message += (message.empty() ? "" : "; ") + part; };
  if (options.strict && !missing.empty()) add("missing tensors " + join_names(missing));
  if (options.strict && !extra.empty()) add("unexpected tensors " + join_names(extra));
  for (const auto& p : problems) add(p);
  if (!message.empty()) throw CheckpointError(fmt::format("{}: {}; no parameter was changed", where, message));
  return plan;
}

void apply_plan(const LoadPlan& plan) {
  ag::NoGradGuard no_grad;
  for (const auto& [param, value] : plan) {
    ag::Tensor p = param;
    p.copy_(value);
  }
}

// The metadata says the file is a checkpoint, and one of this optimizer.
void check_checkpoint_metadata(const SafetensorsData& file, const Module& module, const Optimizer& optimizer,
                               const std::string& where) {
  const Metadata& metadata = file.metadata;
  const auto format = metadata.find("format");
  if (format == metadata.end() || format->second != kFormat) {
    const std::string hint = detail::wrong_loader_hint("load_checkpoint", module, file);
    if (!hint.empty()) throw CheckpointError(fmt::format("{}: {}; nothing was changed", where, hint));
    throw CheckpointError(fmt::format("{}: not a headgrad checkpoint (metadata \"format\" is not \"{}\"); a plain "
                                      "parameter file loads with load_parameters",
                                      where, kFormat));
  }
  const auto name = metadata.find("optimizer");
  if (name == metadata.end() || name->second != optimizer.name())
    throw CheckpointError(fmt::format("{}: the checkpoint holds {} state but the optimizer is {}; nothing was changed",
                                      where, name == metadata.end() ? "no optimizer" : detail::printable_text(name->second),
                                      detail::printable_text(optimizer.name())));
}

// Splits the file's tensors into the model part and the optimizer part (prefixes removed).
std::pair<NamedTensors, NamedTensors> split_checkpoint(const NamedTensors& tensors, const std::string& where) {
  NamedTensors model_part, optimizer_part;
  std::vector<std::string> stray;
  for (const auto& [name, t] : tensors) {
    if (name.starts_with("model.")) model_part.emplace_back(name.substr(6), t);
    else if (name.starts_with("optimizer.")) optimizer_part.emplace_back(name.substr(10), t);
    else stray.push_back(quote_name(name));
  }
  if (!stray.empty())
    throw CheckpointError(fmt::format("{}: unexpected tensors {} (neither model.* nor optimizer.*); nothing was changed",
                                      where, join_names(stray)));
  return {std::move(model_part), std::move(optimizer_part)};
}

// The optimizer's state as the optimizer itself checks it: names, shapes, dtypes, step counts,
// and values no run of the optimizer can produce (a NaN or infinite moment, a negative second
// moment), which would make the next step turn every weight into NaN.
void check_optimizer_state(const Optimizer& optimizer, const NamedTensors& state, const std::string& where) {
  try {
    optimizer.check_state_dict(state);
  } catch (const std::invalid_argument& e) {
    throw CheckpointError(fmt::format("{}: optimizer state: {}; nothing was changed", where, e.what()));
  }
}

}  // namespace

namespace detail {

std::string join_names(const std::vector<std::string>& names) {
  constexpr std::size_t kShown = 20;
  std::string s;
  for (std::size_t i = 0; i < names.size() && i < kShown; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > kShown) s += fmt::format(" and {} more", names.size() - kShown);
  return s;
}

}  // namespace detail

// ---- modules ----

void save_parameters(const Module& module, const std::string& path, const Metadata& metadata) {
  NamedTensors tensors;
  for (const auto& [name, p] : module.named_parameters()) tensors.emplace_back(name, p.detach());
  detail::write_safetensors("save_parameters", path, tensors, detail::describe_file("save_parameters", module, metadata, "headgrad"));
}

Metadata load_parameters(Module& module, const std::string& path, const LoadOptions& options) {
  const std::string where = fmt::format("load_parameters: {}", path);
  SafetensorsData data = load_safetensors(path);
  const std::string hint = detail::wrong_loader_hint("load_parameters", module, data);
  if (!hint.empty()) throw CheckpointError(fmt::format("{}: {}; no parameter was changed", where, hint));
  const LoadPlan plan = plan_parameter_load(module.named_parameters(), data.tensors, options, where);
  apply_plan(plan);
  return data.metadata;
}

// ---- checkpoints ----

void save_checkpoint(const std::string& path, const Module& module, const Optimizer& optimizer, const Metadata& metadata) {
  Metadata meta = metadata;
  for (const char* key : {"format", "optimizer"})
    if (meta.count(key)) throw CheckpointError(fmt::format("save_checkpoint: metadata key '{}' is reserved", key));
  meta = detail::describe_file("save_checkpoint", module, meta, "headgrad");
  meta["format"] = kFormat;
  meta["optimizer"] = optimizer.name();
  NamedTensors tensors;
  for (const auto& [name, p] : module.named_parameters()) tensors.emplace_back("model." + name, p.detach());
  for (auto& [name, t] : optimizer.state_dict()) tensors.emplace_back("optimizer." + name, t);
  detail::write_safetensors("save_checkpoint", path, tensors, meta);
}

Metadata load_checkpoint(const std::string& path, Module& module, Optimizer& optimizer) {
  const std::string where = fmt::format("load_checkpoint: {}", path);
  SafetensorsData data = load_safetensors(path);
  check_checkpoint_metadata(data, module, optimizer, where);
  const auto [model_part, optimizer_part] = split_checkpoint(data.tensors, where);
  const LoadPlan plan = plan_parameter_load(module.named_parameters(), model_part, LoadOptions{}, where, "model.");
  check_optimizer_state(optimizer, optimizer_part, where);
  // Everything is checked. The optimizer first: it copies the state (allocating) before it
  // replaces its own; the parameters' copy allocates nothing.
  optimizer.load_state_dict(optimizer_part);
  apply_plan(plan);
  return data.metadata;
}

}  // namespace nn
