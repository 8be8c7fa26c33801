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
  if (n < 1) fail("set_num_threads", "the thread count must be at least 1, got {}", n);
  omp_set_num_threads(n);
}

int get_num_threads() { return omp_get_max_threads(); }

}  // namespace autograd
