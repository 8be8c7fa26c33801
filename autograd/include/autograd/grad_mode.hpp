#pragma once

// Grad mode is per thread: while it is off, ops record no graph (PyTorch's torch.no_grad()).
namespace autograd {

bool is_grad_enabled();
void set_grad_enabled(bool enabled);

// RAII: no graph is recorded while a NoGradGuard lives; the previous mode comes back after.
class NoGradGuard {
 public:
  NoGradGuard() : prev_(is_grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

// RAII: turns grad mode on (e.g. inside a NoGradGuard) for its lifetime.
class EnableGradGuard {
 public:
  EnableGradGuard() : prev_(is_grad_enabled()) { set_grad_enabled(true); }
  ~EnableGradGuard() { set_grad_enabled(prev_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace autograd
