#pragma once
// Circuit analysis of attention heads from their weights and their patterns, with
// TransformerLens's definitions (its FactoredMatrix, OV and QK circuits, composition scores and
// head detectors) in our layout. docs/circuits.md describes each function and maps it to TL's name.
//
// Layout. nn::MultiHeadAttention projects row vectors, y = x·W + b, with W_Q, W_K, W_V (in x E) and
// W_O (E x E); head h owns columns h·d_k .. (h+1)·d_k - 1 of W_Q, W_K, W_V and the same rows of W_O.
// So head h's weights are TL's W_Q[h] (E x d_k), W_K[h], W_V[h] and W_O[h] (d_k x E), and
//   OV circuit  W_V[h]·W_O[h]    (vdim x E): what the head writes for a source token's residual
//   QK circuit  W_Q[h]·W_K[h]ᵀ   (E x kdim): the bilinear form of its attention scores (before 1/√d_k)
// Every matrix here acts on row vectors on its left, as in TL.
#include <complex>
#include <functional>
#include <cstdint>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

#include "nn/hooks.hpp"
#include "nn/multihead_attention.hpp"
#include "nn/study.hpp"
#include "nn/transformer_lm.hpp"

namespace nn::circuits {

// ---- per-head weights ----

// Head h's slices of the layer's parameters: narrow()s of them, so differentiable in the
// parameters (a gradient through W_Q reaches attn.W_Q's columns of head h only).
struct HeadWeights {
  ag::Tensor W_Q;  // (E, d_k)
  ag::Tensor W_K;  // (kdim, d_k)
  ag::Tensor W_V;  // (vdim, d_k)
  ag::Tensor W_O;  // (d_k, E)
  ag::Tensor b_Q, b_K, b_V;  // (d_k) each; undefined when the layer has no bias
};
HeadWeights head_weights(const MultiHeadAttention& attn, std::int64_t head);

// Every head's weights stacked on a leading head dim (TL's attn.W_Q .. W_O and b_Q .. b_O):
// W_Q (H, E, d_k), W_K (H, kdim, d_k), W_V (H, vdim, d_k), W_O (H, d_k, E), b_Q/b_K/b_V (H, d_k),
// b_O (E). Reshapes of the parameters (differentiable); biases undefined without bias.
struct StackedHeadWeights {
  ag::Tensor W_Q, W_K, W_V, W_O;
  ag::Tensor b_Q, b_K, b_V, b_O;
};
StackedHeadWeights stacked_head_weights(const MultiHeadAttention& attn);
// Several layers of one shape, stacked again on a leading layer dim (TL's model.W_Q (L, H, E, d_k), ...).
StackedHeadWeights stacked_head_weights(const std::vector<const MultiHeadAttention*>& layers);

// ---- FactoredMatrix ----

// The singular value decomposition of a FactoredMatrix, as TL's FactoredMatrix.svd returns it:
// M = U · diag(S) · Vᵀ with U (..., m, k) and V (..., n, k) of orthonormal columns and S (..., k)
// descending, k = min(m, r, n) (TL's .V, which its deprecated .Vh also returns).
struct FactoredSvd {
  ag::Tensor U, S, V;
};

// Eigenvalues of a square FactoredMatrix, as real and imaginary parts (..., r), r the inner
// dimension: the eigenvalues of B·A, which are those of A·B except for A·B's m - r extra zeros
// (TL's FactoredMatrix.eigenvalues). Sorted by decreasing magnitude, then by decreasing real part,
// then by decreasing imaginary part (TL leaves LAPACK's order); a complex pair comes out as
// (a + bi, a - bi).
struct FactoredEigenvalues {
  ag::Tensor real, imag;
  // The values of an unbatched matrix (or all of them, the batch laid end to end).
  std::vector<std::complex<double>> values() const;
};

// A matrix held as the product A·B of A (..., m, r) and B (..., r, n), never formed unless AB()
// is asked for (TL's FactoredMatrix). Leading dims broadcast (A and B are expanded to the common
// ones). The norm, the singular values and the eigenvalues come from the factors: the SVDs of A and
// B and of an r x r middle matrix, and the eigenvalues of the r x r product B·A (Eigen's solvers,
// in float64), at a cost independent of m and n beyond the factors' own SVDs.
//
// AB(), BA(), transpose, the products, indexing, norm() and the collapsed forms are ag ops and
// differentiable in A and B; svd(), singular_values() and eigenvalues() are values outside any
// graph, in A's dtype.
class FactoredMatrix {
 public:
  // Throws when the inner dims differ, a matrix dim is 0, or the leading dims do not broadcast.
  // svd(), singular_values() and eigenvalues() throw on factors holding NaN or ±inf.
  FactoredMatrix(ag::Tensor A, ag::Tensor B);

  const ag::Tensor& A() const { return A_; }
  const ag::Tensor& B() const { return B_; }
  ag::Shape shape() const;                    // leading dims + (m, n)
  std::int64_t ndim() const { return static_cast<std::int64_t>(shape().size()); }
  ag::Shape leading_shape() const;            // the leading dims alone
  std::int64_t ldim() const { return A_.size(-2); }  // m
  std::int64_t mdim() const { return A_.size(-1); }  // r, the inner dimension
  std::int64_t rdim() const { return B_.size(-1); }  // n
  ag::Dtype dtype() const { return A_.dtype(); }

  ag::Tensor AB() const;  // (..., m, n)
  ag::Tensor BA() const;  // (..., r, r); needs m == n
  FactoredMatrix T() const;  // (..., n, m) = Bᵀ·Aᵀ

  // this · M for a matrix M (..., n, k), kept factored as TL does: (A, B·M) when n > r, else
  // (A·B, M). A vector v (n) gives the vector A·(B·v) (..., m).
  FactoredMatrix matmul(const ag::Tensor& M) const;
  ag::Tensor matvec(const ag::Tensor& v) const;
  // M · this for M (..., k, m): (M·A, B) when m > r, else (M, A·B). A vector v (m) gives (v·A)·B.
  FactoredMatrix rmatmul(const ag::Tensor& M) const;
  ag::Tensor vecmat(const ag::Tensor& v) const;
  // this · other = (this · other.A) · other.B, by the rules above.
  FactoredMatrix matmul(const FactoredMatrix& other) const;
  FactoredMatrix scaled(double s) const;  // s·A, B

  // Index the first leading dim (negative counts from the end), or insert a size-1 leading dim
  // at `dim` (counting leading dims only, as TL's unsqueeze does on its factors).
  FactoredMatrix operator[](std::int64_t index) const;
  FactoredMatrix unsqueeze(std::int64_t dim) const;

  // ‖A·B‖_F per matrix (leading dims): sqrt(Σ (AᵀA) ⊙ (BBᵀ)), from r x r Gram matrices.
  ag::Tensor norm() const;
  FactoredSvd svd() const;
  ag::Tensor singular_values() const { return svd().S; }
  FactoredEigenvalues eigenvalues() const;  // needs m == n
  // TL's collapse_l (S·Vᵀ, (..., k, n)) and collapse_r (U·S, (..., m, k)): the product with its
  // left (right) orthogonal factor removed, so ‖collapse_l()‖ = ‖collapse_r()‖ = ‖A·B‖. Values, no graph.
  ag::Tensor collapse_l() const;
  ag::Tensor collapse_r() const;
  // TL's make_even: (U·√S, √S·Vᵀ), the same product with balanced factors. Values, no graph.
  FactoredMatrix make_even() const;

 private:
  ag::Tensor A_, B_;
};

// ---- OV and QK circuits ----

// One head: W_V[h]·W_O[h] (vdim x E) and W_Q[h]·W_K[h]ᵀ (E x kdim).
FactoredMatrix ov_circuit(const MultiHeadAttention& attn, std::int64_t head);
FactoredMatrix qk_circuit(const MultiHeadAttention& attn, std::int64_t head);
// Every head of a layer (H, ., .), and every head of several layers (L, H, ., .) (TL's model.OV,
// model.QK).
FactoredMatrix ov_circuit(const MultiHeadAttention& attn);
FactoredMatrix qk_circuit(const MultiHeadAttention& attn);
FactoredMatrix ov_circuit(const std::vector<const MultiHeadAttention*>& layers);
FactoredMatrix qk_circuit(const std::vector<const MultiHeadAttention*>& layers);

// ---- composition scores (Elhage et al. 2021) ----

// How a later head reads what an earlier head wrote, through the later head's queries (Q), keys
// (K) or values (V).
enum class Composition { Q, K, V };
std::string composition_name(Composition c);  // "Q", "K", "V"

// ‖L·R‖_F / (‖L‖_F ‖R‖_F) (TL's utils.composition_scores). With broadcast_dims, L's leading dims
// come first and R's after them: L (a..., m, n) and R (b..., n, p) give (a..., b...); without, the
// leading dims broadcast. Differentiable in the factors.
ag::Tensor composition_scores(const FactoredMatrix& left, const FactoredMatrix& right, bool broadcast_dims = true);
// The same for two plain matrices W_A (m x n) and W_B (n x p) (one-element result).
ag::Tensor composition_score(const ag::Tensor& W_A, const ag::Tensor& W_B);

// Every (earlier head i, later head j) pair of two layers, (H_earlier, H_later): the earlier head's
// OV circuit on the left and, on the right, the later head's
//   Q: QK circuit W_Q W_Kᵀ      K: its transpose W_K W_Qᵀ      V: OV circuit W_V W_O
// (TL's HookedTransformer.all_composition_scores, for one pair of layers).
ag::Tensor composition_scores(const MultiHeadAttention& earlier, const MultiHeadAttention& later, Composition mode);
// Every pair of heads of a list of layers, (L, H, L, H), zero unless the second head's layer comes
// after the first's (TL's all_composition_scores).
ag::Tensor all_composition_scores(const std::vector<const MultiHeadAttention*>& layers, Composition mode);

// The same score for random matrices of the same shapes: each factor of left and right (their
// last two dims) redrawn with independent standard normal entries, the score computed, over
// `samples` draws. It is the level a score must clearly exceed to mean anything: for Gaussian
// matrices the score is about 1/√n, n the dimension the product contracts (the residual width for
// two circuits; see docs/circuits.md).
struct CompositionBaseline {
  double mean = 0, std = 0;  // over the samples (std with n - 1)
  int samples = 0;
};
CompositionBaseline random_composition_baseline(const FactoredMatrix& left, const FactoredMatrix& right,
                                                ag::Generator& gen, int samples = 100);
// For two layers: left an OV circuit of `earlier`'s shapes, right the `mode` circuit of `later`'s.
CompositionBaseline random_composition_baseline(const MultiHeadAttention& earlier, const MultiHeadAttention& later,
                                                Composition mode, ag::Generator& gen, int samples = 100);

// ---- head detectors (TL's head_detector) ----

enum class HeadKind { PreviousToken, DuplicateToken, Induction };
std::string head_kind_name(HeadKind kind);  // TL's names: "previous_token_head", "duplicate_token_head", "induction_head"

// The 0/1 pattern a head of that kind would show on `tokens` (T) or (B, T) (Int64, or integral
// floats), as (T, T) or (B, T, T) Float64, lower triangular (TL's get_*_detection_pattern):
//   previous token  D[i][j] = 1 for j = i - 1
//   duplicate token D[i][j] = 1 for j < i with tokens[j] = tokens[i]
//   induction       D[i][j] = 1 for 1 <= j <= i with tokens[j - 1] = tokens[i]
ag::Tensor detection_pattern(HeadKind kind, const ag::Tensor& tokens);

enum class ErrorMeasure {
  Mul,    // Σ A⊙D / Σ A: the share of the head's attention that falls on the pattern's 1s
  Abs,    // 1 - round(T · mean |A - D|, 3): TL's "abs", 1 for a perfect match
  Share,  // the mean over the query positions that have a 1 in D (over the whole batch) of their
          // attention on the 1s: Mul leaves the positions without one in its denominator, so a
          // perfect induction head scores only the share of positions with an earlier occurrence
};
struct DetectorOptions {
  bool exclude_bos = false;            // attention to key 0 left out (of both sums for Mul)
  bool exclude_current_token = false;  // attention to key i from query i left out
  ErrorMeasure error_measure = ErrorMeasure::Mul;
};

// Per-head scores (H) of attention patterns `pattern` (B, H, T, T) (our layout, e.g. a cache's
// "….attn.pattern"; (H, T, T) for one sequence) against a detection pattern (T, T) or (B, T, T):
// each sequence scored on its own, as TL's compute_head_attention_similarity_score, and the scores
// averaged over the batch, as TL's detect_head averages over a list of sequences (Share pools the
// batch's positions instead). Mul and Share are differentiable in the pattern. A head whose
// (excluded) attention sums to zero on some sequence, a pattern holding NaN or ±inf, and (Share) a
// detection pattern with no 1 throw, naming them.
ag::Tensor head_scores(const ag::Tensor& pattern, const ag::Tensor& detection, const DetectorOptions& options = {});
// The same against the pattern of a head kind on tokens (B, T) ((T) for one sequence).
ag::Tensor head_scores(const ag::Tensor& pattern, HeadKind kind, const ag::Tensor& tokens,
                       const DetectorOptions& options = {});
// Every layer of a cache, (L, H): the cached pattern points named (in that order), or when
// `pattern_points` is empty every cached point whose name ends in "pattern", in the cache's order.
ag::Tensor head_scores(const ActivationCache& cache, HeadKind kind, const ag::Tensor& tokens,
                       const DetectorOptions& options = {}, const std::vector<std::string>& pattern_points = {});

// ---- the residual stream of a TransformerLM: logit lens, decompositions, attributions ----
// Each reads a cache of the model's forward (nn::run_with_cache) and names what it needs from it.
// A stack is (n, B, T, E) with a label per component, in TransformerLens's order and names.

struct ResidualStack {
  ag::Tensor stack;                 // (n, B, T, E)
  std::vector<std::string> labels;  // n
};

// The residual stream before each block 0 .. `layer` (-1 or n_layers: all, and after the last):
// labels "0_pre", ("0_mid" with incl_mid, ignored for an attention-only model as TL does), "1_pre",
// ..., "final_post" (TL's accumulated_resid).
// Needs blocks.i.resid_pre (resid_mid, blocks.{L-1}.resid_post) cached. apply_ln, as TL 3.9: up to
// the last layer, each stream through the whole ln_final (its own mean and scale, then weight and
// bias), ready for W_U; up to an earlier layer, apply_ln_to_stack with that layer's cached scale.
ResidualStack accumulated_resid(const TransformerLM& model, const ActivationCache& cache, std::int64_t layer = -1,
                                bool incl_mid = false, bool apply_ln = false);
// What each component wrote into the residual stream before `layer` (-1: all): "embed",
// "pos_embed", then per layer "{l}_attn_out" and "{l}_mlp_out" (TL's decompose_resid); their sum is
// the residual stream there. Needs embed_out, pos_embed_out, blocks.l.attn_out, blocks.l.mlp_out.
ResidualStack decompose_resid(const TransformerLM& model, const ActivationCache& cache, std::int64_t layer = -1,
                              bool apply_ln = false);
// Each head's result, "L{l}H{h}", for the layers before `layer` (-1: all) (TL's stack_head_results).
// Needs blocks.l.attn.result.
ResidualStack stack_head_results(const TransformerLM& model, const ActivationCache& cache, std::int64_t layer = -1,
                                 bool apply_ln = false);
// TL's apply_ln_to_stack: each component centred (over E) and divided by the cached LayerNorm
// scale of the stream at `layer` (-1 or n_layers: ln_final.scale; else blocks.{layer}.ln_1.scale),
// as the whole stream is, so the components of a sum add up to the normalised stream before the
// LayerNorm's weight and bias. The identity for a model without LayerNorm.
ag::Tensor apply_ln_to_stack(const TransformerLM& model, const ActivationCache& cache, const ag::Tensor& stack,
                             std::int64_t layer = -1);
// The logit lens: the logits each accumulated residual stream (accumulated_resid without
// apply_ln) would give if the model stopped there (the full ln_final, its own scale, and the
// unembedding): (n, B, T, d_vocab).
ag::Tensor logit_lens(const TransformerLM& model, const ResidualStack& accumulated);
// The residual directions of tokens' logits (n_tokens, E): ln_final.weight ⊙ W_U[:, token], so
// that apply_ln_to_stack(stack) · direction is each component's share of that logit, up to the
// logit's constant part (ln_final's bias · W_U[:, token] + b_U[token]).
ag::Tensor logit_directions(const TransformerLM& model, const std::vector<std::int64_t>& tokens);
// stack (n, B, T, E) · direction (E) or (B, T, E) -> (n, B, T). Differentiable.
ag::Tensor residual_stack_to_logit(const ag::Tensor& stack, const ag::Tensor& direction);

// ---- interventions on a TransformerLM ----

// Path patching (Wang et al. 2022, TL issue #111): the metric of the corrupted run when only the
// direct path from a sender head to one receiver head's queries, keys or values carries the
// clean run: the receiver head's input is the corrupted residual stream plus the sender's result
// from the clean run minus its result from the corrupted run, and every other head and layer runs
// on the corrupted input. per_pair (H_sender x H_receiver). 2 + H·(H + 1) forwards, no graph.
// metric(logits) returns one finite element; receiver_layer > sender_layer.
struct PathPatchingResult {
  double clean_metric = 0, corrupted_metric = 0;
  std::vector<std::vector<double>> per_pair;
};
PathPatchingResult path_patching(TransformerLM& model, const std::function<ag::Tensor(const ag::Tensor& logits)>& metric,
                                 const ag::Tensor& clean_tokens, const ag::Tensor& corrupted_tokens,
                                 std::int64_t sender_layer, std::int64_t receiver_layer, Composition receiver_input);

// Activation patching of every layer's z, per head and per head × position (TransformerLens's
// get_act_patch_attn_head_out_all_pos and _by_pos, on hook_z): for each layer, the metric of the
// corrupted run with head h's z taken from the clean run, at every position and at each position
// alone. Equal to study::activation_patching at "blocks.{l}.attn.z" with run(tokens) =
// metric(model.forward(tokens)), to rounding, but each patched forward starts at the patched
// layer from the corrupted run's cached residual stream and keys and values; a patch at position
// p recomputes only the rows p .. T-1 its change can reach under causal attention (only row p in
// its own layer), the heads of one patch are batched into one forward, and with
// MetricReads::LastPosition only the last position's logits are made (a last-layer patch at
// p < T-1 cannot reach them and costs nothing).
//   metric(logits) returns one finite element; logits are (B, T, d_vocab_out), or (B, 1,
//   d_vocab_out) with LastPosition (read them as logits[:, -1]: a metric that indexes position
//   T-1 of the full logits throws there rather than reading the wrong row).
// Tokens (B, T), clean and corrupted of one shape. Runs without a graph; the model must have no
// hooks (these partial forwards skip hook points) and no dropout acting. Result: one
// PatchingResult per layer (clean_metric and corrupted_metric the same in each).
enum class MetricReads { AllPositions, LastPosition };
struct ZPatchingOptions {
  MetricReads reads = MetricReads::AllPositions;
  bool per_position = true;  // false: per head at every position only (no per_head_position)
};
std::vector<study::PatchingResult> z_patching_sweep(const TransformerLM& model,
                                                   const std::function<ag::Tensor(const ag::Tensor& logits)>& metric,
                                                   const ag::Tensor& clean_tokens, const ag::Tensor& corrupted_tokens,
                                                   const ZPatchingOptions& options = {});

// Resample ablation: a forward hook for a z point that replaces head's z in each sequence of the
// batch with its z from another sequence of `source_z` (B, H, T, d_k) (a cache of the same point
// on other inputs), chosen by a random permutation with no fixed point drawn from gen (B >= 2).
ForwardHook resample_ablate_head(std::int64_t head, const ag::Tensor& source_z, ag::Generator& gen);

}  // namespace nn::circuits
