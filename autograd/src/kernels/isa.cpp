// Which variant of the vector kernels runs (see isa.hpp): detected once, from the CPU's
// features (__builtin_cpu_supports, which also checks that the OS saves the vector registers),
// lowered by HEADGRAD_ISA or set_kernel_isa.
#include "kernels/isa.hpp"

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include <omp.h>

#include "autograd/isa.hpp"
#include "autograd/shape.hpp"

namespace autograd {
namespace isa {
namespace {

// -1 until the first use decides.
std::atomic<int> g_active{-1};

bool parse(std::string_view s, Isa& out) {
  for (Isa i : {Isa::Generic, Isa::Avx2, Isa::Avx512})
    if (s == name(i)) {
      out = i;
      return true;
    }
  return false;
}

// Throws when `requested` is unknown or above what this CPU and build support.
Isa checked(std::string_view op, std::string_view requested) {
  Isa want = Isa::Generic;
  if (!parse(requested, want))
    fail(op, "unknown instruction set '{}' (one of avx512, avx2, generic)", requested);
  const Isa best = best_supported();
  if (static_cast<int>(want) > static_cast<int>(best))
    fail(op, "'{}' is not available on this CPU or in this build (the best is '{}')", requested, name(best));
  return want;
}

}  // namespace

const char* name(Isa isa) {
  switch (isa) {
    case Isa::Avx512: return "avx512";
    case Isa::Avx2: return "avx2";
    default: return "generic";
  }
}

Isa best_supported() {
  static const Isa best = [] {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
#if HEADGRAD_ISA_AVX512
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("fma"))
      return Isa::Avx512;
#endif
#if HEADGRAD_ISA_AVX2
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::Avx2;
#endif
#endif
    return Isa::Generic;
  }();
  return best;
}

#if defined(__x86_64__) || defined(__i386__)
namespace {
__attribute__((target("avx"))) void vzeroupper() { __builtin_ia32_vzeroupper(); }
}  // namespace
#endif

void clear_upper_state() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool has_avx = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx") != 0;
  }();
  if (has_avx) vzeroupper();
#endif
}

Isa active() {
  const int known = g_active.load(std::memory_order_relaxed);
  if (known >= 0) [[likely]]
    return static_cast<Isa>(known);
  const char* env = std::getenv("HEADGRAD_ISA");
  Isa chosen = best_supported();
  if (env != nullptr && *env != '\0') {
    // An exception must not leave an OpenMP region (it would end the process): inside one, a bad
    // value is left for the next call outside, on the calling thread, to report. A region with
    // one thread (OMP_THREAD_LIMIT, a nested region) is not "in parallel" but is a region all the
    // same: omp_get_level counts it.
    if (omp_get_level() > 0) {
      try {
        chosen = checked("HEADGRAD_ISA", env);
      } catch (const std::invalid_argument&) {
        return chosen;
      }
    } else {
      chosen = checked("HEADGRAD_ISA", env);
    }
  }
  g_active.store(static_cast<int>(chosen), std::memory_order_relaxed);
  return chosen;
}

void choose() { (void)active(); }

}  // namespace isa

std::string_view kernel_isa() { return isa::name(isa::active()); }

void set_kernel_isa(std::string_view requested) {
  isa::g_active.store(static_cast<int>(isa::checked("set_kernel_isa", requested)), std::memory_order_relaxed);
}

}  // namespace autograd
