// Memory stays flat: a long training loop frees each step's graph and saved tensors, so the live
// heap and the resident set stop growing after warm-up. Measured, with a bound.
#define BOOST_TEST_MODULE memory
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include <malloc.h>
#include <unistd.h>

#include <fmt/format.h>

#include <autograd/autograd.hpp>
#include <autograd/detail/sanitizer.hpp>
#include <nn/nn.hpp>

#ifdef HEADGRAD_ASAN
// From the AddressSanitizer runtime (declared here: GCC ships no sanitizer/allocator_interface.h).
extern "C" std::size_t __sanitizer_get_current_allocated_bytes();
#endif

namespace ag = autograd;
using ag::Dtype;
using ag::Tensor;

namespace {

constexpr int kWarmupSteps = 300;
constexpr int kSteps = 3000;
constexpr std::int64_t kMaxHeapGrowth = 64 * 1024;         // bytes still allocated, after warm-up
constexpr std::int64_t kMaxRssGrowth = 2 * 1024 * 1024;    // resident set, after warm-up

// Bytes the program holds on the heap right now (not what the allocator keeps cached). Under
// AddressSanitizer, its own count (freed blocks sit in a quarantine that is not "live").
std::int64_t live_heap_bytes() {
#ifdef HEADGRAD_ASAN
  return static_cast<std::int64_t>(__sanitizer_get_current_allocated_bytes());
#else
  const struct mallinfo2 info = mallinfo2();
  return static_cast<std::int64_t>(info.uordblks + info.hblkhd);
#endif
}

// Resident set size from /proc/self/statm (second field, in pages).
std::int64_t rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return -1;
  long size = 0, resident = 0;
  const int n = std::fscanf(f, "%ld %ld", &size, &resident);
  std::fclose(f);
  return n == 2 ? static_cast<std::int64_t>(resident) * sysconf(_SC_PAGESIZE) : -1;
}

// A small attention classifier: self-attention, then a linear head per position.
struct Model : nn::Module {
  std::shared_ptr<nn::MultiHeadAttention> attention;
  std::shared_ptr<nn::Linear> head;
  Model(std::int64_t embed_dim, std::int64_t heads, std::int64_t classes, ag::Generator& gen) : nn::Module("Model") {
    nn::MultiHeadAttentionOptions opt{.embed_dim = embed_dim, .num_heads = heads, .dropout = 0.1};
    attention = register_module("attention", std::make_shared<nn::MultiHeadAttention>(opt, gen));
    head = register_module("head", std::make_shared<nn::Linear>(nn::LinearOptions{embed_dim, classes}, gen));
  }
  Tensor forward(const Tensor& x, const nn::AttentionOptions& ao) {
    auto [context, weights] = attention->forward(x, ao);
    return head->forward(ag::relu(context) + x);
  }
};

}  // namespace

// One optimisation step; returns the loss.
double train_step(Model& model, nn::Optimizer& opt, nn::LRScheduler& schedule, const Tensor& x,
                  const std::vector<std::int64_t>& targets, const nn::AttentionOptions& ao) {
  opt.zero_grad();
  Tensor logits = model.forward(x, ao);                                  // (B, T, C)
  Tensor loss = nn::cross_entropy(ag::reshape(logits, {-1, logits.size(-1)}), targets);
  loss.backward();
  nn::clip_grad_norm_(model.parameters(), 1.0);
  opt.step();
  schedule.step();
  return loss.item();
}

BOOST_AUTO_TEST_CASE(long_training_loop_keeps_memory_flat) {
  const std::int64_t B = 4, T = 8, E = 16, H = 4, C = 5;
  ag::Generator gen(42);
  Model model(E, H, C, gen);
  nn::AdamW opt(model.parameters(), {.lr = 3e-3});
  nn::LRScheduler schedule(opt, nn::warmup_cosine_lr(3e-3, 100, kSteps));
  const Tensor x = ag::randn({B, T, E}, Dtype::Float32, gen);
  std::vector<std::int64_t> targets;
  for (std::int64_t i = 0; i < B * T; ++i) targets.push_back((i * 7 + 3) % C);
  nn::AttentionOptions ao;
  ao.need_weights = false;
  ao.is_causal = true;
  std::vector<double> padding(static_cast<std::size_t>(B * T), 0.0);
  padding[static_cast<std::size_t>(T - 1)] = 1.0;  // one padded key in the first sequence
  ao.key_padding_mask = ag::tensor(padding, {B, T});

  double first_loss = 0, loss = 0;
  for (int step = 0; step < kWarmupSteps; ++step) {
    loss = train_step(model, opt, schedule, x, targets, ao);
    if (step == 0) first_loss = loss;
  }
  const std::int64_t heap0 = live_heap_bytes(), rss0 = rss_bytes();
  std::int64_t heap_peak = heap0;
  for (int step = kWarmupSteps; step < kSteps; ++step) {
    loss = train_step(model, opt, schedule, x, targets, ao);
    if (step % 100 == 0) heap_peak = std::max(heap_peak, live_heap_bytes());
  }
  const std::int64_t heap1 = live_heap_bytes(), rss1 = rss_bytes();
  BOOST_TEST_MESSAGE(fmt::format("{} steps: loss {:.4f} -> {:.4f}; live heap {} -> {} bytes (peak {}); RSS {} -> {} KiB",
                                 kSteps, first_loss, loss, heap0, heap1, heap_peak, rss0 / 1024, rss1 / 1024));
  BOOST_TEST(loss < first_loss);  // it did train
  BOOST_TEST(heap1 - heap0 < kMaxHeapGrowth);
  BOOST_TEST(heap_peak - heap0 < kMaxHeapGrowth);
  BOOST_TEST(rss0 > 0);
#ifdef HEADGRAD_ASAN
  // AddressSanitizer keeps freed blocks resident in its quarantine (256 MB by default), so the
  // resident set says nothing here; the live-heap bounds above still hold.
  BOOST_TEST_MESSAGE("RSS growth not bounded under AddressSanitizer");
#else
  BOOST_TEST(rss1 - rss0 < kMaxRssGrowth);
#endif
}

BOOST_AUTO_TEST_CASE(forward_passes_dropped_without_backward_free_their_graphs) {
  ag::Generator gen(7);
  Model model(8, 2, 3, gen);
  const Tensor x = ag::randn({2, 5, 8}, Dtype::Float32, gen);
  auto forward_and_drop = [&] { (void)ag::sum(model.forward(x, {})).item(); };
  for (int i = 0; i < 50; ++i) forward_and_drop();
  const std::int64_t heap0 = live_heap_bytes();
  for (int i = 0; i < 1000; ++i) forward_and_drop();
  const std::int64_t heap1 = live_heap_bytes();
  BOOST_TEST_MESSAGE(fmt::format("1000 forwards: live heap {} -> {} bytes", heap0, heap1));
  BOOST_TEST(heap1 - heap0 < kMaxHeapGrowth);
}

BOOST_AUTO_TEST_CASE(the_graph_of_a_step_dies_with_its_loss) {
  ag::Generator gen(3);
  Model model(8, 2, 3, gen);
  const Tensor x = ag::randn({2, 5, 8}, Dtype::Float32, gen);
  std::weak_ptr<ag::Node> graph;
  {
    Tensor loss = ag::sum(model.forward(x, {}));
    graph = loss.grad_fn();
    BOOST_TEST(!graph.expired());
    loss.backward({.retain_graph = true});  // even a retained graph goes with its last tensor
  }
  BOOST_TEST(graph.expired());
}

// Negative control: the measurement sees memory that is kept.
BOOST_AUTO_TEST_CASE(the_heap_measure_sees_a_leak) {
  ag::release_cached_buffers();  // else the kept tensors reuse buffers earlier cases freed
  const std::int64_t heap0 = live_heap_bytes();
  std::vector<Tensor> kept;
  for (int i = 0; i < 100; ++i) kept.push_back(ag::zeros({256}));  // 100 KiB of float32
  const std::int64_t heap1 = live_heap_bytes();
  BOOST_TEST(heap1 - heap0 >= 100 * 256 * 4);
  BOOST_TEST(heap1 - heap0 > kMaxHeapGrowth);
}
