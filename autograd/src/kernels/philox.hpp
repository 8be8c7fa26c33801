#pragma once
// Counter-based random numbers for dropout (internal, not installed): Philox-4x32-10 (Salmon,
// Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011; the constants
// and the round of the Random123 library), and the dropout masks drawn from it.
//
// The mask of one dropout call is a pure function of a 64-bit seed (drawn once per call from the
// caller's Generator) and of each element's flat row-major index n:
//   x_n = lane (n mod 4) of philox4x32_10(counter = (low32(n/4), high32(n/4), 0, 0),
//                                           key = (low32(seed), high32(seed)))
//   u_n = x_n / 2^32, a uniform in [0, 1) on a grid of 2^-32 (the same for every dtype)
//   element n is kept iff u_n >= p, i.e. iff x_n >= ceil(p·2^32); kept values scale by 1/(1-p).
// One Philox call gives the draws of four consecutive elements. Since any element's draw can be
// computed alone, a mask can be generated in parallel, in any order and block by block (the
// tiled attention core regenerates each tile's mask in backward instead of storing it), and the
// result does not depend on the thread count or the tiling.
#include <algorithm>
#include <array>
#include <cstdint>

#include "approx.hpp"  // (beside this header: tests include it by its path)

namespace autograd::philox {

using Counter = std::array<std::uint32_t, 4>;
using Key = std::array<std::uint32_t, 2>;

inline constexpr std::uint32_t kM0 = 0xD2511F53, kM1 = 0xCD9E8D57;  // round multipliers
inline constexpr std::uint32_t kW0 = 0x9E3779B9, kW1 = 0xBB67AE85;  // key increments (Weyl)
inline constexpr int kRounds = 10;

// One Philox round on counter words (c0, c1, c2, c3) with key (k0, k1).
inline void philox_round(std::uint32_t& c0, std::uint32_t& c1, std::uint32_t& c2, std::uint32_t& c3, std::uint32_t k0,
                  std::uint32_t k1) {
  const std::uint64_t p0 = std::uint64_t{kM0} * c0, p1 = std::uint64_t{kM1} * c2;
  const std::uint32_t n0 = static_cast<std::uint32_t>(p1 >> 32) ^ c1 ^ k0;
  const std::uint32_t n2 = static_cast<std::uint32_t>(p0 >> 32) ^ c3 ^ k1;
  c1 = static_cast<std::uint32_t>(p1);
  c3 = static_cast<std::uint32_t>(p0);
  c0 = n0;
  c2 = n2;
}

// Philox-4x32-10 of one counter under one key: ten rounds, the key bumped between rounds.
inline Counter philox4x32_10(Counter c, Key k) {
  for (int r = 0; r < kRounds; ++r) {
    if (r > 0) {
      k[0] += kW0;
      k[1] += kW1;
    }
    philox_round(c[0], c[1], c[2], c[3], k[0], k[1]);
  }
  return c;
}

// The draws of one dropout call.
struct DropoutStream {
  Key key{};
  std::uint64_t threshold = 0;  // ceil(p·2^32): x_n >= threshold  <=>  x_n / 2^32 >= p (2^32: none kept)
  double p = 0.0;               // 0: no dropout (every element kept, scale 1)

  DropoutStream() = default;
  DropoutStream(std::uint64_t seed, double p_)
      : key{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)}, p(p_) {
    const double scaled = p * 4294967296.0;  // exact: a power-of-two scaling
    auto t = static_cast<std::uint64_t>(scaled);
    if (static_cast<double>(t) < scaled) ++t;
    threshold = std::min<std::uint64_t>(t, std::uint64_t{1} << 32);
  }

  // x_n, the 32 random bits of element n.
  std::uint32_t bits(std::uint64_t n) const {
    const Counter c = philox4x32_10({static_cast<std::uint32_t>(n / 4), static_cast<std::uint32_t>(n / 4 >> 32), 0, 0},
                                    key);
    return c[n % 4];
  }
  // u_n in [0, 1).
  double uniform(std::uint64_t n) const { return static_cast<double>(bits(n)) * 0x1.0p-32; }
  bool kept(std::uint64_t n) const { return bits(n) >= threshold; }
  bool active() const { return p > 0.0; }
  // The factor a kept element is scaled by: 1/(1-p); 0 when p = 1 (nothing is kept, no 1/0).
  double scale() const { return p < 1.0 ? 1.0 / (1.0 - p) : 0.0; }
};

// Groups of this many counters (4·kGroup elements) are computed side by side, in lanes the
// compiler vectorises.
inline constexpr int kGroup = 16;
static_assert(kGroup == 16, "approx::philox_bits draws 16 counters");

// The random bits of the 4·kGroup elements of counters c .. c + kGroup - 1: x[lane][g] is element
// 4·(c + g) + lane.
inline void bits_group(const Key& key, std::uint64_t c, std::uint32_t (&x)[4][kGroup]) {
  for (int g = 0; g < kGroup; ++g) {
    x[0][g] = static_cast<std::uint32_t>(c + static_cast<std::uint64_t>(g));
    x[1][g] = static_cast<std::uint32_t>((c + static_cast<std::uint64_t>(g)) >> 32);
    x[2][g] = 0;
    x[3][g] = 0;
  }
  std::uint32_t k0 = key[0], k1 = key[1];
  for (int r = 0; r < kRounds; ++r) {
    if (r > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    for (int g = 0; g < kGroup; ++g) philox_round(x[0][g], x[1][g], x[2][g], x[3][g], k0, k1);
  }
}

// out[k] = scale where element first + k is kept, else 0, for k in [0, count). No allocation.
template <class T>
void keep_factors(const DropoutStream& s, std::uint64_t first, std::int64_t count, T scale, T* out) {
  if (count <= 0) return;
  if (s.threshold > 0xFFFFFFFFu) {  // p = 1 (or within 2^-32 of it): nothing is kept
    std::fill(out, out + count, T(0));
    return;
  }
  const auto thr = static_cast<std::uint32_t>(s.threshold);
  std::uint64_t n = first;
  const std::uint64_t end = first + static_cast<std::uint64_t>(count);
  // whole groups of counters, from the first element whose index is a multiple of 4
  std::uint64_t head_end = std::min(end, (n + 3) / 4 * 4);
  for (; n < head_end; ++n) *out++ = s.bits(n) >= thr ? scale : T(0);
  std::uint32_t x[4][kGroup];
  for (; end - n >= 4 * kGroup; n += 4 * kGroup, out += 4 * kGroup) {
    std::uint32_t* flat = &x[0][0];  // with AVX-512, the 4·kGroup draws in element order at once
    if (approx::philox_bits(s.key[0], s.key[1], n / 4, flat)) {
      for (int k = 0; k < 4 * kGroup; ++k) out[k] = flat[k] >= thr ? scale : T(0);
      continue;
    }
    bits_group(s.key, n / 4, x);
    for (int g = 0; g < kGroup; ++g)
      for (int lane = 0; lane < 4; ++lane) out[4 * g + lane] = x[lane][g] >= thr ? scale : T(0);
  }
  // the rest, one counter (four elements) at a time
  while (n < end) {
    const Counter c =
        philox4x32_10({static_cast<std::uint32_t>(n / 4), static_cast<std::uint32_t>(n / 4 >> 32), 0, 0}, s.key);
    for (std::uint64_t lane = n % 4; lane < 4 && n < end; ++lane, ++n) *out++ = c[lane] >= thr ? scale : T(0);
  }
}

// The keep factors of rows i0..i1-1, columns j0..j1-1 of slice (b, h) of a (B, H, T, S) tensor
// (element ((b·H + h)·T + i)·S + j), row i - i0 of the block at out + (i - i0)·ld.
template <class T>
void keep_block(const DropoutStream& s, std::int64_t H, std::int64_t T_, std::int64_t S, std::int64_t b,
                std::int64_t h, std::int64_t i0, std::int64_t i1, std::int64_t j0, std::int64_t j1, T scale, T* out,
                std::int64_t ld) {
  const auto row0 = static_cast<std::uint64_t>((b * H + h) * T_);
  for (std::int64_t i = i0; i < i1; ++i)
    keep_factors(s, (row0 + static_cast<std::uint64_t>(i)) * static_cast<std::uint64_t>(S) + static_cast<std::uint64_t>(j0),
                 j1 - j0, scale, out + (i - i0) * ld);
}

}  // namespace autograd::philox
