// Fused scaled dot-product attention: forward and a hand-derived backward, one (batch, head)
// slice at a time. The derivation, step by step, is in docs/attention_backward.md; each
// backward line below quotes the forward line it differentiates.
//
// Shapes (per slice):  Q [T, d_k]   K [S, d_k]   V [S, d_v]
//                      scores/P/Z/dP/dS [T, S]   O, dO [T, d_v]
#include "autograd/attention.hpp"

#include <cmath>
#include <limits>

#include "autograd/graph.hpp"
#include "autograd/ops.hpp"

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

struct Dims {
  std::int64_t B, H, T, S, d_k, d_v;
  std::int64_t slices() const { return B * H; }
  // Threads split the slices, never one slice's products. Inside a team Eigen runs its GEMMs
  // single-threaded, so every slice is computed the same way whatever the thread count (and
  // below the threshold each product is too small for Eigen to split it). The price: B·H = 1
  // runs on one thread.
  bool parallel() const { return slices() * T * S * (d_k + d_v) >= kParallelWork; }
};

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

void check_args(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask, bool is_causal,
                double scale, double dropout_p) {
  if (!q.defined() || !k.defined() || !v.defined()) fail(kOp, "q, k and v must be defined tensors");
  for (const auto* t : {&q, &k, &v})
    if (t->dim() != 4)
      fail(kOp, "q, k and v must be 4-D (B, H, seq, head_dim); got q {}, k {}, v {}", shape_str(q.shape()),
           shape_str(k.shape()), shape_str(v.shape()));
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype())
    fail(kOp, "dtypes differ: q {}, k {}, v {}", dtype_name(q.dtype()), dtype_name(k.dtype()),
         dtype_name(v.dtype()));
  const Shape &qs = q.shape(), &ks = k.shape(), &vs = v.shape();
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
    if (mask.dtype() != q.dtype())
      fail(kOp, "attn_mask dtype {} differs from q's {}", dtype_name(mask.dtype()), dtype_name(q.dtype()));
  }
  if (!std::isfinite(scale)) fail(kOp, "scale must be finite, got {}", scale);
  if (!(dropout_p >= 0.0 && dropout_p <= 1.0)) fail(kOp, "dropout_p must be in [0, 1], got {}", dropout_p);
}

// ---- forward ----
// For each slice:  S = scale·Q·Kᵀ + M;  P = softmax_rows(S) (causal: columns 0..i of row i);
//                  O = (P ⊙ Z)·V.
template <class T>
void forward_kernel(const Dims& d, const T* q, const T* k, const T* v, const T* mask, MaskStrides ms,
                    bool causal, T scale, const T* keep, T* weights, T* out) {
  const T neg_inf = -std::numeric_limits<T>::infinity();
#pragma omp parallel if (d.parallel())
  {
    RowMatrix<T> dropped;  // P ⊙ Z, per thread
#pragma omp for schedule(static)
    for (std::int64_t bh = 0; bh < d.slices(); ++bh) {
      const std::int64_t b = bh / d.H, h = bh % d.H;
      ConstSliceMap<T> Q(q + bh * d.T * d.d_k, d.T, d.d_k);  // [T, d_k]
      ConstSliceMap<T> K(k + bh * d.S * d.d_k, d.S, d.d_k);  // [S, d_k]
      ConstSliceMap<T> V(v + bh * d.S * d.d_v, d.S, d.d_v);  // [S, d_v]
      SliceMap<T> P(weights + bh * d.T * d.S, d.T, d.S);    // [T, S]: scores, then weights in place
      SliceMap<T> O(out + bh * d.T * d.d_v, d.T, d.d_v);    // [T, d_v]

      // S = scale·Q·Kᵀ                                     [T, d_k] x [d_k, S] -> [T, S]
      P.noalias() = scale * Q * K.transpose();
      // S += M (broadcast)
      if (mask != nullptr) {
        const T* mb = mask + b * ms.sb + h * ms.sh;
        for (std::int64_t i = 0; i < d.T; ++i) {
          const T* mrow = mb + i * ms.st;
          T* srow = P.data() + i * d.S;
          if (ms.ss != 0) {
            for (std::int64_t j = 0; j < d.S; ++j) srow[j] += mrow[j];
          } else {
            const T m = mrow[0];
            for (std::int64_t j = 0; j < d.S; ++j) srow[j] += m;
          }
        }
      }
      // P = softmax(S) by rows; a row with every key blocked (max = -inf) stays all zero,
      // where the textbook formula would give 0/0 = NaN.
      for (std::int64_t i = 0; i < d.T; ++i) {
        const std::int64_t seen = causal ? i + 1 : d.S;  // causal: keys 0..i
        auto row = P.row(i).head(seen).array();
        const T row_max = seen > 0 ? row.maxCoeff() : neg_inf;
        if (row_max == neg_inf) {
          P.row(i).setZero();
          continue;
        }
        // Blocked keys get weight exactly 0 (Eigen's vectorised exp clamps its argument, so
        // exp(-inf) alone would give ~1e-308).
        row = (row == neg_inf).select(T(0), (row - row_max).exp());
        row /= row.sum();             // sum >= 1 (the max term is exp(0))
        if (seen < d.S) P.row(i).tail(d.S - seen).setZero();
      }
      // O = (P ⊙ Z)·V                                        [T, S] x [S, d_v] -> [T, d_v]
      if (d.S == 0) {
        O.setZero();
      } else if (keep != nullptr) {
        dropped = P.array() * ConstSliceMap<T>(keep + bh * d.T * d.S, d.T, d.S).array();
        O.noalias() = dropped * V;
      } else {
        O.noalias() = P * V;
      }
    }
  }
}

// ---- backward ----
// dout/dweights: the gradients that reached `output` and `weights`. Any of dq, dk, dv,
// dscores may be null (not needed). dscores, when wanted, receives dL/dS for the mask.
template <class T>
void backward_kernel(const Dims& d, const T* q, const T* k, const T* v, const T* weights, const T* keep,
                     const T* dout, const T* dweights, T scale, T* dq, T* dk, T* dv, T* dscores) {
  const bool need_ds = dq != nullptr || dk != nullptr || dscores != nullptr;
#pragma omp parallel if (d.parallel())
  {
    RowMatrix<T> dropped;  // P ⊙ Z, per thread
    RowMatrix<T> dP;       // dL/dP, then dL/dS in place, per thread
#pragma omp for schedule(static)
    for (std::int64_t bh = 0; bh < d.slices(); ++bh) {
      ConstSliceMap<T> Q(q + bh * d.T * d.d_k, d.T, d.d_k);       // [T, d_k]
      ConstSliceMap<T> K(k + bh * d.S * d.d_k, d.S, d.d_k);       // [S, d_k]
      ConstSliceMap<T> V(v + bh * d.S * d.d_v, d.S, d.d_v);       // [S, d_v]
      ConstSliceMap<T> P(weights + bh * d.T * d.S, d.T, d.S);     // [T, S]
      ConstSliceMap<T> dO(dout + bh * d.T * d.d_v, d.T, d.d_v);   // [T, d_v]
      ConstSliceMap<T> dW(dweights + bh * d.T * d.S, d.T, d.S);   // [T, S]
      const T* z = keep != nullptr ? keep + bh * d.T * d.S : nullptr;

      // forward: O = Pd·V with Pd = P ⊙ Z (Pd = P without dropout)
      //   => dV = Pdᵀ·dO                                    [S, T] x [T, d_v] -> [S, d_v]
      if (dv != nullptr) {
        SliceMap<T> dV(dv + bh * d.S * d.d_v, d.S, d.d_v);
        if (d.T == 0) {
          dV.setZero();
        } else if (z != nullptr) {
          dropped = P.array() * ConstSliceMap<T>(z, d.T, d.S).array();
          dV.noalias() = dropped.transpose() * dO;
        } else {
          dV.noalias() = P.transpose() * dO;
        }
      }
      if (!need_ds) continue;

      //   => dPd = dO·Vᵀ                                    [T, d_v] x [d_v, S] -> [T, S]
      if (d.d_v == 0) {
        dP.setZero(d.T, d.S);
      } else {
        dP.noalias() = dO * V.transpose();
      }
      // forward: Pd = P ⊙ Z  =>  dP = dPd ⊙ Z; and `weights` is P itself, so the gradient that
      // reached it adds in: dP += dW
      if (z != nullptr) dP.array() *= ConstSliceMap<T>(z, d.T, d.S).array();
      dP += dW;
      // forward: P_i = softmax(S_i)  =>  dS_ij = Σ_k dP_ik · P_ik(δ_jk − P_ij)
      //                                       = P_ij · (dP_ij − Σ_k dP_ik P_ik)
      // (the Jacobian diag(p) − p·pᵀ never formed: O(T·S) per slice). A fully blocked row has
      // P = 0, so its dS row is 0; so are blocked (P = 0) entries.
      const Eigen::Array<T, Eigen::Dynamic, 1> row_dot = (dP.array() * P.array()).rowwise().sum();  // [T]
      dP.array() = P.array() * (dP.array().colwise() - row_dot);  // dP now holds dS
      const auto& dS = dP;

      // forward: S = scale·Q·Kᵀ + M
      //   => dQ = scale·dS·K                                [T, S] x [S, d_k] -> [T, d_k]
      if (dq != nullptr) {
        SliceMap<T> dQ(dq + bh * d.T * d.d_k, d.T, d.d_k);
        if (d.S == 0) {
          dQ.setZero();
        } else {
          dQ.noalias() = scale * dS * K;
        }
      }
      //   => dK = scale·dSᵀ·Q                               [S, T] x [T, d_k] -> [S, d_k]
      if (dk != nullptr) {
        SliceMap<T> dK(dk + bh * d.S * d.d_k, d.S, d.d_k);
        if (d.T == 0) {
          dK.setZero();
        } else {
          dK.noalias() = scale * dS.transpose() * Q;
        }
      }
      //   => dM = dS (summed over broadcast dims by the caller)
      if (dscores != nullptr) SliceMap<T>(dscores + bh * d.T * d.S, d.T, d.S) = dS;
    }
  }
}

}  // namespace

SdpaResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& attn_mask,
                                        bool is_causal, double scale, double dropout_p, Generator* gen) {
  check_args(q, k, v, attn_mask, is_causal, scale, dropout_p);
  const Dims d{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), v.size(3)};
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

  Tensor output = Tensor::empty({d.B, d.H, d.T, d.d_v}, q.dtype());
  Tensor weights = Tensor::empty({d.B, d.H, d.T, d.S}, q.dtype());
  dispatch(q.dtype(), [&](auto zero) {
    using T = decltype(zero);
    forward_kernel<T>(d, q.data<T>(), k.data<T>(), v.data<T>(),
                      attn_mask.defined() ? attn_mask.data<T>() : nullptr, ms, is_causal, static_cast<T>(scale),
                      keep.defined() ? keep.data<T>() : nullptr, weights.data<T>(), output.data<T>());
  });

  TensorList inputs{q, k, v};
  if (attn_mask.defined()) inputs.push_back(attn_mask);
  if (!needs_grad(inputs)) return {output, weights};

  // Saved for backward: q, k, v, the weights P and the dropout factors Z. Not the scores.
  record(std::string(kOp), inputs, TensorList{output, weights},
         [sq = SavedTensor(q), sk = SavedTensor(k), sv = SavedTensor(v), sp = SavedTensor(weights),
          sz = SavedTensor(keep), mask_shape = attn_mask.defined() ? attn_mask.shape() : Shape{}, d,
          scale](const TensorList& g, const Node& node) {
           const std::string_view op = kOp;
           const Tensor qt = sq.get(op), kt = sk.get(op), vt = sv.get(op), pt = sp.get(op);
           const Tensor zt = sz.defined() ? sz.get(op) : Tensor();
           const Dtype dtype = qt.dtype();
           TensorList grads(node.next_edges.size());
           Tensor dq, dk, dv, dscores;
           if (node.needs_input_grad(0)) dq = Tensor::empty(qt.shape(), dtype);
           if (node.needs_input_grad(1)) dk = Tensor::empty(kt.shape(), dtype);
           if (node.needs_input_grad(2)) dv = Tensor::empty(vt.shape(), dtype);
           if (node.needs_input_grad(3)) dscores = Tensor::empty(pt.shape(), dtype);
           dispatch(dtype, [&](auto zero) {
             using T = decltype(zero);
             auto ptr = [](const Tensor& t) { return t.defined() ? t.data<T>() : nullptr; };
             backward_kernel<T>(d, qt.data<T>(), kt.data<T>(), vt.data<T>(), pt.data<T>(), ptr(zt),
                                g[0].data<T>(), g[1].data<T>(), static_cast<T>(scale), ptr(dq), ptr(dk), ptr(dv),
                                ptr(dscores));
           });
           grads[0] = dq;
           grads[1] = dk;
           grads[2] = dv;
           if (dscores.defined()) grads[3] = sum_to(dscores, mask_shape);
           return grads;
         });
  return {output, weights};
}

}  // namespace autograd
