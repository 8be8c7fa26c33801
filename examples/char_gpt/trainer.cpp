#include "trainer.hpp"

#include <cmath>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

namespace char_gpt {

namespace {

// The batch sampler's seed, kept apart from the initialisation generator's (the run's seed).
std::uint64_t batch_seed(std::uint64_t seed) { return seed ^ 0x6261746368ULL; }  // "batch"

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("TrainConfig: " + what);
}

}  // namespace

void TrainConfig::check() const {
  model.check();
  require(batch_size > 0, fmt::format("batch_size must be positive, got {}", batch_size));
  require(max_iters >= 0, fmt::format("max_iters must be >= 0, got {}", max_iters));
  require(lr > 0 && std::isfinite(lr), fmt::format("lr must be positive and finite, got {}", lr));
  require(min_lr >= 0 && min_lr <= lr, fmt::format("min_lr must be in [0, lr {}], got {}", lr, min_lr));
  require(warmup_iters >= 0 && warmup_iters <= decay_iters(),
          fmt::format("warmup_iters must be in [0, lr_decay_iters {}], got {}", decay_iters(), warmup_iters));
  require(lr_decay_iters >= 0, fmt::format("lr_decay_iters must be >= 0, got {}", lr_decay_iters));
  require(weight_decay >= 0 && std::isfinite(weight_decay),
          fmt::format("weight_decay must be >= 0 and finite, got {}", weight_decay));
  require(beta1 >= 0 && beta1 < 1, fmt::format("beta1 must be in [0, 1), got {}", beta1));
  require(beta2 >= 0 && beta2 < 1, fmt::format("beta2 must be in [0, 1), got {}", beta2));
  require(grad_clip >= 0 && std::isfinite(grad_clip),
          fmt::format("grad_clip must be >= 0 and finite (0: none), got {}", grad_clip));
  require(eval_interval > 0, fmt::format("eval_interval must be positive, got {}", eval_interval));
  require(eval_iters > 0, fmt::format("eval_iters must be positive, got {}", eval_iters));
}

nlohmann::json TrainConfig::to_json() const {
  return {{"vocab_size", model.vocab_size}, {"block_size", model.block_size}, {"n_layer", model.n_layer},
          {"n_head", model.n_head}, {"n_embd", model.n_embd}, {"dropout", model.dropout}, {"bias", model.bias},
          {"tie_weights", model.tie_weights}, {"float64", model.dtype == ag::Dtype::Float64},
          {"batch_size", batch_size}, {"max_iters", max_iters}, {"lr", lr}, {"min_lr", min_lr},
          {"warmup_iters", warmup_iters}, {"lr_decay_iters", lr_decay_iters}, {"weight_decay", weight_decay},
          {"beta1", beta1}, {"beta2", beta2}, {"grad_clip", grad_clip}, {"eval_interval", eval_interval},
          {"eval_iters", eval_iters}, {"seed", seed}};
}

TrainConfig TrainConfig::from_json(const nlohmann::json& j) {
  TrainConfig c;
  auto get = [&j](const char* key, auto& out) {
    if (!j.is_object() || !j.contains(key))
      throw std::invalid_argument(fmt::format("TrainConfig::from_json: no entry '{}'", key));
    try {
      j.at(key).get_to(out);
    } catch (const nlohmann::json::exception& e) {
      throw std::invalid_argument(fmt::format("TrainConfig::from_json: entry '{}': {}", key, e.what()));
    }
  };
  bool float64 = false;
  get("vocab_size", c.model.vocab_size), get("block_size", c.model.block_size), get("n_layer", c.model.n_layer);
  get("n_head", c.model.n_head), get("n_embd", c.model.n_embd), get("dropout", c.model.dropout);
  get("bias", c.model.bias), get("tie_weights", c.model.tie_weights), get("float64", float64);
  c.model.dtype = float64 ? ag::Dtype::Float64 : ag::Dtype::Float32;
  get("batch_size", c.batch_size), get("max_iters", c.max_iters), get("lr", c.lr), get("min_lr", c.min_lr);
  get("warmup_iters", c.warmup_iters), get("lr_decay_iters", c.lr_decay_iters);
  get("weight_decay", c.weight_decay), get("beta1", c.beta1), get("beta2", c.beta2);
  get("grad_clip", c.grad_clip), get("eval_interval", c.eval_interval), get("eval_iters", c.eval_iters);
  get("seed", c.seed);
  return c;
}

std::uint64_t token_hash(const Split& data) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const auto* part : {&data.train, &data.val}) {
    for (std::int32_t t : *part) {
      h ^= static_cast<std::uint32_t>(t);
      h *= 0x100000001b3ULL;
    }
    h ^= 0xff;  // where the split falls counts too
    h *= 0x100000001b3ULL;
  }
  return h;
}

Trainer::Trainer(const TrainConfig& config, Vocabulary vocab, Split data)
    : config_(config),
      vocab_(std::move(vocab)),
      data_(std::move(data)),
      data_hash_(token_hash(data_)),
      sampler_(config.batch_size, config.model.block_size, batch_seed(config.seed)) {
  config_.model.vocab_size = vocab_.size();
  config_.check();
  const auto block = static_cast<std::size_t>(config_.model.block_size);
  if (data_.train.size() <= block || data_.val.size() <= block)
    throw std::invalid_argument(fmt::format("Trainer: the training and validation splits ({} and {} tokens) must "
                                            "each be longer than block_size {}",
                                            data_.train.size(), data_.val.size(), block));
  ag::Generator init(config_.seed);
  model_ = std::make_unique<Gpt>(config_.model, init);
  const nn::NamedTensors named = model_->named_parameters();
  for (const auto& [name, p] : named) params_.push_back(p);
  optimizer_ = std::make_unique<GroupedAdamW>(
      named, decay_mask(named),
      GroupedAdamWOptions{.lr = config_.lr, .beta1 = config_.beta1, .beta2 = config_.beta2, .eps = 1e-8,
                          .weight_decay = config_.weight_decay});
  scheduler_ = std::make_unique<nn::LRScheduler>(
      *optimizer_, nn::warmup_cosine_lr(config_.lr, config_.warmup_iters, config_.decay_iters(), config_.min_lr));
  x_ = ag::zeros({config_.batch_size, config_.model.block_size});
  y_ = ag::zeros({config_.batch_size, config_.model.block_size});
  history_.train_losses.reserve(static_cast<std::size_t>(config_.max_iters));
}

double Trainer::train_step() {
  scheduler_->set_step(step_);
  sampler_.fill(data_.train, x_, y_);
  optimizer_->zero_grad();
  const ag::Tensor loss = model_->loss(x_, y_);
  loss.backward();
  if (config_.grad_clip > 0) nn::clip_grad_norm_(params_, config_.grad_clip);
  optimizer_->step();
  ++step_;
  const double value = loss.item();
  history_.train_losses.push_back(value);
  return value;
}

double Trainer::batch_loss(const std::vector<std::int32_t>& data, BatchSampler& sampler) {
  sampler.fill(data, x_, y_);
  return model_->loss(x_, y_).item();
}

EvalRecord Trainer::evaluate() {
  ag::NoGradGuard no_grad;
  const bool was_training = model_->is_training();
  model_->eval();
  EvalRecord r{.step = step_};
  for (int split = 0; split < 2; ++split) {
    BatchSampler sampler(config_.batch_size, config_.model.block_size, kEvalSeed + static_cast<std::uint64_t>(split));
    double total = 0;
    for (std::int64_t i = 0; i < config_.eval_iters; ++i) total += batch_loss(split == 0 ? data_.train : data_.val, sampler);
    (split == 0 ? r.train : r.val) = total / static_cast<double>(config_.eval_iters);
  }
  model_->train(was_training);
  history_.evals.push_back(r);
  return r;
}

double Trainer::full_val_loss() {
  ag::NoGradGuard no_grad;
  const bool was_training = model_->is_training();
  model_->eval();
  const std::int64_t T = config_.model.block_size, B = config_.batch_size;
  const auto& val = data_.val;
  std::vector<std::int64_t> starts;
  for (std::int64_t s = 0; s + T < static_cast<std::int64_t>(val.size()); s += T) starts.push_back(s);
  double total = 0;
  for (std::size_t k = 0; k < starts.size(); k += static_cast<std::size_t>(B)) {
    const auto n = static_cast<std::int64_t>(std::min<std::size_t>(static_cast<std::size_t>(B), starts.size() - k));
    ag::Tensor x = n == B ? x_ : ag::zeros({n, T}), y = n == B ? y_ : ag::zeros({n, T});
    float* xs = x.data<float>();
    float* ys = y.data<float>();
    for (std::int64_t b = 0; b < n; ++b)
      for (std::int64_t t = 0; t < T; ++t) {
        const auto i = static_cast<std::size_t>(starts[k + static_cast<std::size_t>(b)] + t);
        xs[b * T + t] = static_cast<float>(val[i]);
        ys[b * T + t] = static_cast<float>(val[i + 1]);
      }
    x.mark_modified();
    y.mark_modified();
    total += model_->loss(x, y).item() * static_cast<double>(n);
  }
  model_->train(was_training);
  return total / static_cast<double>(starts.size());
}

}  // namespace char_gpt
