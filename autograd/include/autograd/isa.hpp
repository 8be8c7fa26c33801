#pragma once
// The instruction set of the engine's own vector kernels (small matrix products; the float32
// exact gelu, softmax rows and Philox bits; float32 binary arithmetic and layer_norm rows): AVX-512, AVX2 + FMA and plain C++ in every x86 build,
// portable ones (-DHEADGRAD_NATIVE=OFF) included; the best the CPU supports is chosen at the first
// use. libxsmm and OpenBLAS, for the larger products, choose their own ("generic" drops libxsmm).
//
// The environment variable HEADGRAD_ISA (avx512, avx2 or generic), read at the first use, asks
// for a lower one than the CPU supports; an unknown name, or one the CPU or build lacks, throws
// std::invalid_argument from the first call that chooses the kernels: kernel_isa() itself, or any
// op that computes (every op that runs a loop over its elements chooses first, on the calling
// thread, whether or not it has kernel variants). Called from inside a thread region of the
// caller's own, an op cannot throw: it runs the best variant and the next call outside throws.
#include <string_view>

namespace autograd {

// "avx512", "avx2" or "generic".
std::string_view kernel_isa();

// Use the kernels of `isa` ("avx512", "avx2" or "generic") from now on: for tests and benchmarks
// that compare the variants in one process. Throws std::invalid_argument for an unknown name or
// an instruction set this CPU or build lacks. Not to be called while other threads run ops.
void set_kernel_isa(std::string_view isa);

}  // namespace autograd
