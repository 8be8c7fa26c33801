#pragma once
// Loops over the OpenMP threads, entered only when they will run on more than one thread and,
// at each place in the code that asks, only while doing so has been paying (internal, not
// installed).
//
// Entering an OpenMP parallel region costs a futex system call (about 0.5 µs on the benchmark
// machine) even when its `if` clause is false or one thread is allowed, and a training step of
// a small model enters dozens. parallel_for runs the plain loop instead unless the work asked
// for threads (`parallel`: the op's size threshold, below), there is more than one, no
// parallel region is already running, and the region's call site is not holding back (below).
//
// Holding back. The size thresholds cannot know what starting the threads costs here and now:
// a few µs on an idle machine, but when other processes keep the cores busy a sleeping thread
// may wait milliseconds for a core, and the region waits for it. So every region started by
// parallel_for or parallel_region measures itself: its wall time, and the CPU time each of its
// threads spent in it. Idle threads sleep (grad_mode.cpp sets the passive wait policy), so the
// CPU time is the work itself, without the waits for a thread to start, to get a core back or
// to reach a barrier: one thread alone would have needed about the sum. When the region took
// longer than that, it lost, by the difference; its call site then runs its loop on the calling
// thread for 16 times that long, twice as long after each further loss in a row (at most 64
// times over), and tries the threads again after. A loss of more than a millisecond (a thread
// that waited for a core, not a region too small to share) holds back every region of the
// process for the same time, those of matrix products and elementwise kernels included. A probe
// thus costs at most about 1/16 of the time between probes. (With OMP_WAIT_POLICY=active the
// threads spin instead and their CPU time includes the waits: no region is seen to lose.) The
// results do not depend on any of it: the work is cut by its shape alone, whichever thread
// runs a piece.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>

#include <omp.h>

#include "kernels/isa.hpp"

namespace autograd {

// ---- when to use the threads ----
// Below these sizes a loop runs on one thread: starting the threads costs more than they save.
inline constexpr std::int64_t kParallelElementwise = 32768;  // elements computed by a map or softmax
inline constexpr std::int64_t kParallelCopy = 1 << 16;        // elements moved by a copy or gather
inline constexpr std::int64_t kParallelFlops = 1 << 16;       // multiply-adds of a batch of products

namespace thread_policy {

inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// CPU time of the calling thread.
inline std::int64_t thread_cpu_ns() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return std::int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec;
}

inline constexpr std::int64_t kBusyLoss = 1'000'000;  // ns: a loss this large holds back every region
inline constexpr int kHoldFactor = 16;                // hold back for this many times the loss...
inline constexpr int kMaxDoublings = 6;               // ...doubled per further loss in a row, up to 16·64

// Process-wide: until when every region is held back (0: none is), and counts for
// ag::thread_policy_stats().
inline std::atomic<std::int64_t> held_until{0};
inline std::atomic<std::int64_t> regions_run{0}, regions_held{0}, regions_lost{0};

// What one call site has learnt.
struct Site {
  std::atomic<std::int64_t> held_until{0};  // steady-clock ns
  std::atomic<int> losses{0};               // in a row
};

// True when the site (and the process) is not holding back now; counts a held region.
inline bool may_run(Site& site) {
  const std::int64_t site_until = site.held_until.load(std::memory_order_relaxed);
  const std::int64_t all_until = held_until.load(std::memory_order_relaxed);
  if (site_until == 0 && all_until == 0) return true;
  if (now_ns() >= std::max(site_until, all_until)) return true;
  regions_held.fetch_add(1, std::memory_order_relaxed);
  return false;
}

// Learns from one region: `wall` ns long, its threads busy for `cpu` ns together.
inline void learn(Site& site, std::int64_t wall, std::int64_t cpu, std::int64_t end) {
  regions_run.fetch_add(1, std::memory_order_relaxed);
  if (wall <= cpu) {
    site.losses.store(0, std::memory_order_relaxed);
    site.held_until.store(0, std::memory_order_relaxed);
    return;
  }
  regions_lost.fetch_add(1, std::memory_order_relaxed);
  const std::int64_t loss = wall - cpu;
  const int doublings = std::min(site.losses.fetch_add(1, std::memory_order_relaxed), kMaxDoublings);
  const std::int64_t hold = loss * kHoldFactor << doublings;
  site.held_until.store(end + hold, std::memory_order_relaxed);
  if (loss > kBusyLoss) held_until.store(end + hold, std::memory_order_relaxed);
}

}  // namespace thread_policy

// True when a region started now would have more than one thread (and the process is not
// holding every region back, see above).
inline bool threads_available() {
  if (omp_in_parallel() || omp_get_max_threads() <= 1) return false;
  const std::int64_t until = thread_policy::held_until.load(std::memory_order_relaxed);
  return until == 0 || thread_policy::now_ns() >= until;
}

// f() on every thread of one measured region at `site`, when it may run there.
template <class F>
bool measured_region(thread_policy::Site& site, F&& f) {
  if (omp_in_parallel() || omp_get_max_threads() <= 1 || !thread_policy::may_run(site)) return false;
  std::atomic<std::int64_t> cpu{0};
  const std::int64_t start = thread_policy::now_ns();
#pragma omp parallel
  {
    const std::int64_t c0 = thread_policy::thread_cpu_ns();
    isa::clear_upper_state();
    f();
    cpu.fetch_add(thread_policy::thread_cpu_ns() - c0, std::memory_order_relaxed);
  }
  const std::int64_t end = thread_policy::now_ns();
  thread_policy::learn(site, end - start, cpu.load(std::memory_order_relaxed), end);
  return true;
}

// body(i) for i in [0, n), statically scheduled over the threads when `parallel` holds.
template <class Body>
void parallel_for(std::int64_t n, bool parallel, Body&& body) {
  isa::choose();  // on the calling thread: a bad HEADGRAD_ISA throws here, not inside the region
  static thread_policy::Site site;  // one per call site (each passes its own lambda type)
  if (parallel && n > 1 &&
      measured_region(site, [&] {
#pragma omp for schedule(static)
        for (std::int64_t i = 0; i < n; ++i) body(i);
      }))
    return;
  for (std::int64_t i = 0; i < n; ++i) body(i);
}

// f() on every thread of one region when `parallel` holds and threads are available, else once on
// the calling thread. Worksharing loops (`#pragma omp for`) inside f split their range among the
// region's threads, or cover all of it when f runs alone; per-thread scratch lives inside f.
template <class F>
void parallel_region(bool parallel, F&& f) {
  isa::choose();  // as in parallel_for
  static thread_policy::Site site;  // one per call site (each passes its own lambda type)
  if (parallel && measured_region(site, f)) return;
  f();
}

}  // namespace autograd
