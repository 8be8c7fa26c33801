// The fused attention's forward and hand-derived backward, one (batch, head) slice at a time.
// The derivation, step by step, is in docs/attention_backward.md; each backward line below
// quotes the forward line it differentiates.
#include "kernels/attention_core.hpp"

#include <algorithm>
#include <atomic>
#include <limits>
#include <optional>
#include <type_traits>

#include "kernels/approx.hpp"
#include "kernels/gemm.hpp"

namespace autograd::sdpa {

namespace {

// A [rows, cols] block of a slice whose rows are `stride` elements apart.
template <class T>
using StridedView = Eigen::Map<std::conditional_t<std::is_const_v<T>, const RowMatrix<std::remove_const_t<T>>, RowMatrix<T>>,
                               Eigen::Unaligned, Eigen::OuterStride<>>;

// Causal attention works on blocks of this many query rows; block [r0, r1) sees keys 0..r1-1
// only, so about (1 + step/T)/2 of the full products are computed.
constexpr std::int64_t kCausalBlock = 32;

// How a slice's query rows are cut: one block of all T rows seeing all S keys, or causal blocks.
struct RowBlocks {
  std::int64_t step = 1;
  bool causal = false;
  std::int64_t S = 0;
  std::int64_t cols(std::int64_t r1) const { return causal ? r1 : S; }  // keys visible to rows < r1
};

RowBlocks row_blocks(const Dims& d, bool causal) {
  return {causal ? kCausalBlock : std::max<std::int64_t>(d.T, 1), causal, d.S};
}

// One of a slice's products, made by `make(rows, cols)` for a block of `rows` query rows (or key
// columns) against `cols` others: prepared once for every slice when they are one block each
// (not causal), else for each block as it comes.
template <class T, class Make>
class BlockProduct {
 public:
  BlockProduct(Make make, bool causal, std::int64_t rows, std::int64_t cols) : make_(make) {
    if (!causal) all_.emplace(make_(rows, cols));
  }
  PreparedGemm<T> at(std::int64_t rows, std::int64_t cols) const { return all_ ? *all_ : make_(rows, cols); }

 private:
  Make make_;
  std::optional<PreparedGemm<T>> all_;
};

template <class T, class Make>
BlockProduct<T, Make> block_product(bool causal, std::int64_t rows, std::int64_t cols, Make make) {
  return BlockProduct<T, Make>(make, causal, rows, cols);
}

// ---- forward ----

// S += M (broadcast) on rows r0..r1-1, columns 0..cols-1 of slice (b, h)'s scores.
template <class T>
void add_mask(const Dims& d, const T* mask, MaskStrides ms, std::int64_t b, std::int64_t h, std::int64_t r0,
              std::int64_t r1, std::int64_t cols, T* scores) {
  const T* mb = mask + b * ms.sb + h * ms.sh;
  for (std::int64_t i = r0; i < r1; ++i) {
    const T* mrow = mb + i * ms.st;
    T* srow = scores + i * d.S;
    if (ms.ss != 0) {
      for (std::int64_t j = 0; j < cols; ++j) srow[j] += mrow[j];
    } else {
      const T m = mrow[0];
      for (std::int64_t j = 0; j < cols; ++j) srow[j] += m;
    }
  }
}

// P = softmax(S) on one row of S entries, in place, over its first `seen` entries (the rest
// become 0). A row with every key blocked (max = -inf) becomes all zero, where the textbook
// formula would give 0/0 = NaN.
// Returns whether the row had keys but no score above −inf (then all zero).
template <class T>
bool softmax_row(T* row_data, std::int64_t S, std::int64_t seen, bool masked) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  ArrayView<T> prow(row_data, S);
  auto row = prow.head(seen);
  const T row_max = seen > 0 ? row.maxCoeff() : neg_inf;
  if (row_max == neg_inf) {
    prow.setZero();
    return seen > 0;
  }
  // Blocked keys get weight exactly 0 (Eigen's vectorised exp clamps its argument, so exp(-inf)
  // alone would give ~1e-308). Without a mask no key is blocked (causality is the `seen` bound),
  // and the exp stays vectorised (select is not).
  if constexpr (std::is_same_v<T, float>) {
    T sum{};
    if (approx::exp_shifted(row_data, row_data, seen, row_max, sum)) {  // exp(x - max), 0 where x = -inf
      row /= sum;
      if (seen < S) prow.tail(S - seen).setZero();
      return false;
    }
  }
  if (masked && (row == neg_inf).any()) {
    row = (row == neg_inf).select(T(0), (row - row_max).exp());
  } else {
    row = (row - row_max).exp();
  }
  row /= row.sum();  // sum >= 1 (the max term is exp(0))
  if (seen < S) prow.tail(S - seen).setZero();
  return false;
}

// float32 softmax of `rows` contiguous rows of `cols` entries with one exponential pass over all
// of them: softmax does not depend on the shift, so the rows share the largest of their maxima
// m, where each row on its own would use its own maximum m_i. Taken only when every m_i is
// finite and within kSharedShift of m: then each row's largest weight exp(m_i − m) stays a
// normal float, and only entries below about e^-71 of their row's largest lose precision, those
// below e^-72.7 becoming exactly 0 (where a row's own shift keeps them down to e^-87, as
// denormals to e^-88.7): weights under 3e-32 of the row's largest, which matter only against
// values near 1e32 and up in V. Otherwise (NaN or +inf scores, spread-out rows),
// and without a vector exponential, false: nothing done. One call for the block instead of one
// per row: at T = 32 the per-row calls cost about three times their arithmetic. Rows of whole
// vectors take one vector kernel for all of it (approx::softmax_rows_shared); other rows one
// vector exponential over the block, their maxima and sums by Eigen.
constexpr float kSharedShift = 16.f;

template <class T>
bool softmax_rows_shared_shift(T* p, std::int64_t rows, std::int64_t cols) {
  if constexpr (!std::is_same_v<T, float>) {
    return false;
  } else {
    if (rows < 2 || cols < 1) return false;
    const int width = approx::vector_width();
    if (width > 0 && cols % width == 0) return approx::softmax_rows_shared(p, rows, cols, kSharedShift);
    const ConstMatrixView<float> block(p, rows, cols);
    float hi = -std::numeric_limits<float>::infinity(), lo = std::numeric_limits<float>::infinity();
    for (std::int64_t i = 0; i < rows; ++i) {
      const float m = block.row(i).maxCoeff();
      hi = std::max(hi, m);
      lo = std::min(lo, m);
    }
    if (!(hi - lo <= kSharedShift) || !(hi < std::numeric_limits<float>::infinity())) return false;  // NaN too
    float total = 0.f;
    if (!approx::exp_shifted(p, p, rows * cols, hi, total)) return false;
    MatrixView<float> weights(p, rows, cols);
    for (std::int64_t i = 0; i < rows; ++i) weights.row(i) *= 1.f / weights.row(i).sum();  // sum >= exp(lo - hi) > 0
    return true;
  }
}

// C = (A ⊙ Z)·B + beta·C for a block A [rows, cols] of row stride S (Z: the dropout factors' same
// block, or null for none) and B [cols, d_v] with rows lb apart; `dropped` is scratch for A ⊙ Z.
template <class T>
void dropped_times(const Dims& d, const T* A, const T* Z, std::int64_t rows, std::int64_t cols, const T* B,
                   std::int64_t lb, T beta, T* C, std::int64_t lc, RowMatrix<T>& dropped) {
  std::int64_t ld = d.S;
  if (Z != nullptr) {
    dropped = StridedView<const T>(A, rows, cols, d.S).array() * StridedView<const T>(Z, rows, cols, d.S).array();
    A = dropped.data();
    ld = cols;
  }
  gemm<T>(false, false, rows, d.d_v, cols, T(1), A, std::max<std::int64_t>(ld, 1), B, lb, beta, C, lc);
}

}  // namespace

MaskStrides mask_strides(const Shape& mask_shape) {
  Shape padded(4 - mask_shape.size(), 1);
  padded.insert(padded.end(), mask_shape.begin(), mask_shape.end());
  const Shape strides = contiguous_strides(padded);
  auto stride = [&](int i) { return padded[i] == 1 ? 0 : strides[i]; };
  return {stride(0), stride(1), stride(2), stride(3)};
}

// Causal slices go in blocks of query rows: block [r0, r1) multiplies only against keys
// 0..r1-1, the ones its rows can see.
template <class T>
bool forward(const Dims& d, const ForwardData<T>& x, MaskStrides ms, T scale, bool causal) {
  std::atomic<bool> keyless{false};  // a row with no score above −inf
  const RowBlocks blocks = row_blocks(d, causal);
  const std::int64_t lq = d.q.sr, lk = d.k.sr, lv = d.v.sr, lo = d.out.sr, ls = std::max<std::int64_t>(d.S, 1);
  // S = Q·(scale·Kᵀ) and O = P·V of a block of rows seeing cols keys
  const auto scores = block_product<T>(causal, d.T, d.S, [&](std::int64_t rows, std::int64_t cols) {
    return PreparedGemm<T>(false, false, rows, cols, d.d_k, T(1), lq, ls, T(0), d.S);
  });
  const auto weighted = block_product<T>(causal, d.T, d.S, [&](std::int64_t rows, std::int64_t cols) {
    return PreparedGemm<T>(false, false, rows, d.d_v, cols, T(1), ls, lv, T(0), lo);
  });
  parallel_region(d.parallel(), [&] {
    // P ⊙ Z of a block, and scale·Kᵀ of a slice: scratch of each thread, kept between calls
    // (no allocation once warm).
    thread_local RowMatrix<T> dropped, kt;
#pragma omp for schedule(static)
    for (std::int64_t bh = 0; bh < d.slices(); ++bh) {
      const std::int64_t b = bh / d.H, h = bh % d.H;
      const T* Q = x.q + d.q.at(b, h);    // [T, d_k], rows lq apart
      const T* K = x.k + d.k.at(b, h);    // [S, d_k], rows lk apart
      const T* V = x.v + d.v.at(b, h);    // [S, d_v], rows lv apart
      T* P = x.weights + bh * d.T * d.S;  // [T, S]: scores, then weights in place
      T* O = x.out + d.out.at(b, h);      // [T, d_v], rows lo apart
      const T* Z = x.keep != nullptr ? x.keep + bh * d.T * d.S : nullptr;
      // scale·Kᵀ [d_k, S] once for all blocks (the product by a transposed K would transpose it
      // per block: a causal slice's blocks see keys 0..r1-1, about half of them each).
      kt.resize(d.d_k, d.S);
      transpose_scaled(K, lk, d.S, d.d_k, scale, kt.data(), d.S);

      for (std::int64_t r0 = 0; r0 < d.T; r0 += blocks.step) {
        const std::int64_t r1 = std::min(d.T, r0 + blocks.step), rows = r1 - r0;
        const std::int64_t cols = blocks.cols(r1);  // keys rows r0..r1-1 can see
        T* Pb = P + r0 * d.S;                       // [rows, cols] of row stride S
        // S = scale·Q·Kᵀ = Q·(scale·Kᵀ)                [rows, d_k] x [d_k, cols] -> [rows, cols]
        scores.at(rows, cols)(Q + r0 * lq, kt.data(), Pb);
        // S += M
        if (x.mask != nullptr) add_mask(d, x.mask, ms, b, h, r0, r1, cols, P);
        // P = softmax(S) by rows (causal: row i sees keys 0..i)
        // (Without a mask only: a float mask equal to causality then gives the bits of is_causal.)
        if (causal || x.mask != nullptr || !softmax_rows_shared_shift(Pb, rows, d.S))
          for (std::int64_t i = r0; i < r1; ++i)
            if (softmax_row(P + i * d.S, d.S, causal ? i + 1 : d.S, x.mask != nullptr))
              keyless.store(true, std::memory_order_relaxed);
        // O = (P ⊙ Z)·V                                  [rows, cols] x [cols, d_v] -> [rows, d_v]
        if (Z != nullptr) {
          dropped_times<T>(d, Pb, Z + r0 * d.S, rows, cols, V, lv, T(0), O + r0 * lo, lo, dropped);
        } else {
          weighted.at(rows, cols)(Pb, V, O + r0 * lo);
        }
      }
    }
  });
  return keyless.load();
}

// ---- forward mode ----
// Causal slices use the forward's blocks of query rows: block [r0, r1) forms Ṡ and Ṗ against keys
// 0..r1-1 only (P, and so Ṗ, is zero past the diagonal).

template <class T>
void tangent(const Dims& d, const TangentData<T>& x, MaskStrides ms, T scale, bool causal) {
  const RowBlocks blocks = row_blocks(d, causal);
  const std::int64_t lq = d.q.sr, lk = d.k.sr, lv = d.v.sr, lo = d.out.sr;
  const bool moving_scores = x.dq != nullptr || x.dk != nullptr || x.dmask != nullptr;
  parallel_region(d.parallel(), [&] {
    thread_local RowMatrix<T> ds, dropped;  // Ṡ then Ṗ of a block; P ⊙ Z or Ṗ ⊙ Z
#pragma omp for schedule(static)
    for (std::int64_t bh = 0; bh < d.slices(); ++bh) {
      const std::int64_t b = bh / d.H, h = bh % d.H, slice = bh * d.T * d.S;
      const T* Q = x.q + d.q.at(b, h);
      const T* K = x.k + d.k.at(b, h);
      const T* V = x.v + d.v.at(b, h);
      const T* P = x.weights + slice;
      const T* Z = x.keep != nullptr ? x.keep + slice : nullptr;
      T* dO = x.dout + d.out.at(b, h);
      T* dW = x.dweights != nullptr ? x.dweights + slice : nullptr;
      for (std::int64_t r0 = 0; r0 < d.T; r0 += blocks.step) {
        const std::int64_t r1 = std::min(d.T, r0 + blocks.step), rows = r1 - r0;
        const std::int64_t cols = blocks.cols(r1);
        T* Ob = dO + r0 * lo;
        bool written = false;  // Ȯ's block holds a term
        if (moving_scores && cols > 0) {
          // Ṡ = scale·Q̇·Kᵀ + scale·Q·K̇ᵀ + Ṁ              [rows, d_k] x [d_k, cols] -> [rows, cols]
          ds.resize(d.T, d.S);
          StridedView<T>(ds.data() + r0 * d.S, rows, cols, d.S).setZero();
          if (x.dq != nullptr)
            gemm<T>(false, true, rows, cols, d.d_k, scale, x.dq + d.q.at(b, h) + r0 * lq, lq, K, lk, T(1),
                    ds.data() + r0 * d.S, d.S);
          if (x.dk != nullptr)
            gemm<T>(false, true, rows, cols, d.d_k, scale, Q + r0 * lq, lq, x.dk + d.k.at(b, h), lk, T(1),
                    ds.data() + r0 * d.S, d.S);
          if (x.dmask != nullptr) add_mask(d, x.dmask, ms, b, h, r0, r1, cols, ds.data());
          // Ṗ_ij = P_ij·(Ṡ_ij − Σ_k P_ik·Ṡ_ik), in place
          for (std::int64_t i = r0; i < r1; ++i) {
            auto p_row = ConstArrayView<T>(P + i * d.S, cols);
            auto row = ArrayView<T>(ds.data() + i * d.S, cols);
            const T row_dot = (row * p_row).sum();
            row = p_row * (row - row_dot);
          }
          if (dW != nullptr) {
            StridedView<T>(dW + r0 * d.S, rows, cols, d.S) = StridedView<const T>(ds.data() + r0 * d.S, rows, cols, d.S);
            if (cols < d.S) StridedView<T>(dW + r0 * d.S + cols, rows, d.S - cols, d.S).setZero();
          }
          // Ȯ = (Ṗ ⊙ Z)·V                                  [rows, cols] x [cols, d_v] -> [rows, d_v]
          dropped_times<T>(d, ds.data() + r0 * d.S, Z != nullptr ? Z + r0 * d.S : nullptr, rows, cols, V, lv, T(0),
                           Ob, lo, dropped);
          written = true;
        } else if (dW != nullptr) {
          StridedView<T>(dW + r0 * d.S, rows, d.S, d.S).setZero();
        }
        if (x.dv != nullptr && cols > 0) {
          // Ȯ += (P ⊙ Z)·V̇
          dropped_times<T>(d, P + r0 * d.S, Z != nullptr ? Z + r0 * d.S : nullptr, rows, cols, x.dv + d.v.at(b, h), lv,
                           written ? T(1) : T(0), Ob, lo, dropped);
          written = true;
        }
        if (!written) StridedView<T>(Ob, rows, d.d_v, lo).setZero();
      }
    }
  });
}

// ---- backward ----
// Causal slices use the forward's blocks: dS is formed for block [r0, r1) x [0, r1) only (it is
// zero above the diagonal, where P is), and the products that sum over queries (dV, dK) take key
// block [c0, c1) against queries c0..T-1 only.

namespace {

// One slice's matrices in the backward (null: absent or not wanted).
template <class T>
struct Slice {
  const T* Q;   // [T, d_k], rows lq apart (so are dQ's)
  const T* K;   // [S, d_k], rows lk apart (so are dK's)
  const T* V;   // [S, d_v], rows lv apart (so are dV's)
  const T* P;   // [T, S]
  const T* Z;   // [T, S]
  const T* dO;  // [T, d_v], rows lo apart; null = 0
  const T* dW;  // [T, S]; null = 0
};

// The products that sum over queries (dV, dK) take key block [c0, c1) against queries
// first_query(c0)..T-1: all of them, or c0..T-1 when causal.
struct KeyBlocks {
  std::int64_t step;
  bool causal;
  std::int64_t first_query(std::int64_t c0) const { return causal ? c0 : std::int64_t{0}; }
};

// forward: O = Pd·V with Pd = P ⊙ Z (Pd = P without dropout)
//   => dV = Pdᵀ·dO                                          [S, T] x [T, d_v] -> [S, d_v]
template <class T, class Product>
void slice_dv(const Dims& d, const Slice<T>& s, KeyBlocks kb, const Product& product, RowMatrix<T>& dropped, T* dV) {
  const std::int64_t lv = d.v.sr, lo = d.out.sr;
  if (d.T == 0 || s.dO == nullptr) {
    StridedView<T>(dV, d.S, d.d_v, Eigen::OuterStride<>(lv)).setZero();
    return;
  }
  const T* Pd = s.P;
  if (s.Z != nullptr) {
    dropped = ConstMatrixView<T>(s.P, d.T, d.S).array() * ConstMatrixView<T>(s.Z, d.T, d.S).array();
    Pd = dropped.data();
  }
  for (std::int64_t c0 = 0; c0 < d.S; c0 += kb.step) {
    const std::int64_t c1 = std::min(d.S, c0 + kb.step), i0 = kb.first_query(c0);
    product.at(c1 - c0, d.T - i0)(Pd + i0 * d.S + c0, s.dO + i0 * lo, dV + c0 * lv);
  }
}

// dP and then scale·dS on rows r0..r1-1, columns 0..cols-1 of dP (row stride S), in place; dS
// itself into the same rows of `dscores` (row stride S) when that is not null. vt holds Vᵀ
// [d_v, S] (rows S apart) when s.dO is not null.
template <class T, class Product>
void slice_ds_rows(const Dims& d, const Slice<T>& s, std::int64_t r0, std::int64_t r1, std::int64_t cols, T scale,
                   const Product& product, const T* vt, T* dP, T* dscores) {
  const std::int64_t rows = r1 - r0;
  T* dPb = dP + r0 * d.S;  // [rows, cols] of row stride S
  StridedView<T> dPm(dPb, rows, cols, d.S);
  //   => dPd = dO·Vᵀ                                      [rows, d_v] x [d_v, cols] -> [rows, cols]
  if (d.d_v == 0 || s.dO == nullptr) {
    dPm.setZero();
  } else {
    product.at(rows, cols)(s.dO + r0 * d.out.sr, vt, dPb);
    // forward: Pd = P ⊙ Z  =>  dP = dPd ⊙ Z
    if (s.Z != nullptr) dPm.array() *= StridedView<const T>(s.Z + r0 * d.S, rows, cols, d.S).array();
  }
  // `weights` is P itself, so the gradient that reached it adds in: dP += dW
  if (s.dW != nullptr) dPm += StridedView<const T>(s.dW + r0 * d.S, rows, cols, d.S);
  // forward: P_i = softmax(S_i)  =>  dS_ij = Σ_k dP_ik · P_ik(δ_jk − P_ij)
  //                                       = P_ij · (dP_ij − Σ_k dP_ik P_ik)
  // (the Jacobian diag(p) − p·pᵀ never formed: O(T·S) per slice). A fully blocked row has
  // P = 0, so its dS row is 0; so are blocked (P = 0) entries, the causal ones included.
  // dP keeps scale·dS, the factor both dQ = scale·dS·K and dK = scale·dSᵀ·Q need (one pass,
  // instead of one over each of them).
  if constexpr (std::is_same_v<T, float>) {  // the same in one vector kernel for the block
    if (cols > 0 && approx::softmax_slopes_rows(s.P + r0 * d.S, dPb, dscores != nullptr ? dscores + r0 * d.S : nullptr,
                                                rows, cols, d.S, scale))
      return;
  }
  for (std::int64_t i = r0; i < r1; ++i) {
    auto p_row = ConstArrayView<T>(s.P + i * d.S, cols);
    auto ds_row = ArrayView<T>(dP + i * d.S, cols);
    const T row_dot = (ds_row * p_row).sum();
    if (dscores != nullptr) {
      auto out = ArrayView<T>(dscores + i * d.S, cols);
      out = p_row * (ds_row - row_dot);
      ds_row = out * scale;
    } else {
      ds_row = (p_row * (ds_row - row_dot)) * scale;
    }
  }
}

// forward: S = scale·Q·Kᵀ + M
//   => dK = scale·dSᵀ·Q                                     [S, T] x [T, d_k] -> [S, d_k]
// (sdS = scale·dS, as slice_ds_rows leaves it)
template <class T, class Product>
void slice_dk(const Dims& d, const Slice<T>& s, KeyBlocks kb, const Product& product, const T* sdS, T* dK) {
  const std::int64_t lq = d.q.sr, lk = d.k.sr;
  if (d.T == 0) {
    StridedView<T>(dK, d.S, d.d_k, Eigen::OuterStride<>(lk)).setZero();
    return;
  }
  for (std::int64_t c0 = 0; c0 < d.S; c0 += kb.step) {
    const std::int64_t c1 = std::min(d.S, c0 + kb.step), i0 = kb.first_query(c0);
    product.at(c1 - c0, d.T - i0)(sdS + i0 * d.S + c0, s.Q + i0 * lq, dK + c0 * lk);
  }
}

}  // namespace

template <class T>
void backward(const Dims& d, const BackwardData<T>& x, T scale, bool causal) {
  const bool need_ds = x.dq != nullptr || x.dk != nullptr || x.dscores != nullptr;
  const RowBlocks blocks = row_blocks(d, causal);
  const KeyBlocks key_blocks{causal ? blocks.step : std::max<std::int64_t>(d.S, 1), causal};
  const std::int64_t lq = d.q.sr, lk = d.k.sr, lv = d.v.sr, lo = d.out.sr, ls = std::max<std::int64_t>(d.S, 1);
  // dV = Pdᵀ·dO and dK = (scale·dS)ᵀ·Q for a block of keys against the queries that see them;
  // dP = dO·Vᵀ and dQ = (scale·dS)·K for a block of queries against the keys they see
  const auto dv_product = block_product<T>(causal, d.S, d.T, [&](std::int64_t keys, std::int64_t queries) {
    return PreparedGemm<T>(true, false, keys, d.d_v, queries, T(1), d.S, lo, T(0), lv);
  });
  const auto dk_product = block_product<T>(causal, d.S, d.T, [&](std::int64_t keys, std::int64_t queries) {
    return PreparedGemm<T>(true, false, keys, d.d_k, queries, T(1), d.S, lq, T(0), lk);
  });
  const auto dp_product = block_product<T>(causal, d.T, d.S, [&](std::int64_t rows, std::int64_t cols) {
    return PreparedGemm<T>(false, false, rows, cols, d.d_v, T(1), lo, ls, T(0), d.S);
  });
  const auto dq_product = block_product<T>(causal, d.T, d.S, [&](std::int64_t rows, std::int64_t cols) {
    return PreparedGemm<T>(false, false, rows, d.d_k, cols, T(1), d.S, lk, T(0), lq);
  });
  parallel_region(d.parallel(), [&] {
    // Scratch of each thread, kept between calls (no allocation here once warm); it
    // holds the largest slice the thread has seen.
    thread_local RowMatrix<T> dropped;  // P ⊙ Z
    thread_local RowMatrix<T> dP;       // dL/dP, then dL/dS in place
    thread_local RowMatrix<T> vt;       // Vᵀ, once per slice for all row blocks
#pragma omp for schedule(static)
    for (std::int64_t bh = 0; bh < d.slices(); ++bh) {
      const std::int64_t b = bh / d.H, h = bh % d.H, slice = bh * d.T * d.S;
      const Slice<T> s{x.q + d.q.at(b, h),
                       x.k + d.k.at(b, h),
                       x.v + d.v.at(b, h),
                       x.weights + slice,
                       x.keep != nullptr ? x.keep + slice : nullptr,
                       x.dout != nullptr ? x.dout + d.out.at(b, h) : nullptr,
                       x.dweights != nullptr ? x.dweights + slice : nullptr};
      if (x.dv != nullptr) slice_dv(d, s, key_blocks, dv_product, dropped, x.dv + d.v.at(b, h));
      if (!need_ds) continue;

      dP.resize(d.T, d.S);
      if (s.dO != nullptr && d.d_v > 0) {
        vt.resize(d.d_v, d.S);
        transpose_scaled(s.V, d.v.sr, d.S, d.d_v, T(1), vt.data(), d.S);
      }
      for (std::int64_t r0 = 0; r0 < d.T; r0 += blocks.step) {
        const std::int64_t r1 = std::min(d.T, r0 + blocks.step), rows = r1 - r0;
        const std::int64_t cols = blocks.cols(r1);
        //   => dM = dS (summed over broadcast dims by the caller); zero where it was not formed
        T* const dscores = x.dscores != nullptr ? x.dscores + slice : nullptr;
        slice_ds_rows(d, s, r0, r1, cols, scale, dp_product, vt.data(), dP.data(), dscores);
        if (dscores != nullptr && cols < d.S) StridedView<T>(dscores + r0 * d.S + cols, rows, d.S - cols, d.S).setZero();
        const T* sdSb = dP.data() + r0 * d.S;  // scale·dS, [rows, cols] of row stride S
        //   => dQ = scale·dS·K                            [rows, cols] x [cols, d_k] -> [rows, d_k]
        if (x.dq != nullptr) dq_product.at(rows, cols)(sdSb, s.K, x.dq + d.q.at(b, h) + r0 * lq);
      }
      if (x.dk != nullptr) slice_dk(d, s, key_blocks, dk_product, dP.data(), x.dk + d.k.at(b, h));
    }
  });
}

template bool forward<float>(const Dims&, const ForwardData<float>&, MaskStrides, float, bool);
template bool forward<double>(const Dims&, const ForwardData<double>&, MaskStrides, double, bool);
template void tangent<float>(const Dims&, const TangentData<float>&, MaskStrides, float, bool);
template void tangent<double>(const Dims&, const TangentData<double>&, MaskStrides, double, bool);
template void backward<float>(const Dims&, const BackwardData<float>&, float, bool);
template void backward<double>(const Dims&, const BackwardData<double>&, double, bool);

}  // namespace autograd::sdpa
