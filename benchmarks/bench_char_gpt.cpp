// Training steps per second of examples/char_gpt's model (one step: batch, forward, backward,
// clipping, AdamW), heap allocations per warm step and peak memory; benchmarks/char_gpt.sh runs
// it interleaved with benchmarks/char_gpt_torch.py's `bench` mode, which prints the same line.
//
//   bench_char_gpt [--n-layer 4 --n-head 4 --n-embd 128 --block-size 64 --batch-size 12]
//                  [--threads 1] [--warmup 5] [--steps 20] [--data PATH] [--trace-allocs]
//
// Prints one TSV line: implementation, threads, n_layer, n_embd, block_size, batch_size, median
// step time (ms), steps/s, peak RSS (MiB), RSS after the warm-up (MiB), median CPU time of a step
// (ms, all threads), training memory (MiB: peak RSS minus the RSS before the model was made, with
// the program and the corpus loaded), heap allocations per warm step, bytes allocated per warm step.
#include <execinfo.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "trainer.hpp"

namespace ag = autograd;

#include "counting_allocator.hpp"  // g_allocations, g_allocated_bytes, g_trace

namespace {

// CPU seconds of the whole process (all threads): steadier than wall time on a shared machine.
double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Peak resident memory of the process so far.
double rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

// Resident memory now (/proc/self/statm's second field, in pages).
double current_rss_mib() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long pages = 0, resident = 0;
  const int n = std::fscanf(f, "%lu %lu", &pages, &resident);
  std::fclose(f);
  return n == 2 ? static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0) : 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_char_gpt: training steps per second of char_gpt's model"};
  char_gpt::TrainConfig c;
  c.warmup_iters = 0;
  c.max_iters = 1000000;  // the schedule's length only
  std::string data = char_gpt::kDefaultCorpus;
  int threads = 1, warmup = 5, steps = 20;
  app.add_option("--n-layer", c.model.n_layer)->check(CLI::PositiveNumber);
  app.add_option("--n-head", c.model.n_head)->check(CLI::PositiveNumber);
  app.add_option("--n-embd", c.model.n_embd)->check(CLI::PositiveNumber);
  app.add_option("--block-size", c.model.block_size)->check(CLI::PositiveNumber);
  app.add_option("--batch-size", c.batch_size)->check(CLI::PositiveNumber);
  app.add_option("--data", data);
  app.add_flag_callback("--no-tie-weights", [&c] { c.model.tie_weights = false; }, "a head of its own");
  app.add_option("--threads", threads)->check(CLI::Range(1, 256));
  app.add_option("--warmup", warmup, "untimed steps first (default 5)")->check(CLI::NonNegativeNumber);
  app.add_option("--steps", steps, "timed steps (default 20)")->check(CLI::PositiveNumber);
  bool trace = false;
  app.add_flag("--trace-allocs", trace, "print the call stack of each allocation of one more warm step");
  CLI11_PARSE(app, argc, argv);
  try {
    ag::set_num_threads(threads);
    const std::u32string text = char_gpt::load_corpus(data);
    char_gpt::Vocabulary vocab(text);
    char_gpt::Split split = char_gpt::split_tokens(vocab.encode(text));
    const double rss_data = current_rss_mib();  // the program and the corpus, before the model
    char_gpt::Trainer trainer(c, vocab, std::move(split));
    for (int i = 0; i < warmup; ++i) trainer.train_step();
    const double rss_warm = rss_mib();
    std::vector<double> times, cpu;
    times.reserve(static_cast<std::size_t>(steps));
    cpu.reserve(static_cast<std::size_t>(steps));
    const std::uint64_t allocs_before = g_allocations.load(), bytes_before = g_allocated_bytes.load();
    for (int i = 0; i < steps; ++i) {
      const auto start = std::chrono::steady_clock::now();
      const double cpu_start = cpu_seconds();
      trainer.train_step();
      cpu.push_back(cpu_seconds() - cpu_start);
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    const double allocs = static_cast<double>(g_allocations.load() - allocs_before) / steps;
    const double bytes = static_cast<double>(g_allocated_bytes.load() - bytes_before) / steps;
    std::sort(times.begin(), times.end());
    std::sort(cpu.begin(), cpu.end());
    const double median = times[times.size() / 2];
    fmt::print("headgrad\t{}\t{}\t{}\t{}\t{}\t{:.3f}\t{:.3f}\t{:.1f}\t{:.1f}\t{:.3f}\t{:.1f}\t{:.1f}\t{:.0f}\n",
               threads, c.model.n_layer, c.model.n_embd, c.model.block_size, c.batch_size, median * 1e3, 1.0 / median,
               rss_mib(), rss_warm, cpu[cpu.size() / 2] * 1e3, rss_mib() - rss_data, allocs, bytes);
    if (trace) {
      g_trace = true;
      trainer.train_step();
      g_trace = false;
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_char_gpt: {}\n", e.what());
    return 1;
  }
  return 0;
}
