#pragma once
// libtorch's side of bench_torch_cpp, behind an interface free of torch types: libtorch ships its
// own {fmt} headers, which must not meet headgrad's in one translation unit.
#include <cstdint>
#include <memory>

namespace bench {

// torch::nn::MultiheadAttention(E, H) on a (T, B, E) input that requires grad (libtorch's C++
// module is sequence-first); one call = zero the gradients, forward with need_weights = false
// (causal: the (T, T) -inf mask), loss = sum, backward.
class TorchMhaStep {
 public:
  TorchMhaStep(std::int64_t B, std::int64_t T, std::int64_t E, std::int64_t H, bool causal);
  ~TorchMhaStep();
  void operator()();
  static void set_num_threads(int n);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bench
