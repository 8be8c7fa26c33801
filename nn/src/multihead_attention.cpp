#include "nn/multihead_attention.hpp"

#include <array>
#include <cmath>
#include <functional>
#include <mutex>
#include <stdexcept>

#include "nn/init.hpp"
#include "nn/study.hpp"
#include "parameter_budget.hpp"

namespace nn {

namespace {

constexpr std::string_view kOp = "MultiHeadAttention";
// The hook points, in the order the forward reaches them; "result" and "out" last.
constexpr std::size_t kConcatPoint = 7;
constexpr std::size_t kResultPoint = 8;
constexpr std::size_t kOutPoint = 9;
// What attention_path says for a hook on each point before out (which runs the Composed core).
constexpr std::array<std::string_view, kOutPoint> kHookReasons = {
    "hook on q", "hook on k", "hook on v", "hook on raw_scores", "hook on attn_scores",
    "hook on pattern", "hook on z", "hook on concat", "hook on result"};

// The first hooked point among q .. concat and result (those run on the Composed core), or kOutPoint.
std::size_t first_inner_hook(const HookPoints& points) {
  if (!points.any()) return kOutPoint;
  std::size_t i = 0;
  while (i < kOutPoint && !points.hooked(i)) ++i;
  return i;
}

// The parameter of this shape fits in memory's arithmetic: its element and byte counts are
// 64-bit numbers (a wrapped count would make a tiny buffer for a huge shape).
void check_size(std::string_view name, const ag::Shape& shape, ag::Dtype dtype) {
  try {
    ag::checked_mul(kOp, ag::checked_numel(kOp, shape), static_cast<std::int64_t>(ag::dtype_size(dtype)));
  } catch (const std::invalid_argument&) {
    ag::fail(kOp, "parameter {} of shape {} is too large: its size does not fit in 64 bits", name,
             ag::shape_str(shape));
  }
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(std::int64_t embed_dim, std::int64_t num_heads)
    : MultiHeadAttention(MultiHeadAttentionOptions{embed_dim, num_heads}) {}

MultiHeadAttention::MultiHeadAttention(const MultiHeadAttentionOptions& options)
    : MultiHeadAttention(options, ag::default_generator()) {}

MultiHeadAttention::MultiHeadAttention(const MultiHeadAttentionOptions& options, ag::Generator& gen)
    : Module("MultiHeadAttention"), options_(options) {
  declare_hook_points({"q", "k", "v", "raw_scores", "attn_scores", "pattern", "z", "concat", "result", "out"});
  const auto& o = options;
  if (o.embed_dim <= 0 || o.num_heads <= 0)
    ag::fail(kOp, "embed_dim and num_heads must be positive, got {} and {}", o.embed_dim, o.num_heads);
  if (o.embed_dim % o.num_heads != 0)
    ag::fail(kOp, "embed_dim {} is not divisible by num_heads {}", o.embed_dim, o.num_heads);
  if (o.kdim < 0 || o.vdim < 0) ag::fail(kOp, "kdim and vdim must be >= 0 (0 = embed_dim), got {} and {}", o.kdim, o.vdim);
  if (!(o.dropout >= 0.0 && o.dropout < 1.0)) ag::fail(kOp, "dropout must be in [0, 1), got {}", o.dropout);
  if (!ag::is_floating(o.dtype)) ag::fail(kOp, "dtype must be Float32 or Float64, got {}", ag::dtype_name(o.dtype));
  if (options_.kdim == 0) options_.kdim = o.embed_dim;
  if (options_.vdim == 0) options_.vdim = o.embed_dim;
  const std::int64_t E = o.embed_dim;
  check_size("W_Q", {E, E}, o.dtype);
  check_size("W_K", {options_.kdim, E}, o.dtype);
  check_size("W_V", {options_.vdim, E}, o.dtype);
  // Each parameter claimed (parameter_budget.hpp) just before it is allocated.
  auto add = [&](Parameter& p, const char* name, const ag::Shape& shape) {
    detail::claim_parameter(kOp, name, shape);
    p.bind(register_parameter(name, ag::zeros(shape, o.dtype)));
  };
  add(W_Q_, "W_Q", {E, E});
  add(W_K_, "W_K", {options_.kdim, E});
  add(W_V_, "W_V", {options_.vdim, E});
  add(W_O_, "W_O", {E, E});
  if (o.bias) {
    add(b_Q_, "b_Q", {E});
    add(b_K_, "b_K", {E});
    add(b_V_, "b_V", {E});
    add(b_O_, "b_O", {E});
  }
  if (o.add_bias_kv) {
    add(bias_k_, "bias_k", {E});
    add(bias_v_, "bias_v", {E});
  }
  reset_parameters(gen);
  dropout_gen_.manual_seed(gen.next_u64());
}

void MultiHeadAttention::reset_parameters(ag::Generator& gen) {
  const std::int64_t E = options_.embed_dim;
  if (options_.kdim == E && options_.vdim == E) {
    // PyTorch draws one (3E x E) in_proj block: fan_in + fan_out = E + 3E.
    const double a = std::sqrt(6.0 / static_cast<double>(4 * E));
    for (auto* W : {&W_Q_, &W_K_, &W_V_}) init::uniform_(*W, -a, a, gen);
  } else {
    for (auto* W : {&W_Q_, &W_K_, &W_V_}) init::xavier_uniform_(*W, gen);
  }
  init::kaiming_uniform_(W_O_, gen, std::sqrt(5.0));  // nn.Linear's default: U(-1/√E, 1/√E)
  for (auto* b : {&b_Q_, &b_K_, &b_V_, &b_O_})
    if (b->defined()) init::zeros_(*b);
  for (auto* b : {&bias_k_, &bias_v_})
    if (b->defined()) init::xavier_normal_(*b, gen);
}

void MultiHeadAttention::set_study(bool on) {
  options_.study = on;
  if (!on) {
    study_ = AttentionStudy{};
    has_study_ = false;
  }
}

const AttentionStudy& MultiHeadAttention::study() const {
  if (!options_.study) ag::fail(kOp, "study mode is off: call set_study(true) before forward");
  if (!has_study_) ag::fail(kOp, "no forward has run in study mode yet");
  return study_;
}

functional::MultiHeadAttentionWeights MultiHeadAttention::functional_weights() const {
  return {W_Q_, W_K_, W_V_, W_O_, b_Q_, b_K_, b_V_, b_O_, bias_k_, bias_v_};
}

ag::SdpaPath MultiHeadAttention::attention_path(const ag::Tensor& query, const ag::Tensor& key,
                                                const ag::Tensor& value, const AttentionOptions& ao) const {
  // The config forward would build, with stand-ins for the study and the hook callback (only
  // whether they are given matters here).
  functional::MultiHeadAttentionConfig config;
  config.num_heads = options_.num_heads;
  config.add_zero_attn = options_.add_zero_attn;
  config.dropout_p = is_training() ? options_.dropout : 0.0;
  config.core = options_.core;
  AttentionStudy study;
  config.study = options_.study ? &study : nullptr;
  const std::function<ag::Tensor(const char*, const ag::Tensor&)> on_point;
  const std::size_t hooked = first_inner_hook(hook_points());
  if (hooked < kOutPoint) config.hooks = &on_point;
  ag::SdpaPath path = functional::attention_path(query, key, value, functional_weights(), config, ao);
  if (config.hooks != nullptr && path.reason == "hooks") path.reason = kHookReasons[hooked];
  return path;
}

AttentionOutput MultiHeadAttention::forward(const ag::Tensor& query, const ag::Tensor& key,
                                            const ag::Tensor& value, const AttentionOptions& ao) {
  AttentionStudy study;
  functional::MultiHeadAttentionConfig config;
  config.num_heads = options_.num_heads;
  config.add_zero_attn = options_.add_zero_attn;
  config.dropout_p = is_training() ? options_.dropout : 0.0;
  config.dropout_generator = &dropout_gen_;
  // A call with dropout draws exactly one number from its generator. Forwards of this module may
  // run on several threads at once: the call gets a copy of the module's generator, which moves
  // past that draw under a lock, so no two calls draw the same number and the module's stream is
  // the one a single thread would draw.
  ag::Generator call_generator;
  if (config.dropout_p > 0.0) {
    static std::mutex dropout_draw;
    const std::lock_guard<std::mutex> lock(dropout_draw);
    call_generator = dropout_gen_;
    (void)dropout_gen_.next_u64();
    config.dropout_generator = &call_generator;
  }
  config.core = options_.core;
  config.study = options_.study ? &study : nullptr;
  // A hook on an attention-internal point (q .. concat, result) runs the layer on the composed core
  // with the callback; "result" and "out" are run here. No hook: neither (the fused path as it was).
  const HookPoints& points = hook_points();
  std::function<ag::Tensor(const char*, const ag::Tensor&)> on_point;
  ag::Tensor concat;  // the concat point's value after its hooks, when the result point needs it
  if (points.any()) {
    if (first_inner_hook(points) < kOutPoint) {
      on_point = [&points, &concat](const char* point, const ag::Tensor& v) {
        const std::size_t i = points.index(point);
        if (i == kOutPoint) return ag::Tensor();
        ag::Tensor r = points.run(i, v);
        if (i == kConcatPoint) concat = r.defined() ? r : v;
        return r;
      };
      config.hooks = &on_point;
    }
  }
  AttentionOutput result = functional::multi_head_attention_forward(query, key, value, functional_weights(), config, ao);
  const bool batched = query.dim() == 3;
  if (points.hooked(kResultPoint)) {
    // Each head's share z_h · W_O[h] (B, H, T, E); the output is their sum plus b_O (the same as
    // concat · W_O + b_O, to rounding), so a replaced head result changes the output.
    // From concat (after its hooks) back to per-head z (B, H, T, d_k), so every point before
    // stays on the output's path.
    const std::int64_t H = options_.num_heads, d_k = head_dim();
    const ag::Tensor z = ag::permute(ag::reshape(concat, {concat.size(0), concat.size(1), H, d_k}), {0, 2, 1, 3});
    const ag::Tensor r = points.run(kResultPoint, study::head_results(*this, z));
    ag::Tensor out = ag::sum(r, 1);
    if (b_O_.defined()) out = ag::add(out, b_O_);
    result.output = batched ? out : ag::squeeze(out, 0);
  }
  if (points.hooked(kOutPoint)) {  // the out point is batched, as the others
    const ag::Tensor out = points.run(kOutPoint, batched ? result.output : ag::unsqueeze(result.output, 0));
    result.output = batched ? out : ag::squeeze(out, 0);
  }
  if (options_.study) {  // only a forward that succeeded replaces the last one's study
    study_ = std::move(study);
    has_study_ = true;
  }
  return result;
}

std::string MultiHeadAttention::extra_repr() const {
  const auto& o = options_;
  std::string s = fmt::format("embed_dim={}, num_heads={}, head_dim={}, dropout={}, bias={}", o.embed_dim,
                              o.num_heads, head_dim(), o.dropout, o.bias);
  if (o.kdim != o.embed_dim || o.vdim != o.embed_dim) s += fmt::format(", kdim={}, vdim={}", o.kdim, o.vdim);
  if (o.add_bias_kv) s += ", add_bias_kv=true";
  if (o.add_zero_attn) s += ", add_zero_attn=true";
  s += o.core == AttentionCore::Fused ? ", core=fused" : ", core=composed";
  if (o.study) s += ", study=true";
  return s;
}

}  // namespace nn
