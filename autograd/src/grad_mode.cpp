#include "autograd/grad_mode.hpp"

#include <omp.h>

#include "autograd/shape.hpp"

namespace autograd {

namespace {
thread_local bool grad_enabled = true;
}

bool is_grad_enabled() { return grad_enabled; }
void set_grad_enabled(bool enabled) { grad_enabled = enabled; }

void set_num_threads(int n) {
  // (The upper bound keeps per-thread scratch and OpenMP's thread creation within reason; far
  // more threads than cores only slows every kernel down.)
  constexpr int kMaxThreads = 256;
  if (n < 1 || n > kMaxThreads)
    fail("set_num_threads", "the thread count must be in [1, {}], got {}", kMaxThreads, n);
  omp_set_num_threads(n);
}

int get_num_threads() { return omp_get_max_threads(); }

}  // namespace autograd
