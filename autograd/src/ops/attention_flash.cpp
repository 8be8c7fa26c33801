// The tiled attention forward: for each block of query rows, the key blocks one after another,
// with an online softmax (a running maximum and sum per row; the partial output rescaled when
// the maximum grows). Memory: one tile of scores and one block of partial outputs per thread.
#include <atomic>
#include <cmath>
#include <type_traits>
#include <vector>

#include "ops/attention_flash.hpp"
#include "ops/rows.hpp"

namespace autograd::sdpa {

FlashTiles& flash_tiles() {
  static FlashTiles tiles;
  return tiles;
}

namespace {
std::atomic<std::int64_t> calls{0};
}  // namespace

std::int64_t tiled_calls() { return calls.load(std::memory_order_relaxed); }
void count_tiled_call() { calls.fetch_add(1, std::memory_order_relaxed); }

namespace {

// One thread's scratch, kept between calls (a warm step allocates nothing).
template <class T>
struct ForwardScratch {
  Scratch<T> scores;  // [block_q, block_k]
  Scratch<T> acc;     // [block_q, d_v]: Σ_j exp(S_ij − m_i)·V_j so far
  Scratch<T> m, l;    // running maximum and sum per row
};

// row = exp(row − m), exactly 0 where row = -inf; returns the row's new sum.
template <class T>
T exp_row(T* row, std::int64_t cols, T m, bool blocked) {
  if constexpr (std::is_same_v<T, float>) {
    float sum = 0;
    if (rows::exp_shifted(row, row, cols, m, sum)) return sum;
  }
  ArrayView<T> r(row, cols);
  if (blocked) {
    r = (r == -std::numeric_limits<T>::infinity()).select(T(0), (r - m).exp());
  } else {
    r = (r - m).exp();
  }
  return r.sum();
}

// Folds one tile of scores (in Sc, [rows, cols]) into the running state: Sc becomes
// exp(S − m_new) (exactly 0 where S = -inf; a row with nothing seen yet stays all 0), l and the
// partial output are rescaled by exp(m_old − m_new).
template <class T>
void online_softmax(ForwardScratch<T>& s, std::int64_t rows, std::int64_t cols, std::int64_t d_v, bool blocked) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  for (std::int64_t i = 0; i < rows; ++i) {
    ArrayView<T> row(s.scores.data() + i * cols, cols);
    const T m_new = std::max(s.m[i], cols > 0 ? row.maxCoeff() : neg_inf);
    if (m_new == neg_inf) {  // every key so far blocked
      row.setZero();
      continue;
    }
    const T alpha = std::exp(s.m[i] - m_new);  // 0 when m_old = -inf
    s.l[i] = s.l[i] * alpha + exp_row(row.data(), cols, m_new, blocked);
    if (alpha != T(1)) ArrayView<T>(s.acc.data() + i * d_v, d_v) *= alpha;
    s.m[i] = m_new;
  }
}

// Query block [r0, r1) of slice (b, h): its output rows and log-sum-exps.
template <class T>
void forward_block(const Dims& d, const FlashForwardData<T>& x, MaskStrides ms, T scale, bool causal, Tile t,
                   std::int64_t block_k, ForwardScratch<T>& s) {
  const std::int64_t rows = t.rows(), lo = d.out.sr;
  s.scores.resize(static_cast<std::size_t>(rows * block_k));
  s.acc.assign(static_cast<std::size_t>(rows * d.d_v), T(0));
  s.m.assign(static_cast<std::size_t>(rows), -std::numeric_limits<T>::infinity());
  s.l.assign(static_cast<std::size_t>(rows), T(0));
  const std::int64_t seen = keys_seen(d, t.r1, causal);  // key blocks above the diagonal skipped
  for (t.c0 = 0; t.c0 < seen; t.c0 += block_k) {
    t.c1 = std::min(d.S, t.c0 + block_k);
    const bool blocked = score_tile(d, x.q, x.kt, x.mask, ms, scale, causal, t, s.scores.data());
    online_softmax(s, rows, t.cols(), d.d_v, blocked);
    //   acc += exp(S − m)·V                           [rows, cols] x [cols, d_v] -> [rows, d_v]
    const T* V = x.v + d.v.at(t.b, t.h) + t.c0 * d.v.sr;
    gemm<T>(false, false, rows, d.d_v, t.cols(), T(1), s.scores.data(), t.cols(), V, d.v.sr, T(1), s.acc.data(),
            std::max<std::int64_t>(d.d_v, 1));
  }
  // O = acc / l; lse = m + log l. A fully blocked row (l = 0) gets O = 0 and lse = +inf, so that
  // exp(S − lse) = 0 recomputes its zero weights in backward.
  T* O = x.out + d.out.at(t.b, t.h) + t.r0 * lo;
  T* lse = x.lse + (t.b * d.H + t.h) * d.T + t.r0;
  for (std::int64_t i = 0; i < rows; ++i) {
    ArrayView<T> o(O + i * lo, d.d_v);
    if (s.l[i] > T(0)) {
      o = ConstArrayView<T>(s.acc.data() + i * d.d_v, d.d_v) / s.l[i];
      lse[i] = s.m[i] + std::log(s.l[i]);
    } else {
      o.setZero();
      lse[i] = std::numeric_limits<T>::infinity();
    }
  }
}

}  // namespace

template <class T>
Scratch<T> transposed_slices(const Dims& d, const T* x, const Layout& l, std::int64_t cols) {
  Scratch<T> out(static_cast<std::size_t>(d.slices() * cols * d.S));
  parallel_for(d.slices(), d.parallel(), [&](std::int64_t bh) {
    const T* src = x + l.at(bh / d.H, bh % d.H);
    T* dst = out.data() + bh * cols * d.S;
    constexpr std::int64_t step = 16;  // in blocks of 16 x 16, each read and written in cache
    for (std::int64_t j0 = 0; j0 < d.S; j0 += step)
      for (std::int64_t c0 = 0; c0 < cols; c0 += step)
        for (std::int64_t c = c0; c < std::min(cols, c0 + step); ++c)
          for (std::int64_t j = j0; j < std::min(d.S, j0 + step); ++j) dst[c * d.S + j] = src[j * l.sr + c];
  });
  return out;
}

template <class T>
const T* contiguous_slices(const Dims& d, const T* x, Layout& l, std::int64_t L, std::int64_t cols, Scratch<T>& buf) {
  if (is_contiguous(d, l, L, cols)) return x;
  buf.resize(static_cast<std::size_t>(d.slices() * L * cols));
  parallel_for(d.slices(), d.parallel(), [&](std::int64_t bh) {
    const T* src = x + l.at(bh / d.H, bh % d.H);
    T* dst = buf.data() + bh * L * cols;
    for (std::int64_t i = 0; i < L; ++i) std::copy(src + i * l.sr, src + i * l.sr + cols, dst + i * cols);
  });
  l = heads_first(d.H, L, cols);
  return buf.data();
}

template <class T>
void scatter_slices(const Dims& d, const T* src, const Layout& l, std::int64_t L, std::int64_t cols, T* dst) {
  parallel_for(d.slices(), d.parallel(), [&](std::int64_t bh) {
    const T* from = src + bh * L * cols;
    T* to = dst + l.at(bh / d.H, bh % d.H);
    for (std::int64_t i = 0; i < L; ++i) std::copy(from + i * cols, from + (i + 1) * cols, to + i * l.sr);
  });
}

template const float* contiguous_slices(const Dims&, const float*, Layout&, std::int64_t, std::int64_t,
                                        Scratch<float>&);
template const double* contiguous_slices(const Dims&, const double*, Layout&, std::int64_t, std::int64_t,
                                         Scratch<double>&);
template void scatter_slices(const Dims&, const float*, const Layout&, std::int64_t, std::int64_t, float*);
template void scatter_slices(const Dims&, const double*, const Layout&, std::int64_t, std::int64_t, double*);

template Scratch<float> transposed_slices(const Dims&, const float*, const Layout&, std::int64_t);
template Scratch<double> transposed_slices(const Dims&, const double*, const Layout&, std::int64_t);

template <class T>
void flash_forward(const Dims& d_in, const FlashForwardData<T>& x_in, MaskStrides ms, T scale, bool causal) {
  Dims d = d_in;
  FlashForwardData<T> x = x_in;
  Scratch<T> kt = transposed_slices(d, x.k, d.k, d.d_k), q, v;
  x.kt = kt.data();
  x.k = nullptr;
  x.q = contiguous_slices(d_in, x_in.q, d.q, d.T, d.d_k, q);
  x.v = contiguous_slices(d_in, x_in.v, d.v, d.S, d.d_v, v);
  const FlashTiles tiles = flash_tiles();
  const std::int64_t blocks = blocks_of(d.T, tiles.block_q), items = d.slices() * blocks;
  parallel_region(d.parallel(), [&] {
    thread_local ForwardScratch<T> scratch;
    // Work items (b, h, query block): each one thread's alone, so the thread count changes nothing.
#pragma omp for schedule(dynamic)
    for (std::int64_t item = 0; item < items; ++item) {
      const std::int64_t bh = item / blocks, r0 = (item % blocks) * tiles.block_q;
      const Tile t{bh / d.H, bh % d.H, r0, std::min(d.T, r0 + tiles.block_q), 0, 0};
      forward_block(d, x, ms, scale, causal, t, tiles.block_k, scratch);
    }
  });
}

template void flash_forward<float>(const Dims&, const FlashForwardData<float>&, MaskStrides, float, bool);
template void flash_forward<double>(const Dims&, const FlashForwardData<double>&, MaskStrides, double, bool);

}  // namespace autograd::sdpa
