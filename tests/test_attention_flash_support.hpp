#pragma once
// What the tests of the tiled attention core share: a call of one of the three fused ops
// (layout, sizes, mask, causal), its float64 inputs, and a run that returns the output and the
// gradients of L = Σ output ⊙ R; small tiles for the scope of a test.
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include <autograd/autograd.hpp>

#include "../autograd/src/kernels/attention_flash_tiles.hpp"

namespace flash_test {

namespace ag = autograd;

enum class Layout { HeadsFirst, HeadsLast, Packed };

struct Case {
  Case(Layout l, std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t s, std::int64_t dk, std::int64_t dv,
       ag::Tensor m = ag::Tensor(), bool is_causal = false, bool m_grad = false)
      : layout(l), B(b), H(h), T(t), S(s), d_k(dk), d_v(dv), mask(std::move(m)), causal(is_causal), mask_grad(m_grad) {}
  Layout layout = Layout::HeadsFirst;
  std::int64_t B = 1, H = 1, T = 1, S = 1, d_k = 1, d_v = 1;  // packed: S = T, d_v = d_k
  ag::Tensor mask;          // undefined: none
  bool causal = false;
  bool mask_grad = false;   // the mask requires grad
  double scale = 0.0;
};

// q, k, v (packed: qkv), leaves that require grad, then a fresh copy of the mask if there is one.
inline std::vector<ag::Tensor> make_inputs(const Case& c, std::uint64_t seed) {
  ag::Generator gen(seed);
  auto leaf = [&](const ag::Shape& s) { return ag::randn(s, ag::Dtype::Float64, gen).requires_grad_(true); };
  std::vector<ag::Tensor> in;
  switch (c.layout) {
    case Layout::HeadsFirst:
      in = {leaf({c.B, c.H, c.T, c.d_k}), leaf({c.B, c.H, c.S, c.d_k}), leaf({c.B, c.H, c.S, c.d_v})};
      break;
    case Layout::HeadsLast:
      in = {leaf({c.B, c.T, c.H * c.d_k}), leaf({c.B, c.S, c.H * c.d_k}), leaf({c.B, c.S, c.H * c.d_v})};
      break;
    case Layout::Packed:
      in = {leaf({c.B, c.T, 3 * c.H * c.d_k})};
      break;
  }
  if (c.mask.defined()) in.push_back(c.mask.detach().clone().requires_grad_(c.mask_grad));
  return in;
}

inline ag::Shape output_shape(const Case& c) {
  const std::int64_t d_v = c.layout == Layout::Packed ? c.d_k : c.d_v;
  if (c.layout == Layout::HeadsFirst) return {c.B, c.H, c.T, d_v};
  return {c.B, c.T, c.H * d_v};
}

// R: the weights of the readout L = Σ output ⊙ R.
inline ag::Tensor readout(const Case& c, std::uint64_t seed) {
  ag::Generator gen(seed);
  return ag::randn(output_shape(c), ag::Dtype::Float64, gen);
}

// The op on inputs laid out as make_inputs gives them.
inline ag::SdpaResult call(const Case& c, const std::vector<ag::Tensor>& in, bool need_weights) {
  const std::size_t n = c.layout == Layout::Packed ? 1 : 3;
  const ag::Tensor mask = in.size() > n ? in[n] : ag::Tensor();
  switch (c.layout) {
    case Layout::HeadsFirst:
      return ag::scaled_dot_product_attention(
          in[0], in[1], in[2],
          {.need_weights = need_weights, .attn_mask = mask, .is_causal = c.causal, .scale = c.scale});
    case Layout::HeadsLast:
      return ag::scaled_dot_product_attention_heads_last(
          in[0], in[1], in[2], c.H,
          {.need_weights = need_weights, .attn_mask = mask, .is_causal = c.causal, .scale = c.scale});
    case Layout::Packed:
      break;
  }
  return ag::scaled_dot_product_attention_packed(
      in[0], c.H, {.need_weights = need_weights, .attn_mask = mask, .is_causal = c.causal, .scale = c.scale});
}

struct Run {
  ag::Tensor output, weights;
  std::vector<ag::Tensor> grads;  // of the inputs that require grad, in order
};

inline Run run(const Case& c, const std::vector<ag::Tensor>& in, const ag::Tensor& r, bool need_weights) {
  for (auto t : in) t.set_grad(ag::Tensor());
  const ag::SdpaResult res = call(c, in, need_weights);
  ag::sum(res.output * r).backward();
  Run out{res.output.detach(), res.weights.defined() ? res.weights.detach() : ag::Tensor(), {}};
  for (const auto& t : in)
    if (t.requires_grad()) out.grads.push_back(t.grad());
  return out;
}

// Small tiles (and the tiled core at every size) for the scope of a test; restores the sizes after.
struct SmallTiles {
  ag::sdpa::FlashTiles saved = ag::sdpa::flash_tiles();
  explicit SmallTiles(std::int64_t block_q = 3, std::int64_t block_k = 4) {
    ag::sdpa::flash_tiles() = {block_q, block_k, 0};
  }
  ~SmallTiles() { ag::sdpa::flash_tiles() = saved; }
  SmallTiles(const SmallTiles&) = delete;
  SmallTiles& operator=(const SmallTiles&) = delete;
};

// The bits of every element (as float64 values).
inline std::vector<std::uint64_t> bits(const ag::Tensor& t) {
  const std::vector<double> v = t.to_vector();
  std::vector<std::uint64_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * sizeof(double));
  return b;
}

}  // namespace flash_test
