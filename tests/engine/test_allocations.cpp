// A fixed-shape training loop makes no heap allocation once warm: tensor buffers and the
// engine's small objects are reused from per-thread caches, backward rules return their
// gradients inline, and the backward walk reuses its tables. Counted, not timed.
//
// The count comes from this program's own malloc family, which stands in for glibc's (every
// operator new, Eigen temporary and library call reaches it) and forwards to glibc's __libc_*
// entry points. AddressSanitizer brings its own allocator, and the caches are off under it, so
// the sanitizer build leaves this test out (scripts/test_sanitize.sh).
#define BOOST_TEST_MODULE allocations
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include <autograd/autograd.hpp>
#include <autograd/detail/sanitizer.hpp>
#include <nn/nn.hpp>

namespace ag = autograd;
using ag::Dtype;
using ag::Tensor;


namespace {
std::atomic<std::uint64_t> g_allocations{0};
}

#ifndef HEADGRAD_ASAN
extern "C" {
void* __libc_malloc(std::size_t size);
void* __libc_calloc(std::size_t n, std::size_t size);
void* __libc_realloc(void* p, std::size_t size);
void* __libc_memalign(std::size_t align, std::size_t size);

void* malloc(std::size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_malloc(size);
}
void* calloc(std::size_t n, std::size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_calloc(n, size);
}
void* realloc(void* p, std::size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_realloc(p, size);
}
void* aligned_alloc(std::size_t align, std::size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_memalign(align, size);
}
void* memalign(std::size_t align, std::size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_memalign(align, size);
}
int posix_memalign(void** out, std::size_t align, std::size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (align < sizeof(void*) || (align & (align - 1)) != 0) return EINVAL;
  void* p = __libc_memalign(align, size);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}
}
#endif

namespace {

// Heap allocations made by `calls` calls of f, after `warmup` calls.
template <class F>
std::uint64_t allocations_of(F&& f, int warmup = 3, int calls = 10) {
  for (int i = 0; i < warmup; ++i) f();
  const std::uint64_t before = g_allocations.load();
  for (int i = 0; i < calls; ++i) f();
  return g_allocations.load() - before;
}

// The toy example's model (examples/train_heads/): embeddings, one pre-LN transformer block,
// a final LayerNorm and a readout.
struct ToyModel : nn::Module {
  std::shared_ptr<nn::Embedding> tok, pos;
  std::shared_ptr<nn::TransformerBlock> block;
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> readout;
  Tensor positions;
  ToyModel(std::int64_t vocab, std::int64_t T, std::int64_t d_model, std::int64_t heads, ag::Generator& gen)
      : Module("ToyModel") {
    tok = register_module("tok", std::make_shared<nn::Embedding>(nn::EmbeddingOptions{vocab, d_model}, gen));
    pos = register_module("pos", std::make_shared<nn::Embedding>(nn::EmbeddingOptions{T, d_model}, gen));
    block = register_module(
        "block", std::make_shared<nn::TransformerBlock>(
                     nn::TransformerBlockOptions{.d_model = d_model, .num_heads = heads, .d_ff = 4 * d_model}, gen));
    ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(d_model));
    readout = register_module("readout", std::make_shared<nn::Linear>(nn::LinearOptions{d_model, vocab}, gen));
    positions = ag::arange(static_cast<double>(T));
  }
  Tensor forward(const Tensor& tokens, const nn::AttentionOptions& opt) const {
    const Tensor x = ag::add(tok->forward(tokens), pos->forward(positions));
    return readout->forward(ln_f->forward(block->forward(x, opt).output));
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(a_warm_training_step_of_the_toy_model_allocates_nothing) {
  const std::int64_t vocab = 8, T = 12, d_model = 32, batch = 16;
  ag::Generator gen(3);
  ToyModel model(vocab, T, d_model, 2, gen);
  std::vector<double> tokens(static_cast<std::size_t>(batch * T));
  std::vector<std::int64_t> targets(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<double>(gen.next_u64() % vocab);
    targets[i] = i % T == 0 ? -100 : static_cast<std::int64_t>(gen.next_u64() % vocab);
  }
  const Tensor token_tensor = ag::tensor(tokens, {batch, T});
  const std::vector<Tensor> params = model.parameters();
  nn::AdamW opt(params, {.lr = 3e-3, .weight_decay = 0.01});
  nn::AttentionOptions ao;
  ao.is_causal = true;
  ao.need_weights = false;
  double first = 0, last = 0;
  auto step = [&] {
    Tensor loss = nn::cross_entropy(model.forward(token_tensor, ao), targets, {.ignore_index = -100});
    opt.zero_grad();
    loss.backward();
    nn::clip_grad_norm_(params, 1.0);
    opt.step();
    last = loss.item();
    if (first == 0) first = last;
  };
  const std::uint64_t n = allocations_of(step);
  BOOST_TEST_MESSAGE(fmt::format("toy model: {} allocations in 10 warm steps; loss {:.4f} -> {:.4f}", n, first, last));
  BOOST_TEST(n == 0u);
  BOOST_TEST(last < first);  // it trained
}

BOOST_AUTO_TEST_CASE(a_warm_attention_step_with_dropout_and_padding_allocates_nothing) {
  const std::int64_t B = 4, T = 8, E = 16, H = 4;
  ag::Generator gen(5);
  nn::MultiHeadAttention mha({.embed_dim = E, .num_heads = H, .dropout = 0.1}, gen);
  const Tensor x = ag::randn({B, T, E}, Dtype::Float64, gen).requires_grad_(true);
  mha.to(Dtype::Float64);
  std::vector<double> padding(static_cast<std::size_t>(B * T), 0.0);
  padding[static_cast<std::size_t>(T - 1)] = 1.0;
  nn::AttentionOptions ao;
  ao.key_padding_mask = ag::tensor(padding, {B, T});
  ao.need_weights = true;
  auto step = [&] {
    auto [out, weights] = mha.forward(x, x, x, ao);
    ag::sum(out).backward();
  };
  const std::uint64_t n = allocations_of(step);
  BOOST_TEST_MESSAGE(fmt::format("attention with dropout: {} allocations in 10 warm steps", n));
  BOOST_TEST(n == 0u);
}

BOOST_AUTO_TEST_CASE(backward_of_a_tiny_graph_allocates_nothing) {
  const Tensor a = ag::tensor({1.0, 2.0, 3.0, 4.0}, {4}).requires_grad_(true);
  const Tensor b = ag::tensor({0.5, -1.0, 2.0, 0.25}, {4}).requires_grad_(true);
  const std::uint64_t n = allocations_of([&] { ag::sum(a * b + a).backward(); });
  BOOST_TEST(n == 0u);
}

// Negative controls: the counter sees the allocations it must see.
BOOST_AUTO_TEST_CASE(the_counter_sees_operator_new_and_fresh_tensor_sizes) {
  const std::uint64_t with_vector = allocations_of([] {
    auto v = std::make_unique<std::vector<int>>(100);
    BOOST_TEST(v->size() == 100u);
  });
  BOOST_TEST(with_vector >= 20u);  // two allocations per call
  std::int64_t size = 1000;
  const std::uint64_t with_new_sizes = allocations_of([&] {
    ag::zeros({size}, Dtype::Float64);
    size += 100;
  });
  BOOST_TEST(with_new_sizes >= 10u);  // a buffer size the cache has never seen
}
