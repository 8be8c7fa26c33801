#pragma once
// char_gpt's training: the settings (nanoGPT's names and its CPU configuration as defaults),
// one optimizer step, the evaluations, and checkpoints that resume bit for bit.
//
// A step: the learning rate for this step from the schedule (linear warmup over warmup_iters,
// then a half cosine down to min_lr at lr_decay_iters), a batch from the seeded sampler, forward,
// backward, clipping of the gradients' total norm to grad_clip, and an AdamW step with the weight
// decay on the 2-D parameters only. Its heap allocations per warm step are measured in
// docs/char_gpt.md (none with an untied head at the CPU configuration; some with the tied one).
//
// Evaluation: the mean loss over eval_iters batches of each split, drawn by a generator with a
// fixed seed, so every evaluation of every run (and the PyTorch peer) sees the same batches; and
// at the end the full validation loss, over the whole validation split in consecutive windows.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <nn/nn.hpp>

#include "corpus.hpp"
#include "gpt.hpp"
#include "optimizer.hpp"

namespace char_gpt {

struct TrainConfig {
  GptConfig model;
  std::int64_t batch_size = 12;
  std::int64_t max_iters = 2000;
  double lr = 1e-3;
  double min_lr = 1e-4;
  std::int64_t warmup_iters = 100;
  std::int64_t lr_decay_iters = 0;  // 0: max_iters
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double grad_clip = 1.0;  // 0: no clipping
  std::int64_t eval_interval = 250;
  std::int64_t eval_iters = 20;
  std::uint64_t seed = 1;

  std::int64_t decay_iters() const { return lr_decay_iters > 0 ? lr_decay_iters : max_iters; }
  void check() const;  // std::invalid_argument naming the setting at fault
  nlohmann::json to_json() const;
  // Throws std::invalid_argument naming a missing or mistyped entry.
  static TrainConfig from_json(const nlohmann::json& j);
};

// The seed of the evaluation batches' generator (train: this, validation: this + 1).
inline constexpr std::uint64_t kEvalSeed = 0x6576616C;

struct EvalRecord {
  std::int64_t step = 0;
  double train = 0, val = 0;
};

struct History {
  std::vector<double> train_losses;  // one per optimizer step, of that step's batch
  std::vector<EvalRecord> evals;
};

class Trainer {
 public:
  // data: the tokens of the corpus the vocabulary was built from.
  Trainer(const TrainConfig& config, Vocabulary vocab, Split data);

  double train_step();  // one optimizer step; returns the batch's loss
  EvalRecord evaluate();  // appends to history().evals
  double full_val_loss();

  // Parameters, optimizer state, the step, the sampler's and dropout generators' states, the
  // settings, the vocabulary and the loss history, in one safetensors file (atomic).
  void save(const std::string& path) const;
  // Restores everything save() wrote. Throws std::runtime_error when the checkpoint's settings,
  // vocabulary or corpus differ from this trainer's (nn::CheckpointError for a bad file).
  void load(const std::string& path);

  std::int64_t step() const { return step_; }
  const TrainConfig& config() const { return config_; }
  const Vocabulary& vocab() const { return vocab_; }
  const Split& data() const { return data_; }
  const History& history() const { return history_; }
  Gpt& model() { return *model_; }
  GroupedAdamW& optimizer() { return *optimizer_; }

 private:
  double batch_loss(const std::vector<std::int32_t>& data, BatchSampler& sampler);
  nn::Metadata metadata() const;

  TrainConfig config_;
  Vocabulary vocab_;
  Split data_;
  std::uint64_t data_hash_;
  std::unique_ptr<Gpt> model_;
  std::vector<ag::Tensor> params_;
  std::unique_ptr<GroupedAdamW> optimizer_;
  std::unique_ptr<nn::LRScheduler> scheduler_;
  BatchSampler sampler_;
  ag::Tensor x_, y_;  // the batch, reused every step
  std::int64_t step_ = 0;
  History history_;
};

// A checkpoint's settings and vocabulary, read from its metadata (without loading the tensors
// into a model).
struct CheckpointInfo {
  TrainConfig config;
  Vocabulary vocab;
  std::int64_t step = 0;
};
CheckpointInfo read_checkpoint_info(const std::string& path);

// The model of a checkpoint, for sampling: built from its settings, parameters loaded.
std::unique_ptr<Gpt> load_model(const std::string& path, const CheckpointInfo& info);

// FNV-1a of the tokens: checkpoints remember it to refuse resuming on another corpus.
std::uint64_t token_hash(const Split& data);

}  // namespace char_gpt
