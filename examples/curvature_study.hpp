#pragma once
// The curvature example's measurements: train_heads' model and task trained as train_heads trains
// them (same seeds, data, optimiser and schedule; in float64 here), with the top Hessian eigenvalue
// of the held-out loss measured by power iteration at chosen steps, and one gradient-penalty step
// at the end whose gradient is checked against central differences of the penalised loss.
#include <cstdint>
#include <vector>

#include "hessian_power.hpp"
#include "heads_task.hpp"

namespace curvature {

struct StudyConfig {
  heads::Task task;
  std::int64_t d_model = 32, d_ff = 128;
  bool mlp = true;
  std::int64_t batch = 64, steps = 2000, warmup = 100;
  double lr = 3e-3, weight_decay = 0.01, clip = 1.0;
  std::vector<std::int64_t> checkpoints = {0, 100, 250, 500, 750, 1000, 1500, 2000};  // steps at which H is measured
  std::int64_t hessian_sequences = 256;  // held-out sequences whose mean loss H is the Hessian of
  PowerOptions power = {.max_iterations = 100, .tolerance = 1e-3};
  double penalty = 0.1;     // λ of loss + λ‖∇_θ loss‖²
  // The plain gradient step taken with the penalised gradient; 0: 1 / (λ_max·(1 + 2λ·λ_max)),
  // the inverse curvature of P = L + λ‖∇L‖² along H's top eigenvector, third derivatives left out
  // (λ_max from the last measurement), a step that is stable on both terms.
  double penalty_lr = 0.0;
};

struct CurvaturePoint {
  std::int64_t step = 0;
  double loss = 0, accuracy = 0;  // on the held-out sequences H is measured on
  double grad_norm = 0;           // ‖∇_θ loss‖ there
  PowerResult top;                // the eigenvalue of largest magnitude
  double symmetry_error = 0;      // |uᵀHw − wᵀHu| / (‖u‖‖Hw‖ + ‖w‖‖Hu‖) for two random u, w
  double hvp_ms = 0;              // mean time of one H·v
  double step_ms = 0;             // one forward + backward of the same loss, for comparison
};

struct PenaltyCheck {
  double lambda = 0;
  double loss = 0, penalty = 0;              // L and ‖∇L‖² before the step
  double directional = 0, numeric = 0;       // ∇P·d by backward, and (P(θ+εd) − P(θ−εd)) / 2ε
  double rel_error = 0;                      // worst of three random unit directions d
  double second_route_error = 0;             // ‖∇P − (∇L + 2λ·H∇L)‖ / ‖∇P‖
  double lr = 0;                             // of the step θ ← θ − lr·∇P
  double loss_after = 0, penalty_after = 0;  // after it
};

struct CurvatureRun {
  std::int64_t heads = 0;
  std::uint64_t seed = 0;
  std::int64_t parameters = 0;
  std::vector<CurvaturePoint> points;
  PenaltyCheck penalty;
  double seconds = 0;
};

// Trains one model (`heads` heads, weights and data from `seed`) and measures it.
CurvatureRun run_study(const StudyConfig& config, std::int64_t heads, std::uint64_t seed, bool progress);

}  // namespace curvature
