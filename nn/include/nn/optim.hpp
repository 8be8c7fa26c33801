#pragma once
// Optimizers (PyTorch's torch.optim, same update rules and defaults), learning-rate schedules
// and gradient clipping.
//
//   nn::AdamW opt(model.parameters(), {.lr = 1e-3});
//   for (...) {
//     opt.zero_grad();
//     loss.backward();
//     nn::clip_grad_norm_(model.parameters(), 1.0);
//     opt.step();
//   }
//
// An optimizer holds handles to the parameters: step() changes the module's tensors in place
// (under NoGradGuard, bumping their version counters). Parameters whose .grad is undefined are
// skipped, as in PyTorch. Every parameter must be Float32 or Float64: an Int64 one (a counter or
// ids registered with requires_grad = false) is refused at construction, naming it; pass the
// floating parameters only. Per-parameter state (momentum buffers, Adam's moments, step counts) is
// created on a parameter's first update and can be saved and restored with state_dict() /
// load_state_dict() (and nn::save_checkpoint), so that a resumed run continues bit for bit.
//
// Given model.named_parameters() instead of model.parameters(), an optimizer knows the names and
// its messages use them. step(), load_state_dict() and the clipping functions check everything
// before they change anything: when they throw, no parameter, gradient or state has changed.
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <autograd/autograd.hpp>

#include "nn/module.hpp"

namespace nn {

// The parameters an optimizer updates: a list of tensors, or of (name, tensor) pairs.
struct OptimizerParams {
  OptimizerParams(std::vector<ag::Tensor> params) : tensors(std::move(params)) {}
  OptimizerParams(std::initializer_list<ag::Tensor> params) : tensors(params) {}
  OptimizerParams(const NamedTensors& named);
  std::vector<ag::Tensor> tensors;
  std::vector<std::string> names;  // empty, or one per tensor
};

class Optimizer {
 public:
  Optimizer(std::string name, OptimizerParams params, double lr);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient. Throws std::invalid_argument, changing
  // nothing, when a gradient's shape or dtype differs from its parameter's, or a parameter's
  // shape or dtype changed after its state was created (e.g. by Module::to).
  void step();
  // Sets every parameter's .grad to zero (kept allocated), or to none.
  void zero_grad(bool set_to_none = false);

  double lr() const { return lr_; }
  void set_lr(double lr);
  const std::vector<ag::Tensor>& params() const { return params_; }
  // The parameters' names when constructed from named tensors, else empty strings.
  const std::vector<std::string>& param_names() const { return names_; }
  const std::string& name() const { return name_; }
  // How many times step() ran (restored by load_state_dict).
  std::int64_t step_count() const { return step_count_; }

  // Everything step() depends on apart from the parameters and the constructor's settings, as
  // named tensors with PyTorch's names: "state.<i>.<slot>" (shaped like parameter i, its
  // dtype), "state.<i>.step" (a Float64 scalar, for each parameter updated at least once),
  // "param_groups.0.lr" and "step_count" (Float64 scalars). The tensors are copies.
  NamedTensors state_dict() const;
  // Throws std::invalid_argument naming the optimizer, the entry, the parameter and the value at
  // fault: an unknown, repeated or missing name, a shape or dtype that does not match the
  // parameter, a step that is not a non-negative integer, a learning rate that is negative or not
  // finite, a state value that is NaN or infinite, or negative where it must not be (Adam's
  // exp_avg_sq and max_exp_avg_sq). load_state_dict runs this check first and changes nothing
  // when it throws.
  void check_state_dict(const NamedTensors& state) const;
  void load_state_dict(const NamedTensors& state);

 protected:
  // The state slots the current settings use for each parameter, e.g. {"exp_avg", "exp_avg_sq"}
  // (static names: step() asks for them every time and allocates nothing).
  virtual std::span<const std::string_view> slot_names() const = 0;
  // Whether every value of this slot is >= 0 in any real run (a second moment, say); loaded
  // state is checked against it.
  virtual bool slot_is_nonnegative(std::string_view /*slot*/) const { return false; }
  // Updates params_[i] in place from grad; slots[k] is the tensor of slot_names()[k], zero-filled
  // (and `step` = 1) on the parameter's first update. `step` has already been incremented.
  virtual void update(std::size_t i, const ag::Tensor& param, const ag::Tensor& grad,
                      std::vector<ag::Tensor>& slots, std::int64_t step) = 0;
  // "parameter 3", or "parameter 3 ('block.attn.W_Q')" when the name is known.
  std::string describe(std::size_t i) const;

 private:
  void check_step() const;
  void check_slot_values(const std::string& op, const std::string& entry, std::size_t i, std::string_view slot,
                         const ag::Tensor& t) const;

  std::string name_;
  std::vector<ag::Tensor> params_;
  std::vector<std::string> names_;  // one per parameter, empty when unknown
  double lr_;
  std::int64_t step_count_ = 0;
  std::vector<std::vector<ag::Tensor>> slots_;  // per parameter; empty until its first update
  std::vector<std::int64_t> steps_;             // per parameter: updates so far
};

// ---- SGD ----
// g = grad + weight_decay·p
// with momentum μ:  b = g on the first step, then b = μ·b + (1 − dampening)·g;
//                   g = g + μ·b (Nesterov) or g = b
// p = p − lr·g
struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;  // needs momentum > 0 and dampening = 0
};

class SGD : public Optimizer {
 public:
  SGD(OptimizerParams params, const SGDOptions& options);
  const SGDOptions& options() const { return options_; }

 protected:
  std::span<const std::string_view> slot_names() const override;
  void update(std::size_t i, const ag::Tensor& param, const ag::Tensor& grad, std::vector<ag::Tensor>& slots,
              std::int64_t step) override;

 private:
  SGDOptions options_;
};

// ---- Adam / AdamW ----
// g = grad (+ weight_decay·p for Adam: L2 penalty);  AdamW instead decays p = p·(1 − lr·weight_decay)
// m = β1·m + (1 − β1)·g;  v = β2·v + (1 − β2)·g²     (amsgrad: v̂max = max(v̂max, v), used in place of v)
// p = p − lr/(1 − β1ᵗ) · m / (√v / √(1 − β2ᵗ) + eps)
// Adam's and AdamW's options have the same fields; only the default weight decay differs, PyTorch's
// for each (0 for Adam, 0.01 for AdamW's decoupled decay).
template <bool Decoupled>
struct AdamFamilyOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = Decoupled ? 1e-2 : 0.0;
  bool amsgrad = false;
};
using AdamOptions = AdamFamilyOptions<false>;
using AdamWOptions = AdamFamilyOptions<true>;

class Adam : public Optimizer {
 public:
  Adam(OptimizerParams params, const AdamOptions& options = {});
  const AdamOptions& options() const { return options_; }

 protected:
  Adam(std::string name, OptimizerParams params, const AdamOptions& options, bool decoupled);
  std::span<const std::string_view> slot_names() const override;
  bool slot_is_nonnegative(std::string_view slot) const override;
  void update(std::size_t i, const ag::Tensor& param, const ag::Tensor& grad, std::vector<ag::Tensor>& slots,
              std::int64_t step) override;

 private:
  AdamOptions options_;
  bool decoupled_;
};

// AdamW (Loshchilov & Hutter): Adam with decoupled weight decay; PyTorch's default decay 0.01.
class AdamW : public Adam {
 public:
  AdamW(OptimizerParams params, const AdamWOptions& options = {});
};

// ---- learning-rate schedules ----
// A schedule maps the step index (0 for the first optimizer step) to a learning rate.
using LRSchedule = std::function<double(std::int64_t step)>;

LRSchedule constant_lr(double lr);
// lr · gamma^(step / step_size)  (integer division)
LRSchedule step_lr(double lr, std::int64_t step_size, double gamma = 0.1);
// Linear warmup from peak_lr/warmup_steps to peak_lr over steps 0 .. warmup_steps − 1, then a
// half cosine from peak_lr down to min_lr at step total_steps; min_lr after that.
LRSchedule warmup_cosine_lr(double peak_lr, std::int64_t warmup_steps, std::int64_t total_steps,
                            double min_lr = 0.0);

// Drives an optimizer's learning rate from a schedule: the constructor sets lr = schedule(0),
// and each step() (call it after optimizer.step()) moves to the next step's rate.
class LRScheduler {
 public:
  LRScheduler(Optimizer& optimizer, LRSchedule schedule, std::int64_t start_step = 0);
  void step();
  std::int64_t current_step() const { return step_; }
  // Jumps to a step (e.g. after loading a checkpoint) and sets the rate for it.
  void set_step(std::int64_t step);
  double lr() const { return optimizer_->lr(); }

 private:
  Optimizer* optimizer_;
  LRSchedule schedule_;
  std::int64_t step_;
};

// ---- gradient clipping ----
// Scales the gradients of `params` together so that their total norm (the norm of all gradients
// concatenated; norm_type 2, 1, or infinity) is at most max_norm: each is multiplied by
// min(1, max_norm / (total + 1e-6)), as in PyTorch. Returns the total norm before clipping.
// Parameters without a gradient are skipped; a tensor listed more than once counts once. An
// undefined entry is std::invalid_argument, thrown before any gradient changes.
double clip_grad_norm_(const std::vector<ag::Tensor>& params, double max_norm, double norm_type = 2.0);
// Clamps every gradient element into [-clip_value, clip_value] (all entries checked first).
// Both clipping functions skip parameters without a gradient (Int64 ones included) and refuse a
// non-floating gradient, naming its index, before changing any gradient.
void clip_grad_value_(const std::vector<ag::Tensor>& params, double clip_value);

}  // namespace nn
