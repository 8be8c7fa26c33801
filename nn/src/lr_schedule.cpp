// Learning-rate schedules and the scheduler that applies one to an optimizer.
#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>

#include "nn/optim.hpp"

namespace nn {

// ---- schedules ----

LRSchedule constant_lr(double lr) {
  return [lr](std::int64_t) { return lr; };
}

LRSchedule step_lr(double lr, std::int64_t step_size, double gamma) {
  if (step_size <= 0) ag::fail("step_lr", "step_size must be positive, got {}", step_size);
  return [=](std::int64_t step) { return lr * std::pow(gamma, static_cast<double>(std::max<std::int64_t>(step, 0) / step_size)); };
}

LRSchedule warmup_cosine_lr(double peak_lr, std::int64_t warmup_steps, std::int64_t total_steps, double min_lr) {
  if (warmup_steps < 0 || total_steps < warmup_steps)
    ag::fail("warmup_cosine_lr", "need 0 <= warmup_steps <= total_steps, got warmup_steps {} and total_steps {}",
             warmup_steps, total_steps);
  return [=](std::int64_t step) {
    if (step < warmup_steps) return peak_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
    if (step >= total_steps) return min_lr;
    const double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
    return min_lr + 0.5 * (peak_lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
  };
}

LRScheduler::LRScheduler(Optimizer& optimizer, LRSchedule schedule, std::int64_t start_step)
    : optimizer_(&optimizer), schedule_(std::move(schedule)), step_(start_step) {
  if (!schedule_) ag::fail("LRScheduler", "schedule is empty");
  set_step(start_step);
}

void LRScheduler::step() { set_step(step_ + 1); }

void LRScheduler::set_step(std::int64_t step) {
  step_ = step;
  optimizer_->set_lr(schedule_(step_));
}

}  // namespace nn
