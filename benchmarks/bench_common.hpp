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
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

namespace bench {

// Self-attention of (B, T, embed_dim) with `heads` heads; causal = query i sees keys 0..i.
// group: "short" shapes are what `all` means (benchmarks/run.sh); the "long" shapes (T up to 16k,
// seconds per step) and the "memory" series (T = 1k..16k at one width, for the peak memory per
// step) run only when asked for, by group or by name.
struct AttentionShape {
  std::string name;
  std::int64_t B, T, E, H;
  bool causal = false;
  std::string group = "short";
  bool is_long() const { return group != "short"; }
};

inline std::vector<AttentionShape> attention_shapes() {
  return {{"seed", 1, 2, 4, 2},          {"tiny", 1, 8, 32, 4},
          {"toy", 8, 32, 64, 4},         {"medium", 16, 128, 128, 4},
          {"large", 8, 256, 384, 6},     {"medium-causal", 16, 128, 128, 4, true},
          {"large-causal", 8, 256, 384, 6, true},
          {"long-1k", 2, 1024, 256, 4, false, "long"},
          {"long-4k-causal", 1, 4096, 256, 4, true, "long"},
          {"long-8k-causal", 1, 8192, 256, 4, true, "long"},
          {"long-16k-causal", 1, 16384, 128, 2, true, "long"},
          {"mem-1k", 1, 1024, 256, 4, true, "memory"},
          {"mem-2k", 1, 2048, 256, 4, true, "memory"},
          {"mem-4k", 1, 4096, 256, 4, true, "memory"},
          {"mem-8k", 1, 8192, 256, 4, true, "memory"},
          {"mem-16k", 1, 16384, 256, 4, true, "memory"}};
}

// Multiply-adds (x2) of forward + backward, counted dense (a causal mask does not change the count):
//   forward:  4 projections 4·2·B·T·E²  +  Q·Kᵀ and P·V 2·2·B·T²·E
//   backward: two GEMMs for each forward GEMM (one per operand)  ->  2x the forward
//   total = 3 · (8·B·T·E² + 4·B·T²·E)
inline double attention_flops(const AttentionShape& s) {
  const double B = static_cast<double>(s.B), T = static_cast<double>(s.T), E = static_cast<double>(s.E);
  return 3.0 * (8.0 * B * T * E * E + 4.0 * B * T * T * E);
}

// The attention part alone: Q·Kᵀ and P·V forward (2·2·B·T²·E) and their four backward products
// (dP = dO·Vᵀ, dV = Pᵀ·dO, dQ = dS·K, dK = dSᵀ·Q), 12·B·T²·E in all; causal work is the
// T·(T+1)/2 query-key pairs on and below the diagonal instead of T², about half. (The
// projections and the softmax are not counted.)
inline double attention_core_flops(const AttentionShape& s) {
  const double B = static_cast<double>(s.B), T = static_cast<double>(s.T), E = static_cast<double>(s.E);
  const double pairs = s.causal ? T * (T + 1.0) / 2.0 : T * T;
  return 12.0 * B * pairs * E;
}

// One training step of nn::MultiHeadAttention on a shape, float32: a module (in training mode,
// with dropout p on the attention weights), an input that requires grad (as inside a network),
// and a call that zeroes the gradients, runs forward with need_weights = false, and backward
// from loss = sum of the output.
struct AttentionStep {
  nn::MultiHeadAttention mha;
  autograd::Tensor x;
  nn::AttentionOptions options;

  AttentionStep(const AttentionShape& s, nn::AttentionCore core, double dropout = 0.0)
      : mha(nn::MultiHeadAttentionOptions{.embed_dim = s.E, .num_heads = s.H, .dropout = dropout, .core = core}) {
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
// Measured, not looked up: the best rate of a loop of 14 independent chains of FMAs on the
// calling thread, in each vector width the CPU runs (AVX-512: zmm; AVX2: ymm). 14 chains cover
// the FMA latency on every current x86 core (4-5 cycles x 2 FMA pipes needs 8-10 in flight);
// fewer would measure the latency, not the throughput. The clock is measured too, as the best
// rate of a chain of dependent integer multiplies (3 cycles each on every Intel core since
// Nehalem and every AMD core since Zen): a VM does not report the clock the core actually runs
// at. (A chain of `add $1` is no clock: Golden Cove cores, Sapphire Rapids' among them, execute
// such adds at rename, several per cycle, so it read 22 GHz there.) FLOP/cycle = GFLOP/s / GHz,
// to set against the ISA's nominal 2 pipes x lanes x 2: 64 for AVX-512 (32 on Zen 4, whose
// 256-bit pipes take a 512-bit FMA in two halves), 32 for AVX2+FMA. Best of many short trials,
// so other processes do not lower it.
struct IsaPeak {
  std::string isa;
  double gflops = 0.0, flops_per_cycle = 0.0;
};

struct PeakEstimate {
  std::string kernels_isa = "generic";  // what this build's kernels are compiled for
  double ghz = 0.0;                      // measured clock
  std::vector<IsaPeak> measured;         // widest first
  double flops_per_cycle = 0.0;          // for the kernels' ISA (0: not measured)
  double peak_gflops = 0.0;
  std::string isa;                       // the ISA peak_gflops was measured with
  double gflops() const { return peak_gflops; }
};

// The CPU this runs on, from /proc/cpuinfo, so that every table names its machine: "AMD EPYC,
// family 26 model 2, avx512 (OPENBLAS_CORETYPE=Haswell)"; "unknown CPU" where there is none.
inline std::string cpu_description() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, name, family, model, isa = "no AVX2";
  auto value = [&] {  // what follows "key\t: "
    const std::size_t colon = line.find(':');
    return colon == std::string::npos || colon + 2 > line.size() ? std::string() : line.substr(colon + 2);
  };
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0 && name.empty()) name = value();
    else if (line.rfind("cpu family", 0) == 0 && family.empty()) family = value();
    else if (line.rfind("model\t", 0) == 0 && model.empty()) model = value();
    else if (line.rfind("flags", 0) == 0) {
      const std::string flags = " " + value() + " ";
      if (flags.find(" avx2 ") != std::string::npos) isa = "avx2";
      if (flags.find(" avx512f ") != std::string::npos) isa = "avx512";
      if (flags.find(" amx_tile ") != std::string::npos) isa += "+amx";
      break;  // the first processor's lines are enough
    }
  }
  if (name.empty()) return "unknown CPU";
  const char* core = std::getenv("OPENBLAS_CORETYPE");
  return name + ", family " + family + " model " + model + ", " + isa +
         (core != nullptr ? std::string(" (OPENBLAS_CORETYPE=") + core + ")" : std::string());
}

// The instruction set this program was compiled for (CMake's HEADGRAD_NATIVE builds the
// library and the benchmarks with the same flags).
inline std::string compiled_isa() {
#if defined(__AVX512F__)
  return "AVX-512";
#elif defined(__AVX2__) && defined(__FMA__)
  return "AVX2+FMA";
#elif defined(__AVX__)
  return "AVX";
#elif defined(__SSE2__)
  return "SSE2";
#else
  return "generic";
#endif
}

#if defined(__x86_64__) && defined(__GNUC__)
// 14 independent FMA chains in registers 2..15 (0 and 1 hold the factors, zero: FMA timing does
// not depend on the values, and zero stays zero), `iters` times. REG is "zmm" or "ymm".
#define HEADGRAD_FMA14(REG)                                                                          \
  "vfmadd231ps %%" REG "0, %%" REG "1, %%" REG "2\n\tvfmadd231ps %%" REG "0, %%" REG "1, %%" REG   \
  "3\n\tvfmadd231ps %%" REG "0, %%" REG "1, %%" REG "4\n\tvfmadd231ps %%" REG "0, %%" REG "1, %%"  \
  REG "5\n\tvfmadd231ps %%" REG "0, %%" REG "1, %%" REG "6\n\tvfmadd231ps %%" REG "0, %%" REG      \
  "1, %%" REG "7\n\tvfmadd231ps %%" REG "0, %%" REG "1, %%" REG "8\n\tvfmadd231ps %%" REG "0, %%"  \
  REG "1, %%" REG "9\n\tvfmadd231ps %%" REG "0, %%" REG "1, %%" REG "10\n\tvfmadd231ps %%" REG     \
  "0, %%" REG "1, %%" REG "11\n\tvfmadd231ps %%" REG "0, %%" REG "1, %%" REG "12\n\tvfmadd231ps %%" \
  REG "0, %%" REG "1, %%" REG "13\n\tvfmadd231ps %%" REG "0, %%" REG "1, %%" REG "14\n\tvfmadd231ps %%" \
  REG "0, %%" REG "1, %%" REG "15\n\t"
#define HEADGRAD_FMA_LOOP(REG)                                                                 \
  asm volatile("vpxor %%xmm0, %%xmm0, %%xmm0\n\tvpxor %%xmm1, %%xmm1, %%xmm1\n\t"              \
               "1:\n\t" HEADGRAD_FMA14(REG) "dec %0\n\tjnz 1b\n\tvzeroupper"                 \
               : "+r"(n)::"xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", \
                 "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "cc")

inline void fma_chains_zmm(std::uint64_t n) { HEADGRAD_FMA_LOOP("zmm"); }
inline void fma_chains_ymm(std::uint64_t n) { HEADGRAD_FMA_LOOP("ymm"); }
#undef HEADGRAD_FMA_LOOP
#undef HEADGRAD_FMA14

// Best GFLOP/s of `trials` runs of `iters` iterations of 14 FMAs of `lanes` floats.
inline double best_fma_gflops(void (*loop)(std::uint64_t), int lanes, int trials, std::uint64_t iters) {
  double best = 0.0;
  for (int t = 0; t < trials; ++t) {
    const auto t0 = Clock::now();
    loop(iters);
    best = std::max(best, 14.0 * 2.0 * lanes * static_cast<double>(iters) / seconds_since(t0) / 1e9);
  }
  return best;
}

// Best clock (GHz) of `trials` chains of 16·iters dependent imuls (3 cycles each).
inline double best_clock_ghz(int trials, std::uint64_t iters) {
  double best = 0.0;
  for (int t = 0; t < trials; ++t) {
    std::uint64_t x = 1, n = iters;
    const auto t0 = Clock::now();
    asm volatile(
        "1:\n\t"
        "imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0\n\t"
        "imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0\n\t"
        "imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0\n\t"
        "imul %0, %0\n\timul %0, %0\n\timul %0, %0\n\timul %0, %0\n\t"
        "dec %1\n\tjnz 1b"
        : "+r"(x), "+r"(n)::"cc");
    best = std::max(best, 16.0 * 3.0 * static_cast<double>(iters) / seconds_since(t0) / 1e9);
  }
  return best;
}
#endif

inline PeakEstimate estimate_fp32_peak() {
  PeakEstimate p;
  // The vector kernels chosen at run time (small products, gelu, softmax rows) say which ISA they
  // use; the rest of the build follows its compile flags.
  const std::string run_time(autograd::kernel_isa());
  p.kernels_isa = run_time == "avx512" ? "AVX-512" : run_time == "avx2" ? "AVX2+FMA" : compiled_isa();
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  constexpr int kTrials = 60;
  constexpr std::uint64_t kIters = 40000;  // ~1 ms per trial at ~3 GHz
  p.ghz = best_clock_ghz(kTrials, kIters);
  if (__builtin_cpu_supports("avx512f"))
    p.measured.push_back({"AVX-512", best_fma_gflops(&fma_chains_zmm, 16, kTrials, kIters / 2), 0.0});
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    p.measured.push_back({"AVX2+FMA", best_fma_gflops(&fma_chains_ymm, 8, kTrials, kIters), 0.0});
  p.ghz = std::max(p.ghz, best_clock_ghz(kTrials, kIters));  // again, after the FMA loops
  for (auto& m : p.measured) m.flops_per_cycle = p.ghz > 0 ? m.gflops / p.ghz : 0.0;
  // The kernels' ISA, or the widest measured one the build does not reach (a generic build's
  // kernels are held to the best the core can do).
  for (const auto& m : p.measured)
    if (m.isa == p.kernels_isa || p.isa.empty()) {
      p.isa = m.isa;
      p.peak_gflops = m.gflops;
      p.flops_per_cycle = m.flops_per_cycle;
    }
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

  // `all` is the short shapes; `long` and `memory` name their groups.
  bool wants(const AttentionShape& s) const {
    const auto asked = [&](const std::string& n) { return std::find(shapes.begin(), shapes.end(), n) != shapes.end(); };
    return asked(s.name) || asked(s.group) || (s.group == "short" && asked("all"));
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
  std::vector<std::string> names{"all", "long", "memory"};
  for (const auto& s : attention_shapes()) names.push_back(s.name);
  app.add_option("--shapes", o.shapes,
                 "comma-separated shapes or groups: all (default: the short shapes), long, memory")
      ->delimiter(',')->check(CLI::IsMember(names))->type_name("a,b|all|long|memory");
  app.add_option("--threads", o.threads, "comma-separated thread counts (default 1,2)")
      ->delimiter(',')->check(CLI::Range(1, 1 << 16))->type_name("1,2");
  app.add_option("--samples", o.samples, "samples per measurement (default 11)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--min-time", o.min_time, "seconds per sample, at least one call (default 0.03)")
      ->check(CLI::PositiveNumber)->type_name("S");
  app.add_flag("--tsv", o.tsv, "machine-readable lines instead of a table");
}

}  // namespace bench
