#include "autograd/grad_mode.hpp"

#include <algorithm>
#include <thread>

#include <Eigen/Core>
#include <omp.h>

namespace autograd {

namespace {
thread_local bool grad_enabled = true;
}

bool is_grad_enabled() { return grad_enabled; }
void set_grad_enabled(bool enabled) { grad_enabled = enabled; }

void set_num_threads(int n) {
  n = std::max(1, n);
  omp_set_num_threads(n);
  Eigen::setNbThreads(n);
}

int get_num_threads() { return omp_get_max_threads(); }

}  // namespace autograd
