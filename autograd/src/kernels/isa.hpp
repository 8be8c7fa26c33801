#pragma once
// The instruction set of the vector kernels compiled in several variants (internal, not
// installed; the public side is autograd/isa.hpp).
//
// Each variant lives in its own source file compiled with its own -m flags (gemm_avx512.cpp,
// gemm_avx2.cpp, approx_avx512.cpp, approx_avx2.cpp, exact_avx512.cpp, exact_avx2.cpp). Those files
// include nothing but <cstdint>, <immintrin.h>, headers of plain declarations and their loop
// bodies (gemm_small_impl.hpp, approx_impl.hpp, exact_impl.hpp, in unnamed namespaces), and all
// their code has internal linkage except the entry points, whose names carry the instruction set. The reason: an inline
// function or template (Eigen's, the standard library's) instantiated in files compiled with
// different -m flags gets one mangled name, and the linker keeps just one of the copies, so an
// AVX-512 copy could end up running on a CPU without AVX-512.
#include <cstdint>

namespace autograd::isa {

enum class Isa : int { Generic = 0, Avx2 = 1, Avx512 = 2 };

// The variant in use: the best the CPU supports (and the build compiled), or lower when
// HEADGRAD_ISA or set_kernel_isa asked for it. Cheap (one relaxed atomic load once known).
// The first call reads HEADGRAD_ISA and throws std::invalid_argument for a bad value; inside a
// thread region (active or not) it cannot throw, so there it leaves the choice to the next call
// outside and runs the best variant meanwhile.
Isa active();

// Makes the choice of active() on the calling thread (throwing for a bad HEADGRAD_ISA). Every
// entry to a thread region (parallel_for, parallel_region, parallel_chunks, the product's
// region) calls it first, so the kernels inside a region never make the first choice.
void choose();

// The best variant this CPU supports among those compiled in.
Isa best_supported();

const char* name(Isa isa);

// Clears the upper halves of the vector registers (vzeroupper) when the CPU has AVX; nothing
// otherwise. Each thread of a region calls it before its share of the work. A thread of the
// OpenMP pool keeps the register state of the last code it ran, and OpenBLAS's AVX-512 kernels
// return without clearing it; legacy SSE code run in that state (glibc's exp wrapper, for one) is
// penalised on Intel cores. A cross-entropy row loop measured about 18 times slower on the worker
// thread than on the calling thread without it.
void clear_upper_state();

}  // namespace autograd::isa
