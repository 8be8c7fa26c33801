// The thread default on a small model while another process loads the machine: a token
// embedding plus a position embedding, causal nn::MultiHeadAttention and an nn::Linear read-out,
// trained for 400 AdamW steps, once at the default thread count and once at 1 thread, in
// interleaved rounds (the order alternates), while a child process keeps `--load` cores busy.
// Prints each round, the medians and default / 1 thread (the goal: at most 1.5).
//
//   bench_threads                     5 rounds, 2 spinning threads in the child
//   bench_threads --rounds 9 --load 0 the same on the machine as it is (no child)
//   bench_threads --steps 100 --batch 32 --seq 32 --embed 64
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

#include "bench_common.hpp"

namespace ag = autograd;

namespace {

struct ModelShape {
  std::int64_t vocab = 16, seq = 16, batch = 16, embed = 32, heads = 4;
  std::int64_t steps = 400;
};

struct SmallModel : nn::Module {
  std::shared_ptr<nn::Embedding> tok, pos;
  std::shared_ptr<nn::MultiHeadAttention> attn;
  std::shared_ptr<nn::Linear> head;

  explicit SmallModel(const ModelShape& s) : nn::Module("SmallModel") {
    tok = register_module("tok", std::make_shared<nn::Embedding>(s.vocab, s.embed));
    pos = register_module("pos", std::make_shared<nn::Embedding>(s.seq, s.embed));
    attn = register_module("attn", std::make_shared<nn::MultiHeadAttention>(
                                       nn::MultiHeadAttentionOptions{.embed_dim = s.embed, .num_heads = s.heads}));
    head = register_module("head", std::make_shared<nn::Linear>(s.embed, s.vocab));
  }
  // tokens (B, T) -> logits (B, T, vocab)
  ag::Tensor forward(const ag::Tensor& tokens) const {
    ag::Tensor h = (*tok)(tokens) + (*pos)(ag::arange(static_cast<double>(tokens.size(1))));
    h = attn->forward(h, {.need_weights = false, .is_causal = true}).output;
    return (*head)(h);
  }
};

// Seconds for `steps` AdamW steps from a fixed seed (task: predict the previous token), and the
// final loss, at `threads` threads.
std::pair<double, double> train(const ModelShape& s, int threads) {
  ag::set_num_threads(threads);
  ag::manual_seed(0);
  ag::Generator data(1);
  SmallModel model(s);
  nn::AdamW opt(model.named_parameters(), {.lr = 3e-3, .weight_decay = 0.01});
  double loss_value = 0;
  const auto t0 = bench::Clock::now();
  for (std::int64_t step = 0; step < s.steps; ++step) {
    std::vector<double> x(static_cast<std::size_t>(s.batch * s.seq));
    std::vector<std::int64_t> y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      x[i] = static_cast<double>(static_cast<std::int64_t>(data.uniform() * static_cast<double>(s.vocab)));
      y[i] = i % static_cast<std::size_t>(s.seq) == 0 ? 0 : static_cast<std::int64_t>(x[i - 1]);
    }
    opt.zero_grad();
    ag::Tensor loss = nn::cross_entropy(model.forward(ag::tensor(x, {s.batch, s.seq})), y);
    loss.backward();
    opt.step();
    loss_value = loss.item();
  }
  return {bench::seconds_since(t0), loss_value};
}

// A child process that keeps `threads` threads spinning until it is killed (or this process
// dies). Started before this process runs any OpenMP code, so the fork copies no thread pool.
pid_t start_load(int threads) {
  if (threads <= 0) return 0;
  const pid_t pid = fork();
  if (pid != 0) return pid;  // the parent (or -1: no load)
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  std::atomic<std::uint64_t> sink{0};
  auto spin = [&sink] {
    std::uint64_t x = 0;
    for (;;) {
      for (int i = 0; i < 1 << 20; ++i) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      sink.fetch_add(x, std::memory_order_relaxed);
    }
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(spin);
  spin();
  _exit(0);  // not reached
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("A small model's 400 AdamW steps at the default thread count and at 1 thread, under load.",
               "bench_threads");
  ModelShape s;
  int rounds = 5;
  int load = static_cast<int>(std::thread::hardware_concurrency());
  app.add_option("--rounds", rounds, "interleaved rounds (default 5)")->check(CLI::Range(1, 1000));
  app.add_option("--load", load, "spinning threads in a child process (default: one per core; 0: none)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--steps", s.steps, "AdamW steps per run (default 400)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--batch", s.batch, "batch size (default 16)")->check(CLI::Range(1, 1 << 12));
  app.add_option("--seq", s.seq, "sequence length (default 16)")->check(CLI::Range(1, 1 << 12));
  app.add_option("--embed", s.embed, "embedding size (default 32)")->check(CLI::Range(1, 1 << 12));
  app.add_option("--heads", s.heads, "attention heads (default 4)")->check(CLI::Range(1, 1 << 10));
  CLI11_PARSE(app, argc, argv);

  const pid_t child = start_load(load);
  const int default_threads = ag::get_num_threads();  // before any set_num_threads
  fmt::print("model: vocab {}, B {} x T {}, embed {}, {} heads, causal; {} AdamW steps per run\n", s.vocab,
             s.batch, s.seq, s.embed, s.heads, s.steps);
  fmt::print("load: {} spinning thread(s) in a child process; default thread count {}\n\n",
             child > 0 ? load : 0, default_threads);
  fmt::print("{:>5} {:>14} {:>14} {:>7}\n", "round", "default (s)", "1 thread (s)", "ratio");
  train(s, 1);  // warm up: the allocator's pools and the thread team exist
  train(s, default_threads);
  std::vector<double> def, one;
  double loss_def = 0, loss_one = 0;
  for (int r = 0; r < rounds; ++r) {
    // Alternate which goes first, so a change in the machine's load does not favour one.
    std::pair<double, double> a, b;
    if (r % 2 == 0) {
      a = train(s, default_threads);
      b = train(s, 1);
    } else {
      b = train(s, 1);
      a = train(s, default_threads);
    }
    def.push_back(a.first);
    one.push_back(b.first);
    loss_def = a.second;
    loss_one = b.second;
    fmt::print("{:>5} {:>14.3f} {:>14.3f} {:>7.2f}\n", r, a.first, b.first, a.first / b.first);
    std::fflush(stdout);
  }
  if (child > 0) {
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
  }
  const double md = bench::median(def), m1 = bench::median(one);
  fmt::print("\nmedian: default {:.3f} s, 1 thread {:.3f} s, default / 1 thread = {:.2f} (goal <= 1.5)\n", md, m1,
             md / m1);
  const ag::ThreadPolicyStats st = ag::thread_policy_stats();
  fmt::print("parallel regions: {} run on the threads ({} slower than one thread), {} run alone instead\n",
             st.regions_run, st.regions_lost, st.regions_held);
  fmt::print("final losses identical at both thread counts: {}\n", loss_def == loss_one ? "yes" : "NO");
  return loss_def == loss_one ? 0 : 1;
}
