// docs/guide.md, "Attention": nn::MultiHeadAttention's options, the causal mask, key padding,
// float masks, per-head and averaged weights, need_weights, a fully blocked row (zeros, not NaN),
// weights before dropout, cross-attention with kdim and vdim, and a first look at the study tools.
// The guide shows this program's code and output; CI runs it.
#include <cmath>
#include <limits>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

namespace ag = autograd;

int main() {
  ag::manual_seed(0);
  nn::MultiHeadAttention attn(nn::MultiHeadAttentionOptions{.embed_dim = 8, .num_heads = 2});
  const ag::Tensor x = ag::randn({2, 4, 8});  // (B, T, E), batch first

  // Self-attention, causal: query i sees keys 0..i. Weights (B, T, S), averaged over the heads.
  nn::AttentionOutput r = attn(x, x, x, {.is_causal = true});
  fmt::print("out {}  weights {}; sequence 0:\n{}\n\n", ag::shape_str(r.output.shape()),
             ag::shape_str(r.weights.shape()), ag::squeeze(ag::narrow(r.weights, 0, 0, 1), 0));

  // The same mask as a float attn_mask (T, S), added to the scaled scores: 0 or -inf.
  const double inf = std::numeric_limits<double>::infinity();
  const ag::Tensor causal = ag::tensor({0, -inf, -inf, -inf, 0, 0, -inf, -inf, 0, 0, 0, -inf, 0, 0, 0, 0}, {4, 4});
  const ag::Tensor same = attn(x, x, x, {.attn_mask = causal}).output;
  fmt::print("is_causal vs float mask: max difference {}\n", ag::max(ag::abs(same - r.output)).item());

  // Key padding (B, S): nonzero = padding. The last key of sequence 1 is padding.
  // Per-head weights: average_attn_weights = false gives (B, H, T, S).
  const ag::Tensor padding = ag::tensor({0, 0, 0, 0, 0, 0, 0, 1}, {2, 4});
  nn::AttentionOutput p = attn(x, x, x, {.key_padding_mask = padding, .average_attn_weights = false});
  fmt::print("per-head weights {}; sequence 1, head 0:\n{}\n\n", ag::shape_str(p.weights.shape()),
             nn::AttentionStudy::head(p.weights, /*h=*/0, /*b=*/1));

  // need_weights = false: no weights are averaged or returned (weights is undefined).
  fmt::print("need_weights = false: weights defined? {}\n", attn(x, x, x, {.need_weights = false}).weights.defined());

  // A query whose keys are all blocked gets zero weights, out = b_O, zero gradients: never NaN.
  const ag::Tensor q = ag::randn({1, 2, 8}).requires_grad_();
  const ag::Tensor all_padding = ag::ones({1, 2});
  nn::AttentionOutput blocked = attn(q, q, q, {.key_padding_mask = all_padding});
  ag::sum(blocked.output).backward();
  fmt::print("fully blocked: weights sum {}, largest |gradient| {}, any NaN? {}\n", ag::sum(blocked.weights).item(),
             ag::max(ag::abs(q.grad())).item(), std::isnan(ag::sum(blocked.output).item()));

  // Dropout acts on the weights in training mode; the weights returned are those before dropout.
  nn::MultiHeadAttention dropped(nn::MultiHeadAttentionOptions{.embed_dim = 8, .num_heads = 2, .dropout = 0.5});
  fmt::print("with dropout 0.5 (training): weight rows sum to {:.4f}\n",
             ag::sum(dropped(x, x, x).weights, -1).to_vector()[0]);

  // Cross-attention: keys of width kdim = 3, values of width vdim = 5, S = 6 keys.
  nn::MultiHeadAttention cross(nn::MultiHeadAttentionOptions{.embed_dim = 8, .num_heads = 2, .kdim = 3, .vdim = 5});
  nn::AttentionOutput c = cross(x, ag::randn({2, 6, 3}), ag::randn({2, 6, 5}));
  fmt::print("cross-attention: out {}, weights {}\n", ag::shape_str(c.output.shape()), ag::shape_str(c.weights.shape()));
  for (const auto& [name, t] : cross.named_parameters()) fmt::print("  {} {}", name, ag::shape_str(t.shape()));
  fmt::print("\n\n");

  // Study tools (docs/studying_attention.md): hook points, cached activations, ablation.
  nn::ActivationCache cache = nn::run_with_cache(attn, [&] { return attn(x, x, x, {.is_causal = true}).output; },
                                                 {.names = {"pattern", "z"}});
  fmt::print("cached: pattern {}, z {}\n", ag::shape_str(cache["pattern"].shape()), ag::shape_str(cache["z"].shape()));
  nn::HookHandle h = attn.add_hook("z", nn::study::zero_ablate_head(1));
  const ag::Tensor ablated = attn(x, x, x, {.is_causal = true}).output;
  h.remove();
  fmt::print("head 1 ablated: output changes by up to {:.4f}\n", ag::max(ag::abs(ablated - r.output)).item());
}
