#include "autograd/grad_mode.hpp"

#include <cstdlib>

#include <omp.h>

#include "autograd/shape.hpp"
#include "ops/parallel.hpp"

namespace autograd {

namespace {
thread_local bool grad_enabled = true;

// Idle OpenMP threads sleep instead of spinning, unless the program's environment says how they
// wait (OMP_WAIT_POLICY, or GOMP_SPINCOUNT for GCC's runtime). Left to itself, GCC's libgomp
// spins every idle thread for about 300,000 rounds (a few ms) after each parallel region, and
// LLVM's libomp for 200 ms: on a machine whose cores run other work too, those spinning threads
// take the cores from the thread that has work, and a region then waits for a thread that is
// not running. Sleeping costs a wake-up (a futex call) when the next region starts, which the
// thresholds for going parallel (ops/common.hpp) are set to pay for.
//
// libgomp reads the variables once, in its own initialiser, which runs before any initialiser
// of a library that links it: hence a function in .preinit_array, which the dynamic loader runs
// before every library's initialisers, and which the linker takes into the executable along
// with this file (it takes it whenever the program uses an op: every op asks is_grad_enabled).
// Only an executable may have one: a shared build of this library gets an ordinary initialiser,
// in time for libomp (which reads the variables when the first OpenMP call starts it) but not
// for libgomp, whose users then set OMP_WAIT_POLICY=passive themselves.
void default_to_passive_waiting() {
  if (std::getenv("OMP_WAIT_POLICY") == nullptr && std::getenv("GOMP_SPINCOUNT") == nullptr)
    setenv("OMP_WAIT_POLICY", "passive", 0);
}

void default_to_passive_waiting_at_start(int, char**, char**) { default_to_passive_waiting(); }

#if defined(__ELF__) && !defined(headgrad_autograd_EXPORTS)
[[gnu::section(".preinit_array"), gnu::used]] void (*const wait_policy_preinit)(int, char**, char**) =
    &default_to_passive_waiting_at_start;
#endif
[[gnu::constructor]] void wait_policy_init() { default_to_passive_waiting(); }
}  // namespace

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

ThreadPolicyStats thread_policy_stats() {
  return {.regions_run = thread_policy::regions_run.load(std::memory_order_relaxed),
          .regions_lost = thread_policy::regions_lost.load(std::memory_order_relaxed),
          .regions_held = thread_policy::regions_held.load(std::memory_order_relaxed)};
}

}  // namespace autograd
