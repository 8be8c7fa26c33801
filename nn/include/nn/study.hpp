#pragma once
// Interventions and attributions on hook points (nn/hooks.hpp), for studying which head does what:
// ablation (zero, mean), activation patching between a clean and a corrupted input, attribution
// patching (its first-order estimate), attention × gradient and direct logit attribution.
// docs/studying_attention.md walks through each on train_heads' toy task.
//
// The z point of an attention layer ("block.attn.z", (B, H, T, d_k)) holds each head's context:
// head h's share of the layer's output is z_h · W_O[h·d_k .. (h+1)·d_k - 1], so changing z_h
// changes exactly head h's contribution.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "nn/hooks.hpp"
#include "nn/multihead_attention.hpp"

namespace nn::study {

// Forward hooks for a z point (B, H, T, d_k), e.g. add_hook("block.attn.z", zero_ablate_head(1)).
// They throw (at forward) naming the point when the value is not 4-D, when the head is out of range
// (naming H), or when a given tensor does not fit the value (naming both shapes). The result is
// differentiable in the other heads' z.
ForwardHook zero_ablate_head(std::int64_t head);  // head's z set to 0
// mean_z (H, T, d_k), e.g. batch_mean(cache["block.attn.z"]): head's z set to its mean.
ForwardHook mean_ablate_head(std::int64_t head, const ag::Tensor& mean_z);
// (B, H, T, d_k) -> (H, T, d_k), the mean over the batch, as an owned tensor outside any graph.
ag::Tensor batch_mean(const ag::Tensor& z);
// Head's z (at one query position; -1 = all) replaced by source_z's, a (B, H, T, d_k) value of the same
// point from another run (e.g. cache["block.attn.z"] of the clean input). source_z is used as a constant.
ForwardHook patch_head(std::int64_t head, const ag::Tensor& source_z, std::int64_t position = -1);

// Activation patching: for each head (and each head and position) of the z point, the metric of the
// corrupted run with that head's z (at that position) replaced by the clean run's.
struct PatchingResult {
  double clean_metric = 0, corrupted_metric = 0;
  std::vector<double> per_head;                        // H
  std::vector<std::vector<double>> per_head_position;  // H x T
};
// run(input) runs the model and returns a one-element metric (e.g. the mean log-prob of the right
// answers). Runs without a graph (NoGradGuard); the model's other hooks stay as they are; the
// patching hooks are removed afterwards, also when run throws. H·(T + 1) + 3 forwards, each with a
// hook at z_point (the corrupted run with one that keeps the value), so every metric comes from the
// same core: a patch that changes nothing gives corrupted_metric exactly. The corrupted run is made
// twice and must give the same metric both times (else it throws: e.g. dropout in training mode).
// Throws naming the run when a metric is not one finite element, and naming both shapes when the
// clean and corrupted z differ in shape.
PatchingResult activation_patching(Module& model, const std::string& z_point,
                                   const std::function<ag::Tensor(const ag::Tensor& input)>& run,
                                   const ag::Tensor& clean_input, const ag::Tensor& corrupted_input);

// Attribution patching: the first-order estimate (clean_z - corrupted_z) · d metric/d z at the corrupted
// run, per head and per head and position, from one forward on each input and one backward; with the
// real activation patching values and the largest absolute error of the estimate against them. The
// gradient is taken with respect to z alone (ag::grad): no tensor's .grad changes (the model's
// parameters', an input's that requires grad, any other tensor's run uses). run's metric must be
// a floating (Float32 or Float64) one-element tensor: an Int64 one is refused after the clean run.
struct AttributionPatchingResult {
  PatchingResult actual;
  std::vector<double> estimate_per_head;                        // estimated metric change (patched - corrupted)
  std::vector<std::vector<double>> estimate_per_head_position;  // H x T
  double max_abs_error = 0;                                     // vs actual change, over heads and positions
};
AttributionPatchingResult attribution_patching(Module& model, const std::string& z_point,
                                               const std::function<ag::Tensor(const ag::Tensor& input)>& run,
                                               const ag::Tensor& clean_input, const ag::Tensor& corrupted_input);

// Attention × gradient: A ⊙ dL/dA from a cache made with backward = true at a pattern point;
// map (H, T, S') averaged over the batch, and per head the sum over T and S' of map's absolute values.
struct AttentionGradient {
  ag::Tensor map;
  std::vector<double> per_head;
};
AttentionGradient attention_times_gradient(const ActivationCache& cache, const std::string& pattern_point);

// Direct logit attribution: each head's own contribution to an attention layer's output,
// z_h · W_O[rows h·d_k .. (h+1)·d_k - 1] (B, H, T, E) (b_O not included: the sum over heads plus b_O
// is the layer's out), and its dot product with a direction (E) or (B, T, E) -> (B, H, T). Both are
// differentiable.
ag::Tensor head_results(const MultiHeadAttention& attn, const ag::Tensor& z);
ag::Tensor direct_logit_attribution(const ag::Tensor& head_results, const ag::Tensor& direction);

}  // namespace nn::study
