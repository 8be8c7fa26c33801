// Per-head weights of nn::MultiHeadAttention and the OV / QK circuits built from them.
#include <cstdint>
#include <vector>

#include <autograd/autograd.hpp>

#include "nn/circuits.hpp"

namespace nn::circuits {

namespace {

void check_head(const char* op, const MultiHeadAttention& attn, std::int64_t head) {
  if (head < 0 || head >= attn.num_heads())
    ag::fail(op, "head {} is out of range for a layer of {} heads", head, attn.num_heads());
}

// (in, E) -> (H, in, d_k): head h's columns h·d_k .. (h+1)·d_k - 1 as slice h.
ag::Tensor split_columns(const ag::Tensor& W, std::int64_t H, std::int64_t d) {
  return ag::permute(ag::reshape(W, {W.size(0), H, d}), {1, 0, 2});
}

void check_same_layout(const char* op, const std::vector<const MultiHeadAttention*>& layers) {
  if (layers.empty()) ag::fail(op, "needs at least one layer, got none");
  for (std::size_t l = 0; l < layers.size(); ++l)
    if (layers[l] == nullptr) ag::fail(op, "layer {} is a null pointer", l);
  const auto& first = *layers[0];
  for (std::size_t l = 1; l < layers.size(); ++l) {
    const auto& a = *layers[l];
    if (a.embed_dim() != first.embed_dim() || a.num_heads() != first.num_heads() || a.kdim() != first.kdim() ||
        a.vdim() != first.vdim() || a.W_Q().dtype() != first.W_Q().dtype() ||
        a.b_Q().defined() != first.b_Q().defined())
      ag::fail(op,
               "layer {} (embed_dim {}, {} heads, kdim {}, vdim {}, {}, {}) differs from layer 0 (embed_dim {}, {} heads, "
               "kdim {}, vdim {}, {}, {}): stacking needs one layout",
               l, a.embed_dim(), a.num_heads(), a.kdim(), a.vdim(), ag::dtype_name(a.W_Q().dtype()),
               a.b_Q().defined() ? "bias" : "no bias", first.embed_dim(), first.num_heads(), first.kdim(), first.vdim(),
               ag::dtype_name(first.W_Q().dtype()), first.b_Q().defined() ? "bias" : "no bias");
  }
}

}  // namespace

HeadWeights head_weights(const MultiHeadAttention& attn, std::int64_t head) {
  check_head("circuits::head_weights", attn, head);
  const std::int64_t d = attn.head_dim(), start = head * d;
  HeadWeights w;
  w.W_Q = ag::narrow(attn.W_Q(), 1, start, d);
  w.W_K = ag::narrow(attn.W_K(), 1, start, d);
  w.W_V = ag::narrow(attn.W_V(), 1, start, d);
  w.W_O = ag::narrow(attn.W_O(), 0, start, d);
  if (attn.b_Q().defined()) {
    w.b_Q = ag::narrow(attn.b_Q(), 0, start, d);
    w.b_K = ag::narrow(attn.b_K(), 0, start, d);
    w.b_V = ag::narrow(attn.b_V(), 0, start, d);
  }
  return w;
}

StackedHeadWeights stacked_head_weights(const MultiHeadAttention& attn) {
  const std::int64_t H = attn.num_heads(), d = attn.head_dim(), E = attn.embed_dim();
  StackedHeadWeights w;
  w.W_Q = split_columns(attn.W_Q(), H, d);
  w.W_K = split_columns(attn.W_K(), H, d);
  w.W_V = split_columns(attn.W_V(), H, d);
  w.W_O = ag::reshape(attn.W_O(), {H, d, E});
  if (attn.b_Q().defined()) {
    w.b_Q = ag::reshape(attn.b_Q(), {H, d});
    w.b_K = ag::reshape(attn.b_K(), {H, d});
    w.b_V = ag::reshape(attn.b_V(), {H, d});
    w.b_O = attn.b_O();
  }
  return w;
}

StackedHeadWeights stacked_head_weights(const std::vector<const MultiHeadAttention*>& layers) {
  check_same_layout("circuits::stacked_head_weights", layers);
  std::vector<StackedHeadWeights> per;
  for (const auto* a : layers) per.push_back(stacked_head_weights(*a));
  auto stack = [&](ag::Tensor StackedHeadWeights::*field) {
    ag::TensorList ts;
    for (const auto& p : per) ts.push_back(p.*field);
    return ts.front().defined() ? ag::stack(ts, 0) : ag::Tensor();
  };
  StackedHeadWeights w;
  w.W_Q = stack(&StackedHeadWeights::W_Q);
  w.W_K = stack(&StackedHeadWeights::W_K);
  w.W_V = stack(&StackedHeadWeights::W_V);
  w.W_O = stack(&StackedHeadWeights::W_O);
  w.b_Q = stack(&StackedHeadWeights::b_Q);
  w.b_K = stack(&StackedHeadWeights::b_K);
  w.b_V = stack(&StackedHeadWeights::b_V);
  w.b_O = stack(&StackedHeadWeights::b_O);
  return w;
}

FactoredMatrix ov_circuit(const MultiHeadAttention& attn, std::int64_t head) {
  check_head("circuits::ov_circuit", attn, head);
  const HeadWeights w = head_weights(attn, head);
  return FactoredMatrix(w.W_V, w.W_O);
}

FactoredMatrix qk_circuit(const MultiHeadAttention& attn, std::int64_t head) {
  check_head("circuits::qk_circuit", attn, head);
  const HeadWeights w = head_weights(attn, head);
  return FactoredMatrix(w.W_Q, ag::transpose(w.W_K, 0, 1));
}

FactoredMatrix ov_circuit(const MultiHeadAttention& attn) {
  const StackedHeadWeights w = stacked_head_weights(attn);
  return FactoredMatrix(w.W_V, w.W_O);
}

FactoredMatrix qk_circuit(const MultiHeadAttention& attn) {
  const StackedHeadWeights w = stacked_head_weights(attn);
  return FactoredMatrix(w.W_Q, ag::transpose(w.W_K, -2, -1));
}

FactoredMatrix ov_circuit(const std::vector<const MultiHeadAttention*>& layers) {
  check_same_layout("circuits::ov_circuit", layers);
  const StackedHeadWeights w = stacked_head_weights(layers);
  return FactoredMatrix(w.W_V, w.W_O);
}

FactoredMatrix qk_circuit(const std::vector<const MultiHeadAttention*>& layers) {
  check_same_layout("circuits::qk_circuit", layers);
  const StackedHeadWeights w = stacked_head_weights(layers);
  return FactoredMatrix(w.W_Q, ag::transpose(w.W_K, -2, -1));
}

}  // namespace nn::circuits
