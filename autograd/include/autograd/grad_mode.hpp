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

// Threads the kernels may use (OpenMP's count; default: all cores). n < 1 throws
// std::invalid_argument. Results do not depend on it: every kernel cuts its work by the shape
// alone and adds in a fixed order, so 1, 2 or 64 threads give the same bits. (Matrix products
// keep Eigen's and OpenBLAS's own threading off and share shape-fixed pieces among the threads;
// a program that turns Eigen's threading back on with Eigen::setNbThreads loses this.)
// Like omp_set_num_threads, it sets the count for the calling thread and the threads it starts.
void set_num_threads(int n);
int get_num_threads();

}  // namespace autograd
