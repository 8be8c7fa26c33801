#pragma once
// Grokking of modular addition (Power et al. 2022), in the setup of Nanda et al. 2023 ("Progress
// measures for grokking via mechanistic interpretability") as TransformerLens's Grokking demo
// gives it: inputs "a b =" (tokens a, b in 0 .. p-1 and "=" = p), the label (a + b) mod p read at
// the last position, a fraction of the p² pairs for training, a 1-layer transformer without
// LayerNorm (4 heads, d_model 128, d_head 32, d_mlp 512, ReLU, biases held at 0), full-batch AdamW.
//
// The mechanism is measured as the paper does: the embedding in the Fourier basis of Z_p, where a
// few key frequencies carry its norm, and two progress measures computed from the final key
// frequencies at snapshots taken during training: the restricted loss (the MLP activations kept to
// their mean and the cos/sin(w(a+b)) components of the key frequencies w, on the test pairs) and
// the excluded loss (those components removed, on the training pairs).
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nn/nn.hpp>

namespace grokking {

namespace ag = autograd;

struct Config {
  std::int64_t p = 113;           // the modulus, a prime
  double train_fraction = 0.3;    // of the p² pairs
  std::int64_t d_model = 128, n_heads = 4, d_mlp = 512;
  std::int64_t steps = 25000;
  double lr = 1e-3, weight_decay = 1.0, beta1 = 0.9, beta2 = 0.98;
  std::int64_t eval_interval = 100;      // steps between test-set evaluations
  std::int64_t snapshot_interval = 500;  // steps between the snapshots the progress measures are taken at
  std::uint64_t seed = 1;
  ag::Dtype dtype = ag::Dtype::Float32;  // of the parameters (the loss is taken in Float64 either way)

  // The configuration CI runs: p = 53, 60 % of the pairs for training, 2,000 steps (groks at
  // about step 1,000, within a minute).
  static Config quick();
  // Throws naming the setting at fault (p not a prime, a fraction outside (0, 1), ...).
  void check() const;
  std::string describe() const;
};

struct CurvePoint {
  std::int64_t step = 0;  // after this many optimizer steps
  double train_loss = 0, train_accuracy = 0, test_loss = 0, test_accuracy = 0;
};

struct ProgressPoint {
  std::int64_t step = 0;
  double train_loss = 0, test_loss = 0;
  double train_accuracy = 0, test_accuracy = 0;
  double restricted_loss = 0;  // test pairs
  double excluded_loss = 0;    // training pairs
  double key_share = 0;        // the key frequencies' share of W_E's non-constant squared norm
  double weight_norm = 0;      // the L2 norm of all trained weights together (what weight decay shrinks)
};

struct Result {
  Config config;
  std::int64_t parameters = 0, trained_parameters = 0, train_pairs = 0, test_pairs = 0;
  int threads = 1;
  std::vector<CurvePoint> curve;        // every eval_interval steps, and step 0 and the last
  std::vector<double> train_losses;     // every step, before its update
  std::optional<std::int64_t> memorized_step;  // the first step with train accuracy >= 99 %
  std::optional<std::int64_t> grokked_step;    // the first evaluation with test accuracy >= 99 %
  CurvePoint test_loss_peak;                   // the evaluation with the largest test loss
  CurvePoint final_point;
  // The final embedding's norm per frequency k = 1 .. (p-1)/2 (cos and sin together), and the
  // constant component's; the key frequencies, largest first.
  std::vector<double> frequency_norms;
  double constant_norm = 0;
  std::vector<std::int64_t> key_frequencies;
  std::vector<ProgressPoint> progress;  // at the snapshots, with the final key frequencies
  // The final MLP neurons at "=" (Nanda et al. 2023, section 4.2): each neuron's activation over the
  // p² pairs in the 2D Fourier basis of (a, b); per neuron the frequency k whose terms (cos/sin ka,
  // cos/sin kb and their products) explain most of its variance, and that fraction.
  std::vector<std::int64_t> neuron_frequency;
  std::vector<double> neuron_explained;
  double train_seconds = 0, measure_seconds = 0;
};

// Optional outputs of a run.
struct Outputs {
  std::string initial_weights;  // the initial model (TransformerLens layout, safetensors) and its data split
  // The trained model (TransformerLens layout, safetensors), written after the last step: a model
  // of model_config(config) loads it (nn::load_transformer_lens_state_dict).
  std::string trained_weights;
  std::function<void(const CurvePoint&)> progress;
};

Result run(const Config& config, const Outputs& outputs = {});

// The model: 1 layer, the configuration's sizes, ReLU MLP, no LayerNorm, p + 1 input tokens, p outputs.
nn::TransformerLMConfig model_config(const Config& config);

// The orthonormal Fourier basis of functions on Z_p, (p, p) Float64: row 0 the constant, rows
// 2k-1 and 2k cos(2πkx/p) and sin(2πkx/p), each of unit norm.
ag::Tensor fourier_basis(std::int64_t p);

// Per MLP neuron of the model at "=", over all p² pairs: the frequency k = 1 .. (p-1)/2 explaining
// most of its activation's variance and that fraction (the squares of its 2D Fourier coefficients
// with both indices in {constant, cos k, sin k}, the constant-constant one left out, over all
// non-constant ones). pairs: every "a b =" as (p², 3) Int64, row a·p + b; basis: fourier_basis(p).
void neuron_frequencies(nn::TransformerLM& model, const ag::Tensor& pairs, const ag::Tensor& basis,
                        std::vector<std::int64_t>& frequency, std::vector<double>& explained);

// The key frequencies of the norms per frequency: sorted by norm, the largest that together carry
// 90 % of the squared norm (the fewest such), largest first.
std::vector<std::int64_t> key_frequencies(const std::vector<double>& norms);

}  // namespace grokking
