// Results do not depend on the thread count: every op family, forward and backward, gives the
// same bits at 1, 2, 3 and 7 threads, on shapes large enough to take the parallel paths (and on
// narrow outputs with a long summed dimension, where a product is cut along K). A short
// training run of a multi-head attention layer is bit-identical at 1, 2 and 7 threads.
#define BOOST_TEST_MODULE determinism
#include <boost/test/unit_test.hpp>

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

#include "../autograd/src/kernels/gemm.hpp"  // the product every op calls, tested directly

#include "test_support.hpp"

using namespace test_support::prelude;
using test_support::ThreadCount;

namespace {

// The values of a run: each tensor's elements as exact doubles.
using Values = std::vector<std::vector<double>>;
using Run = std::function<std::vector<Tensor>()>;

Values values_of(const std::vector<Tensor>& ts) {
  Values v;
  for (const Tensor& t : ts) v.push_back(t.to_vector());
  return v;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// run() at 1 thread, then at 2, 3 and 7: every result must have the same bits.
void check_thread_independent(const std::string& what, const Run& run, std::vector<int> counts = {2, 3, 7}) {
  Values ref;
  {
    ThreadCount tc(1);
    ref = values_of(run());
  }
  for (int n : counts) {
    ThreadCount tc(n);
    const Values got = values_of(run());
    BOOST_REQUIRE_EQUAL(got.size(), ref.size());
    for (std::size_t r = 0; r < ref.size(); ++r) {
      BOOST_REQUIRE_EQUAL(got[r].size(), ref[r].size());
      std::size_t differ = 0, first = 0;
      for (std::size_t i = 0; i < ref[r].size(); ++i)
        if (!same_bits(got[r][i], ref[r][i]) && differ++ == 0) first = i;
      BOOST_TEST(differ == 0u, what << ", result " << r << ", " << n << " threads: " << differ << " of "
                                    << ref[r].size() << " elements differ from 1 thread, first at " << first
                                    << " (" << (differ ? got[r][first] : 0.0) << " vs "
                                    << (differ ? ref[r][first] : 0.0) << ")");
    }
  }
}

Tensor leaf(const ag::Shape& s, ag::Generator& gen, Dtype dtype = Dtype::Float32) {
  return ag::randn(s, dtype, gen).requires_grad_(true);
}

// Backward of sum(y_k · w_k) over the outputs (w_k random), then {outputs..., grads of leaves...}.
std::vector<Tensor> with_grads(const std::vector<Tensor>& ys, const std::vector<Tensor>& leaves, ag::Generator& gen) {
  Tensor loss;
  for (const Tensor& y : ys) {
    const Tensor term = ag::sum(y * ag::randn(y.shape(), y.dtype(), gen));
    loss = loss.defined() ? loss + term : term;
  }
  loss.backward();
  std::vector<Tensor> out = ys;
  out.push_back(loss);
  for (const Tensor& l : leaves) out.push_back(l.grad());
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(elementwise_unary_ops) {
  check_thread_independent("unary", [] {
    ag::Generator gen(1);
    Tensor x = leaf({257, 300}, gen);
    const Tensor a = ag::abs(x) + 0.5;
    return with_grads({ag::exp(x * 0.5), ag::log(a), ag::sqrt(a), ag::rsqrt(a), ag::square(x), ag::tanh(x),
                       ag::sigmoid(x), ag::relu(x), ag::gelu(x), ag::gelu(x, ag::GeluApproximation::Tanh),
                       ag::clamp(x, -0.5, 0.7), ag::pow(a, 1.7), -x, ag::rdiv(a, 2.0), ag::rsub(x, 3.0)},
                      {x}, gen);
  });
}

BOOST_AUTO_TEST_CASE(elementwise_binary_ops_with_broadcast) {
  check_thread_independent("binary", [] {
    ag::Generator gen(2);
    Tensor a = leaf({257, 300}, gen), row = leaf({300}, gen), col = leaf({257, 1}, gen);
    Tensor same = leaf({257, 300}, gen);
    const Tensor pos = ag::abs(a) + 0.5;
    std::vector<double> m(257 * 300);
    for (std::size_t i = 0; i < m.size(); ++i) m[i] = (i * 7) % 5 == 0 ? 1.0 : 0.0;
    const Tensor cond = ag::tensor(m, {257, 300});
    return with_grads({a + row, a - col, a * row, a / (col * col + 1.0), same * a, ag::maximum(a, col),
                       ag::minimum(same, row), ag::pow(pos, row * 0.1), ag::where(cond, a, row),
                       ag::masked_fill(same, cond, 2.5), a * 1.5 + 0.25},
                      {a, row, col, same}, gen);
  });
  check_thread_independent("binary, 3-d broadcast", [] {
    ag::Generator gen(3);
    Tensor a = leaf({6, 1, 6000}, gen), b = leaf({1, 8, 1}, gen), c = leaf({8, 6000}, gen);
    return with_grads({a * b + c, ag::expand(b, {6, 8, 6000}) * a}, {a, b, c}, gen);
  });
}

BOOST_AUTO_TEST_CASE(reductions) {
  check_thread_independent("reductions", [] {
    ag::Generator gen(4);
    Tensor x = leaf({1000, 300}, gen), x3 = leaf({20, 500, 30}, gen), v = leaf({1 << 20}, gen);
    const Tensor centred = x - ag::mean(x, 1, true);
    const Tensor var = ag::mean(ag::square(centred), 1);
    return with_grads({ag::sum(x), ag::sum(x, 0), ag::sum(x, 1), ag::sum(x, {0, 1}), ag::mean(x), ag::mean(x, 0),
                       ag::mean(x, 1, true), var, ag::max(x), ag::max(x, 0), ag::max(x, 1), ag::argmax(x, 1).to(x.dtype()),
                       ag::sum(x3, 1), ag::mean(x3, {0, 2}), ag::max(x3, 1), ag::sum(v), ag::mean(v)},
                      {x, x3, v}, gen);
  });
}

BOOST_AUTO_TEST_CASE(softmax_and_log_softmax) {
  check_thread_independent("softmax", [] {
    ag::Generator gen(5);
    Tensor x = leaf({2000, 50}, gen), x3 = leaf({16, 300, 20}, gen);
    return with_grads({ag::softmax(x, 1), ag::log_softmax(x, 1), ag::softmax(x, 0), ag::log_softmax(x, 0),
                       ag::softmax(x3, 1), ag::log_softmax(x3, -1)},
                      {x, x3}, gen);
  });
}

BOOST_AUTO_TEST_CASE(matmul_and_batched_matmul) {
  for (Dtype dt : {Dtype::Float32, Dtype::Float64}) {
    check_thread_independent("matmul", [dt] {
      ag::Generator gen(6);
      Tensor a = leaf({300, 200}, gen, dt), b = leaf({200, 150}, gen, dt);
      Tensor ba = leaf({4, 96, 160}, gen, dt), bb = leaf({160, 128}, gen, dt);
      Tensor ca = leaf({8, 64, 80}, gen, dt), cb = leaf({8, 80, 72}, gen, dt);
      Tensor na = leaf({16, 4096}, gen, dt), nb = leaf({4096, 8}, gen, dt);
      Tensor u = leaf({100000}, gen, dt), w = leaf({100000}, gen, dt);
      Tensor m = leaf({500, 400}, gen, dt), mv = leaf({400}, gen, dt);
      // Batches whose slices are large products themselves (the BLAS's and Eigen's).
      Tensor la = leaf({2, 512, 1024}, gen, dt), lb = leaf({1024, 64}, gen, dt);
      Tensor ea = leaf({3, 256, 2048}, gen, dt), eb = leaf({3, 2048, 16}, gen, dt);
      return with_grads({ag::matmul(a, b), ag::matmul(ba, bb), ag::matmul(ca, cb), ag::matmul(na, nb),
                         ag::matmul(u, w), ag::matmul(m, mv), ag::matmul(ag::transpose(b, 0, 1), ag::transpose(a, 0, 1)),
                         ag::matmul(la, lb), ag::matmul(ea, eb)},
                        {a, b, ba, bb, ca, cb, na, nb, u, w, m, mv, la, lb, ea, eb}, gen);
    });
  }
}

BOOST_AUTO_TEST_CASE(linear_forward_and_backward_narrow_and_wide) {
  // Weight gradients of narrow layers are products with a long summed dimension (the rows).
  for (std::int64_t rows : {1024, 8192}) {
    for (std::int64_t out : {5, 8, 16, 64}) {
      check_thread_independent("linear " + std::to_string(rows) + "x128 -> " + std::to_string(out), [=] {
        ag::Generator gen(7);
        Tensor x = leaf({rows, 128}, gen), w = leaf({128, out}, gen), b = leaf({out}, gen);
        return with_grads({ag::linear(x, w, b)}, {x, w, b}, gen);
      });
    }
  }
  check_thread_independent("linear 3-d and linear_cat", [] {
    ag::Generator gen(8);
    Tensor x = leaf({8, 128, 96}, gen), w = leaf({96, 96}, gen), b = leaf({96}, gen);
    Tensor w2 = leaf({96, 32}, gen), w3 = leaf({96, 8}, gen);
    const std::vector<Tensor> ws{w, w2, w3};
    return with_grads({ag::linear(x, w, b), ag::linear(x, w), ag::linear_cat(x, ws)}, {x, w, b, w2, w3}, gen);
  });
}

namespace {

// C = 0.7·op(A)·op(B) + 0.3·C through the product itself, for every transpose pair.
template <class T>
std::vector<Tensor> gemm_all_transposes(std::int64_t M, std::int64_t N, std::int64_t K) {
  const Dtype dt = std::is_same_v<T, float> ? Dtype::Float32 : Dtype::Float64;
  ag::Generator gen(9);
  const Tensor a = ag::randn({M * K}, dt, gen), b = ag::randn({K * N}, dt, gen), c0 = ag::randn({M * N}, dt, gen);
  std::vector<Tensor> out;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      Tensor c = ag::randn({M * N}, dt, gen);
      c.copy_(c0);
      ag::gemm<T>(ta, tb, M, N, K, T(0.7), a.data<T>(), ta ? M : K, b.data<T>(), tb ? K : N, T(0.3), c.data<T>(), N);
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(gemm_every_transpose_and_shape) {
  // (M, N, K): narrow and tall outputs with long K, square, small-kernel sized, BLAS sized.
  const std::vector<std::array<std::int64_t, 3>> shapes{{8, 128, 8192}, {128, 8, 8192},  {128, 32, 8192},
                                                        {300, 257, 190}, {64, 64, 64},    {2048, 16, 512},
                                                        {17, 1000, 333}, {1024, 128, 1024}, {5, 128, 1024}};
  for (const auto& shape : shapes) {
    const std::int64_t M = shape[0], N = shape[1], K = shape[2];
    const std::string what = "gemm " + std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
    check_thread_independent(what + " float", [=] { return gemm_all_transposes<float>(M, N, K); });
    check_thread_independent(what + " double", [=] { return gemm_all_transposes<double>(M, N, K); });
  }
}

BOOST_AUTO_TEST_CASE(attention_core) {
  check_thread_independent("scaled_dot_product_attention", [] {
    ag::Generator gen(10);
    Tensor q = leaf({4, 4, 96, 32}, gen), k = leaf({4, 4, 96, 32}, gen), v = leaf({4, 4, 96, 32}, gen);
    Tensor mask = leaf({96, 96}, gen);
    ag::Generator drop(11);
    auto r1 = ag::scaled_dot_product_attention(q, k, v, {.attn_mask = mask, .dropout_p = 0.1, .generator = &drop});
    auto r2 = ag::scaled_dot_product_attention(q, k, v, {.is_causal = true});
    Tensor ql = leaf({4, 96, 128}, gen), kl = leaf({4, 96, 128}, gen), vl = leaf({4, 96, 128}, gen);
    auto r3 = ag::scaled_dot_product_attention_heads_last(ql, kl, vl, 4, {.is_causal = true});
    Tensor qkv = leaf({4, 96, 384}, gen);
    auto r4 = ag::scaled_dot_product_attention_packed(qkv, 4, {.attn_mask = mask});
    return with_grads({r1.output, r1.weights, r2.output, r3.output, r4.output}, {q, k, v, mask, ql, kl, vl, qkv}, gen);
  });
}

BOOST_AUTO_TEST_CASE(layer_norm_and_cross_entropy) {
  check_thread_independent("layer_norm", [] {
    ag::Generator gen(12);
    Tensor x = leaf({4096, 64}, gen), w = leaf({64}, gen), b = leaf({64}, gen);
    Tensor x3 = leaf({16, 256, 48}, gen);
    nn::LayerNorm ln(nn::LayerNormOptions{.normalized_shape = {48}});
    std::vector<Tensor> leaves{x, w, b, x3};
    for (const Tensor& p : ln.parameters()) leaves.push_back(p);
    return with_grads({nn::layer_norm(x, {64}, w, b), ln.forward(x3)}, leaves, gen);
  });
  check_thread_independent("cross_entropy", [] {
    ag::Generator gen(13);
    Tensor logits = leaf({4096, 50}, gen), l3 = leaf({8, 512, 40}, gen);
    std::vector<std::int64_t> t(4096), t3(8 * 512);
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<std::int64_t>((i * 13) % 50);
    for (std::size_t i = 0; i < t3.size(); ++i) t3[i] = static_cast<std::int64_t>((i * 7) % 40);
    const Tensor mean = nn::cross_entropy(logits, t, {.label_smoothing = 0.1});
    const Tensor sum = nn::cross_entropy(l3, t3, {.reduction = nn::Reduction::Sum});
    const Tensor none = nn::cross_entropy(logits, t, {.reduction = nn::Reduction::None});
    return with_grads({mean, sum, none}, {logits, l3}, gen);
  });
}

BOOST_AUTO_TEST_CASE(dropout_with_a_seed) {
  check_thread_independent("dropout", [] {
    ag::Generator gen(14);
    Tensor x = leaf({300, 300}, gen);
    ag::Generator drop(15);
    const Tensor y1 = ag::dropout(x, 0.3, true, drop);
    ag::manual_seed(16);
    const Tensor y2 = ag::dropout(x, 0.5);
    return with_grads({y1, y2}, {x}, gen);
  });
}

BOOST_AUTO_TEST_CASE(indexing_and_embedding_backward) {
  check_thread_independent("embedding / index_select", [] {
    ag::Generator gen(17);
    Tensor weight = leaf({1000, 64}, gen), x = leaf({300, 400}, gen);
    std::vector<double> idx(8192);
    for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<double>((i * 7) % 1000);
    const Tensor indices = ag::tensor(idx, {64, 128});
    std::vector<std::int64_t> rows, cols;
    for (std::int64_t i = 0; i < 600; ++i) rows.push_back((i * 11) % 300);
    for (std::int64_t i = 0; i < 500; ++i) cols.push_back((i * 3) % 400);
    return with_grads({ag::embedding(weight, indices), ag::index_select(x, 0, rows), ag::index_select(x, 1, cols)},
                      {weight, x}, gen);
  });
}

BOOST_AUTO_TEST_CASE(shape_ops_cat_split) {
  check_thread_independent("cat / split / stack / permute", [] {
    ag::Generator gen(18);
    Tensor a = leaf({300, 200}, gen), b = leaf({300, 100}, gen), c = leaf({40, 50, 60}, gen);
    Tensor r = leaf({1, 300}, gen);
    std::vector<Tensor> ys{ag::cat({a, b}, 1), ag::cat({a, a}, 0), ag::stack({a, a}, 1), ag::permute(c, {2, 0, 1}),
                           ag::transpose(c, 0, 2), ag::expand(r, {400, 300}), ag::slice(a, 1, 3, 190, 2),
                           ag::narrow(c, 1, 5, 30)};
    for (const Tensor& s : ag::split(c, 7, 2)) ys.push_back(s * 2.0);
    for (const Tensor& s : ag::chunk(a, 3, 0)) ys.push_back(s);
    return with_grads(ys, {a, b, c, r}, gen);
  });
}

namespace {

// A multi-head attention layer with dropout and a linear head, trained with AdamW: the losses
// and the final parameters.
std::vector<Tensor> short_training_run() {
  ag::Generator gen(2024);
  nn::MultiHeadAttention mha(nn::MultiHeadAttentionOptions{.embed_dim = 64, .num_heads = 4, .dropout = 0.1}, gen);
  nn::Linear head(nn::LinearOptions{64, 7}, gen);
  std::vector<Tensor> params = mha.parameters();
  for (const Tensor& p : head.parameters()) params.push_back(p);
  nn::AdamW opt(params, {.lr = 3e-3});
  const Tensor x = ag::randn({8, 64, 64}, Dtype::Float32, gen);
  std::vector<std::int64_t> targets(8 * 64);
  for (std::size_t i = 0; i < targets.size(); ++i) targets[i] = static_cast<std::int64_t>((i * 5 + 1) % 7);
  nn::AttentionOptions ao;
  ao.need_weights = false;
  ao.is_causal = true;
  std::vector<double> losses;
  for (int step = 0; step < 20; ++step) {
    opt.zero_grad();
    const Tensor out = mha.forward(x, x, x, ao).output;
    const Tensor logits = ag::reshape(head.forward(ag::gelu(out)), {-1, 7});
    Tensor loss = nn::cross_entropy(logits, targets);
    loss.backward();
    opt.step();
    losses.push_back(loss.item());
  }
  std::vector<Tensor> result{ag::tensor(losses, {static_cast<std::int64_t>(losses.size())}, Dtype::Float64)};
  for (const Tensor& p : params) result.push_back(p);
  return result;
}

}  // namespace

BOOST_AUTO_TEST_CASE(training_run_is_bit_identical_at_any_thread_count) {
  check_thread_independent("MultiHeadAttention + AdamW, 20 steps", short_training_run, {2, 7});
}
