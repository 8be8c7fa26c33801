#pragma once
// Seedable random numbers. The same seed gives the same numbers on every platform: the
// generator is SplitMix64 and the normal draws are our own Box–Muller, not <random>'s
// implementation-defined distributions.
#include <cstdint>

#include "autograd/tensor.hpp"

namespace autograd {

class Generator {
 public:
  explicit Generator(std::uint64_t seed = 0x5eed) : state_(seed) {}
  void manual_seed(std::uint64_t seed) { state_ = seed; has_spare_ = false; }
  std::uint64_t state() const { return state_; }

  std::uint64_t next_u64();
  double uniform();  // [0, 1)
  double normal();   // mean 0, standard deviation 1

 private:
  std::uint64_t state_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

// The process-wide generator used when none is passed.
Generator& default_generator();
void manual_seed(std::uint64_t seed);

Tensor rand(const Shape& shape, Dtype dtype, Generator& gen);  // uniform [0, 1)
Tensor rand(const Shape& shape, Dtype dtype = Dtype::Float32);
Tensor randn(const Shape& shape, Dtype dtype, Generator& gen);  // standard normal
Tensor randn(const Shape& shape, Dtype dtype = Dtype::Float32);
Tensor uniform(const Shape& shape, double low, double high, Dtype dtype, Generator& gen);

}  // namespace autograd
