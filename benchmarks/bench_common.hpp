#pragma once
// Shared by the benchmark programs: the benchmark shapes, one training step of multi-head
// attention and its FLOP count, a timer that reports medians, the machine's FP32 peak, and the
// command-line options the attention benchmarks share.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

namespace bench {

// Self-attention of (B, T, embed_dim) with `heads` heads; causal = query i sees keys 0..i.
struct AttentionShape {
  std::string name;
  std::int64_t B, T, E, H;
  bool causal = false;
};

inline std::vector<AttentionShape> attention_shapes() {
  return {{"seed", 1, 2, 4, 2},          {"tiny", 1, 8, 32, 4},
          {"toy", 8, 32, 64, 4},         {"medium", 16, 128, 128, 4},
          {"large", 8, 256, 384, 6},     {"medium-causal", 16, 128, 128, 4, true},
          {"large-causal", 8, 256, 384, 6, true}};
}

// Multiply-adds (x2) of forward + backward, counted dense (a causal mask does not change the count):
//   forward:  4 projections 4·2·B·T·E²  +  Q·Kᵀ and P·V 2·2·B·T²·E
//   backward: two GEMMs for each forward GEMM (one per operand)  ->  2x the forward
//   total = 3 · (8·B·T·E² + 4·B·T²·E)
inline double attention_flops(const AttentionShape& s) {
  const double B = static_cast<double>(s.B), T = static_cast<double>(s.T), E = static_cast<double>(s.E);
  return 3.0 * (8.0 * B * T * E * E + 4.0 * B * T * T * E);
}

// One training step of nn::MultiHeadAttention on a shape, float32: a module, an input that
// requires grad (as inside a network), and a call that zeroes the gradients, runs forward with
// need_weights = false, and backward from loss = sum of the output.
struct AttentionStep {
  nn::MultiHeadAttention mha;
  autograd::Tensor x;
  nn::AttentionOptions options;

  AttentionStep(const AttentionShape& s, nn::AttentionCore core)
      : mha(nn::MultiHeadAttentionOptions{.embed_dim = s.E, .num_heads = s.H, .core = core}) {
    autograd::Generator gen(42);
    x = autograd::randn({s.B, s.T, s.E}, autograd::Dtype::Float32, gen).requires_grad_();
    options.need_weights = false;
    options.is_causal = s.causal;
  }

  void operator()() {
    mha.zero_grad();
    if (x.grad().defined()) x.grad().zero_();
    autograd::Tensor out = mha.forward(x, options).output;  // (B, T, E)
    autograd::sum(out).backward();
  }
};

using Clock = std::chrono::steady_clock;

// CPU seconds used by the whole process (all threads) so far.
inline double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// How many calls of f make one sample of at least `min_seconds` (at least 1).
template <class F>
int calibrate(F&& f, double min_seconds) {
  int reps = 1;
  for (;;) {
    const auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) f();
    const double t = seconds_since(t0);
    if (t >= min_seconds || reps >= (1 << 24)) {
      if (t <= 0) return reps;
      const double per_call = t / reps;
      return std::max(1, static_cast<int>(min_seconds / per_call + 0.5));
    }
    reps *= t < min_seconds / 16 ? 8 : 2;
  }
}

// One sample: `reps` calls, each timed alone; the median call time in seconds. On a loaded
// machine a call that the scheduler interrupted is an outlier that the median drops (a mean over
// the batch would charge it to the step).
template <class F>
double sample(F&& f, int reps) {
  std::vector<double> t(static_cast<std::size_t>(reps));
  for (auto& ti : t) {
    const auto t0 = Clock::now();
    f();
    ti = seconds_since(t0);
  }
  return median(std::move(t));
}

// One sample of process CPU seconds per call: `reps` calls, each measured alone, the median.
// CPU time does not count the time the scheduler gave to other processes, so on a loaded machine
// it is the steadier measure of how much work a step is (it does count time spent spinning at
// OpenMP barriers).
template <class F>
double sample_cpu(F&& f, int reps) {
  std::vector<double> t(static_cast<std::size_t>(reps));
  for (auto& ti : t) {
    const double c0 = process_cpu_seconds();
    f();
    ti = process_cpu_seconds() - c0;
  }
  return median(std::move(t));
}

// ---- FP32 peak of one core ----
// peak = (FP32 FLOP per cycle from the vector ISA) x (clock).
//   FLOP per cycle: 2 FMA pipes x lanes x 2 (multiply + add): AVX-512 64, AVX2+FMA 32 (Zen 2/3/4,
//   Haswell and later), AVX without FMA 16, SSE 8. Read from /proc/cpuinfo's flags.
//   Clock: measured, as the best rate of a chain of dependent integer adds (one cycle each on
//   every x86 core since the P6), so it is the clock the core actually runs at (turbo included),
//   which a VM does not report. Best of many short trials, so other processes do not lower it.
struct PeakEstimate {
  int flops_per_cycle = 8;
  std::string isa = "SSE";
  double ghz = 0.0;
  double gflops() const { return flops_per_cycle * ghz; }
};

inline PeakEstimate estimate_fp32_peak() {
  PeakEstimate p;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  std::vector<std::string> flags;
  while (std::getline(cpuinfo, line))
    if (line.rfind("flags", 0) == 0) {
      std::istringstream words(line.substr(line.find(':') + 1));
      for (std::string w; words >> w;) flags.push_back(w);
      break;
    }
  auto has = [&](std::string_view f) { return std::find(flags.begin(), flags.end(), f) != flags.end(); };
  if (has("avx512f")) {
    p.flops_per_cycle = 64;
    p.isa = "AVX-512";
  } else if (has("avx2") && has("fma")) {
    p.flops_per_cycle = 32;
    p.isa = "AVX2+FMA";
  } else if (has("avx")) {
    p.flops_per_cycle = 16;
    p.isa = "AVX";
  }
#if defined(__x86_64__)
  double best = 0.0;
  for (int trial = 0; trial < 200; ++trial) {
    std::uint64_t x = 0;
    constexpr std::uint64_t kIters = 200000;  // x 16 dependent adds = 3.2 M cycles (~1 ms)
    const auto t0 = Clock::now();
    for (std::uint64_t i = 0; i < kIters; ++i) {
      asm volatile(
          "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
          "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
          "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
          "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0"
          : "+r"(x));
    }
    const double t = seconds_since(t0);
    best = std::max(best, static_cast<double>(x) / t / 1e9);
  }
  p.ghz = best;
#endif
  return p;
}

// The options of bench_attention and bench_torch_cpp: which shapes, at which thread counts, how
// many samples of at least how long, and tab-separated output for compare_torch.py.
struct AttentionRunOptions {
  std::vector<std::string> shapes{"all"};
  std::vector<int> threads{1, 2};
  int samples = 11;
  double min_time = 0.03;
  bool tsv = false;

  bool wants(const AttentionShape& s) const {
    return std::find(shapes.begin(), shapes.end(), "all") != shapes.end() ||
           std::find(shapes.begin(), shapes.end(), s.name) != shapes.end();
  }

  // Calls measure(shape, threads) for every thread count asked for (set with
  // autograd::set_num_threads first) and every shape asked for, flushing stdout after each.
  template <class F>
  void for_each_run(F&& measure) const {
    for (int n : threads) {
      autograd::set_num_threads(n);
      for (const auto& s : attention_shapes()) {
        if (!wants(s)) continue;
        measure(s, n);
        std::fflush(stdout);
      }
    }
  }
};

inline void add_attention_run_options(CLI::App& app, AttentionRunOptions& o) {
  std::vector<std::string> names{"all"};
  for (const auto& s : attention_shapes()) names.push_back(s.name);
  app.add_option("--shapes", o.shapes, "comma-separated shapes, or all (default)")
      ->delimiter(',')->check(CLI::IsMember(names))->type_name("a,b|all");
  app.add_option("--threads", o.threads, "comma-separated thread counts (default 1,2)")
      ->delimiter(',')->check(CLI::Range(1, 1 << 16))->type_name("1,2");
  app.add_option("--samples", o.samples, "samples per measurement (default 11)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--min-time", o.min_time, "seconds per sample, at least one call (default 0.03)")
      ->check(CLI::PositiveNumber)->type_name("S");
  app.add_flag("--tsv", o.tsv, "machine-readable lines instead of a table");
}

}  // namespace bench
