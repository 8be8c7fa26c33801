#pragma once
// The kernels of the fused attention op (internal, not installed): where each (batch, head)
// slice of q, k, v and the output lives, and the forward and backward over all slices.
// attention_core.cpp holds the kernels; attention.cpp the op's entry points, checks and graph
// node.
//
// Shapes (per slice):  Q [T, d_k]   K [S, d_k]   V [S, d_v]
//                      scores/P/Z/dP/dS [T, S]   O, dO [T, d_v]
#include <cstdint>

#include "autograd/shape.hpp"
#include "kernels/eigen_views.hpp"

namespace autograd::sdpa {

// Where slice (b, h)'s matrix of q, k, v or the output lives: it starts at base + b·sb + h·sh
// and its rows are sr apart. (B, H, L, d) storage: sb = H·L·d, sh = L·d, sr = d. Heads-last
// (B, L, H·d) storage: sb = L·H·d, sh = d, sr = H·d (the head is a column block of each row).
// Packed (B, L, 3·H·d) storage, each row [q | k | v]: sb = L·3·H·d, sh = d, sr = 3·H·d, and base
// 0, H·d or 2·H·d picks q, k or v.
struct Layout {
  std::int64_t sb = 0, sh = 0, sr = 0, base = 0;
  std::int64_t at(std::int64_t b, std::int64_t h) const { return base + b * sb + h * sh; }
};

inline Layout heads_first(std::int64_t H, std::int64_t L, std::int64_t d) { return {H * L * d, L * d, d}; }
inline Layout heads_last(std::int64_t H, std::int64_t L, std::int64_t d) { return {L * H * d, d, H * d}; }
// which = 0, 1, 2: the q, k or v columns of a packed row.
inline Layout packed(std::int64_t H, std::int64_t L, std::int64_t d, std::int64_t which) {
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
  bool parallel() const { return slices() * T * S * (d_k + d_v) >= kParallelFlops; }
};

// Where slice (b, h), row i, column j of the broadcast mask lives: b·sb + h·sh + i·st + j·ss.
// A stride is 0 along a broadcast (size-1) dim.
struct MaskStrides {
  std::int64_t sb = 0, sh = 0, st = 0, ss = 0;
};

// The strides of a mask of this shape (rank <= 4) broadcast to (B, H, T, S).
MaskStrides mask_strides(const Shape& mask_shape);

// What the forward reads and writes. mask and keep may be null (no mask, no dropout).
template <class T>
struct ForwardData {
  const T* q;
  const T* k;
  const T* v;
  const T* mask;     // the additive mask, read through MaskStrides
  const T* keep;     // (B, H, T, S) dropout factors Z: 0 or 1/(1-p)
  T* weights;        // (B, H, T, S): P, softmax of the masked scores
  T* out;            // O = (P ⊙ Z)·V, laid out as Dims::out
};

// What the backward reads and writes. dout and dweights are the gradients that reached `output`
// and `weights`: null when none did, which reads as zero and skips its work. Any of dq, dk, dv,
// dscores may be null (not needed); dscores receives dL/dS, the mask's gradient before it is
// summed to the mask's shape.
template <class T>
struct BackwardData {
  const T* q;
  const T* k;
  const T* v;
  const T* weights;
  const T* keep;
  const T* dout;
  const T* dweights;
  T* dq;
  T* dk;
  T* dv;
  T* dscores;
};

// What the forward-mode rule reads and writes: the forward's operands, weights P and dropout
// factors Z (null: none); the tangents of q, k, v (in their layouts) and of the mask (through
// MaskStrides), null where zero; the output's tangent (laid out as Dims::out) and the weights'
// (B, H, T, S; null: not wanted).
template <class T>
struct TangentData {
  const T* q;
  const T* k;
  const T* v;
  const T* weights;
  const T* keep;
  const T* dq;
  const T* dk;
  const T* dv;
  const T* dmask;
  T* dout;
  T* dweights;
};

// For each slice:  S = scale·Q·Kᵀ + M;  P = softmax_rows(S) (causal: columns 0..i of row i);
//                  O = (P ⊙ Z)·V. Returns whether a row with keys had no score above −inf (its
// weights and output then 0): blocked by the mask, or, without one, scores that overflowed to −inf.
template <class T>
bool forward(const Dims& d, const ForwardData<T>& x, MaskStrides ms, T scale, bool causal);

// The forward's derivative along the tangents (forward mode), for each slice:
//   Ṡ = scale·(Q̇·Kᵀ + Q·K̇ᵀ) + Ṁ;  Ṗ_ij = P_ij·(Ṡ_ij − Σ_k P_ik·Ṡ_ik);  Ȯ = (Ṗ ⊙ Z)·V + (P ⊙ Z)·V̇.
template <class T>
void tangent(const Dims& d, const TangentData<T>& x, MaskStrides ms, T scale, bool causal);

// The gradients of the forward above, derived in docs/attention_backward.md.
template <class T>
void backward(const Dims& d, const BackwardData<T>& x, T scale, bool causal);

}  // namespace autograd::sdpa
