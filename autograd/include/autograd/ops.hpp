#pragma once
// The op set. Names and semantics follow PyTorch. Every op checks its arguments and throws
// std::invalid_argument naming itself and the shapes at fault; every op is differentiable in
// every tensor argument except masks, conditions and indices.
//
// Binary ops broadcast like NumPy; their gradients are summed back to each input's shape.
// Mixing Float32 and Float64 tensors in one op is an error (convert with .to()).
//
// Int64 tensors (indices, class targets; see dtype.hpp) are taken by the ops that move, pick or
// compare values: the factories, to(), clone, the shape ops, cat/stack/split, index_select,
// gather, the comparisons, sum, max and argmax, masked_fill, and as indices, masks and conditions. The ops
// that compute with values (arithmetic, the unary functions, mean, matmul, linear, softmax,
// layer_norm, dropout, attention, cross_entropy's logits, embedding's weight) need Float32 or
// Float64 and say so, naming themselves.
#include <cstdint>
#include <span>
#include <vector>

#include "autograd/random.hpp"
#include "autograd/tensor.hpp"

namespace autograd {

// ---- elementwise, binary (broadcasting) — src/ops/elementwise_binary.cpp ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);  // a > 0 where b is not an integer
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor sub(const Tensor& a, double b);
Tensor rsub(const Tensor& a, double b);  // b - a
Tensor mul(const Tensor& a, double b);
Tensor div(const Tensor& a, double b);
Tensor rdiv(const Tensor& a, double b);  // b / a
Tensor pow(const Tensor& a, double exponent);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);
Tensor operator-(const Tensor& a);

// ---- elementwise, unary — src/ops/elementwise_unary.cpp ----
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor square(const Tensor& x);
Tensor abs(const Tensor& x);  // gradient sign(x), 0 at 0
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);  // gradient 0 at 0
// GELU exact, x·Φ(x), or its tanh approximation x/2·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
// (PyTorch's approximate="none" and approximate="tanh").
enum class GeluApproximation { None, Tanh };
Tensor gelu(const Tensor& x, GeluApproximation approximate = GeluApproximation::None);
Tensor clamp(const Tensor& x, double min, double max);  // gradient passes where min < x < max

// ---- selection by mask — src/ops/elementwise_binary.cpp ----
// mask broadcasts to x's shape; where mask != 0, the result is `value` (gradient 0 there). An
// Int64 x (targets with -100 to clean out, say) takes an integral value within the Int64 range,
// exactly; any other value is refused.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
// cond, a and b broadcast together; result = cond != 0 ? a : b.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);

// ---- comparisons — src/ops/compare.cpp ----
// Broadcasting; the result is an Int64 tensor of 1 where the comparison holds and 0 elsewhere
// (PyTorch returns bool: here 0/1 Int64, which masked_fill and where take as a mask and sum
// counts). Any dtypes: one dtype compares in it, Int64 against a float compares in Float64.
// Not differentiable (the result is outside the graph). NaN compares unequal to everything.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, double b);
Tensor ne(const Tensor& a, double b);
Tensor lt(const Tensor& a, double b);
Tensor le(const Tensor& a, double b);
Tensor gt(const Tensor& a, double b);
Tensor ge(const Tensor& a, double b);

// ---- reductions — src/ops/reduce.cpp ----
// sum, max and argmax take Int64 tensors too (an Int64 sum or max is Int64, with no gradient);
// mean needs Float32 or Float64.
Tensor sum(const Tensor& x);  // all elements -> shape []
Tensor sum(const Tensor& x, const std::vector<std::int64_t>& dims, bool keepdim = false);
Tensor sum(const Tensor& x, std::int64_t dim, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<std::int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x, std::int64_t dim, bool keepdim = false);
Tensor max(const Tensor& x);  // gradient split evenly among tied maxima
Tensor max(const Tensor& x, std::int64_t dim, bool keepdim = false);  // gradient to the first maximum
// Int64 indices (as PyTorch), of the first maximum; no gradient.
Tensor argmax(const Tensor& x, std::int64_t dim, bool keepdim = false);

// ---- linear algebra — src/ops/matmul.cpp, src/ops/linear.cpp ----
// 1-D·1-D, 2-D·2-D, and batched N-D with broadcast batch dims (PyTorch's torch.matmul).
Tensor matmul(const Tensor& a, const Tensor& b);
// x·W + b with W of shape (in, out) (the seed's and nn::Linear's layout), x of shape (..., in),
// b of shape (out) or undefined: one fused op (src/ops/linear.cpp), the leading dims of x folded
// into one GEMM.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = Tensor());
// Several linears of one input as one op: x·[W_0 | W_1 | …] + [b_0 | b_1 | …], the outputs side by
// side in the last dim (..., Σ out_i), with one GEMM forward and one per operand backward (e.g.
// a self-attention's Q, K, V projections). 1 to 4 weights (in, out_i) of one `in`; biases: none
// (empty span) or one per weight, each (out_i) or undefined (no bias).
Tensor linear_cat(const Tensor& x, std::span<const Tensor> weights, std::span<const Tensor> biases = {});

// ---- shape — src/ops/shape.cpp, src/ops/join.cpp ----
Tensor reshape(const Tensor& x, const Shape& shape);  // one -1 may be inferred; shares storage
Tensor flatten(const Tensor& x, std::int64_t start_dim = 0, std::int64_t end_dim = -1);
Tensor transpose(const Tensor& x, std::int64_t dim0, std::int64_t dim1);
Tensor permute(const Tensor& x, const std::vector<std::int64_t>& dims);
Tensor squeeze(const Tensor& x);  // all size-1 dims
Tensor squeeze(const Tensor& x, std::int64_t dim);
Tensor unsqueeze(const Tensor& x, std::int64_t dim);
Tensor expand(const Tensor& x, const Shape& shape);  // broadcast to shape (copies)
// x.clone() (src/tensor.cpp): the same values in new storage; the gradient passes through unchanged.
Tensor clone(const Tensor& x);
Tensor narrow(const Tensor& x, std::int64_t dim, std::int64_t start, std::int64_t length);
Tensor slice(const Tensor& x, std::int64_t dim, std::int64_t start, std::int64_t end, std::int64_t step = 1);
Tensor cat(const TensorList& xs, std::int64_t dim = 0);
Tensor stack(const TensorList& xs, std::int64_t dim = 0);
TensorList split(const Tensor& x, std::int64_t split_size, std::int64_t dim = 0);
TensorList split(const Tensor& x, const std::vector<std::int64_t>& sizes, std::int64_t dim = 0);
TensorList chunk(const Tensor& x, std::int64_t chunks, std::int64_t dim = 0);

// ---- indexing — src/ops/indexing.cpp, src/ops/gather.cpp ----
// Rows (or slices along dim) picked by index; gradient scattered (added) back.
Tensor index_select(const Tensor& x, std::int64_t dim, const std::vector<std::int64_t>& index);
// Index tensors (here, in gather, embedding and cross_entropy's targets) are Int64, or Float32 /
// Float64 holding integral values; an index outside [0, size) is an error naming it and the size.
Tensor index_select(const Tensor& x, std::int64_t dim, const Tensor& index);  // 0-d or 1-D index
// Embedding lookup: weight (V, D), indices of any shape -> indices.shape + [D].
Tensor embedding(const Tensor& weight, const Tensor& indices);
// torch.gather: out[i][j][k] = x[index[i][j][k]][j][k] for dim 0 (likewise for the other dims).
// index has x's rank and, in every dim but `dim`, a size no larger than x's; the result has
// index's shape. Differentiable in x (to any order); gradient scattered (added) back.
Tensor gather(const Tensor& x, std::int64_t dim, const Tensor& index);

// ---- softmax — src/ops/softmax.cpp (numerically stable: max subtracted) ----
Tensor softmax(const Tensor& x, std::int64_t dim);
Tensor log_softmax(const Tensor& x, std::int64_t dim);

// ---- normalisation — src/ops/layer_norm.cpp ----
// LayerNorm over the last dims (torch.nn.functional.layer_norm): y = (x − mean) / √(var + eps) ·
// weight + bias, mean and biased variance over the last normalized_shape.size() dims of x, which
// must equal normalized_shape. weight and bias are shaped normalized_shape, or undefined (none).
// Differentiable in x, weight and bias, to any order (create_graph).
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

// ---- losses — src/ops/cross_entropy.cpp ----
enum class Reduction { None, Mean, Sum };

struct CrossEntropyOptions {
  std::int64_t ignore_index = -100;       // targets equal to this contribute nothing (and no gradient)
  Reduction reduction = Reduction::Mean;  // Mean divides by the number of targets not ignored
  double label_smoothing = 0.0;           // in [0, 1]: the target distribution is (1-ε)·onehot + ε/C
};

// Cross entropy of softmax(logits) against class indices (torch.nn.functional.cross_entropy),
// computed stably from the logits: loss_n = logsumexp(x_n) − x_n[target_n]. The class dimension
// is the LAST one: logits (N, C) with targets (N) is PyTorch's layout; logits (B, T, C) go with
// targets (B, T) (PyTorch would want (B, C, T)). Float32 or Float64 logits; targets shaped like
// logits without the last dim, holding integral values in [0, C) or ignore_index (any dtype;
// not differentiated). Returns a scalar (Mean, Sum) or the per-position losses (None). With
// Mean and every target ignored the result is NaN (0/0), as in PyTorch.
// Masked (−inf) logits: a −inf class adds nothing (gradient 0 there without smoothing); a −inf
// target, or smoothing over a row holding a −inf logit, gives +inf, as in PyTorch; a row that is
// −inf throughout gives +inf with zero gradient (PyTorch: NaN). Differentiable in logits, to any order (create_graph).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& options = {});
// Same, targets given as row-major indices (logits.numel() / C of them).
Tensor cross_entropy(const Tensor& logits, const std::vector<std::int64_t>& targets,
                     const CrossEntropyOptions& options = {});

// ---- dropout — src/ops/dropout.cpp ----
// In training, zeroes each element with probability p and scales the rest by 1/(1-p). Each call
// with p > 0 draws one 64-bit seed from gen, whatever the size (eval mode and p == 0 draw
// nothing); element n (row-major flat index) is kept iff the Philox-4x32-10 uniform of that
// seed and n is >= p (src/kernels/philox.hpp). The mask is the same for every dtype and thread
// count, and the fused attention ops draw theirs on (B, H, T, S) weights by the same rule.
Tensor dropout(const Tensor& x, double p, bool training, Generator& gen);
Tensor dropout(const Tensor& x, double p, bool training = true);  // default generator

}  // namespace autograd
