#include "autograd/random.hpp"

#include <atomic>
#include <cmath>
#include <numbers>

namespace autograd {

std::uint64_t Generator::next_u64() {
  // SplitMix64 (Steele, Lea, Flood 2014): a full-period 64-bit generator.
  std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double Generator::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

double Generator::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  // Box–Muller: two uniforms give two independent standard normals.
  double u1 = uniform();
  while (u1 <= 0.0) u1 = uniform();
  const double u2 = uniform();
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double theta = 2.0 * std::numbers::pi * u2;
  spare_ = r * std::sin(theta);
  has_spare_ = true;
  return r * std::cos(theta);
}

namespace {
// The seed a thread's default generator starts from: the last one manual_seed was given.
std::atomic<std::uint64_t> start_seed{0x5eed};
}  // namespace

Generator& default_generator() {
  thread_local Generator gen(start_seed.load(std::memory_order_relaxed));
  return gen;
}

void manual_seed(std::uint64_t seed) {
  start_seed.store(seed, std::memory_order_relaxed);
  default_generator().manual_seed(seed);
}

namespace {
template <class Draw>
Tensor fill_with(std::string_view op, const Shape& shape, Dtype dtype, Draw draw) {
  if (!is_floating(dtype))
    fail(op, "draws floating-point values: dtype must be Float32 or Float64, got {}", dtype_name(dtype));
  Tensor t = Tensor::empty(shape, dtype, op);
  dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    T* p = t.data<T>();
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<T>(draw());
  });
  return t;
}
}  // namespace

Tensor rand(const Shape& shape, Dtype dtype, Generator& gen) {
  return fill_with("rand", shape, dtype, [&] { return gen.uniform(); });
}
Tensor rand(const Shape& shape, Dtype dtype) { return rand(shape, dtype, default_generator()); }
Tensor randn(const Shape& shape, Dtype dtype, Generator& gen) {
  return fill_with("randn", shape, dtype, [&] { return gen.normal(); });
}
Tensor randn(const Shape& shape, Dtype dtype) { return randn(shape, dtype, default_generator()); }
Tensor uniform(const Shape& shape, double low, double high, Dtype dtype, Generator& gen) {
  if (!(low <= high)) fail("uniform", "low {} is greater than high {}", low, high);
  return fill_with("uniform", shape, dtype, [&] { return low + (high - low) * gen.uniform(); });
}

namespace {
// A uniform integer in [0, range) for 0 < range <= 2^64 - 1 (Lemire's multiply-and-reject): the
// high word of x * range is uniform once the few low words that would favour some values are
// rejected, so every value has exactly the same chance.
std::uint64_t below(std::uint64_t range, Generator& gen) {
  unsigned __int128 m = static_cast<unsigned __int128>(gen.next_u64()) * range;
  if (static_cast<std::uint64_t>(m) < range) {
    const std::uint64_t threshold = (0 - range) % range;  // 2^64 mod range
    while (static_cast<std::uint64_t>(m) < threshold)
      m = static_cast<unsigned __int128>(gen.next_u64()) * range;
  }
  return static_cast<std::uint64_t>(m >> 64);
}
}  // namespace

Tensor randint(std::int64_t low, std::int64_t high, const Shape& shape, Generator& gen) {
  if (!(low < high)) fail("randint", "needs low < high, got low {} and high {}", low, high);
  // The width in unsigned arithmetic: at most 2^64 - 1, exact even for the full int64 range.
  const std::uint64_t range = static_cast<std::uint64_t>(high) - static_cast<std::uint64_t>(low);
  Tensor t = Tensor::empty(shape, Dtype::Int64, "randint");
  std::int64_t* p = t.data<std::int64_t>();
  for (std::int64_t i = 0; i < t.numel(); ++i)
    p[i] = static_cast<std::int64_t>(static_cast<std::uint64_t>(low) + below(range, gen));
  return t;
}
Tensor randint(std::int64_t low, std::int64_t high, const Shape& shape) {
  return randint(low, high, shape, default_generator());
}

}  // namespace autograd
