// The tiled attention backward. With D_i = Σ_c dO_ic·O_ic (= Σ_j P_ij·dP_ij) formed first, each
// tile recomputes P = exp(S − lse) and dS = P ⊙ (dO·Vᵀ − D), and then two passes share out the
// products without two threads ever adding into one element:
//   key pass, one work item per (b, h, key block):    dV += Pᵀ·dO,  dK += scale·dSᵀ·Q
//   query pass, one per (b, h, query block):          dQ += scale·dS·K,  dM += dS
// Each item adds its tiles in a fixed order, so the results have the same bits at any thread
// count. The query pass with a mask gradient groups the items that add into the same mask
// elements (those along the mask's broadcast dims) into one item. With a slice for each thread
// one pass does it all: one item per (b, h), adding dQ as the key pass goes (see one_pass).
#include <cmath>
#include <vector>

#include <omp.h>

#include "ops/attention_flash.hpp"

namespace autograd::sdpa {

namespace {

template <class T>
struct BackwardScratch {
  Scratch<T> p;   // [block_q, block_k]: P
  Scratch<T> ds;  // [block_q, block_k]: dP, then dS
  Scratch<T> z;   // [block_q, block_k]: the tile's dropout factors
};

// P and dS of one tile into s.p and s.ds, [rows, cols] with row stride cols; with dropout, s.p
// then holds P ⊙ Z (what dV needs).
template <class T>
void ds_tile(const Dims& d, const FlashBackwardData<T>& x, MaskStrides ms, T scale, bool causal, const T* D,
             const Tile& t, BackwardScratch<T>& s) {
  const std::int64_t rows = t.rows(), cols = t.cols(), bh = t.b * d.H + t.h;
  s.p.resize(static_cast<std::size_t>(rows * cols));
  s.ds.resize(static_cast<std::size_t>(rows * cols));
  const bool blocked = score_tile(d, x.q, x.k, x.mask, ms, scale, causal, t, s.p.data());
  // forward: P_ij = exp(S_ij − lse_i); exactly 0 where S = -inf and on fully blocked rows
  const T inf = std::numeric_limits<T>::infinity();
  for (std::int64_t i = 0; i < rows; ++i) {
    ArrayView<T> row(s.p.data() + i * cols, cols);
    const T lse = x.lse[bh * d.T + t.r0 + i];
    if (lse == inf) {
      row.setZero();
    } else if (blocked) {
      row = (row == -inf).select(T(0), (row - lse).exp());
    } else {
      row = (row - lse).exp();
    }
  }
  //   => dP = dO·Vᵀ                                   [rows, d_v] x [d_v, cols] -> [rows, cols]
  gemm<T>(false, true, rows, cols, d.d_v, T(1), x.dout + d.out.at(t.b, t.h) + t.r0 * d.out.sr, d.out.sr,
          x.v + d.v.at(t.b, t.h) + t.c0 * d.v.sr, d.v.sr, T(0), s.ds.data(), std::max<std::int64_t>(cols, 1));
  // dropout, forward: O = (P ⊙ Z)·V  =>  dP = (dO·Vᵀ) ⊙ Z, and D = rowsum(dO ⊙ O) = rowsum(dP ⊙ P) still
  if (x.dropout != nullptr) drop_tile(d, *x.dropout, t, s.z, s.ds.data());
  //   => dS = P ⊙ (dP − D)   (0 wherever P is)
  for (std::int64_t i = 0; i < rows; ++i) {
    ArrayView<T> ds(s.ds.data() + i * cols, cols);
    ds = ConstArrayView<T>(s.p.data() + i * cols, cols) * (ds - D[bh * d.T + t.r0 + i]);
  }
  if (x.dropout != nullptr) ArrayView<T>(s.p.data(), rows * cols) *= ConstArrayView<T>(s.z.data(), rows * cols);
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

void zero_rows(auto* p, std::int64_t rows, std::int64_t cols, std::int64_t stride) {
  for (std::int64_t i = 0; i < rows; ++i) std::fill(p + i * stride, p + i * stride + cols, 0);
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
void query_item(const Dims& d, const FlashBackwardData<T>& x, MaskStrides ms, T scale, bool causal, const T* D,
                Tile t, std::int64_t block_k, BackwardScratch<T>& s) {
  T* dQ = x.dq != nullptr ? x.dq + d.q.at(t.b, t.h) + t.r0 * d.q.sr : nullptr;
  if (dQ != nullptr) zero_rows(dQ, t.rows(), d.d_k, d.q.sr);
  const std::int64_t seen = keys_seen(d, t.r1, causal);
  for (t.c0 = 0; t.c0 < seen; t.c0 += block_k) {
    t.c1 = std::min(d.S, t.c0 + block_k);
    ds_tile(d, x, ms, scale, causal, D, t, s);
    //   => dQ += scale·dS·K                           [rows, cols] x [cols, d_k] -> [rows, d_k]
    if (dQ != nullptr)
      gemm<T>(false, false, t.rows(), d.d_k, t.cols(), scale, s.ds.data(), t.cols(),
              x.k + d.k.at(t.b, t.h) + t.c0 * d.k.sr, d.k.sr, T(1), dQ, d.q.sr);
    if (x.dmask != nullptr) add_to_mask(d, ms, t, s.ds.data(), x.dmask);
  }
}

// Key block [c0, c1) of slice (b, h): dV and dK, summed over the query blocks that see it; with
// `with_query` also each query block's dQ += scale·dS·K and dM += dS for this key block.
template <class T>
void key_item(const Dims& d, const FlashBackwardData<T>& x, MaskStrides ms, T scale, bool causal, const T* D,
              Tile t, std::int64_t block_q, bool with_query, BackwardScratch<T>& s) {
  const std::int64_t cols = t.cols();
  T* dV = x.dv != nullptr ? x.dv + d.v.at(t.b, t.h) + t.c0 * d.v.sr : nullptr;
  T* dK = x.dk != nullptr ? x.dk + d.k.at(t.b, t.h) + t.c0 * d.k.sr : nullptr;
  T* dQ = with_query && x.dq != nullptr ? x.dq + d.q.at(t.b, t.h) : nullptr;
  if (dV != nullptr) zero_rows(dV, cols, d.d_v, d.v.sr);
  if (dK != nullptr) zero_rows(dK, cols, d.d_k, d.k.sr);
  // causal: query blocks entirely above key c0 see none of this block
  for (t.r0 = causal ? t.c0 / block_q * block_q : 0; t.r0 < d.T; t.r0 += block_q) {
    t.r1 = std::min(d.T, t.r0 + block_q);
    ds_tile(d, x, ms, scale, causal, D, t, s);
    const T* dO = x.dout + d.out.at(t.b, t.h) + t.r0 * d.out.sr;
    //   => dV += (P ⊙ Z)ᵀ·dO                          [cols, rows] x [rows, d_v] -> [cols, d_v]
    if (dV != nullptr)
      gemm<T>(true, false, cols, d.d_v, t.rows(), T(1), s.p.data(), cols, dO, d.out.sr, T(1), dV, d.v.sr);
    //   => dK += scale·dSᵀ·Q                          [cols, rows] x [rows, d_k] -> [cols, d_k]
    if (dK != nullptr)
      gemm<T>(true, false, cols, d.d_k, t.rows(), scale, s.ds.data(), cols, x.q + d.q.at(t.b, t.h) + t.r0 * d.q.sr,
              d.q.sr, T(1), dK, d.k.sr);
    if (!with_query) continue;
    //   => dQ += scale·dS·K                           [rows, cols] x [cols, d_k] -> [rows, d_k]
    if (dQ != nullptr)
      gemm<T>(false, false, t.rows(), d.d_k, cols, scale, s.ds.data(), cols, x.k + d.k.at(t.b, t.h) + t.c0 * d.k.sr,
              d.k.sr, T(1), dQ + t.r0 * d.q.sr, d.q.sr);
    if (x.dmask != nullptr) add_to_mask(d, ms, t, s.ds.data(), x.dmask);
  }
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
void key_pass(const Dims& d, const FlashBackwardData<T>& x, MaskStrides ms, T scale, bool causal, const T* D,
              bool with_query) {
  const FlashTiles tiles = flash_tiles();
  const std::int64_t nk = blocks_of(d.S, tiles.block_k), per_item = with_query ? nk : 1;
  parallel_region(d.parallel(), [&] {
    thread_local BackwardScratch<T> scratch;
#pragma omp for schedule(dynamic)
    for (std::int64_t item = 0; item < d.slices() * nk / per_item; ++item) {
      const std::int64_t bh = item * per_item / nk, b = bh / d.H, h = bh % d.H;
      if (with_query && x.dq != nullptr) zero_rows(x.dq + d.q.at(b, h), d.T, d.d_k, d.q.sr);
      for (std::int64_t kb = item * per_item % nk; kb < item * per_item % nk + per_item; ++kb) {
        const std::int64_t c0 = kb * tiles.block_k;
        key_item(d, x, ms, scale, causal, D, Tile{b, h, 0, 0, c0, std::min(d.S, c0 + tiles.block_k)}, tiles.block_q,
                 with_query, scratch);
      }
    }
  });
}

// The query pass: dQ and dM.
template <class T>
void query_pass(const Dims& d, const FlashBackwardData<T>& x, MaskStrides ms, T scale, bool causal, const T* D) {
  const FlashTiles tiles = flash_tiles();
  const std::int64_t nq = blocks_of(d.T, tiles.block_q);
  const bool m = x.dmask != nullptr;
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
            query_item(d, x, ms, scale, causal, D, Tile{b, h, r0, std::min(d.T, r0 + tiles.block_q), 0, 0},
                       tiles.block_k, scratch);
          }
    }
  });
}

}  // namespace

template <class T>
void flash_backward(const Dims& d, const FlashBackwardData<T>& x, MaskStrides ms, T scale, bool causal) {
  const Scratch<T> D = row_dots(d, x);
  const bool need_query = x.dq != nullptr || x.dmask != nullptr;
  if (d.S > 0 && need_query && one_pass(d, ms, x.dmask != nullptr)) {
    key_pass(d, x, ms, scale, causal, D.data(), true);
    return;
  }
  if (x.dk != nullptr || x.dv != nullptr) key_pass(d, x, ms, scale, causal, D.data(), false);
  if (need_query) query_pass(d, x, ms, scale, causal, D.data());
}

template void flash_backward<float>(const Dims&, const FlashBackwardData<float>&, MaskStrides, float, bool);
template void flash_backward<double>(const Dims&, const FlashBackwardData<double>&, MaskStrides, double, bool);

}  // namespace autograd::sdpa
