// nn::per_example_gradients (nn/per_example.hpp): the capture, the outer-product forms, the
// checks, and the fallback of B backwards.
#include "nn/per_example.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "per_example_capture.hpp"

namespace nn {

namespace detail {

thread_local PerExampleCapture* per_example_capture = nullptr;

namespace {
bool wanted(const ag::Tensor& y, const ag::Tensor& weight, const ag::Tensor& bias) {
  return y.defined() && y.requires_grad() &&
         ((weight.defined() && weight.requires_grad()) || (bias.defined() && bias.requires_grad()));
}
}  // namespace

void record_linear(const ag::Tensor& x, const ag::Tensor& y, const ag::Tensor& weight, const ag::Tensor& bias,
                   std::int64_t column) {
  if (per_example_capture == nullptr || !wanted(y, weight, bias)) return;
  per_example_capture->uses.push_back({UseKind::Linear, x.detach(), y, weight, bias, column, 0, 0.0});
}

void record_embedding(const ag::Tensor& indices, const ag::Tensor& y, const ag::Tensor& weight) {
  if (per_example_capture == nullptr || !wanted(y, weight, ag::Tensor())) return;
  per_example_capture->uses.push_back({UseKind::Embedding, indices.detach(), y, weight, {}, 0, 0, 0.0});
}

void record_layer_norm(const ag::Tensor& x, const ag::Tensor& y, const ag::Tensor& weight, const ag::Tensor& bias,
                       std::int64_t normalized_dims, double eps) {
  if (per_example_capture == nullptr || !wanted(y, weight, bias)) return;
  per_example_capture->uses.push_back({UseKind::LayerNorm, x.detach(), y, weight, bias, 0, normalized_dims, eps});
}

}  // namespace detail

namespace {

constexpr const char* kOp = "per_example_gradients";

using detail::ParameterUse;
using detail::UseKind;

// Restores the previous capture (a nested call) also when the user's function throws.
struct CaptureScope {
  detail::PerExampleCapture* previous;
  explicit CaptureScope(detail::PerExampleCapture* capture) : previous(detail::per_example_capture) {
    detail::per_example_capture = capture;
  }
  ~CaptureScope() { detail::per_example_capture = previous; }
  CaptureScope(const CaptureScope&) = delete;
  CaptureScope& operator=(const CaptureScope&) = delete;
};


double tolerance(ag::Dtype dtype) { return dtype == ag::Dtype::Float64 ? 1e-9 : 1e-3; }

template <class T>
double max_abs_t(const ag::Tensor& t) {
  const T* p = t.data<T>();
  double m = 0.0;
  for (std::int64_t i = 0, n = t.numel(); i < n; ++i) m = std::max(m, std::abs(static_cast<double>(p[i])));
  return m;
}
double max_abs(const ag::Tensor& t) {
  if (!t.defined()) return 0.0;
  return t.dtype() == ag::Dtype::Float64 ? max_abs_t<double>(t) : max_abs_t<float>(t);
}

// The independence check at one output: weighted (seeded with c) = c_b · plain (seeded with ones), row by row
// (Eigen arrays, so that the maxima vectorise).
template <class T>
bool rows_scale_t(const ag::Tensor& weighted, const ag::Tensor& plain, const std::vector<double>& c) {
  using Row = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;
  const auto B = static_cast<std::int64_t>(c.size());
  const std::int64_t row = plain.numel() / B;
  double diff = 0.0, scale = 0.0;
  for (std::int64_t b = 0; b < B; ++b) {
    const Row w(weighted.data<T>() + b * row, row), p(plain.data<T>() + b * row, row);
    const T cb = static_cast<T>(c[static_cast<std::size_t>(b)]);
    diff = std::max(diff, static_cast<double>((w - cb * p).abs().maxCoeff()));
    scale = std::max(scale, static_cast<double>(w.abs().maxCoeff()));
  }
  return !(diff > tolerance(plain.dtype()) * std::max(scale, 1e-300));
}
bool rows_scale(const ag::Tensor& weighted, const ag::Tensor& plain, const std::vector<double>& c) {
  if (!weighted.defined() || !plain.defined()) return max_abs(weighted) == 0.0 && max_abs(plain) == 0.0;
  return plain.dtype() == ag::Dtype::Float64 ? rows_scale_t<double>(weighted, plain, c)
                                             : rows_scale_t<float>(weighted, plain, c);
}

// Embedding: gW[b] = Σ_t e_{idx[b,t]} gy[b,t]ᵀ, the rows of gy added into the rows the indices name.
template <class T>
ag::Tensor embedding_grads(const ag::Tensor& indices, const ag::Tensor& gy, std::int64_t B, const ag::Shape& w_shape) {
  const std::int64_t V = w_shape[0], D = w_shape[1];
  ag::Tensor out = ag::zeros({B, V, D}, gy.dtype());  // (B, V, D)
  const std::vector<double> idx = indices.to_vector();
  const std::int64_t R = static_cast<std::int64_t>(idx.size()) / B;
  const T* g = gy.data<T>();  // (B, R, D)
  T* o = out.data<T>();
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t r = 0; r < R; ++r) {
      const auto v = static_cast<std::int64_t>(idx[static_cast<std::size_t>(b * R + r)]);
      T* dst = o + (b * V + v) * D;
      const T* src = g + (b * R + r) * D;
      for (std::int64_t d = 0; d < D; ++d) dst[d] += src[d];
    }
  return out;
}

// LayerNorm: x̂ = (x − mean) / √(var + eps) per row of N; gw[b] = Σ_rows gy · x̂, gb[b] = Σ_rows gy.
template <class T>
std::pair<ag::Tensor, ag::Tensor> layer_norm_grads(const ag::Tensor& x, const ag::Tensor& gy, std::int64_t B,
                                                   std::int64_t N, double eps) {
  ag::Tensor gw = ag::zeros({B, N}, gy.dtype()), gb = ag::zeros({B, N}, gy.dtype());
  const std::int64_t R = x.numel() / (B * N);
  const T* px = x.data<T>();
  const T* pg = gy.data<T>();
  T* w = gw.data<T>();
  T* bb = gb.data<T>();
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t r = 0; r < R; ++r) {
      const T* xr = px + (b * R + r) * N;
      const T* gr = pg + (b * R + r) * N;
      double mean = 0.0;
      for (std::int64_t j = 0; j < N; ++j) mean += static_cast<double>(xr[j]);
      mean /= static_cast<double>(N);
      double var = 0.0;
      for (std::int64_t j = 0; j < N; ++j) var += (static_cast<double>(xr[j]) - mean) * (static_cast<double>(xr[j]) - mean);
      const double inv = 1.0 / std::sqrt(var / static_cast<double>(N) + eps);
      for (std::int64_t j = 0; j < N; ++j) {
        w[b * N + j] += static_cast<T>(static_cast<double>(gr[j]) * (static_cast<double>(xr[j]) - mean) * inv);
        bb[b * N + j] += gr[j];
      }
    }
  return {gw, gb};
}

// x (B, R, C) -> (B, C, R), one Eigen transpose per example.
template <class T>
ag::Tensor transpose_rows(const ag::Tensor& x3) {
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const std::int64_t B = x3.size(0), R = x3.size(1), C = x3.size(2);
  ag::Tensor out = ag::zeros({B, C, R}, x3.dtype());
  for (std::int64_t b = 0; b < B; ++b)
    Eigen::Map<Mat>(out.data<T>() + b * R * C, C, R) = Eigen::Map<const Mat>(x3.data<T>() + b * R * C, R, C).transpose();
  return out;
}

ag::Shape batched(std::int64_t B, const ag::Shape& shape) {
  ag::Shape s;
  s.push_back(B);
  for (auto d : shape) s.push_back(d);
  return s;
}

// Why a recorded use cannot give per-example gradients (empty: it can).
std::string unusable(const ParameterUse& u, std::int64_t B) {
  const auto shapes = [&] { return fmt::format("input {}, output {}", ag::shape_str(u.x.shape()), ag::shape_str(u.y.shape())); };
  if (u.x.dim() < 1 || u.y.dim() < 1 || u.x.size(0) != B || u.y.size(0) != B)
    return fmt::format("its layer ran on a tensor whose first dimension is not the batch's {} ({})", B, shapes());
  if (u.kind == UseKind::Linear && u.x.dim() < 2)
    return fmt::format("its layer ran on an unbatched input ({})", shapes());
  if (u.kind == UseKind::LayerNorm && u.x.dim() <= u.normalized_dims)
    return fmt::format("its LayerNorm ran on an unbatched input ({})", shapes());
  return {};
}

// The graph behind `losses`, walked once: its nodes, and for each leaf (by its impl) the nodes
// that take it as an input directly, once per edge into its AccumulateGrad.
struct GraphUses {
  std::unordered_map<const ag::TensorImpl*, std::vector<const ag::Node*>> consumers;
  std::unordered_set<const ag::Node*> seen;
};
GraphUses graph_uses(const ag::Tensor& losses) {
  GraphUses uses;
  auto& [consumers, seen] = uses;
  std::vector<const ag::Node*> stack;
  if (const ag::Edge root = ag::gradient_edge(losses); root.valid() && !root.node->accumulates_into_leaf())
    stack.push_back(root.node.get());
  while (!stack.empty()) {
    const ag::Node* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) continue;
    for (const ag::Edge& e : n->next_edges) {
      if (!e.valid()) continue;
      if (e.node->accumulates_into_leaf()) {
        // One entry per edge: a node that takes the leaf twice (a layer run on its own weight) is listed twice.
        consumers[static_cast<const ag::AccumulateGrad&>(*e.node).leaf().get()].push_back(n);
      } else if (!seen.contains(e.node.get())) {
        stack.push_back(e.node.get());
      }
    }
  }
  return uses;
}

struct ParamState {
  std::string name;
  ag::Tensor param;
  std::vector<std::size_t> uses;
  std::string reason;  // non-empty: the fallback, and why
  ag::Tensor fast;     // (B, *shape) summed over the uses
};

}  // namespace

const ag::Tensor& PerExampleGrads::operator[](const std::string& name) const {
  for (const auto& [n, t] : grads)
    if (n == name) return t;
  std::string names;
  for (const auto& [n, t] : grads) names += (names.empty() ? "" : ", ") + quote_name(n);
  ag::fail("PerExampleGrads", "no parameter named {}; there are: {}", quote_name(name), names);
}

bool PerExampleGrads::took_fallback(const std::string& name) const {
  (void)(*this)[name];
  return std::any_of(fallback.begin(), fallback.end(), [&](const Fallback& f) { return f.name == name; });
}

PerExampleGrads per_example_gradients(Module& model, const ag::Tensor& batch, const PerExampleLoss& loss_fn,
                                      const PerExampleOptions& options) {
  // ---- check ----
  if (!batch.defined()) ag::fail(kOp, "the batch is undefined");
  if (batch.dim() < 1 || batch.size(0) < 1)
    ag::fail(kOp, "the batch of shape {} has no first (batch) dimension of at least one example",
             ag::shape_str(batch.shape()));
  if (!loss_fn) ag::fail(kOp, "the loss function is empty");
  const std::int64_t B = batch.size(0);
  std::vector<ParamState> params;
  for (auto& [name, t] : model.named_parameters())
    if (t.requires_grad()) params.push_back({name, t, {}, {}, {}});
  if (params.empty())
    ag::fail(kOp, "the model ({}) has no parameter that requires grad", model.type_name());

  // ---- forward, recording the layers' uses ----
  detail::PerExampleCapture capture;
  ag::Tensor losses;
  {
    const ag::EnableGradGuard grad_on;
    const CaptureScope scope(options.method == PerExampleMethod::Auto ? &capture : nullptr);
    losses = loss_fn(batch);
  }
  if (!losses.defined()) ag::fail(kOp, "the loss function returned an undefined tensor");
  if (!ag::is_floating(losses.dtype()))
    ag::fail(kOp, "the losses are {} of shape {}; expected Float32 or Float64", ag::dtype_name(losses.dtype()),
             ag::shape_str(losses.shape()));
  if (losses.dim() != 1 || losses.size(0) != B)
    ag::fail(kOp, "the losses have shape {}; expected [{}], one per example of the batch of shape {}",
             ag::shape_str(losses.shape()), B, ag::shape_str(batch.shape()));
  if (!losses.requires_grad())
    ag::fail(kOp, "the losses of shape {} do not depend on any parameter (no graph was recorded)",
             ag::shape_str(losses.shape()));

  std::unordered_map<const ag::TensorImpl*, std::size_t> index;
  for (std::size_t i = 0; i < params.size(); ++i) index.emplace(params[i].param.impl().get(), i);
  const auto owner = [&](const ag::Tensor& t) -> ParamState* {
    if (!t.defined()) return nullptr;
    auto it = index.find(t.impl().get());
    return it == index.end() ? nullptr : &params[it->second];
  };

  // ---- fast path ----
  const ag::Dtype loss_dtype = losses.dtype();
  if (options.method == PerExampleMethod::Auto) {
    for (std::size_t i = 0; i < capture.uses.size(); ++i) {
      const ParameterUse& u = capture.uses[i];
      const std::string why = unusable(u, B);
      for (ParamState* p : {owner(u.weight), owner(u.bias)}) {
        if (p == nullptr) continue;
        p->uses.push_back(i);
        if (!why.empty() && p->reason.empty()) p->reason = why;
      }
    }
    // A gradient hook on the parameter (register_hook) sees what reaches the parameter: the fast
    // path never forms that, so the hook would not run.
    for (ParamState& p : params)
      if (p.reason.empty() && !p.param.impl()->leaf_hooks.empty())
        p.reason = "it has a gradient hook (register_hook), which would see its batch gradient, not each example's";
    // The outputs whose gradients are needed, each once (linear_cat's three weights share one).
    std::vector<ag::Tensor> outputs;
    std::unordered_map<const ag::TensorImpl*, std::size_t> output_of;
    std::vector<std::size_t> use_output(capture.uses.size(), static_cast<std::size_t>(-1));
    for (std::size_t i = 0; i < capture.uses.size(); ++i) {
      const ParameterUse& u = capture.uses[i];
      const ParamState* pw = owner(u.weight);
      const ParamState* pb = owner(u.bias);
      if ((pw == nullptr || !pw->reason.empty()) && (pb == nullptr || !pb->reason.empty())) continue;
      auto [it, fresh] = output_of.emplace(u.y.impl().get(), outputs.size());
      if (fresh) outputs.push_back(u.y);
      use_output[i] = it->second;
    }
    for (ParamState& p : params)
      if (p.uses.empty()) p.reason = "no layer with a fast per-example form used it";

    if (!outputs.empty()) {
      const ag::TensorList g = ag::grad({losses}, ag::TensorList(outputs.begin(), outputs.end()),
                                        {.grad_outputs = {ag::ones({B}, loss_dtype)}, .retain_graph = true,
                                         .allow_unused = true});
      const ag::NoGradGuard no_grad;
      // Each layer input transposed once, (B, R, in) -> (B, in, R) (the three projections of a
      // self-attention share theirs).
      std::unordered_map<const ag::TensorImpl*, ag::Tensor> transposed;
      // Each use's share of its parameters' per-example gradients.
      for (std::size_t i = 0; i < capture.uses.size(); ++i) {
        if (use_output[i] == static_cast<std::size_t>(-1)) continue;
        const ParameterUse& u = capture.uses[i];
        const ag::Tensor& gy = g[use_output[i]];
        ParamState* pw = owner(u.weight);
        ParamState* pb = owner(u.bias);
        if (pw != nullptr && !pw->reason.empty()) pw = nullptr;
        if (pb != nullptr && !pb->reason.empty()) pb = nullptr;
        const auto add = [&](ParamState* p, const ag::Tensor& share) {
          if (p == nullptr) return;
          const ag::Tensor s = ag::reshape(share, batched(B, p->param.shape()));
          p->fast = p->fast.defined() ? ag::add(p->fast, s) : s;
        };
        if (!gy.defined()) {  // the losses do not reach this output: its share is zero
          for (ParamState* p : {pw, pb})
            if (p != nullptr && !p->fast.defined()) p->fast = ag::zeros(batched(B, p->param.shape()), p->param.dtype());
          continue;
        }
        if (u.kind == UseKind::Linear) {
          const std::int64_t in = u.x.size(-1), total = u.y.size(-1);
          const std::int64_t R = u.x.numel() / (B * in);
          ag::Tensor& xt = transposed[u.x.impl().get()];
          if (pw != nullptr && !xt.defined()) {
            const ag::Tensor x3 = ag::reshape(u.x, {B, R, in});  // (B, R, in)
            xt = x3.dtype() == ag::Dtype::Float64 ? transpose_rows<double>(x3) : transpose_rows<float>(x3);  // (B, in, R)
          }
          ag::Tensor gy3 = ag::reshape(gy, {B, R, total});      // (B, R, total)
          const std::int64_t width = u.weight.defined() ? u.weight.size(-1) : u.bias.size(0);
          if (u.column != 0 || width != total) gy3 = ag::narrow(gy3, 2, u.column, width);  // (B, R, out)
          if (pw != nullptr) add(pw, ag::matmul(xt, gy3));  // (B, in, R)·(B, R, out) = (B, in, out)
          if (pb != nullptr) add(pb, ag::sum(gy3, 1));                           // (B, out)
        } else if (u.kind == UseKind::Embedding) {
          const std::int64_t D = u.weight.size(1);
          const ag::Tensor gy3 = ag::reshape(gy, {B, -1, D});  // (B, R, D)
          add(pw, gy.dtype() == ag::Dtype::Float64 ? embedding_grads<double>(u.x, gy3, B, u.weight.shape())
                                                   : embedding_grads<float>(u.x, gy3, B, u.weight.shape()));
        } else {
          const ag::Tensor& shape_of = u.weight.defined() ? u.weight : u.bias;
          const std::int64_t N = shape_of.numel();
          const auto [gw, gb] = gy.dtype() == ag::Dtype::Float64 ? layer_norm_grads<double>(u.x, gy, B, N, u.eps)
                                                                 : layer_norm_grads<float>(u.x, gy, B, N, u.eps);
          add(pw, gw);
          add(pb, gb);
        }
      }
      if (options.verify) {
        // Independence: seeded with distinct weights c_b, each output's gradient is c_b · gy[b].
        std::vector<double> c(static_cast<std::size_t>(B));
        for (std::int64_t b = 0; b < B; ++b) c[static_cast<std::size_t>(b)] = 1.0 + std::fmod(0.6180339887 * static_cast<double>(b + 1), 1.0);
        if (!outputs.empty()) {
          const ag::Tensor seed = ag::tensor(c, {B}, loss_dtype);
          ag::TensorList gc;
          {
            const ag::EnableGradGuard grad_on;  // grad() as the first one ran, outside the NoGradGuard
            gc = ag::grad({losses}, ag::TensorList(outputs.begin(), outputs.end()),
                          {.grad_outputs = {seed}, .retain_graph = true, .allow_unused = true});
          }
          for (std::size_t i = 0; i < capture.uses.size(); ++i) {
            if (use_output[i] == static_cast<std::size_t>(-1)) continue;
            if (rows_scale(gc[use_output[i]], g[use_output[i]], c)) continue;
            const ParameterUse& u = capture.uses[i];
            for (ParamState* p : {owner(u.weight), owner(u.bias)})
              if (p != nullptr && p->reason.empty())
                p->reason = fmt::format("the gradient at its layer's output {} mixes examples (a layer or loss "
                                        "that couples the batch)", ag::shape_str(u.y.shape()));
          }
        }
      }
    }
    if (options.verify) {
      // Completeness, from the graph: each node takes the parameter as an input exactly as many
      // times as its recorded uses there name it (weight, bias), and every recorded use the losses
      // reach is such a node. A parameter the losses do not reach has a zero gradient for every example.
      const GraphUses graph = graph_uses(losses);
      for (ParamState& p : params) {
        const auto it = graph.consumers.find(p.param.impl().get());
        if (it == graph.consumers.end()) {
          p.reason.clear();
          p.fast = ag::zeros(batched(B, p.param.shape()), p.param.dtype());
          continue;
        }
        if (!p.reason.empty()) continue;
        // The edges the recorded uses account for: one per role (weight, bias) in each use's node.
        std::vector<const ag::Node*> use_nodes;
        for (const std::size_t i : p.uses) {
          const ParameterUse& u = capture.uses[i];
          const ag::Edge e = ag::gradient_edge(u.y);
          if (!e.valid()) continue;
          if (owner(u.weight) == &p) use_nodes.push_back(e.node.get());
          if (owner(u.bias) == &p) use_nodes.push_back(e.node.get());
        }
        const auto count = [](const std::vector<const ag::Node*>& list, const ag::Node* n) {
          return std::count(list.begin(), list.end(), n);
        };
        const bool outside = std::any_of(it->second.begin(), it->second.end(), [&](const ag::Node* n) {
          return count(it->second, n) != count(use_nodes, n);
        });
        const bool lost = std::any_of(p.uses.begin(), p.uses.end(), [&](std::size_t i) {
          const ag::Node* n = ag::gradient_edge(capture.uses[i].y).node.get();
          return graph.seen.contains(n) && count(it->second, n) == 0;
        });
        if (outside)
          p.reason = "it is also used outside the layers with a fast form (tied weights?): the graph takes it "
                     "as an input of another op, or of its layer's op in another place";
        else if (lost)
          p.reason = "a layer recorded it, but the op that made that layer's output does not take it as an input";
      }
    }
  } else {
    for (ParamState& p : params) p.reason = "PerExampleMethod::Fallback was asked for";
  }

  // ---- fallback: B backwards, the b-th seeded with e_b ----
  ag::TensorList slow;
  std::vector<ag::Tensor> slow_out;
  for (ParamState& p : params)
    if (!p.reason.empty()) {
      slow.push_back(p.param);
      p.fast = ag::zeros(batched(B, p.param.shape()), p.param.dtype());
      slow_out.push_back(p.fast);
    }
  if (!slow.empty()) {
    std::vector<double> e(static_cast<std::size_t>(B), 0.0);
    for (std::int64_t b = 0; b < B; ++b) {
      std::fill(e.begin(), e.end(), 0.0);
      e[static_cast<std::size_t>(b)] = 1.0;
      const ag::Tensor seed = ag::tensor(e, {B}, loss_dtype);
      const ag::TensorList g =
          ag::grad({losses}, slow, {.grad_outputs = {seed}, .retain_graph = true, .allow_unused = true});
      for (std::size_t k = 0; k < slow.size(); ++k) {
        if (!g[k].defined()) continue;
        const std::size_t bytes = static_cast<std::size_t>(g[k].numel()) * ag::dtype_size(g[k].dtype());
        std::memcpy(static_cast<char*>(slow_out[k].raw_data()) + static_cast<std::size_t>(b) * bytes,
                    g[k].raw_data(), bytes);
      }
    }
  }

  PerExampleGrads result;
  result.batch_size = B;
  for (ParamState& p : params) {
    result.grads.emplace_back(p.name, p.fast);
    if (p.reason.empty())
      result.fast.push_back(p.name);
    else
      result.fallback.push_back({p.name, p.reason});
  }
  return result;
}

}  // namespace nn
