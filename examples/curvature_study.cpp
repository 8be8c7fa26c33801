#include "curvature_study.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include <fmt/format.h>
#include <nn/nn.hpp>

#include "heads_model.hpp"

namespace curvature {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

struct Evaluated {
  ag::Tensor loss;
  double accuracy = 0;
};

// The mean cross entropy of the model on `batch`, with a graph.
Evaluated evaluate(const heads::HeadsModel& model, const heads::Batch& batch) {
  const ag::Tensor logits = model.forward(batch.token_tensor);
  return {nn::cross_entropy(logits, batch.targets, {.ignore_index = heads::kIgnore}),
          heads::batch_accuracy(logits, batch.targets)};
}

// The parameters' values set to `values` (flat, in the parameters' order), exactly.
void set_parameters(const std::vector<ag::Tensor>& params, const Vector& values) {
  ag::NoGradGuard no_grad;
  const ag::TensorList ts = unflatten(values, params);
  for (std::size_t i = 0; i < params.size(); ++i) ag::Tensor(params[i]).copy_(ts[i]);
}

// |uᵀHw − wᵀHu| relative to the size of the two products: zero for a symmetric H, up to rounding.
double symmetry_error(const Hessian& H, ag::Generator& gen) {
  const Vector u = random_vector(H.size(), gen), w = random_vector(H.size(), gen);
  const Vector Hu = H.apply(u), Hw = H.apply(w);
  const double scale = norm(u) * norm(Hw) + norm(w) * norm(Hu);
  return scale > 0 ? std::abs(dot(u, Hw) - dot(w, Hu)) / scale : 0.0;  // H = 0 is symmetric
}

CurvaturePoint measure(const heads::HeadsModel& model, const std::vector<ag::Tensor>& params,
                       const heads::Batch& test, const StudyConfig& c, std::int64_t step, ag::Generator& gen) {
  CurvaturePoint p;
  p.step = step;
  {  // one first-order forward + backward of the same loss, the unit the HVP's time is compared with
    const auto start = Clock::now();
    const auto e = evaluate(model, test);
    ag::grad({e.loss}, params);
    p.step_ms = ms_since(start);
  }
  const Evaluated e = evaluate(model, test);
  const Hessian H(e.loss, params);
  p.loss = e.loss.item();
  p.accuracy = e.accuracy;
  p.grad_norm = norm(H.gradient());
  const auto start = Clock::now();
  p.top = power_iteration([&H](const Vector& v) { return H.apply(v); }, random_vector(H.size(), gen), c.power);
  p.hvp_ms = ms_since(start) / p.top.iterations;
  p.symmetry_error = symmetry_error(H, gen);
  return p;
}

struct Penalised {
  ag::Tensor loss, penalty;  // L and ‖∇_θ L‖²
};

// L and ‖∇_θ L‖²; with `graph`, the gradient is part of the graph, so the penalty can be
// differentiated in θ.
Penalised penalised(const heads::HeadsModel& model, const std::vector<ag::Tensor>& params,
                    const heads::Batch& batch, bool graph) {
  Penalised out{evaluate(model, batch).loss, ag::Tensor()};
  const ag::TensorList g = ag::grad({out.loss}, params, {.create_graph = graph});
  for (const auto& gi : g) {
    const ag::Tensor s = ag::sum(gi * gi);
    out.penalty = out.penalty.defined() ? out.penalty + s : s;
  }
  return out;
}

double penalised_value(const heads::HeadsModel& model, const std::vector<ag::Tensor>& params,
                       const heads::Batch& batch, double lambda) {
  const Penalised p = penalised(model, params, batch, false);
  return p.loss.item() + lambda * p.penalty.item();
}

// One training step on P = L + λ‖∇_θ L‖², P.backward() going through the gradient's graph, its
// gradient checked two ways before the step: against central differences of P along random
// directions, and against ∇L + 2λ·H∇L (the penalty's gradient, 2H∇L, by an HVP).
PenaltyCheck penalty_step(heads::HeadsModel& model, const std::vector<ag::Tensor>& params,
                          const heads::Batch& batch, const StudyConfig& c, double lambda_max, ag::Generator& gen) {
  PenaltyCheck r;
  r.lambda = c.penalty;
  const double curv = std::abs(lambda_max);
  r.lr = c.penalty_lr > 0 ? c.penalty_lr : curv > 0 ? 1 / (curv * (1 + 2 * c.penalty * curv)) : 0.01;
  const Vector theta = flatten(params);
  const Penalised p = penalised(model, params, batch, true);
  r.loss = p.loss.item();
  r.penalty = p.penalty.item();
  model.zero_grad(true);
  (p.loss + p.penalty * c.penalty).backward();
  ag::TensorList grads;
  for (const auto& t : params) grads.push_back(t.grad());
  const Vector gP = flatten(grads);
  {
    const Hessian H(evaluate(model, batch).loss, params);
    const Vector gL = H.gradient(), HgL = H.apply(gL);
    Vector diff(gP.size());
    for (std::size_t i = 0; i < gP.size(); ++i) diff[i] = gP[i] - (gL[i] + 2 * c.penalty * HgL[i]);
    r.second_route_error = norm(diff) / norm(gP);
  }
  const double eps = 1e-5;
  for (int k = 0; k < 3; ++k) {
    Vector d = random_vector(static_cast<std::int64_t>(theta.size()), gen);
    const double n = norm(d);
    for (auto& x : d) x /= n;
    Vector shifted(theta.size());
    for (std::size_t i = 0; i < theta.size(); ++i) shifted[i] = theta[i] + eps * d[i];
    set_parameters(params, shifted);
    const double plus = penalised_value(model, params, batch, c.penalty);
    for (std::size_t i = 0; i < theta.size(); ++i) shifted[i] = theta[i] - eps * d[i];
    set_parameters(params, shifted);
    const double minus = penalised_value(model, params, batch, c.penalty);
    const double numeric = (plus - minus) / (2 * eps), analytic = dot(gP, d);
    const double rel = std::abs(analytic - numeric) / std::max(std::abs(analytic), std::abs(numeric));
    if (k == 0 || rel > r.rel_error) r.rel_error = rel, r.directional = analytic, r.numeric = numeric;
  }
  set_parameters(params, theta);  // exactly the point the gradient was taken at
  nn::SGD sgd(params, {.lr = r.lr});
  sgd.step();
  const Penalised after = penalised(model, params, batch, false);
  r.loss_after = after.loss.item();
  r.penalty_after = after.penalty.item();
  return r;
}

}  // namespace

CurvatureRun run_study(const StudyConfig& c, std::int64_t heads_count, std::uint64_t seed, bool progress) {
  const auto start = Clock::now();
  // train_heads' generators: the same seed gives the same initial weights and batches.
  ag::Generator init_gen(seed);
  ag::Generator data_gen(seed * 0x9E3779B97F4A7C15ull + 1);
  ag::Generator test_gen(seed * 0x9E3779B97F4A7C15ull + 2);
  ag::Generator probe_gen(seed * 0x9E3779B97F4A7C15ull + 3);  // power iteration starts, FD directions
  const heads::Batch test = heads::make_batch(test_gen, c.task, c.hessian_sequences);
  heads::HeadsModel model({.vocab = c.task.vocab, .seq_len = c.task.seq_len, .d_model = c.d_model, .d_ff = c.d_ff,
                           .heads = heads_count, .classes = c.task.classes(), .mlp = c.mlp},
                          init_gen);
  model.to(ag::Dtype::Float64);
  const std::vector<ag::Tensor> params = model.parameters();
  nn::AdamW opt(params, {.lr = c.lr, .weight_decay = c.weight_decay});
  nn::LRScheduler sched(opt, nn::warmup_cosine_lr(c.lr, std::min(c.warmup, c.steps / 10), c.steps, c.lr * 0.05));
  CurvatureRun run;
  run.heads = heads_count;
  run.seed = seed;
  run.parameters = model.num_parameters();
  auto checkpoint = [&](std::int64_t step) {
    if (std::find(c.checkpoints.begin(), c.checkpoints.end(), step) == c.checkpoints.end()) return;
    run.points.push_back(measure(model, params, test, c, step, probe_gen));
    if (progress)
      fmt::print(stderr, "  {} head{}, seed {}: step {:>5}  loss {:.4f}  λ_max {:.4f} ({} products)\n", heads_count,
                 heads_count == 1 ? "" : "s", seed, step, run.points.back().loss, run.points.back().top.eigenvalue,
                 run.points.back().top.iterations);
  };
  checkpoint(0);
  const nn::CrossEntropyOptions ce{.ignore_index = heads::kIgnore};
  for (std::int64_t step = 1; step <= c.steps; ++step) {
    const heads::Batch b = heads::make_batch(data_gen, c.task, c.batch);
    ag::Tensor loss = nn::cross_entropy(model.forward(b.token_tensor), b.targets, ce);
    opt.zero_grad();
    loss.backward();
    nn::clip_grad_norm_(params, c.clip);
    opt.step();
    sched.step();
    checkpoint(step);
  }
  run.penalty = penalty_step(model, params, test, c, run.points.empty() ? 0.0 : run.points.back().top.eigenvalue,
                             probe_gen);
  run.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return run;
}

}  // namespace curvature
