#pragma once
// The tiled attention core (internal, not installed): FlashAttention-2 style forward and
// backward over tiles of query rows x key columns, in memory linear in T. Only the output and
// one log-sum-exp per query row are kept for backward; the weights are recomputed tile by tile.
// attention_flash.cpp holds the forward, attention_flash_backward.cpp the backward,
// attention_flash_operands.cpp the per-thread operand copies (SliceOperands), and
// ops/attention_flash_node.cpp the graph node; docs/attention_backward.md §10 derives it.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include <Eigen/Core>

#include "kernels/attention_core.hpp"
#include "kernels/attention_flash_tiles.hpp"
#include "kernels/gemm.hpp"
#include "kernels/philox.hpp"

namespace autograd::sdpa {

// What the forward reads and writes. mask may be null.
template <class T>
struct FlashForwardData {
  const T* q;
  const T* k;
  const T* v;
  const T* mask;  // the additive mask, read through MaskStrides
  T* out;         // laid out as Dims::out
  // (B, H, T, 2): per row lse = log Σ_j exp(S_ij) as the nearest T (+inf for a row whose keys
  // are all blocked), then its low part: 0, or, when the rounding of m + log l lost more than
  // 16 units of the last place of a weight (|m| large: say every key masked by -1e9), what it
  // lost, so that backward forms exp((S − lse) − low) with that part kept.
  T* lse;
  const philox::DropoutStream* dropout;  // null: no dropout
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
  const philox::DropoutStream* dropout;  // null: no dropout
};

// For each slice, the output O = (P ⊙ Z)·V with P = softmax_rows(scale·Q·Kᵀ + M) (causal: row i
// sees keys 0..i) and Z the dropout factors (none: 1), and the row log-sum-exps of the scores.
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

// One slice's operands as the tile products read them: rows next to each other (the products
// run faster on them than on the rows of a packed or heads-last tensor, hundreds of elements
// apart), and the keys and values also transposed, so that no product has a transposed right
// operand (the slowest form of the matrix product at these sizes):
//   q = scale·Q [T, d_k], kt = Kᵀ [d_k, S] and in the forward v [S, d_v];
//   in the backward also k = scale·K [S, d_k], vt = Vᵀ [d_v, S] and dout [T, d_v].
// q and k come scaled (each product that reads them has the scale as a factor), so that every
// tile product is a plain op(A)·B (+ C), with no pass of its own for the scaling.
// kt and vt are stored in panels of `panel` key columns (the key block), one after another,
// each [d, width] with its own width as row stride (the last one may be narrower): a tile reads
// one contiguous panel, where rows S apart (a multiple of 4 KiB at long S) would all fall in
// the same few cache sets.
// Each thread has one (thread_operands), kept between calls: no allocation here once warm.
template <class T>
struct SliceOperands {
  Scratch<T> q, k, kt, v, vt, dout;
  std::int64_t bh = -1, panel = 1;
  std::uint64_t call = 0;

  // Slice bh of call `call`'s operands (dout null: the forward's set), unless already held;
  // panels of `panel` key columns; q and k times `scale`.
  void load(const Dims& d, std::uint64_t call, std::int64_t bh, std::int64_t panel, T scale, const T* q,
            const T* k, const T* v, const T* dout);
  // Columns c0.. (c0 a multiple of `panel`) of Kᵀ (or Vᵀ, with the d_v rows of vt): the panel
  // holding them and its row stride.
  const T* kt_panel(std::int64_t c0, std::int64_t rows) const { return kt.data() + c0 * rows; }
  const T* vt_panel(std::int64_t c0, std::int64_t rows) const { return vt.data() + c0 * rows; }
  std::int64_t panel_stride(const Dims& d, std::int64_t c0) const {
    return std::max<std::int64_t>(std::min(panel, d.S - c0), 1);
  }
};

template <class T>
SliceOperands<T>& thread_operands();

// The most bytes of per-thread copies a thread keeps after a call (64 MiB: the operands of a
// slice of T = S = 16k with d = 64, about). Larger ones are freed when the thread's part of the
// call ends, so no thread holds gigabytes after one long call; the next call that large
// allocates again, which costs little next to the copies it makes anyway.
inline constexpr std::size_t kKeptScratchBytes = std::size_t{64} << 20;

// Frees buf when it holds more than kKeptScratchBytes.
template <class T>
void trim_scratch(Scratch<T>& buf) {
  if (buf.capacity() * sizeof(T) > kKeptScratchBytes) Scratch<T>().swap(buf);
}

// Frees this thread's operand copies when together they hold more than kKeptScratchBytes.
template <class T>
void trim_thread_operands();

// A number for each forward or backward call (never 0): SliceOperands::load tells calls apart by it.
std::uint64_t next_call();

// Rows [r0, r1) x columns [c0, c1) of slice (b, h)'s scores.
struct Tile {
  std::int64_t b, h, r0, r1, c0, c1;
  std::int64_t rows() const { return r1 - r0; }
  std::int64_t cols() const { return c1 - c0; }
};

inline std::int64_t blocks_of(std::int64_t n, std::int64_t step) { return (n + step - 1) / step; }

// The key columns query block [r0, r1) sees: all S, or 0..r1-1 when causal.
inline std::int64_t keys_seen(const Dims& d, std::int64_t r1, bool causal) { return causal ? std::min(r1, d.S) : d.S; }

// Tile t with its columns cut to those its query rows see (causal: none past the last row's
// diagonal, j < r1); empty (cols() <= 0) when they see none. The forward and both backward
// passes cut a tile alike, so its products have the same shapes in each.
inline Tile seen_part(const Dims& d, Tile t, bool causal) {
  t.c1 = std::min(t.c1, keys_seen(d, t.r1, causal));
  return t;
}

// Sc = (scale·Q_r)·K_cᵀ + M_rc, [rows, cols] with row stride cols; causal entries j > i are -inf.
// Returns whether an entry may be -inf (a mask, or a tile crossing the diagonal).
template <class T>
bool score_tile(const Dims& d, const SliceOperands<T>& o, const T* mask, MaskStrides ms, bool causal, const Tile& t,
                T* Sc) {
  const std::int64_t rows = t.rows(), cols = t.cols(), dk = std::max<std::int64_t>(d.d_k, 1);
  //   S = (scale·Q)·Kᵀ                                [rows, d_k] x [d_k, cols] -> [rows, cols]
  gemm<T>(false, false, rows, cols, d.d_k, T(1), o.q.data() + t.r0 * dk, dk, o.kt_panel(t.c0, d.d_k),
          o.panel_stride(d, t.c0), T(0), Sc, std::max<std::int64_t>(cols, 1));
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

// Sc ⊙= Z on tile t ([rows, cols], row stride cols), Z regenerated from the stream into z.
template <class T>
void drop_tile(const Dims& d, const philox::DropoutStream& s, const Tile& t, Scratch<T>& z, T* Sc) {
  const std::int64_t n = t.rows() * t.cols();
  z.resize(static_cast<std::size_t>(n));
  philox::keep_block(s, d.H, d.T, d.S, t.b, t.h, t.r0, t.r1, t.c0, t.c1, static_cast<T>(s.scale()), z.data(), t.cols());
  ArrayView<T>(Sc, n) *= ConstArrayView<T>(z.data(), n);
}

}  // namespace autograd::sdpa
