// A floating attn_mask that requires grad gets its gradient through nn::MultiHeadAttention, as
// through PyTorch's nn.MultiheadAttention: checked against central differences in float64, on
// both cores, with and without the weights, 2-D and per-head 3-D masks, alone and with key
// padding, causal masking and appended keys. A mask that does not require grad records nothing.
#define BOOST_TEST_MODULE mha_mask_grad
#include <boost/test/unit_test.hpp>

#include <fmt/format.h>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

namespace ag = autograd;

namespace {

constexpr auto F64 = ag::Dtype::Float64;
constexpr std::int64_t B = 2, T = 3, S = 3, E = 4, H = 2;

struct Case {
  bool per_head = false;      // (B·H, T, S) instead of (T, S)
  bool padding = false;       // a key padding mask too
  bool causal = false;        // is_causal too
  bool bias_kv = false;       // add_bias_kv and add_zero_attn: two keys appended to the mask
};

ag::GradcheckResult check(const Case& c, nn::AttentionCore core, bool need_weights, bool detach_in_fn) {
  ag::Generator gen(7);
  nn::MultiHeadAttention mha(nn::MultiHeadAttentionOptions{.embed_dim = E,
                                                           .num_heads = H,
                                                           .add_bias_kv = c.bias_kv,
                                                           .add_zero_attn = c.bias_kv,
                                                           .core = core,
                                                           .dtype = F64},
                             gen);
  const ag::Tensor q = ag::randn({B, T, E}, F64, gen), kv = ag::randn({B, S, E}, F64, gen);
  ag::Tensor mask = ag::randn(c.per_head ? ag::Shape{B * H, T, S} : ag::Shape{T, S}, F64, gen);
  mask.requires_grad_(true);
  nn::AttentionOptions ao;
  ao.need_weights = need_weights;
  ao.average_attn_weights = false;
  ao.is_causal = c.causal;
  if (c.padding) ao.key_padding_mask = ag::tensor({0.0, 0.0, 1.0, 0.0, 1.0, 0.0}, {B, S}, ag::Dtype::Int64);
  auto fn = [&](const std::vector<ag::Tensor>& in) {
    nn::AttentionOptions o = ao;
    o.attn_mask = detach_in_fn ? in[0].detach() : in[0];
    auto [out, w] = mha.forward(q, kv, kv, o);
    return need_weights ? ag::cat({ag::reshape(out, {-1}), ag::reshape(w, {-1})}, 0) : out;
  };
  return ag::gradcheck(fn, {mask});
}

std::string name(const Case& c, nn::AttentionCore core, bool need_weights) {
  return fmt::format("per_head {} padding {} causal {} bias_kv {} core {} need_weights {}", c.per_head, c.padding,
                     c.causal, c.bias_kv, core == nn::AttentionCore::Fused ? "fused" : "composed", need_weights);
}

const std::vector<Case> kCases = {{}, {.per_head = true}, {.padding = true}, {.per_head = true, .causal = true},
                                  {.padding = true, .causal = true, .bias_kv = true}};

}  // namespace

BOOST_AUTO_TEST_CASE(a_float_mask_that_requires_grad_gets_its_gradient) {
  for (const Case& c : kCases)
    for (auto core : {nn::AttentionCore::Fused, nn::AttentionCore::Composed})
      for (bool need_weights : {false, true}) {
        const ag::GradcheckResult r = check(c, core, need_weights, false);
        BOOST_TEST(r.ok, name(c, core, need_weights) << ": " << fmt::format("{}", r));
        BOOST_TEST(r.elements_checked > 0);
      }
}

// Negative control: the same check with the mask detached inside the function (its gradient
// lost, as before masks recorded a graph) must fail.
BOOST_AUTO_TEST_CASE(negative_control_a_lost_mask_gradient_fails_the_check) {
  for (const Case& c : kCases) {
    const ag::GradcheckResult r = check(c, nn::AttentionCore::Fused, false, true);
    BOOST_TEST(!r.ok, name(c, nn::AttentionCore::Fused, false));
  }
}

BOOST_AUTO_TEST_CASE(a_mask_that_does_not_require_grad_records_no_graph_for_it) {
  ag::Generator gen(3);
  nn::MultiHeadAttention mha(nn::MultiHeadAttentionOptions{.embed_dim = E, .num_heads = H, .dtype = F64}, gen);
  const ag::Tensor x = ag::randn({B, T, E}, F64, gen);
  nn::AttentionOptions ao;
  ao.attn_mask = ag::randn({T, T}, F64, gen);
  const ag::Tensor out = mha.forward(x, x, x, ao).output;
  ag::sum(out).backward();
  BOOST_TEST(!ao.attn_mask.grad().defined());
  BOOST_TEST(mha.parameters()[0].grad().defined());
}
