// The tiled attention forward: for each block of query rows, the key blocks one after another,
// with an online softmax (a running maximum and sum per row; the partial output rescaled when
// the maximum grows). Memory: one tile of scores and one block of partial outputs per thread.
#include <atomic>
#include <cmath>
#include <type_traits>
#include <vector>

#include "kernels/approx.hpp"
#include "kernels/attention_flash.hpp"

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

// One thread's scratch, kept between calls (no allocation here once warm).
template <class T>
struct ForwardScratch {
  Scratch<T> scores;  // [block_q, block_k]
  Scratch<T> acc;     // [block_q, d_v]: Σ_j exp(S_ij − m_i)·V_j so far
  Scratch<T> m, l;    // running maximum and sum per row
  Scratch<T> z;       // [block_q, block_k]: the tile's dropout factors
};

// row = exp(row − m), exactly 0 where row = -inf; returns the row's new sum.
template <class T>
T exp_row(T* row, std::int64_t cols, T m, bool blocked) {
  if constexpr (std::is_same_v<T, float>) {
    float sum = 0;
    if (approx::exp_shifted(row, row, cols, m, sum)) return sum;
  }
  ArrayView<T> r(row, cols);
  if (blocked) {
    r = (r == -std::numeric_limits<T>::infinity()).select(T(0), (r - m).exp());
  } else {
    r = (r - m).exp();
  }
  return r.sum();
}

// The largest of row[0..cols), NaN when one is; -inf when cols = 0.
template <class T>
T row_max(const T* row, std::int64_t cols) {
  if (cols <= 0) return -std::numeric_limits<T>::infinity();
  if constexpr (std::is_same_v<T, float>) {
    float m = 0;
    if (approx::max(row, cols, m)) return m;
  }
  return ConstArrayView<T>(row, cols).template maxCoeff<Eigen::PropagateNaN>();
}

// Folds one tile of scores (in Sc, [rows, cols]) into the running state: Sc becomes
// exp(S − m_new) (exactly 0 where S = -inf; a row with nothing seen yet stays all 0), l and the
// partial output are rescaled by exp(m_old − m_new). A row that meets a NaN score (or a sum made
// NaN by +inf scores) gets l = NaN and takes no further part: its output becomes NaN.
template <class T>
void online_softmax(ForwardScratch<T>& s, std::int64_t rows, std::int64_t cols, std::int64_t d_v, bool blocked) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  for (std::int64_t i = 0; i < rows; ++i) {
    ArrayView<T> row(s.scores.data() + i * cols, cols);
    const T tile_max = row_max(row.data(), cols);
    if (std::isnan(tile_max) || std::isnan(s.l[i])) {  // a NaN score: the row's output is NaN
      s.l[i] = std::numeric_limits<T>::quiet_NaN();
      row.setZero();
      continue;
    }
    const T m_new = std::max(s.m[i], tile_max);
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
void forward_block(const Dims& d, const FlashForwardData<T>& x, const SliceOperands<T>& o, MaskStrides ms, bool causal,
                   Tile t, std::int64_t block_k, ForwardScratch<T>& s) {
  const std::int64_t rows = t.rows(), lo = d.out.sr;
  s.scores.resize(static_cast<std::size_t>(rows * block_k));
  s.acc.assign(static_cast<std::size_t>(rows * d.d_v), T(0));
  s.m.assign(static_cast<std::size_t>(rows), -std::numeric_limits<T>::infinity());
  s.l.assign(static_cast<std::size_t>(rows), T(0));
  const std::int64_t seen = keys_seen(d, t.r1, causal);  // key blocks above the diagonal skipped
  for (t.c0 = 0; t.c0 < seen; t.c0 += block_k) {
    t.c1 = std::min(seen, t.c0 + block_k);  // = seen_part(d, t, causal)
    const bool blocked = score_tile(d, o, x.mask, ms, causal, t, s.scores.data());
    online_softmax(s, rows, t.cols(), d.d_v, blocked);
    // dropout: the output takes exp(S − m) ⊙ Z, the sums l (and so lse) the undropped weights
    if (x.dropout != nullptr) drop_tile(d, *x.dropout, t, s.z, s.scores.data());
    //   acc += exp(S − m)·V                           [rows, cols] x [cols, d_v] -> [rows, d_v]
    const std::int64_t dv = std::max<std::int64_t>(d.d_v, 1);
    gemm<T>(false, false, rows, d.d_v, t.cols(), T(1), s.scores.data(), t.cols(), o.v.data() + t.c0 * dv, dv, T(1),
            s.acc.data(), dv);
  }
  // O = acc / l; lse = m + log l, with its low part (FlashForwardData). A fully blocked row (l = 0)
  // gets O = 0 and lse = +inf, so that exp(S − lse) = 0 recomputes its zero weights in backward.
  T* O = x.out + d.out.at(t.b, t.h) + t.r0 * lo;
  T* lse = x.lse + 2 * ((t.b * d.H + t.h) * d.T + t.r0);
  for (std::int64_t i = 0; i < rows; ++i) {
    ArrayView<T> o(O + i * lo, d.d_v);
    T& low = lse[2 * i + 1];
    low = T(0);
    if (s.l[i] > T(0)) {
      o = ConstArrayView<T>(s.acc.data() + i * d.d_v, d.d_v) / s.l[i];
      const T m = s.m[i], log_l = std::log(s.l[i]);
      const T sum = m + log_l;
      // The error of that sum, exactly (Knuth's two-sum): kept when it is above 16 units.
      const T back = sum - m;
      const T lost = (m - (sum - back)) + (log_l - back);
      lse[2 * i] = sum;
      if (std::abs(lost) > T(16) * std::numeric_limits<T>::epsilon()) low = lost;
    } else if (std::isnan(s.l[i])) {  // NaN in, NaN out, as the untiled kernel gives
      o.setConstant(std::numeric_limits<T>::quiet_NaN());
      lse[2 * i] = std::numeric_limits<T>::quiet_NaN();
    } else {
      o.setZero();
      lse[2 * i] = std::numeric_limits<T>::infinity();
    }
  }
}

}  // namespace

template <class T>
void flash_forward(const Dims& d, const FlashForwardData<T>& x, MaskStrides ms, T scale, bool causal) {
  const FlashTiles tiles = flash_tiles();
  const std::int64_t blocks = blocks_of(d.T, tiles.block_q), items = d.slices() * blocks;
  const std::uint64_t call = next_call();
  parallel_region(d.parallel(), [&] {
    thread_local ForwardScratch<T> scratch;
    SliceOperands<T>& operands = thread_operands<T>();
    // Work items (b, h, query block): each one thread's alone, so the thread count changes nothing.
    // A thread's items follow one another along the slices (dynamic, in order), so it copies
    // each slice's operands about once.
#pragma omp for schedule(dynamic)
    for (std::int64_t item = 0; item < items; ++item) {
      const std::int64_t bh = item / blocks, r0 = (item % blocks) * tiles.block_q;
      const Tile t{bh / d.H, bh % d.H, r0, std::min(d.T, r0 + tiles.block_q), 0, 0};
      operands.load(d, call, bh, tiles.block_k, scale, x.q, x.k, x.v, nullptr);
      forward_block(d, x, operands, ms, causal, t, tiles.block_k, scratch);
    }
    trim_thread_operands<T>();
  });
}

template void flash_forward<float>(const Dims&, const FlashForwardData<float>&, MaskStrides, float, bool);
template void flash_forward<double>(const Dims&, const FlashForwardData<double>&, MaskStrides, double, bool);

}  // namespace autograd::sdpa
