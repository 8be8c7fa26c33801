// The tiled attention backward. With D_i = Σ_c dO_ic·O_ic (= Σ_j P_ij·dP_ij) formed first, each
// tile recomputes P = exp(S − lse) and dS = P ⊙ (dO·Vᵀ − D), and then two passes share out the
// products without two threads ever adding into one element:
//   key pass, one work item per (b, h, key block):    dV += Pᵀ·dO,  dK += scale·dSᵀ·Q
//   query pass, one per (b, h, query block):          dQ += scale·dS·K,  dM += dS
// Each item adds its tiles in a fixed order, so the results have the same bits at any thread
// count. The query pass with a mask gradient groups the items that add into the same mask
// elements (those along the mask's broadcast dims) into one item. With a slice for each thread
// one pass does it all: one item per (b, h), adding dQ as the key pass goes (see one_pass).
// The products read each thread's copy of the slice's operands (SliceOperands) and sum into
// the thread's own accumulators, written out to the gradients when an item is done.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include <omp.h>

#include "kernels/approx.hpp"
#include "kernels/attention_flash.hpp"

namespace autograd::sdpa {

namespace {

template <class T>
struct BackwardScratch {
  Scratch<T> p;       // [block_q, block_k]: P
  Scratch<T> ds;      // [block_q, block_k]: dP, then dS
  Scratch<T> dk, dv;  // [block_k, d]: a key block's dK and dV, summed here, then written out
  Scratch<T> dq;      // [T, d_k]: dQ (all rows, or a query block's), summed here, then written out
  Scratch<T> z;       // [block_q, block_k]: the tile's dropout factors
};

// What every tile of one backward call reads.
template <class T>
struct BackwardArgs {
  const Dims& d;
  const FlashBackwardData<T>& x;
  MaskStrides ms;
  T scale;
  bool causal;
  const T* D;  // (B, H, T): D_i = Σ_c dO_ic·O_ic
  std::uint64_t call;
};

// n rows of `cols` from src (row stride cols) to dst (row stride sr).
template <class T>
void write_rows(const T* src, std::int64_t n, std::int64_t cols, T* dst, std::int64_t sr) {
  for (std::int64_t i = 0; i < n; ++i) std::copy(src + i * cols, src + (i + 1) * cols, dst + i * sr);
}

// A zeroed [n, cols] accumulator in buf.
template <class T>
T* zeroed(Scratch<T>& buf, std::int64_t n, std::int64_t cols) {
  buf.assign(static_cast<std::size_t>(n * cols), T(0));
  return buf.data();
}

// The weights of one tile's row: the scores in `row` (cols of them) become
// P_ij = exp(S_ij − lse_i), exactly 0 where S = -inf and on a fully blocked row (lse = +inf).
// The one place the backward forms P.
template <class T>
void weights_row(T* row, std::int64_t cols, T lse, bool blocked) {
  const T inf = std::numeric_limits<T>::infinity();
  ArrayView<T> r(row, cols);
  if (lse == inf) {
    r.setZero();
    return;
  }
  if constexpr (std::is_same_v<T, float>) {
    float sum = 0;  // not needed
    if (approx::exp_shifted(row, row, cols, lse, sum)) return;
  }
  if (blocked) {
    r = (r == -inf).select(T(0), (r - lse).exp());
  } else {
    r = (r - lse).exp();
  }
}

// One tile row's weights and their slopes: p (the scores) becomes P as weights_row makes it, and
// ds (dP) becomes dS = P ⊙ (dP − D_i), 0 wherever P is (with the AVX-512 or AVX2 kernel in one
// pass, the same operations).
template <class T>
void weights_and_slopes_row(T* p, T* ds, std::int64_t cols, T lse, T Di, bool blocked) {
  if constexpr (std::is_same_v<T, float>) {
    if (lse != std::numeric_limits<T>::infinity() && approx::exp_slopes(p, ds, cols, lse, Di)) return;
  }
  weights_row(p, cols, lse, blocked);
  for (std::int64_t j = 0; j < cols; ++j) ds[j] = p[j] * (ds[j] - Di);
}

// P and dS of one tile into s.p and s.ds, [rows, cols] with row stride cols; with dropout, s.p
// then holds P ⊙ Z (what dV needs).
template <class T>
void ds_tile(const BackwardArgs<T>& a, const SliceOperands<T>& o, const Tile& t, BackwardScratch<T>& s) {
  const Dims& d = a.d;
  const std::int64_t rows = t.rows(), cols = t.cols(), bh = t.b * d.H + t.h, dv = std::max<std::int64_t>(d.d_v, 1);
  s.p.resize(static_cast<std::size_t>(rows * cols));
  s.ds.resize(static_cast<std::size_t>(rows * cols));
  const bool blocked = score_tile(d, o, a.x.mask, a.ms, a.causal, t, s.p.data());
  //   => dP = dO·Vᵀ                                   [rows, d_v] x [d_v, cols] -> [rows, cols]
  gemm<T>(false, false, rows, cols, d.d_v, T(1), o.dout.data() + t.r0 * dv, dv, o.vt_panel(t.c0, d.d_v),
          o.panel_stride(d, t.c0), T(0), s.ds.data(), std::max<std::int64_t>(cols, 1));
  // dropout, forward: O = (P ⊙ Z)·V  =>  dP = (dO·Vᵀ) ⊙ Z, and D = rowsum(dO ⊙ O) = rowsum(dP ⊙ P) still
  if (a.x.dropout != nullptr) drop_tile(d, *a.x.dropout, t, s.z, s.ds.data());
  //   P = exp(S − lse),  => dS = P ⊙ (dP − D)   (0 wherever P is)
  for (std::int64_t i = 0; i < rows; ++i) {
    const std::int64_t row = bh * d.T + t.r0 + i;
    T* p = s.p.data() + i * cols;
    const T lse = a.x.lse[2 * row], low = a.x.lse[2 * row + 1];
    if (low == T(0)) {
      weights_and_slopes_row(p, s.ds.data() + i * cols, cols, lse, a.D[row], blocked);
    } else {  // P = exp((S − lse) − low): S − lse first (exact near the maximum), then the low part
      for (std::int64_t j = 0; j < cols; ++j) p[j] -= lse;
      weights_and_slopes_row(p, s.ds.data() + i * cols, cols, low, a.D[row], blocked);
    }
  }
  if (a.x.dropout != nullptr) ArrayView<T>(s.p.data(), rows * cols) *= ConstArrayView<T>(s.z.data(), rows * cols);
}

// D_i = Σ_c dO_ic·O_ic for every (b, h, i).
template <class T>
Scratch<T> row_dots(const Dims& d, const FlashBackwardData<T>& x) {
  Scratch<T> D(static_cast<std::size_t>(d.slices() * d.T));
  parallel_for(d.slices(), d.parallel(), [&](std::int64_t bh) {
    const std::int64_t b = bh / d.H, h = bh % d.H;
    for (std::int64_t i = 0; i < d.T; ++i) {
      const std::int64_t at = d.out.at(b, h) + i * d.out.sr;
      D[bh * d.T + i] = (ConstArrayView<T>(x.dout + at, d.d_v) * ConstArrayView<T>(x.out + at, d.d_v)).sum();
    }
  });
  return D;
}

// dS of one tile into the mask-shaped dM: dM[broadcast position of (b, h, i, j)] += dS_ij.
template <class T>
void add_to_mask(const Dims& d, MaskStrides ms, const Tile& t, const T* ds, T* dmask) {
  (void)d;
  T* mb = dmask + t.b * ms.sb + t.h * ms.sh + t.c0 * ms.ss;
  for (std::int64_t i = 0; i < t.rows(); ++i) {
    T* mrow = mb + (t.r0 + i) * ms.st;
    const T* row = ds + i * t.cols();
    if (ms.ss != 0) {
      for (std::int64_t j = 0; j < t.cols(); ++j) mrow[j] += row[j];
    } else {
      mrow[0] += ConstArrayView<T>(row, t.cols()).sum();
    }
  }
}

// Query block [r0, r1) of slice (b, h): dQ, and its tiles' part of dM.
template <class T>
void query_item(const BackwardArgs<T>& a, Tile t, std::int64_t block_k, BackwardScratch<T>& s) {
  const Dims& d = a.d;
  SliceOperands<T>& o = thread_operands<T>();
  o.load(d, a.call, t.b * d.H + t.h, block_k, a.scale, a.x.q, a.x.k, a.x.v, a.x.dout);
  const std::int64_t dk = std::max<std::int64_t>(d.d_k, 1);
  // dQ's rows where the one pass has them (rows r0.. of a [T, d_k] accumulator): the products
  // see their operands at the same alignment, whichever scheme runs
  T* dQ = nullptr;
  if (a.x.dq != nullptr) {
    if (s.dq.size() < static_cast<std::size_t>(d.T * dk)) s.dq.resize(static_cast<std::size_t>(d.T * dk));
    dQ = s.dq.data() + t.r0 * dk;
    std::fill(dQ, dQ + t.rows() * dk, T(0));
  }
  const std::int64_t seen = keys_seen(d, t.r1, a.causal);
  for (t.c0 = 0; t.c0 < seen; t.c0 += block_k) {
    t.c1 = std::min(seen, t.c0 + block_k);  // = seen_part(d, t, causal)
    ds_tile(a, o, t, s);
    //   => dQ += dS·(scale·K)                         [rows, cols] x [cols, d_k] -> [rows, d_k]
    if (dQ != nullptr)
      gemm<T>(false, false, t.rows(), d.d_k, t.cols(), T(1), s.ds.data(), t.cols(), o.k.data() + t.c0 * dk, dk,
              T(1), dQ, dk);
    if (a.x.dmask != nullptr) add_to_mask(d, a.ms, t, s.ds.data(), a.x.dmask);
  }
  if (dQ != nullptr) write_rows(dQ, t.rows(), d.d_k, a.x.dq + d.q.at(t.b, t.h) + t.r0 * d.q.sr, d.q.sr);
}

// Key block [c0, c1) of slice (b, h): dV and dK, summed over the query blocks that see it; with
// `with_query` also each query block's dQ += scale·dS·K (into dQ, the slice's [T, d_k]
// accumulator, unless null) and dM += dS for this key block.
template <class T>
void key_item(const BackwardArgs<T>& a, const SliceOperands<T>& o, Tile t, std::int64_t block_q, bool with_query,
              T* dQ, BackwardScratch<T>& s) {
  const Dims& d = a.d;
  const std::int64_t block_cols = t.cols(), dk = std::max<std::int64_t>(d.d_k, 1);
  const std::int64_t dv = std::max<std::int64_t>(d.d_v, 1);
  T* dV = a.x.dv != nullptr ? zeroed(s.dv, block_cols, dv) : nullptr;
  T* dK = a.x.dk != nullptr ? zeroed(s.dk, block_cols, dk) : nullptr;
  // causal: query blocks entirely above key c0 see none of this block
  const std::int64_t c1 = t.c1;
  for (t.r0 = a.causal ? t.c0 / block_q * block_q : 0; t.r0 < d.T; t.r0 += block_q) {
    t.r1 = std::min(d.T, t.r0 + block_q);
    t.c1 = c1;
    t = seen_part(d, t, a.causal);  // the query pass's tile (causal: the columns of rows < r1)
    if (t.cols() <= 0) continue;
    const std::int64_t cols = t.cols();
    ds_tile(a, o, t, s);
    //   => dV += (P ⊙ Z)ᵀ·dO                          [cols, rows] x [rows, d_v] -> [cols, d_v]
    if (dV != nullptr)
      gemm<T>(true, false, cols, d.d_v, t.rows(), T(1), s.p.data(), cols, o.dout.data() + t.r0 * dv, dv, T(1), dV,
              dv);
    //   => dK += dSᵀ·(scale·Q)                        [cols, rows] x [rows, d_k] -> [cols, d_k]
    if (dK != nullptr)
      gemm<T>(true, false, cols, d.d_k, t.rows(), T(1), s.ds.data(), cols, o.q.data() + t.r0 * dk, dk, T(1), dK,
              dk);
    if (!with_query) continue;
    //   => dQ += dS·(scale·K)                         [rows, cols] x [cols, d_k] -> [rows, d_k]
    if (dQ != nullptr)
      gemm<T>(false, false, t.rows(), d.d_k, cols, T(1), s.ds.data(), cols, o.k.data() + t.c0 * dk, dk, T(1),
              dQ + t.r0 * dk, dk);
    if (a.x.dmask != nullptr) add_to_mask(d, a.ms, t, s.ds.data(), a.x.dmask);
  }
  if (dV != nullptr) write_rows(dV, block_cols, d.d_v, a.x.dv + d.v.at(t.b, t.h) + t.c0 * d.v.sr, d.v.sr);
  if (dK != nullptr) write_rows(dK, block_cols, d.d_k, a.x.dk + d.k.at(t.b, t.h) + t.c0 * d.k.sr, d.k.sr);
}

// The query pass's items: one per (b, h, query block), except that along a dim the mask's
// gradient is summed over (a broadcast dim of the mask) one item takes all of them, in order.
struct QueryItems {
  std::int64_t nb, nh, nq;  // items along b, h, query blocks (1 or the full count)
  std::int64_t count() const { return nb * nh * nq; }
};


// One pass per slice: work items (b, h), each running its key blocks in order with dQ (and dM)
// added as they come, in the order the query pass adds them, so both schemes give the same bits
// and the choice may follow the thread count: one pass (five products per tile) when there are
// slices enough for the threads, else two (seven) that share out every slice's blocks. Not when
// two slices would add into one mask element, nor for a mask constant over each slice (its
// element would take the tiles in another order).
bool one_pass(const Dims& d, MaskStrides ms, bool mask_grad) {
  const bool enough = d.slices() >= (d.parallel() ? omp_get_max_threads() : 1);
  const bool own_mask = (ms.sb != 0 || d.B == 1) && (ms.sh != 0 || d.H == 1) && (ms.st != 0 || ms.ss != 0);
  return enough && (!mask_grad || own_mask);
}

// The key pass (with_query: the single pass), one item per (b, h, key block) or per (b, h).
template <class T>
void key_pass(const BackwardArgs<T>& a, bool with_query) {
  const Dims& d = a.d;
  const FlashTiles tiles = flash_tiles();
  const std::int64_t nk = blocks_of(d.S, tiles.block_k), per_item = with_query ? nk : 1;
  const std::int64_t dk = std::max<std::int64_t>(d.d_k, 1);
  parallel_region(d.parallel(), [&] {
    thread_local BackwardScratch<T> scratch;
    SliceOperands<T>& operands = thread_operands<T>();
#pragma omp for schedule(dynamic)
    for (std::int64_t item = 0; item < d.slices() * nk / per_item; ++item) {
      const std::int64_t bh = item * per_item / nk, b = bh / d.H, h = bh % d.H;
      operands.load(d, a.call, bh, tiles.block_k, a.scale, a.x.q, a.x.k, a.x.v, a.x.dout);
      T* dQ = with_query && a.x.dq != nullptr ? zeroed(scratch.dq, d.T, dk) : nullptr;
      for (std::int64_t kb = item * per_item % nk; kb < item * per_item % nk + per_item; ++kb) {
        const std::int64_t c0 = kb * tiles.block_k;
        key_item(a, operands, Tile{b, h, 0, 0, c0, std::min(d.S, c0 + tiles.block_k)}, tiles.block_q, with_query, dQ,
                 scratch);
      }
      if (dQ != nullptr) write_rows(dQ, d.T, d.d_k, a.x.dq + d.q.at(b, h), d.q.sr);
    }
    trim_thread_operands<T>();
    trim_scratch(scratch.dq);
  });
}

// The query pass: dQ and dM.
template <class T>
void query_pass(const BackwardArgs<T>& a) {
  const Dims& d = a.d;
  const MaskStrides ms = a.ms;
  const FlashTiles tiles = flash_tiles();
  const std::int64_t nq = blocks_of(d.T, tiles.block_q);
  const bool m = a.x.dmask != nullptr;
  const QueryItems qi{m && ms.sb == 0 ? 1 : d.B, m && ms.sh == 0 ? 1 : d.H, m && ms.st == 0 ? 1 : nq};
  parallel_region(d.parallel(), [&] {
    thread_local BackwardScratch<T> scratch;
#pragma omp for schedule(dynamic)
    for (std::int64_t item = 0; item < qi.count(); ++item) {
      const std::int64_t ib = item / (qi.nh * qi.nq), ih = item / qi.nq % qi.nh, iq = item % qi.nq;
      for (std::int64_t b = qi.nb == 1 ? 0 : ib; b < (qi.nb == 1 ? d.B : ib + 1); ++b)
        for (std::int64_t h = qi.nh == 1 ? 0 : ih; h < (qi.nh == 1 ? d.H : ih + 1); ++h)
          for (std::int64_t q = qi.nq == 1 ? 0 : iq; q < (qi.nq == 1 ? nq : iq + 1); ++q) {
            const std::int64_t r0 = q * tiles.block_q;
            query_item(a, Tile{b, h, r0, std::min(d.T, r0 + tiles.block_q), 0, 0}, tiles.block_k, scratch);
          }
    }
    trim_thread_operands<T>();
    trim_scratch(scratch.dq);
  });
}

}  // namespace

template <class T>
void flash_backward(const Dims& d, const FlashBackwardData<T>& x, MaskStrides ms, T scale, bool causal) {
  const Scratch<T> D = row_dots(d, x);
  const BackwardArgs<T> a{d, x, ms, scale, causal, D.data(), next_call()};
  const bool need_query = x.dq != nullptr || x.dmask != nullptr;
  if (d.S > 0 && need_query && one_pass(d, ms, x.dmask != nullptr)) {
    key_pass(a, true);
    return;
  }
  if (x.dk != nullptr || x.dv != nullptr) key_pass(a, false);
  if (need_query) query_pass(a);
}

template void flash_backward<float>(const Dims&, const FlashBackwardData<float>&, MaskStrides, float, bool);
template void flash_backward<double>(const Dims&, const FlashBackwardData<double>&, MaskStrides, double, bool);

}  // namespace autograd::sdpa
