#include "gpt.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace char_gpt {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void GptConfig::check() const {
  const std::pair<const char*, std::int64_t> sizes[] = {
      {"vocab_size", vocab_size}, {"block_size", block_size}, {"n_layer", n_layer}, {"n_head", n_head},
      {"n_embd", n_embd}};
  for (const auto& [name, value] : sizes)
    if (value <= 0) throw std::invalid_argument(fmt::format("GptConfig: {} must be positive, got {}", name, value));
  if (n_embd % n_head != 0)
    throw std::invalid_argument(
        fmt::format("GptConfig: n_embd {} is not a multiple of n_head {}", n_embd, n_head));
  if (!(dropout >= 0.0 && dropout < 1.0))
    throw std::invalid_argument(fmt::format("GptConfig: dropout must be in [0, 1), got {}", dropout));
}

Gpt::Gpt(const GptConfig& config, ag::Generator& gen) : Module("Gpt"), config_(config) {
  config_.check();
  const auto& c = config_;
  wte_ = register_module("wte", std::make_shared<nn::Embedding>(
                                    nn::EmbeddingOptions{c.vocab_size, c.n_embd, c.dtype}, gen));
  wpe_ = register_module("wpe", std::make_shared<nn::Embedding>(
                                    nn::EmbeddingOptions{c.block_size, c.n_embd, c.dtype}, gen));
  auto h = register_module("h", std::make_shared<nn::Module>("ModuleList"));
  const nn::TransformerBlockOptions block{.d_model = c.n_embd, .num_heads = c.n_head, .dropout = c.dropout,
                                          .bias = c.bias, .dtype = c.dtype,
                                          .layer_norm_bias = true};  // as the PyTorch peer's blocks
  for (std::int64_t i = 0; i < c.n_layer; ++i)
    blocks_.push_back(h->register_module(std::to_string(i), std::make_shared<nn::TransformerBlock>(block, gen)));
  ln_f_ = register_module("ln_f", std::make_shared<nn::LayerNorm>(
                                      nn::LayerNormOptions{.normalized_shape = {c.n_embd}, .dtype = c.dtype}));
  if (!c.tie_weights)
    lm_head_ = register_module(
        "lm_head", std::make_shared<nn::Linear>(nn::LinearOptions{c.n_embd, c.vocab_size, false, c.dtype}, gen));
  positions_ = ag::arange(static_cast<double>(c.block_size));
  dropout_gen_.manual_seed(gen.next_u64());
  initialise(gen);
}

void Gpt::initialise(ag::Generator& gen) {
  const double std_residual = 0.02 / std::sqrt(2.0 * static_cast<double>(config_.n_layer));
  for (auto& [name, p] : named_parameters()) {
    if (p.dim() >= 2) {
      const bool residual = ends_with(name, "attn.W_O") || ends_with(name, "fc_2.weight");
      nn::init::normal_(p, 0.0, residual ? std_residual : 0.02, gen);
    } else if (ends_with(name, "ln_1.weight") || ends_with(name, "ln_2.weight") || name == "ln_f.weight") {
      nn::init::ones_(p);
    } else {
      nn::init::zeros_(p);
    }
  }
}

ag::Tensor Gpt::forward(const ag::Tensor& tokens) const {
  if (!tokens.defined() || tokens.dim() != 2)
    throw std::invalid_argument(fmt::format("Gpt::forward: tokens must be (B, T), got {}",
                                            tokens.defined() ? ag::shape_str(tokens.shape()) : "undefined"));
  const std::int64_t T = tokens.size(1);
  if (T < 1 || T > config_.block_size)
    throw std::invalid_argument(fmt::format("Gpt::forward: sequence length {} is outside [1, block_size {}]", T,
                                            config_.block_size));
  const ag::Tensor pos = T == config_.block_size ? positions_ : ag::arange(static_cast<double>(T));
  ag::Tensor x = ag::add(wte_->forward(tokens), wpe_->forward(pos));  // (B, T, E)
  if (config_.dropout > 0.0 && is_training()) x = ag::dropout(x, config_.dropout, true, dropout_gen_);
  nn::AttentionOptions causal;
  causal.need_weights = false;
  causal.is_causal = true;
  for (const auto& block : blocks_) x = block->forward(x, causal).output;
  x = ln_f_->forward(x);
  if (lm_head_) return lm_head_->forward(x);
  return ag::linear(x, ag::transpose(wte_->weight(), 0, 1));  // (B, T, V)
}

ag::Tensor Gpt::loss(const ag::Tensor& tokens, const ag::Tensor& targets) const {
  return ag::cross_entropy(forward(tokens), targets);
}

std::vector<ag::Generator*> Gpt::dropout_generators() {
  std::vector<ag::Generator*> out{&dropout_gen_};
  for (auto& b : blocks_) out.push_back(&b->attn().dropout_generator());
  return out;
}

std::vector<bool> decay_mask(const nn::NamedTensors& params) {
  std::vector<bool> out;
  for (const auto& [name, p] : params) out.push_back(p.dim() >= 2);
  return out;
}

}  // namespace char_gpt
