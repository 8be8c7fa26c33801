// Which torch.nn module each headgrad module is, and where its parameters go in that module's
// state_dict (nn/torch_state_dict.hpp).
#include "torch_state_dict_layout.hpp"

#include <algorithm>
#include <map>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "nn/checkpoint.hpp"
#include "nn/layers.hpp"
#include "nn/linear.hpp"
#include "nn/multihead_attention.hpp"

namespace nn::detail {

namespace {

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

std::string describe_path(const std::string& path) { return path.empty() ? "the root module" : "module " + quote_name(path); }

// Walks a module tree, giving each module's parameters their torch keys. `key` is the torch
// prefix of the module (dotted, "" for the root), `path` its headgrad dotted name.
class LayoutWalker {
 public:
  explicit LayoutWalker(std::string op) : op_(std::move(op)) {}

  void walk(const Module& m, const std::string& key, const std::string& path) {
    std::vector<std::string> consumed;  // children mapped here under torch's names
    if (const auto* l = dynamic_cast<const Linear*>(&m)) {
      linear(*l, key, path);
    } else if (const auto* e = dynamic_cast<const Embedding*>(&m)) {
      add(key, "weight", e->weight().shape(), {{e->weight(), join(path, "weight"), false}});
    } else if (const auto* n = dynamic_cast<const LayerNorm*>(&m)) {
      layer_norm(*n, key, path);
    } else if (const auto* a = dynamic_cast<const MultiHeadAttention*>(&m)) {
      attention(*a, key, path);
    } else if (const auto* b = dynamic_cast<const TransformerBlock*>(&m)) {
      block(*b, key, path);
      consumed = {"ln_1", "attn", "ln_2", "fc_1", "fc_2"};
    }
    check_own_parameters(m, path);
    for (const auto& [name, child] : m.named_children())
      if (std::find(consumed.begin(), consumed.end(), name) == consumed.end())
        walk(*child, join(key, name), join(path, name));
  }

  std::vector<TorchTensor> take() { return std::move(out_); }

 private:
  void add(const std::string& key, const std::string& name, ag::Shape shape, std::vector<TorchPart> parts) {
    for (const auto& part : parts) placed_.insert(part.param.impl().get());
    out_.push_back({join(key, name), std::move(shape), std::move(parts)});
  }

  // nn.Linear: weight (out, in), bias (out).
  void linear(const Linear& l, const std::string& key, const std::string& path) {
    add(key, "weight", {l.out_features(), l.in_features()}, {{l.weight(), join(path, "weight"), true}});
    if (l.bias().defined()) add(key, "bias", {l.out_features()}, {{l.bias(), join(path, "bias"), false}});
  }

  void layer_norm(const LayerNorm& n, const std::string& key, const std::string& path) {
    if (n.weight().defined()) add(key, "weight", n.weight().shape(), {{n.weight(), join(path, "weight"), false}});
    if (n.bias().defined()) add(key, "bias", n.bias().shape(), {{n.bias(), join(path, "bias"), false}});
  }

  // nn.MultiheadAttention: in_proj_weight (3E, E) = [W_Qᵀ; W_Kᵀ; W_Vᵀ], or q/k/v_proj_weight when
  // kdim or vdim differ from E; in_proj_bias (3E); bias_k, bias_v (1, 1, E); out_proj (a Linear).
  void attention(const MultiHeadAttention& a, const std::string& key, const std::string& path) {
    const std::int64_t E = a.embed_dim();
    auto part = [&](const ag::Tensor& t, const char* name, bool transpose) {
      return TorchPart{t, join(path, name), transpose};
    };
    if (a.kdim() == E && a.vdim() == E) {
      add(key, "in_proj_weight", {3 * E, E}, {part(a.W_Q(), "W_Q", true), part(a.W_K(), "W_K", true),
                                              part(a.W_V(), "W_V", true)});
    } else {
      add(key, "q_proj_weight", {E, E}, {part(a.W_Q(), "W_Q", true)});
      add(key, "k_proj_weight", {E, a.kdim()}, {part(a.W_K(), "W_K", true)});
      add(key, "v_proj_weight", {E, a.vdim()}, {part(a.W_V(), "W_V", true)});
    }
    if (a.b_Q().defined())
      add(key, "in_proj_bias", {3 * E}, {part(a.b_Q(), "b_Q", false), part(a.b_K(), "b_K", false),
                                         part(a.b_V(), "b_V", false)});
    if (a.bias_k().defined()) {
      add(key, "bias_k", {1, 1, E}, {part(a.bias_k(), "bias_k", false)});
      add(key, "bias_v", {1, 1, E}, {part(a.bias_v(), "bias_v", false)});
    }
    add(key, "out_proj.weight", {E, E}, {part(a.W_O(), "W_O", true)});
    if (a.b_O().defined()) add(key, "out_proj.bias", {E}, {part(a.b_O(), "b_O", false)});
  }

  // nn.TransformerEncoderLayer(norm_first=True, batch_first=True): self_attn, linear1, linear2,
  // norm1, norm2. Blocks without biases are not mapped (the layout of torch's bias=False layer is
  // not checked against PyTorch here), nor blocks with biases whose LayerNorms have none: torch's
  // bias=True layer always has norm1.bias and norm2.bias, so its strict load_state_dict would
  // refuse a state_dict without them.
  void block(const TransformerBlock& b, const std::string& key, const std::string& path) {
    const auto other_form = [&](const char* what) {
      return CheckpointError(fmt::format(
          "{}: {} (TransformerBlock) {}, which torch's nn.TransformerEncoderLayer cannot express; a TransformerLM "
          "made of such blocks exports to TransformerLens's layout (save_transformer_lens_state_dict)",
          op_, describe_path(path), what));
    };
    if (!b.has_mlp()) throw other_form("is attention-only");
    if (b.options().normalization == Normalization::None) throw other_form("has no LayerNorm");
    if (b.options().gelu && b.options().gelu_tanh) throw other_form("uses GELU's tanh approximation");
    if (!b.options().bias)
      throw CheckpointError(fmt::format(
          "{}: {} (TransformerBlock) has bias=false; only blocks with biases are written in the layout of "
          "torch's nn.TransformerEncoderLayer",
          op_, describe_path(path)));
    if (!b.ln_1().bias().defined() || !b.ln_2().bias().defined())
      throw CheckpointError(fmt::format(
          "{}: {} (TransformerBlock) has bias=true but layer_norm_bias=false: torch's "
          "nn.TransformerEncoderLayer(bias=True) has norm1.bias and norm2.bias, which this block lacks, so "
          "PyTorch's load_state_dict(strict=True) would refuse its state_dict",
          op_, describe_path(path)));
    attention(b.attn(), join(key, "self_attn"), join(path, "attn"));
    linear(b.fc_1(), join(key, "linear1"), join(path, "fc_1"));
    linear(b.fc_2(), join(key, "linear2"), join(path, "fc_2"));
    layer_norm(b.ln_1(), join(key, "norm1"), join(path, "ln_1"));
    layer_norm(b.ln_2(), join(key, "norm2"), join(path, "ln_2"));
    check_own_parameters(b.attn(), join(path, "attn"));
    check_own_parameters(b.fc_1(), join(path, "fc_1"));
    check_own_parameters(b.fc_2(), join(path, "fc_2"));
    check_own_parameters(b.ln_1(), join(path, "ln_1"));
    check_own_parameters(b.ln_2(), join(path, "ln_2"));
  }

  // Every parameter a module holds itself went into some torch key; one that did not has no
  // place in the torch module (or the module has no torch equivalent at all).
  void check_own_parameters(const Module& m, const std::string& path) {
    std::vector<std::string> left;
    for (const auto& [name, p] : m.named_parameters(false, false))
      if (!placed_.count(p.impl().get())) left.push_back(quote_name(name));
    if (left.empty()) return;
    std::string names;
    for (const auto& n : left) names += (names.empty() ? "" : ", ") + n;
    throw CheckpointError(fmt::format(
        "{}: {} ({}) holds parameters {} that no torch.nn module of its kind has: a torch state_dict maps "
        "Linear, Embedding, LayerNorm, MultiHeadAttention, TransformerBlock and modules that only contain "
        "those (save this model with save_parameters instead)",
        op_, describe_path(path), m.type_name(), names));
  }

  std::string op_;
  std::vector<TorchTensor> out_;
  std::unordered_set<const void*> placed_;  // the parameters given a key so far
};

// The parts' common dtype (a module's parameters share one unless they were changed one by one).
ag::Dtype parts_dtype(const TorchTensor& entry) {
  const ag::Dtype d = entry.parts.front().param.dtype();
  for (const auto& part : entry.parts)
    if (part.param.dtype() != d)
      throw CheckpointError(fmt::format("torch key {}: its parts {} and {} have different dtypes ({} and {})",
                                        quote_name(entry.key), quote_name(entry.parts.front().name), quote_name(part.name),
                                        ag::dtype_name(d), ag::dtype_name(part.param.dtype())));
  return d;
}

}  // namespace

std::vector<TorchTensor> torch_layout(const Module& module, const std::string& op) {
  LayoutWalker walker(op);
  walker.walk(module, "", "");
  return walker.take();
}

ag::Tensor torch_value(const TorchTensor& entry) {
  const ag::Dtype dtype = parts_dtype(entry);
  std::vector<double> values;
  for (const auto& part : entry.parts) {
    const std::vector<double> v = part.param.to_vector();
    if (!part.transpose) {
      values.insert(values.end(), v.begin(), v.end());
      continue;
    }
    const auto rows = static_cast<std::size_t>(part.param.size(0)), cols = static_cast<std::size_t>(part.param.size(1));
    for (std::size_t j = 0; j < cols; ++j)
      for (std::size_t i = 0; i < rows; ++i) values.push_back(v[i * cols + j]);
  }
  return ag::tensor(values, entry.shape, dtype);
}

std::vector<ag::Tensor> split_torch_value(const TorchTensor& entry, const ag::Tensor& stored) {
  const std::vector<double> v = stored.to_vector();
  std::vector<ag::Tensor> out;
  std::size_t offset = 0;
  for (const auto& part : entry.parts) {
    const auto n = static_cast<std::size_t>(part.param.numel());
    std::vector<double> values(v.begin() + static_cast<std::ptrdiff_t>(offset),
                               v.begin() + static_cast<std::ptrdiff_t>(offset + n));
    if (part.transpose) {  // the block is (cols, rows) in the file; the parameter (rows, cols)
      const auto rows = static_cast<std::size_t>(part.param.size(0)), cols = static_cast<std::size_t>(part.param.size(1));
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) values[i * cols + j] = v[offset + j * rows + i];
    }
    out.push_back(ag::tensor(values, part.param.shape(), part.param.dtype()));
    offset += n;
  }
  return out;
}

bool matches_torch_layout(const Module& module, const NamedTensors& tensors) {
  std::vector<TorchTensor> layout;
  try {
    layout = torch_layout(module, "");
  } catch (const CheckpointError&) {
    return false;
  }
  if (layout.empty() || layout.size() != tensors.size()) return false;
  std::map<std::string_view, const ag::Shape*> shapes;
  for (const auto& e : layout) shapes.emplace(e.key, &e.shape);
  for (const auto& [name, t] : tensors) {
    const auto it = shapes.find(name);
    if (it == shapes.end() || *it->second != t.shape()) return false;
  }
  return true;
}

}  // namespace nn::detail
