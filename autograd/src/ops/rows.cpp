// The elementwise kernels of rows.hpp through the instruction set in use (ops/isa.hpp).
#include "ops/rows.hpp"

#include "ops/isa.hpp"

namespace autograd::rows {

bool gelu(const float* x, float* y, std::int64_t n) {
  switch (isa::active()) {
#if HEADGRAD_ISA_AVX512
    case isa::Isa::Avx512: gelu_avx512(x, y, n); return true;
#endif
#if HEADGRAD_ISA_AVX2
    case isa::Isa::Avx2: gelu_avx2(x, y, n); return true;
#endif
    default: return false;
  }
}

bool gelu_backward(const float* dy, const float* x, float* dx, std::int64_t n) {
  switch (isa::active()) {
#if HEADGRAD_ISA_AVX512
    case isa::Isa::Avx512: gelu_backward_avx512(dy, x, dx, n); return true;
#endif
#if HEADGRAD_ISA_AVX2
    case isa::Isa::Avx2: gelu_backward_avx2(dy, x, dx, n); return true;
#endif
    default: return false;
  }
}

bool exp_shifted(const float* x, float* y, std::int64_t n, float m, float& sum) {
  switch (isa::active()) {
#if HEADGRAD_ISA_AVX512
    case isa::Isa::Avx512: sum = exp_shifted_avx512(x, y, n, m); return true;
#endif
#if HEADGRAD_ISA_AVX2
    case isa::Isa::Avx2: sum = exp_shifted_avx2(x, y, n, m); return true;
#endif
    default: return false;
  }
}

}  // namespace autograd::rows
