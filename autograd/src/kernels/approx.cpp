// The elementwise kernels of approx.hpp through the instruction set in use (kernels/isa.hpp).
#include "kernels/approx.hpp"

#include "kernels/isa.hpp"

namespace autograd::approx {

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

bool exp_slopes(float* p, float* g, std::int64_t n, float m, float c) {
  switch (isa::active()) {
#if HEADGRAD_ISA_AVX512
    case isa::Isa::Avx512: exp_slopes_avx512(p, g, n, m, c); return true;
#endif
#if HEADGRAD_ISA_AVX2
    case isa::Isa::Avx2: exp_slopes_avx2(p, g, n, m, c); return true;
#endif
    default: return false;
  }
}

bool max(const float* x, std::int64_t n, float& max) {
  switch (isa::active()) {
#if HEADGRAD_ISA_AVX512
    case isa::Isa::Avx512: max = max_avx512(x, n); return true;
#endif
#if HEADGRAD_ISA_AVX2
    case isa::Isa::Avx2: max = max_avx2(x, n); return true;
#endif
    default: return false;
  }
}

int vector_width() {
  switch (isa::active()) {
#if HEADGRAD_ISA_AVX512
    case isa::Isa::Avx512: return 16;
#endif
#if HEADGRAD_ISA_AVX2
    case isa::Isa::Avx2: return 8;
#endif
    default: return 0;
  }
}

namespace {
// Rows of whole vectors of the variant in use (none for the generic one).
bool whole_vectors(std::int64_t cols) {
  const int width = vector_width();
  return width > 0 && cols > 0 && cols % width == 0;
}
}  // namespace

bool softmax_rows_shared(float* p, std::int64_t rows, std::int64_t cols, float spread) {
  if (!whole_vectors(cols)) return false;
  switch (isa::active()) {
#if HEADGRAD_ISA_AVX512
    case isa::Isa::Avx512: return softmax_rows_shared_avx512(p, rows, cols, spread);
#endif
#if HEADGRAD_ISA_AVX2
    case isa::Isa::Avx2: return softmax_rows_shared_avx2(p, rows, cols, spread);
#endif
    default: return false;
  }
}

bool softmax_slopes_rows(const float* p, float* g, float* out, std::int64_t rows, std::int64_t cols, std::int64_t ld,
                         float scale) {
  if (!whole_vectors(cols)) return false;
  switch (isa::active()) {
#if HEADGRAD_ISA_AVX512
    case isa::Isa::Avx512: softmax_slopes_rows_avx512(p, g, out, rows, cols, ld, scale); return true;
#endif
#if HEADGRAD_ISA_AVX2
    case isa::Isa::Avx2: softmax_slopes_rows_avx2(p, g, out, rows, cols, ld, scale); return true;
#endif
    default: return false;
  }
}

bool philox_bits(std::uint32_t k0, std::uint32_t k1, std::uint64_t c, std::uint32_t* out) {
#if HEADGRAD_ISA_AVX512
  if (isa::active() == isa::Isa::Avx512) {
    philox_bits_avx512(k0, k1, c, out);
    return true;
  }
#endif
  (void)k0, (void)k1, (void)c, (void)out;
  return false;
}

}  // namespace autograd::approx
