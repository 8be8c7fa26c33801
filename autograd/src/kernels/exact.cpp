// The loops of exact.hpp through the instruction set in use (kernels/isa.hpp), and the tensor forms of
// exact_ops.hpp, which walk a broadcast as broadcast::map does (kernels/broadcast.hpp).
#include "kernels/exact.hpp"

#include <array>

#include "kernels/broadcast.hpp"
#include "kernels/exact_ops.hpp"
#include "kernels/isa.hpp"

namespace autograd::exact {

bool binary(Op op, const float* a, std::int64_t sa, const float* b, std::int64_t sb, float* y, std::int64_t n) {
  switch (isa::active()) {
#if HEADGRAD_ISA_AVX512
    case isa::Isa::Avx512: binary_avx512(op, a, sa, b, sb, y, n); return true;
#endif
#if HEADGRAD_ISA_AVX2
    case isa::Isa::Avx2: binary_avx2(op, a, sa, b, sb, y, n); return true;
#endif
    default: return false;
  }
}

bool layer_norm_forward(const float* x, std::int64_t n, const float* w, const float* b, double eps, double* stats,
                        float* y) {
  switch (isa::active()) {
#if HEADGRAD_ISA_AVX512
    case isa::Isa::Avx512: layer_norm_forward_avx512(x, n, w, b, eps, stats, y); return true;
#endif
#if HEADGRAD_ISA_AVX2
    case isa::Isa::Avx2: layer_norm_forward_avx2(x, n, w, b, eps, stats, y); return true;
#endif
    default: return false;
  }
}

bool layer_norm_backward(const float* x, const float* dy, std::int64_t n, const float* w, const double* stats,
                         float* dx, float* dw, float* db) {
  switch (isa::active()) {
#if HEADGRAD_ISA_AVX512
    case isa::Isa::Avx512: layer_norm_backward_avx512(x, dy, n, w, stats, dx, dw, db); return true;
#endif
#if HEADGRAD_ISA_AVX2
    case isa::Isa::Avx2: layer_norm_backward_avx2(x, dy, n, w, stats, dx, dw, db); return true;
#endif
    default: return false;
  }
}

namespace {

bool applies(const Tensor& a) { return a.dtype() == Dtype::Float32 && isa::active() != isa::Isa::Generic; }

// y = a ∘ c or c ∘ a over the whole tensor.
Tensor scalar_op(Op op, const Tensor& a, double c, bool c_first) {
  if (!applies(a)) return Tensor();
  Tensor out = Tensor::empty(a.shape(), Dtype::Float32);
  const float value = static_cast<float>(c);
  const float* pa = a.data<float>();
  float* py = out.data<float>();
  broadcast::parallel_chunks(out.numel(), [&](std::int64_t begin, std::int64_t end) {
    if (c_first) binary(op, &value, 0, pa + begin, 1, py + begin, end - begin);
    else binary(op, pa + begin, 1, &value, 0, py + begin, end - begin);
  });
  return out;
}

}  // namespace

Tensor binary(Op op, const Shape& shape, const Tensor& a, const Tensor& b) {
  if (!applies(a)) return Tensor();
  Tensor out = Tensor::empty(shape, Dtype::Float32);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* py = out.data<float>();
  if (a.shape() == shape && b.shape() == shape) {  // one run, as in broadcast::map
    broadcast::parallel_chunks(out.numel(), [&](std::int64_t begin, std::int64_t end) {
      binary(op, pa + begin, 1, pb + begin, 1, py + begin, end - begin);
    });
    return out;
  }
  const broadcast::BroadcastPlan<2> plan = broadcast::make_plan<2>(shape, {&a.shape(), &b.shape()});
  const std::int64_t sa = plan.strides[0].back() == 0 ? 0 : 1, sb = plan.strides[1].back() == 0 ? 0 : 1;
  broadcast::parallel_chunks(plan.numel, [&](std::int64_t begin, std::int64_t end) {
    broadcast::for_each_run(plan, begin, end,
                          [&](std::int64_t at, const std::array<std::int64_t, 2>& in, std::int64_t len) {
                            binary(op, pa + in[0], sa, pb + in[1], sb, py + at, len);
                          });
  });
  return out;
}

Tensor with_scalar(Op op, const Tensor& a, double c) { return scalar_op(op, a, c, false); }
Tensor scalar_first(Op op, const Tensor& a, double c) { return scalar_op(op, a, c, true); }

}  // namespace autograd::exact
