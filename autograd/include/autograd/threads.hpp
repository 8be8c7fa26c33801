#pragma once
// How many threads the kernels may use, and what the thread policy has done (src/grad_mode.cpp,
// beside grad mode: see the comment there on why the OpenMP set-up lives in that file).
#include <cstdint>

namespace autograd {

// Threads the kernels may use: OpenMP's count for the calling thread and the threads it starts
// (omp_set_num_threads); default: every core, or OMP_NUM_THREADS. n outside [1, 256] throws
// std::invalid_argument. It caps the threads; it does not force them: an op runs on the calling
// thread alone when its work is below a size threshold, and a place in the code that found its
// last parallel runs slower than one thread (the other threads started too late, e.g. because
// other processes keep the cores busy) runs alone for a while and then tries again (see
// thread_policy_stats). Results do not depend on any of it: every kernel cuts its work by the
// shape alone and adds in a fixed order, so 1, 2 or 64 threads give the same bits. (Matrix
// products keep Eigen's and OpenBLAS's own threading off and share shape-fixed pieces among the
// threads; a program that turns Eigen's threading back on with Eigen::setNbThreads loses this.)
// Idle threads sleep rather than spin: unless the environment sets OMP_WAIT_POLICY or
// GOMP_SPINCOUNT, a program linking this library (statically) starts with
// OMP_WAIT_POLICY=passive, which its child processes inherit.
void set_num_threads(int n);
int get_num_threads();

// What the thread policy has done in this process so far: parallel regions run on the threads,
// the ones among them that took longer than one thread would have (which make their place in the
// code run alone for a while), and the regions run on the calling thread meanwhile.
struct ThreadPolicyStats {
  std::int64_t regions_run = 0, regions_lost = 0, regions_held = 0;
};
ThreadPolicyStats thread_policy_stats();

}  // namespace autograd
