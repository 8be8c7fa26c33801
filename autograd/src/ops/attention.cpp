// Fused scaled dot-product attention: forward and a hand-derived backward, one (batch, head)
// slice at a time. The derivation, step by step, is in docs/attention_backward.md; each
// backward line below quotes the forward line it differentiates.
//
// Shapes (per slice):  Q [T, d_k]   K [S, d_k]   V [S, d_v]
//                      scores/P/Z/dP/dS [T, S]   O, dO [T, d_v]
#include "autograd/attention.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <type_traits>

#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "gemm.hpp"
#include "parallel.hpp"

namespace autograd {

namespace {

constexpr std::string_view kOp = "scaled_dot_product_attention";

template <class T>
using SliceMap = Eigen::Map<RowMatrix<T>>;  // a slice is not 64-byte aligned in general
template <class T>
using ConstSliceMap = Eigen::Map<const RowMatrix<T>>;

// Below this much work (multiply-adds of the scores and output products) one thread runs every
// slice: starting a team costs more than it saves.
constexpr std::int64_t kParallelWork = 1 << 16;

// Where slice (b, h)'s matrix of q, k, v or the output lives: it starts at base + b·sb + h·sh
// and its rows are sr apart. (B, H, L, d) storage: sb = H·L·d, sh = L·d, sr = d. Heads-last
// (B, L, H·d) storage: sb = L·H·d, sh = d, sr = H·d (the head is a column block of each row).
// Packed (B, L, 3·H·d) storage, each row [q | k | v]: sb = L·3·H·d, sh = d, sr = 3·H·d, and base
// 0, H·d or 2·H·d picks q, k or v.
struct Layout {
  std::int64_t sb = 0, sh = 0, sr = 0, base = 0;
  std::int64_t at(std::int64_t b, std::int64_t h) const { return base + b * sb + h * sh; }
};

Layout heads_first(std::int64_t H, std::int64_t L, std::int64_t d) { return {H * L * d, L * d, d}; }
Layout heads_last(std::int64_t H, std::int64_t L, std::int64_t d) { return {L * H * d, d, H * d}; }
Layout packed(std::int64_t H, std::int64_t L, std::int64_t d, std::int64_t which) {
  return {L * 3 * H * d, d, 3 * H * d, which * H * d};
}

struct Dims {
  std::int64_t B, H, T, S, d_k, d_v;
  Layout q, k, v, out;  // the gradients of q, k, v and out share their layouts
  std::int64_t slices() const { return B * H; }
  // Threads split the slices, never one slice's products. Inside a team Eigen and the BLAS
  // run their GEMMs single-threaded, so every slice is computed the same way whatever the thread
  // count (and below the threshold each product is too small for gemm to split it). The price:
  // B·H = 1 runs on one thread.
  bool parallel() const { return slices() * T * S * (d_k + d_v) >= kParallelWork; }
};

template <class T>
using StridedMap = Eigen::Map<std::conditional_t<std::is_const_v<T>, const RowMatrix<std::remove_const_t<T>>, RowMatrix<T>>,
                              Eigen::Unaligned, Eigen::OuterStride<>>;
template <class T>
using RowMap = Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>>;
template <class T>
using ConstRowMap = Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>;

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

// Where slice (b, h), row i, column j of the broadcast mask lives: b·sb + h·sh + i·st + j·ss.
// A stride is 0 along a broadcast (size-1) dim.
struct MaskStrides {
  std::int64_t sb = 0, sh = 0, st = 0, ss = 0;
};

MaskStrides mask_strides(const Shape& mask_shape) {
  Shape padded(4 - mask_shape.size(), 1);
  padded.insert(padded.end(), mask_shape.begin(), mask_shape.end());
  const Shape strides = contiguous_strides(padded);
  auto stride = [&](int i) { return padded[i] == 1 ? 0 : strides[i]; };
  return {stride(0), stride(1), stride(2), stride(3)};
}

void check_logical(std::string_view op, const Shape& qs, const Shape& ks, const Shape& vs, Dtype dtype,
                   const Tensor& mask, bool is_causal, double scale, double dropout_p);

// q, k and v are defined, of rank `rank` (laid out as `layout`), and of one dtype.
void check_qkv(std::string_view op, const Tensor& q, const Tensor& k, const Tensor& v, std::int64_t rank,
               std::string_view layout) {
  if (!q.defined() || !k.defined() || !v.defined()) fail(op, "q, k and v must be defined tensors");
  for (const auto* t : {&q, &k, &v})
    if (t->dim() != rank)
      fail(op, "q, k and v must be {}-D {}; got q {}, k {}, v {}", rank, layout, shape_str(q.shape()),
           shape_str(k.shape()), shape_str(v.shape()));
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype())
    fail(op, "dtypes differ: q {}, k {}, v {}", dtype_name(q.dtype()), dtype_name(k.dtype()), dtype_name(v.dtype()));
}

void check_args(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool is_causal,
                double scale, double dropout_p) {
  check_qkv(kOp, q, k, v, 4, "(B, H, seq, head_dim)");
  check_logical(kOp, q.shape(), k.shape(), v.shape(), q.dtype(), mask, is_causal, scale, dropout_p);
}

// The checks on the logical (B, H, L, d) shapes, for both entry points.
void check_logical(std::string_view op, const Shape& qs, const Shape& ks, const Shape& vs, Dtype dtype,
                   const Tensor& mask, bool is_causal, double scale, double dropout_p) {
  const std::string_view kOp = op;
  if (qs[0] != ks[0] || qs[1] != ks[1] || qs[0] != vs[0] || qs[1] != vs[1])
    fail(kOp, "batch and head dims differ: q {}, k {}, v {}", shape_str(qs), shape_str(ks), shape_str(vs));
  if (qs[3] != ks[3]) fail(kOp, "q and k head dims differ: {} and {}", shape_str(qs), shape_str(ks));
  if (ks[2] != vs[2]) fail(kOp, "k and v sequence lengths differ: {} and {}", shape_str(ks), shape_str(vs));
  if (is_causal && qs[2] != ks[2])
    fail(kOp, "is_causal needs as many queries as keys (T == S); got q {} and k {}", shape_str(qs),
         shape_str(ks));
  if (mask.defined()) {
    const Shape target{qs[0], qs[1], qs[2], ks[2]};
    const Shape& ms = mask.shape();
    bool ok = ms.size() <= 4;
    for (std::size_t i = 0; ok && i < ms.size(); ++i) {
      const std::int64_t want = target[4 - ms.size() + i];
      ok = ms[i] == want || ms[i] == 1;
    }
    if (!ok)
      fail(kOp, "attn_mask of shape {} does not broadcast to (B, H, T, S) = {}", shape_str(ms), shape_str(target));
    if (mask.dtype() != dtype)
      fail(kOp, "attn_mask dtype {} differs from q's {}", dtype_name(mask.dtype()), dtype_name(dtype));
  }
  if (!std::isfinite(scale)) fail(kOp, "scale must be finite, got {}", scale);
  if (!(dropout_p >= 0.0 && dropout_p <= 1.0)) fail(kOp, "dropout_p must be in [0, 1], got {}", dropout_p);
}

// ---- forward ----
// For each slice:  S = scale·Q·Kᵀ + M;  P = softmax_rows(S) (causal: columns 0..i of row i);
//                  O = (P ⊙ Z)·V.
// Causal slices go in blocks of query rows (causal_blocks): block [r0, r1) multiplies only
// against keys 0..r1-1, the ones its rows can see.
template <class T>
void forward_kernel(const Dims& d, const T* q, const T* k, const T* v, const T* mask, MaskStrides ms,
                    bool causal, T scale, const T* keep, T* weights, T* out) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
  const RowBlocks blocks = row_blocks(d, causal);
  const std::int64_t lq = d.q.sr, lk = d.k.sr, lv = d.v.sr, lo = d.out.sr;
  parallel_region(d.parallel(), [&] {
    // P ⊙ Z of a block: scratch of each thread, kept between calls (no allocation once warm).
    thread_local RowMatrix<T> dropped;
#pragma omp for schedule(static)
    for (std::int64_t bh = 0; bh < d.slices(); ++bh) {
      const std::int64_t b = bh / d.H, h = bh % d.H;
      const T* Q = q + d.q.at(b, h);    // [T, d_k], rows lq apart
      const T* K = k + d.k.at(b, h);    // [S, d_k], rows lk apart
      const T* V = v + d.v.at(b, h);    // [S, d_v], rows lv apart
      T* P = weights + bh * d.T * d.S;  // [T, S]: scores, then weights in place
      T* O = out + d.out.at(b, h);      // [T, d_v], rows lo apart
      const T* Z = keep != nullptr ? keep + bh * d.T * d.S : nullptr;

      for (std::int64_t r0 = 0; r0 < d.T; r0 += blocks.step) {
        const std::int64_t r1 = std::min(d.T, r0 + blocks.step), rows = r1 - r0;
        const std::int64_t cols = blocks.cols(r1);  // keys rows r0..r1-1 can see
        T* Pb = P + r0 * d.S;                       // [rows, cols] of row stride S
        // S = scale·Q·Kᵀ                               [rows, d_k] x [d_k, cols] -> [rows, cols]
        gemm<T>(false, true, rows, cols, d.d_k, scale, Q + r0 * lq, lq, K, lk, T(0), Pb, d.S);
        // S += M (broadcast)
        if (mask != nullptr) {
          const T* mb = mask + b * ms.sb + h * ms.sh;
          for (std::int64_t i = r0; i < r1; ++i) {
            const T* mrow = mb + i * ms.st;
            T* srow = P + i * d.S;
            if (ms.ss != 0) {
              for (std::int64_t j = 0; j < cols; ++j) srow[j] += mrow[j];
            } else {
              const T m = mrow[0];
              for (std::int64_t j = 0; j < cols; ++j) srow[j] += m;
            }
          }
        }
        // P = softmax(S) by rows; a row with every key blocked (max = -inf) stays all zero,
        // where the textbook formula would give 0/0 = NaN.
        for (std::int64_t i = r0; i < r1; ++i) {
          const std::int64_t seen = causal ? i + 1 : d.S;  // causal: keys 0..i
          RowMap<T> prow(P + i * d.S, d.S);
          auto row = prow.head(seen).array();
          const T row_max = seen > 0 ? row.maxCoeff() : neg_inf;
          if (row_max == neg_inf) {
            prow.setZero();
            continue;
          }
          // Blocked keys get weight exactly 0 (Eigen's vectorised exp clamps its argument, so
          // exp(-inf) alone would give ~1e-308). Without a mask no key is blocked (causality is
          // the `seen` bound), and the exp stays vectorised (select is not).
          if (mask != nullptr && (row == neg_inf).any()) {
            row = (row == neg_inf).select(T(0), (row - row_max).exp());
          } else {
            row = (row - row_max).exp();
          }
          row /= row.sum();  // sum >= 1 (the max term is exp(0))
          if (seen < d.S) prow.tail(d.S - seen).setZero();
        }
        // O = (P ⊙ Z)·V                                  [rows, cols] x [cols, d_v] -> [rows, d_v]
        const T* Pd = Pb;
        std::int64_t ld = d.S;
        if (Z != nullptr) {
          dropped = StridedMap<const T>(Pb, rows, cols, d.S).array() *
                    StridedMap<const T>(Z + r0 * d.S, rows, cols, d.S).array();
          Pd = dropped.data();
          ld = cols;
        }
        gemm<T>(false, false, rows, d.d_v, cols, T(1), Pd, std::max<std::int64_t>(ld, 1), V, lv, T(0), O + r0 * lo,
                lo);
      }
    }
  });
}

// ---- backward ----
// dout/dweights: the gradients that reached `output` and `weights`; null when none did (the node
// does not materialise them), which reads as zero and skips its work. Any of dq, dk, dv,
// dscores may be null (not needed). dscores, when wanted, receives dL/dS for the mask.
// Causal slices use the forward's blocks: dS is formed for block [r0, r1) x [0, r1) only (it is
// zero above the diagonal, where P is), and the products that sum over queries (dV, dK) take key
// block [c0, c1) against queries c0..T-1 only.
template <class T>
void backward_kernel(const Dims& d, const T* q, const T* k, const T* v, const T* weights, const T* keep,
                     const T* dout, const T* dweights, T scale, T* dq, T* dk, T* dv, T* dscores, bool causal) {
  const bool need_ds = dq != nullptr || dk != nullptr || dscores != nullptr;
  const RowBlocks blocks = row_blocks(d, causal);
  const std::int64_t key_step = causal ? blocks.step : std::max<std::int64_t>(d.S, 1);
  const std::int64_t lq = d.q.sr, lk = d.k.sr, lv = d.v.sr, lo = d.out.sr;
  parallel_region(d.parallel(), [&] {
    // Scratch of each thread, kept between calls (a warm training step allocates nothing); it
    // holds the largest slice the thread has seen.
    thread_local RowMatrix<T> dropped;  // P ⊙ Z
    thread_local RowMatrix<T> dP;       // dL/dP, then dL/dS in place
#pragma omp for schedule(static)
    for (std::int64_t bh = 0; bh < d.slices(); ++bh) {
      const std::int64_t b = bh / d.H, h = bh % d.H;
      const T* Q = q + d.q.at(b, h);          // [T, d_k], rows lq apart (so are dQ's)
      const T* K = k + d.k.at(b, h);          // [S, d_k], rows lk apart (so are dK's)
      const T* V = v + d.v.at(b, h);          // [S, d_v], rows lv apart (so are dV's)
      const T* P = weights + bh * d.T * d.S;  // [T, S]
      const T* dO = dout != nullptr ? dout + d.out.at(b, h) : nullptr;         // [T, d_v], rows lo apart; null = 0
      const T* dW = dweights != nullptr ? dweights + bh * d.T * d.S : nullptr;  // [T, S], null = 0
      const T* Z = keep != nullptr ? keep + bh * d.T * d.S : nullptr;
      // Queries that see key block [c0, c1): all of them, or c0..T-1 when causal.
      auto first_query = [&](std::int64_t c0) { return causal ? c0 : std::int64_t{0}; };

      // forward: O = Pd·V with Pd = P ⊙ Z (Pd = P without dropout)
      //   => dV = Pdᵀ·dO                                    [S, T] x [T, d_v] -> [S, d_v]
      if (dv != nullptr) {
        T* dV = dv + d.v.at(b, h);
        if (d.T == 0 || dO == nullptr) {
          StridedMap<T>(dV, d.S, d.d_v, Eigen::OuterStride<>(lv)).setZero();
        } else {
          const T* Pd = P;
          if (Z != nullptr) {
            dropped = ConstSliceMap<T>(P, d.T, d.S).array() * ConstSliceMap<T>(Z, d.T, d.S).array();
            Pd = dropped.data();
          }
          for (std::int64_t c0 = 0; c0 < d.S; c0 += key_step) {
            const std::int64_t c1 = std::min(d.S, c0 + key_step), i0 = first_query(c0);
            gemm<T>(true, false, c1 - c0, d.d_v, d.T - i0, T(1), Pd + i0 * d.S + c0, d.S, dO + i0 * lo, lo, T(0),
                    dV + c0 * lv, lv);
          }
        }
      }
      if (!need_ds) continue;

      dP.resize(d.T, d.S);
      for (std::int64_t r0 = 0; r0 < d.T; r0 += blocks.step) {
        const std::int64_t r1 = std::min(d.T, r0 + blocks.step), rows = r1 - r0;
        const std::int64_t cols = blocks.cols(r1);
        T* dPb = dP.data() + r0 * d.S;  // [rows, cols] of row stride S
        StridedMap<T> dPm(dPb, rows, cols, d.S);
        //   => dPd = dO·Vᵀ                                [rows, d_v] x [d_v, cols] -> [rows, cols]
        if (d.d_v == 0 || dO == nullptr) {
          dPm.setZero();
        } else {
          gemm<T>(false, true, rows, cols, d.d_v, T(1), dO + r0 * lo, lo, V, lv, T(0), dPb, d.S);
          // forward: Pd = P ⊙ Z  =>  dP = dPd ⊙ Z
          if (Z != nullptr) dPm.array() *= StridedMap<const T>(Z + r0 * d.S, rows, cols, d.S).array();
        }
        // `weights` is P itself, so the gradient that reached it adds in: dP += dW
        if (dW != nullptr) dPm += StridedMap<const T>(dW + r0 * d.S, rows, cols, d.S);
        // forward: P_i = softmax(S_i)  =>  dS_ij = Σ_k dP_ik · P_ik(δ_jk − P_ij)
        //                                       = P_ij · (dP_ij − Σ_k dP_ik P_ik)
        // (the Jacobian diag(p) − p·pᵀ never formed: O(T·S) per slice). A fully blocked row has
        // P = 0, so its dS row is 0; so are blocked (P = 0) entries, the causal ones included.
        for (std::int64_t i = r0; i < r1; ++i) {
          auto p_row = ConstRowMap<T>(P + i * d.S, cols).array();
          auto ds_row = RowMap<T>(dP.data() + i * d.S, cols).array();
          const T row_dot = (ds_row * p_row).sum();
          ds_row = p_row * (ds_row - row_dot);  // dP now holds dS
        }
        // forward: S = scale·Q·Kᵀ + M
        //   => dQ = scale·dS·K                            [rows, cols] x [cols, d_k] -> [rows, d_k]
        if (dq != nullptr)
          gemm<T>(false, false, rows, d.d_k, cols, scale, dPb, d.S, K, lk, T(0), dq + d.q.at(b, h) + r0 * lq, lq);
        //   => dM = dS (summed over broadcast dims by the caller); zero where it was not formed
        if (dscores != nullptr) {
          T* out = dscores + (bh * d.T + r0) * d.S;
          StridedMap<T>(out, rows, cols, d.S) = dPm;
          if (cols < d.S) StridedMap<T>(out + cols, rows, d.S - cols, d.S).setZero();
        }
      }
      const T* dS = dP.data();
      //   => dK = scale·dSᵀ·Q                               [S, T] x [T, d_k] -> [S, d_k]
      if (dk != nullptr) {
        T* dK = dk + d.k.at(b, h);
        if (d.T == 0) {
          StridedMap<T>(dK, d.S, d.d_k, Eigen::OuterStride<>(lk)).setZero();
        } else {
          for (std::int64_t c0 = 0; c0 < d.S; c0 += key_step) {
            const std::int64_t c1 = std::min(d.S, c0 + key_step), i0 = first_query(c0);
            gemm<T>(true, false, c1 - c0, d.d_k, d.T - i0, scale, dS + i0 * d.S + c0, d.S, Q + i0 * lq, lq, T(0),
                    dK + c0 * lk, lk);
          }
        }
      }
    }
  });
}

}  // namespace

namespace {

// Every entry point, once the arguments are checked: d says where each slice lives, out_shape is
// the output's shape (its layout is d.out). Packed (q, k and v are one tensor, d's layouts pick
// the columns): one input and one gradient for all three.
SdpaResult attend(std::string_view op_name, const Dims& d, const Shape& out_shape, const Tensor& q, const Tensor& k,
                  const Tensor& v, const Tensor& attn_mask, bool is_causal, double scale, double dropout_p,
                  Generator* gen, bool packed = false) {
  // scale 0 means 1/sqrt(d_k); with d_k = 0 every product is 0 and the scale does not matter.
  if (scale == 0.0) scale = d.d_k > 0 ? 1.0 / std::sqrt(static_cast<double>(d.d_k)) : 1.0;
  const MaskStrides ms = attn_mask.defined() ? mask_strides(attn_mask.shape()) : MaskStrides{};

  // Dropout factors Z (0 or 1/(1-p)), drawn here, in one thread, in row-major order: the same
  // generator state gives the same mask whatever the thread count.
  Tensor keep;
  if (dropout_p > 0.0) {
    Generator& g = gen != nullptr ? *gen : default_generator();
    keep = Tensor::empty({d.B, d.H, d.T, d.S}, q.dtype());
    const double kept_scale = dropout_p < 1.0 ? 1.0 / (1.0 - dropout_p) : 0.0;
    dispatch(q.dtype(), [&](auto zero) {
      using T = decltype(zero);
      T* z = keep.data<T>();
      for (std::int64_t i = 0; i < keep.numel(); ++i) z[i] = g.uniform() < dropout_p ? T(0) : T(kept_scale);
    });
  }

  Tensor output = Tensor::empty(out_shape, q.dtype());
  Tensor weights = Tensor::empty({d.B, d.H, d.T, d.S}, q.dtype());
  dispatch(q.dtype(), [&](auto zero) {
    using T = decltype(zero);
    forward_kernel<T>(d, q.data<T>(), k.data<T>(), v.data<T>(),
                      attn_mask.defined() ? attn_mask.data<T>() : nullptr, ms, is_causal, static_cast<T>(scale),
                      keep.defined() ? keep.data<T>() : nullptr, weights.data<T>(), output.data<T>());
  });

  // Inputs: q, k, v, then the mask if any; packed: qkv, then the mask.
  const std::array<Tensor, 4> all_inputs =
      packed ? std::array<Tensor, 4>{q, attn_mask, Tensor(), Tensor()} : std::array<Tensor, 4>{q, k, v, attn_mask};
  const std::size_t n_qkv = packed ? 1 : 3;
  const std::span<const Tensor> inputs(all_inputs.data(), n_qkv + (attn_mask.defined() ? 1 : 0));
  if (!needs_grad(inputs)) return {output, weights};

  // Saved for backward: q, k, v (packed: the one tensor), the weights P and the dropout factors Z.
  // Not the scores.
  const std::array<Tensor, 2> outputs{output, weights};
  record(op_name, inputs, outputs,
         [sq = SavedTensor(q), sk = SavedTensor(packed ? Tensor() : k), sv = SavedTensor(packed ? Tensor() : v),
          sp = SavedTensor(weights), sz = SavedTensor(keep),
          mask_shape = attn_mask.defined() ? attn_mask.shape() : Shape{}, d, scale, causal = is_causal,
          op = op_name, n_qkv](const TensorList& g, const Node& node) {
           const bool one = n_qkv == 1;  // packed
           const Tensor qt = sq.get(op), kt = one ? qt : sk.get(op), vt = one ? qt : sv.get(op), pt = sp.get(op);
           const Tensor zt = sz.defined() ? sz.get(op) : Tensor();
           const Dtype dtype = qt.dtype();
           GradList grads(node.next_edges.size());
           Tensor dq, dk, dv, dscores;
           if (one) {  // one gradient; the layouts put dq, dk, dv in their own columns of it
             if (node.needs_input_grad(0)) dq = dk = dv = Tensor::empty(qt.shape(), dtype);
           } else {
             if (node.needs_input_grad(0)) dq = Tensor::empty(qt.shape(), dtype);
             if (node.needs_input_grad(1)) dk = Tensor::empty(kt.shape(), dtype);
             if (node.needs_input_grad(2)) dv = Tensor::empty(vt.shape(), dtype);
           }
           if (node.needs_input_grad(n_qkv)) dscores = Tensor::empty(pt.shape(), dtype);
           dispatch(dtype, [&](auto zero) {
             using T = decltype(zero);
             auto ptr = [](const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
             backward_kernel<T>(d, qt.data<T>(), kt.data<T>(), vt.data<T>(), pt.data<T>(), ptr(zt),
                                ptr(g[0]), ptr(g[1]), static_cast<T>(scale), ptr(dq), ptr(dk), ptr(dv),
                                ptr(dscores), causal);
           });
           grads[0] = dq;
           if (!one) {
             grads[1] = dk;
             grads[2] = dv;
           }
           if (dscores.defined()) grads[n_qkv] = sum_to(dscores, mask_shape);
           return grads;
         });
  // An output nobody used (usually `weights`) reaches the rule undefined, read as zero: no
  // [B, H, T, S] tensor of zeros is made and added.
  output.grad_fn()->materialize_grads = false;
  return {output, weights};
}

}  // namespace

SdpaResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                        bool is_causal, double scale, double dropout_p, Generator* gen) {
  check_args(q, k, v, attn_mask, is_causal, scale, dropout_p);
  const std::int64_t B = q.size(0), H = q.size(1), T = q.size(2), S = k.size(2), d_k = q.size(3), d_v = v.size(3);
  const Dims d{B, H, T, S, d_k, d_v, heads_first(H, T, d_k), heads_first(H, S, d_k), heads_first(H, S, d_v),
               heads_first(H, T, d_v)};
  return attend(kOp, d, {B, H, T, d_v}, q, k, v, attn_mask, is_causal, scale, dropout_p, gen);
}

SdpaResult scaled_dot_product_attention_heads_last(const Tensor& q, const Tensor& k, const Tensor& v,
                                                   std::int64_t num_heads, const Tensor& attn_mask, bool is_causal,
                                                   double scale, double dropout_p, Generator* gen) {
  constexpr std::string_view op = "scaled_dot_product_attention_heads_last";
  check_qkv(op, q, k, v, 3, "(B, seq, heads * head_dim)");
  const std::int64_t H = num_heads;
  if (H <= 0) fail(op, "num_heads must be positive, got {}", H);
  for (const auto* t : {&q, &k, &v})
    if (t->size(2) % H != 0)
      fail(op, "the last dims of q {}, k {}, v {} must be divisible by num_heads = {}", shape_str(q.shape()),
           shape_str(k.shape()), shape_str(v.shape()), H);
  const std::int64_t B = q.size(0), T = q.size(1), S = k.size(1), d_k = q.size(2) / H, d_v = v.size(2) / H;
  // The same checks as the (B, H, L, d) op, on the shapes the heads-last tensors stand for.
  check_logical(op, {B, H, T, d_k}, {k.size(0), H, S, k.size(2) / H}, {v.size(0), H, v.size(1), d_v}, q.dtype(),
                attn_mask, is_causal, scale, dropout_p);
  const Dims d{B, H, T, S, d_k, d_v, heads_last(H, T, d_k), heads_last(H, S, d_k), heads_last(H, S, d_v),
               heads_last(H, T, d_v)};
  return attend(op, d, {B, T, H * d_v}, q, k, v, attn_mask, is_causal, scale, dropout_p, gen);
}

SdpaResult scaled_dot_product_attention_packed(const Tensor& qkv, std::int64_t num_heads, const Tensor& attn_mask,
                                               bool is_causal, double scale, double dropout_p, Generator* gen) {
  constexpr std::string_view op = "scaled_dot_product_attention_packed";
  if (!qkv.defined()) fail(op, "qkv must be a defined tensor");
  if (qkv.dim() != 3) fail(op, "qkv must be 3-D (B, seq, 3 * heads * head_dim); got {}", shape_str(qkv.shape()));
  const std::int64_t H = num_heads;
  if (H <= 0) fail(op, "num_heads must be positive, got {}", H);
  if (qkv.size(2) % (3 * H) != 0)
    fail(op, "the last dim of qkv {} must be divisible by 3 * num_heads = {}", shape_str(qkv.shape()), 3 * H);
  const std::int64_t B = qkv.size(0), T = qkv.size(1), dh = qkv.size(2) / (3 * H);
  check_logical(op, {B, H, T, dh}, {B, H, T, dh}, {B, H, T, dh}, qkv.dtype(), attn_mask, is_causal, scale,
                dropout_p);
  const Dims d{B, H, T, T, dh, dh, packed(H, T, dh, 0), packed(H, T, dh, 1), packed(H, T, dh, 2),
               heads_last(H, T, dh)};
  return attend(op, d, {B, T, H * dh}, qkv, qkv, qkv, attn_mask, is_causal, scale, dropout_p, gen, true);
}

}  // namespace autograd
