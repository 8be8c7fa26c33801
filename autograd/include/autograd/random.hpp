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

// The generator used when none is passed: one per thread, so that threads never share one
// (two threads initialising modules at once each draw their own numbers, with no lock and no
// race). A thread's default generator is made on the thread's first use, seeded with the seed
// last given to manual_seed by any thread (0x5eed before any call): threads started after
// manual_seed(s) each draw the same numbers as a generator Generator(s).
Generator& default_generator();
// Reseeds the calling thread's default generator and sets the seed that threads' generators
// made later start from; generators other threads already use are not changed.
void manual_seed(std::uint64_t seed);

Tensor rand(const Shape& shape, Dtype dtype, Generator& gen);  // uniform [0, 1)
Tensor rand(const Shape& shape, Dtype dtype = Dtype::Float32);
Tensor randn(const Shape& shape, Dtype dtype, Generator& gen);  // standard normal
Tensor randn(const Shape& shape, Dtype dtype = Dtype::Float32);
Tensor uniform(const Shape& shape, double low, double high, Dtype dtype, Generator& gen);
// Int64 integers drawn uniformly from [low, high) (PyTorch's torch.randint(low, high, size)), each
// exactly equally likely whatever the width of the range (no modulo bias); low < high.
Tensor randint(std::int64_t low, std::int64_t high, const Shape& shape, Generator& gen);
Tensor randint(std::int64_t low, std::int64_t high, const Shape& shape);

}  // namespace autograd
