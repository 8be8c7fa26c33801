#pragma once
// Loops over the OpenMP threads, entered only when they will run on more than one thread
// (internal, not installed).
//
// Entering an OpenMP parallel region costs a futex system call (about 0.5 µs on the benchmark
// machine) even when its `if` clause is false or one thread is allowed, and a training step of
// a small model enters dozens. parallel_for runs the plain loop instead unless the work asked
// for threads (`parallel`), there is more than one, and no parallel region is already running.
#include <cstdint>

#include <omp.h>

namespace autograd {

// True when a region started now would have more than one thread.
inline bool threads_available() { return !omp_in_parallel() && omp_get_max_threads() > 1; }

// body(i) for i in [0, n), statically scheduled over the threads when `parallel` holds.
template <class Body>
void parallel_for(std::int64_t n, bool parallel, Body&& body) {
  if (parallel && n > 1 && threads_available()) {
#pragma omp parallel for schedule(static)
    for (std::int64_t i = 0; i < n; ++i) body(i);
  } else {
    for (std::int64_t i = 0; i < n; ++i) body(i);
  }
}

// f() on every thread of one region when `parallel` holds and threads are available, else once on
// the calling thread. Worksharing loops (`#pragma omp for`) inside f split their range among the
// region's threads, or cover all of it when f runs alone; per-thread scratch lives inside f.
template <class F>
void parallel_region(bool parallel, F&& f) {
  if (parallel && threads_available()) {
#pragma omp parallel
    f();
  } else {
    f();
  }
}

}  // namespace autograd
