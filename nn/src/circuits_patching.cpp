// nn::circuits::z_patching_sweep: activation patching of every layer's z on a TransformerLM,
// with each patched forward starting at the patched layer and recomputing only the rows the
// patch can reach (TransformerBlock::forward_rows, a decode with a key-value cache).
#include <cmath>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>

#include "nn/circuits.hpp"

namespace nn::circuits {

namespace {

constexpr std::string_view kOp = "z_patching_sweep";

using Metric = std::function<ag::Tensor(const ag::Tensor&)>;

// One run of the model through forward_rows, every layer's input, keys, values and z kept.
struct Run {
  std::vector<ag::Tensor> x;        // x[l]: block l's input (B, T, E); x[L]: the last block's output
  std::vector<ag::Tensor> k, v, z;  // per layer (B, T, E), heads side by side
  ag::Tensor logits;                // (B, T, V), or (B, 1, V) for a metric that reads the last position
};

Run full_run(const TransformerLM& model, const ag::Tensor& tokens, bool last_only, std::string_view which) {
  const std::int64_t L = model.config().n_layers, T = tokens.size(1);
  Run r;
  try {
    r.x.push_back(model.residual_at(tokens, 0));
  } catch (const std::invalid_argument& e) {  // say which input it was
    ag::fail(kOp, "the {} tokens: {}", which, e.what());
  }
  for (std::int64_t l = 0; l < L; ++l) {
    TransformerBlock::Rows rows = model.block(l).forward_rows(r.x.back(), {}, {}, T);
    r.x.push_back(rows.output);
    r.k.push_back(std::move(rows.keys));
    r.v.push_back(std::move(rows.values));
    r.z.push_back(std::move(rows.z));
  }
  r.logits = model.unembed(last_only ? ag::narrow(r.x.back(), 1, T - 1, 1) : r.x.back());
  return r;
}

// n copies of t (B, ...) one after another along the batch: (n·B, ...).
ag::Tensor repeat_batch(const ag::Tensor& t, std::int64_t n) {
  ag::Shape shape = t.shape(), big = t.shape();
  shape.insert(shape.begin(), 1);
  big.insert(big.begin(), n);
  ag::Shape flat = t.shape();
  flat[0] *= n;
  return ag::reshape(ag::expand(ag::reshape(t, shape), big), flat);
}

// Rows start .. start+length-1 (dim 1) of t (B, T, .), n copies along the batch (n·B, length, .);
// an undefined tensor when there are no rows.
ag::Tensor rows_of(const ag::Tensor& t, std::int64_t start, std::int64_t length, std::int64_t n = 1) {
  if (length == 0) return {};
  const ag::Tensor rows = start == 0 && length == t.size(1) ? t : ag::narrow(t, 1, start, length);
  return n == 1 ? rows : repeat_batch(rows, n);
}

// The corrupted z rows (B, R, E) with head h's columns from the clean ones, for h = 0 .. H-1,
// one after another along the batch: (H·B, R, E).
ag::Tensor patched_heads(const ag::Tensor& corrupted, const ag::Tensor& clean, std::int64_t H) {
  const std::int64_t E = corrupted.size(2), d = E / H;
  std::vector<ag::Tensor> each;
  for (std::int64_t h = 0; h < H; ++h) {
    std::vector<ag::Tensor> parts;
    if (h > 0) parts.push_back(ag::narrow(corrupted, 2, 0, h * d));
    parts.push_back(ag::narrow(clean, 2, h * d, d));
    if (h < H - 1) parts.push_back(ag::narrow(corrupted, 2, (h + 1) * d, E - (h + 1) * d));
    each.push_back(ag::cat(parts, 2));
  }
  return ag::cat(each, 0);
}

double metric_value(const Metric& metric, const ag::Tensor& logits, const std::string& what, bool last_only) {
  ag::Tensor m;
  try {
    m = metric(logits);
  } catch (const std::invalid_argument& e) {  // say which logits the metric was given
    ag::fail(kOp, "the metric threw on the logits of {}, shape {}{}: {}", what, ag::shape_str(logits.shape()),
             last_only ? " (MetricReads::LastPosition: the last position only, read it as row -1)" : "", e.what());
  }
  if (!m.defined() || m.numel() != 1)
    ag::fail(kOp, "the metric must return one element, got {} from {}",
             m.defined() ? ag::shape_str(m.shape()) : std::string("an undefined tensor"), what);
  const double value = m.to(ag::Dtype::Float64).item();
  if (!std::isfinite(value)) ag::fail(kOp, "the metric of {} is not finite: {}", what, value);
  return value;
}

}  // namespace

std::vector<study::PatchingResult> z_patching_sweep(const TransformerLM& model, const Metric& metric,
                                                   const ag::Tensor& clean_tokens, const ag::Tensor& corrupted_tokens,
                                                   const ZPatchingOptions& options) {
  if (!metric) ag::fail(kOp, "the metric is an empty function");
  if (options.reads != MetricReads::AllPositions && options.reads != MetricReads::LastPosition)
    ag::fail(kOp, "unknown MetricReads {}", static_cast<int>(options.reads));
  if (!clean_tokens.defined() || !corrupted_tokens.defined() || clean_tokens.dim() != 2 ||
      clean_tokens.shape() != corrupted_tokens.shape())
    ag::fail(kOp, "clean and corrupted tokens must be (B, T) of one shape, got {} and {}",
             clean_tokens.defined() ? ag::shape_str(clean_tokens.shape()) : "undefined",
             corrupted_tokens.defined() ? ag::shape_str(corrupted_tokens.shape()) : "undefined");
  if (model.hook_count() != 0)
    ag::fail(kOp, "the model has {} hook(s); this sweep's partial forwards skip hook points, so remove them first (or "
             "use study::activation_patching)", model.hook_count());
  ag::NoGradGuard no_grad;
  const bool last_only = options.reads == MetricReads::LastPosition;
  const std::int64_t L = model.config().n_layers, H = model.config().n_heads;
  const std::int64_t B = clean_tokens.size(0), T = clean_tokens.size(1);
  const Run clean = full_run(model, clean_tokens, last_only, "clean");
  const Run corrupted = full_run(model, corrupted_tokens, last_only, "corrupted");
  study::PatchingResult base;
  // The metric gets copies: it may write to its logits, and the cached rows are pasted into patches.
  base.clean_metric = metric_value(metric, clean.logits.clone(), "the clean run", last_only);
  base.corrupted_metric = metric_value(metric, corrupted.logits.clone(), "the corrupted run", last_only);

  // The metric of each head's patch: logits (H·B, ., V), head h's batch h·B .. (h+1)·B - 1.
  const auto per_head = [&](const ag::Tensor& logits, const std::string& what) {
    std::vector<double> m;
    for (std::int64_t h = 0; h < H; ++h)
      m.push_back(metric_value(metric, ag::narrow(logits, 0, h * B, B), fmt::format("{} (head {})", what, h), last_only));
    return m;
  };
  // Blocks from .. L-1 on residual rows p .. T-1 (H·B, T-p, E) whose rows before p are the
  // corrupted run's, then the logits the metric reads.
  const auto finish = [&](ag::Tensor rows, std::int64_t from, std::int64_t p) {
    for (std::int64_t m = from; m < L; ++m) {
      const std::int64_t queries = last_only && m == L - 1 ? 1 : T - p;
      rows = model.block(m)
                 .forward_rows(rows, rows_of(corrupted.k[static_cast<std::size_t>(m)], 0, p, H),
                               rows_of(corrupted.v[static_cast<std::size_t>(m)], 0, p, H), queries)
                 .output;
    }
    if (last_only) return model.unembed(ag::narrow(rows, 1, rows.size(1) - 1, 1));
    const ag::Tensor logits = model.unembed(rows);
    return p > 0 ? ag::cat({rows_of(corrupted.logits, 0, p, H), logits}, 1) : logits;
  };

  std::vector<study::PatchingResult> result;
  for (std::int64_t l = 0; l < L; ++l) {
    const auto li = static_cast<std::size_t>(l);
    const TransformerBlock& block = model.block(l);
    const MultiHeadAttention& attn = block.attn();
    const auto layer_out = [&](const ag::Tensor& x, const ag::Tensor& z) {
      return block.after_attention(x, ag::linear(z, attn.W_O(), attn.b_O()));
    };
    study::PatchingResult r = base;
    // Every position: the layer's output rows change everywhere (only the last one is read when
    // this is the last layer and the metric reads the last position).
    {
      const std::int64_t p = last_only && l == L - 1 ? T - 1 : 0;
      const ag::Tensor z = patched_heads(rows_of(corrupted.z[li], p, T - p), rows_of(clean.z[li], p, T - p), H);
      const ag::Tensor rows = layer_out(rows_of(corrupted.x[li], p, T - p, H), z);
      r.per_head = per_head(finish(rows, l + 1, p), fmt::format("layer {}'s z patched", l));
    }
    if (options.per_position) {
      r.per_head_position.assign(static_cast<std::size_t>(H), std::vector<double>(static_cast<std::size_t>(T)));
      for (std::int64_t p = 0; p < T; ++p) {
        std::vector<double> m;
        if (last_only && l == L - 1 && p < T - 1) {
          m.assign(static_cast<std::size_t>(H), base.corrupted_metric);  // the last position does not see row p
        } else {
          const ag::Tensor z = patched_heads(rows_of(corrupted.z[li], p, 1), rows_of(clean.z[li], p, 1), H);
          ag::Tensor rows = layer_out(rows_of(corrupted.x[li], p, 1, H), z);  // (H·B, 1, E)
          if (p + 1 < T) rows = ag::cat({rows, rows_of(corrupted.x[li + 1], p + 1, T - p - 1, H)}, 1);
          m = per_head(finish(rows, l + 1, p), fmt::format("layer {}'s z patched at position {}", l, p));
        }
        for (std::int64_t h = 0; h < H; ++h)
          r.per_head_position[static_cast<std::size_t>(h)][static_cast<std::size_t>(p)] = m[static_cast<std::size_t>(h)];
      }
    }
    result.push_back(std::move(r));
  }
  return result;
}

}  // namespace nn::circuits
