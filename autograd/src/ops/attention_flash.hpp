#pragma once
// The tiled attention core (internal, not installed): FlashAttention-2 style forward and
// backward over tiles of query rows x key columns, in memory linear in T. Only the output and
// one log-sum-exp per query row are kept for backward; the weights are recomputed tile by tile.
// attention_flash.cpp holds the forward, attention_flash_backward.cpp the backward,
// attention_flash_node.cpp the graph node; docs/attention_backward.md §10 derives it.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include <Eigen/Core>

#include "ops/attention_flash_tiles.hpp"
#include "ops/attention_kernels.hpp"
#include "ops/gemm.hpp"

namespace autograd::sdpa {

// What the forward reads and writes. mask may be null.
template <class T>
struct FlashForwardData {
  const T* q;
  const T* k;
  const T* v;
  const T* mask;  // the additive mask, read through MaskStrides
  T* out;         // laid out as Dims::out
  T* lse;         // (B, H, T): log Σ_j exp(S_ij); +inf for a row whose keys are all blocked
  const T* kt;    // null: flash_forward sets it to each slice's Kᵀ (see transposed_slices)
};

// What the backward reads and writes. Any of dq, dk, dv, dmask may be null (not needed); dmask
// has the mask's own (contiguous) shape and receives dL/dS summed over the mask's broadcast dims.
template <class T>
struct FlashBackwardData {
  const T* q;
  const T* k;
  const T* v;
  const T* mask;
  const T* out;
  const T* lse;
  const T* dout;  // never null
  T* dq;
  T* dk;
  T* dv;
  T* dmask;
  const T* kt;  // null: flash_backward sets them to each slice's Kᵀ and Vᵀ (see transposed_slices)
  const T* vt;
};

// For each slice, the output O = softmax_rows(scale·Q·Kᵀ + M)·V (causal: row i sees keys 0..i)
// and the row log-sum-exps of the scores.
template <class T>
void flash_forward(const Dims& d, const FlashForwardData<T>& x, MaskStrides ms, T scale, bool causal);

// The gradients of flash_forward. Bit-identical at any thread count.
template <class T>
void flash_backward(const Dims& d, const FlashBackwardData<T>& x, MaskStrides ms, T scale, bool causal);

// ---- shared by the forward and the backward ----

// Scratch of one thread. Aligned as tensors are: Eigen's vectorised sums start on an aligned
// element, so the order of their additions follows the address, and two threads must add alike.
template <class T>
using Scratch = std::vector<T, Eigen::aligned_allocator<T>>;

// Each slice's matrix of k or v (layout l, `cols` columns) transposed, [cols, S] per slice, the
// slices one after another: the tile products read Kᵀ and Vᵀ so that all of them take the
// matrix product's fastest form (no transposed operand on the right; see score_tile).
template <class T>
Scratch<T> transposed_slices(const Dims& d, const T* x, const Layout& l, std::int64_t cols);

// x's slices (layout l, L rows of `cols`) one after another, [B, H, L, cols]: x itself when they
// already are, else a copy in buf; l becomes that layout. The tile products run faster on rows
// next to each other than on rows of a packed or heads-last tensor (hundreds of floats apart).
template <class T>
const T* contiguous_slices(const Dims& d, const T* x, Layout& l, std::int64_t L, std::int64_t cols, Scratch<T>& buf);

// Whether l is the layout contiguous_slices gives (so x needs no copy).
inline bool is_contiguous(const Dims& d, const Layout& l, std::int64_t L, std::int64_t cols) {
  const Layout c = heads_first(d.H, L, cols);
  return l.base == 0 && (l.sr == c.sr || L <= 1) && (l.sh == c.sh || d.H == 1) && (l.sb == c.sb || d.B == 1);
}

// The inverse: the [B, H, L, cols] slices in src written to dst, laid out as l.
template <class T>
void scatter_slices(const Dims& d, const T* src, const Layout& l, std::int64_t L, std::int64_t cols, T* dst);

// Slice (b, h)'s Kᵀ (or Vᵀ) in the result of transposed_slices, and its row stride.
inline std::int64_t transposed_at(const Dims& d, std::int64_t b, std::int64_t h, std::int64_t cols) {
  return (b * d.H + h) * cols * d.S;
}
inline std::int64_t transposed_stride(const Dims& d) { return std::max<std::int64_t>(d.S, 1); }

// Rows [r0, r1) x columns [c0, c1) of slice (b, h)'s scores.
struct Tile {
  std::int64_t b, h, r0, r1, c0, c1;
  std::int64_t rows() const { return r1 - r0; }
  std::int64_t cols() const { return c1 - c0; }
};

inline std::int64_t blocks_of(std::int64_t n, std::int64_t step) { return (n + step - 1) / step; }

// The key columns query block [r0, r1) sees: all S, or 0..r1-1 when causal.
inline std::int64_t keys_seen(const Dims& d, std::int64_t r1, bool causal) { return causal ? std::min(r1, d.S) : d.S; }

// Sc = scale·Q_r·K_cᵀ + M_rc, [rows, cols] with row stride cols; causal entries j > i are -inf.
// Returns whether an entry may be -inf (a mask, or a tile crossing the diagonal).
// kt: Kᵀ of every slice (transposed_slices).
template <class T>
bool score_tile(const Dims& d, const T* q, const T* kt, const T* mask, MaskStrides ms, T scale, bool causal,
                const Tile& t, T* Sc) {
  const std::int64_t rows = t.rows(), cols = t.cols();
  //   S = scale·Q·Kᵀ                                  [rows, d_k] x [d_k, cols] -> [rows, cols]
  gemm<T>(false, false, rows, cols, d.d_k, scale, q + d.q.at(t.b, t.h) + t.r0 * d.q.sr, d.q.sr,
          kt + transposed_at(d, t.b, t.h, d.d_k) + t.c0, transposed_stride(d), T(0), Sc,
          std::max<std::int64_t>(cols, 1));
  if (mask != nullptr) {  //   S += M
    const T* mb = mask + t.b * ms.sb + t.h * ms.sh + t.c0 * ms.ss;
    for (std::int64_t i = 0; i < rows; ++i) {
      const T* mrow = mb + (t.r0 + i) * ms.st;
      T* srow = Sc + i * cols;
      if (ms.ss != 0) {
        for (std::int64_t j = 0; j < cols; ++j) srow[j] += mrow[j];
      } else {
        for (std::int64_t j = 0; j < cols; ++j) srow[j] += mrow[0];
      }
    }
  }
  const bool crosses = causal && t.c1 - 1 > t.r0;  // some column j > some row i
  if (crosses) {
    const T neg_inf = -std::numeric_limits<T>::infinity();
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = std::max<std::int64_t>(t.r0 + i + 1 - t.c0, 0); j < cols; ++j) Sc[i * cols + j] = neg_inf;
  }
  return mask != nullptr || crosses;
}

}  // namespace autograd::sdpa
