#include "autograd/grad_mode.hpp"
#include "autograd/threads.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>

#include <omp.h>

#include "autograd/shape.hpp"
#include "kernels/parallel.hpp"

namespace autograd {

namespace {
thread_local bool grad_enabled = true;

// Idle OpenMP threads sleep instead of spinning, unless the program's environment says how they
// wait (OMP_WAIT_POLICY, or GOMP_SPINCOUNT for GCC's runtime). Left to itself, GCC's libgomp
// spins every idle thread for about 300,000 rounds (a few ms) after each parallel region, and
// LLVM's libomp for 200 ms: on a machine whose cores run other work too, those spinning threads
// take the cores from the thread that has work, and a region then waits for a thread that is
// not running. Sleeping costs a wake-up (a futex call) when the next region starts, which the
// thresholds for going parallel (kernels/parallel.hpp) are set to pay for.
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

// The most threads set_num_threads accepts (per-thread scratch and OpenMP's thread creation stay
// within reason; far more threads than cores only slows every kernel down).
constexpr long kMaxThreads = 256;

// OMP_NUM_THREADS above kMaxThreads would be taken by the OpenMP runtime as it is: libgomp then
// fails to create the threads at the first parallel region (it exits, or crashes, at 50,000 or
// 100,000). The first number of the list is lowered to kMaxThreads, with a warning on stderr,
// before the runtime reads the variable (the same .preinit_array function as above).
void cap_thread_count_variable() {
  const char* value = std::getenv("OMP_NUM_THREADS");
  if (value == nullptr) return;
  std::size_t start = 0;
  while (value[start] == ' ') ++start;
  std::size_t end = start;
  while (value[end] >= '0' && value[end] <= '9') ++end;
  if (end == start) return;  // not a number: the runtime's own checks apply
  std::size_t first = start;
  while (first + 1 < end && value[first] == '0') ++first;  // leading zeros
  if (end - first <= 3 && std::strtol(value + first, nullptr, 10) <= kMaxThreads) return;
  const std::string capped = std::to_string(kMaxThreads) + (value + end);
  std::fprintf(stderr, "headgrad: OMP_NUM_THREADS=%s asks for more than %ld threads; using %s\n", value,
               kMaxThreads, capped.c_str());
  setenv("OMP_NUM_THREADS", capped.c_str(), 1);
}

void prepare_openmp_environment() {
  default_to_passive_waiting();
  cap_thread_count_variable();
}

void default_to_passive_waiting_at_start(int, char**, char**) { prepare_openmp_environment(); }

#if defined(__ELF__) && !defined(headgrad_autograd_EXPORTS)
[[gnu::section(".preinit_array"), gnu::used]] void (*const wait_policy_preinit)(int, char**, char**) =
    &default_to_passive_waiting_at_start;
#endif
// (In a shared build libgomp has read the variables already; the cap then holds for the calling
// thread, as set_num_threads would.)
[[gnu::constructor]] void wait_policy_init() {
  prepare_openmp_environment();
  if (omp_get_max_threads() > kMaxThreads) omp_set_num_threads(static_cast<int>(kMaxThreads));
}
}  // namespace

bool is_grad_enabled() { return grad_enabled; }
void set_grad_enabled(bool enabled) { grad_enabled = enabled; }

void set_num_threads(int n) {
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
