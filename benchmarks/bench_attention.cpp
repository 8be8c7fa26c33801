// One training step of nn::MultiHeadAttention — forward and backward of self-attention, float32,
// need_weights = false, loss = sum of the output — at the benchmark shapes, timed as medians.
//
//   bench_attention                      every shape at 1 and 2 threads, as a table
//   bench_attention --shapes toy,large --threads 1 --samples 21 --min-time 0.05
//   bench_attention --tsv                machine-readable lines (compare_torch.py reads them):
//       ours <shape> <threads> <median s/step> <GFLOP/s> <sample,sample,...> <median CPU s/step>
//   (* % of peak = FLOPs per CPU-second of the process over one core's FP32 peak)
//   bench_attention --core composed      the composed attention core instead of the fused one
//   bench_attention --peak               only the FP32 peak, measured per core for each vector ISA the
//                                        CPU runs, and the ISA the kernels are compiled for
//                                        (bench_common.hpp says how)
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fmt/format.h>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

#include "bench_common.hpp"

int main(int argc, char** argv) {
  CLI::App app("One training step of nn::MultiHeadAttention (forward + backward, float32), timed as medians.",
               "bench_attention");
  bench::AttentionRunOptions run;
  bench::add_attention_run_options(app, run);
  std::string core_name = "fused";
  app.add_option("--core", core_name, "attention core (default fused)")->check(CLI::IsMember({"fused", "composed"}));
  bool peak_only = false;
  app.add_flag("--peak", peak_only, "print only the FP32 peak estimate");
  CLI11_PARSE(app, argc, argv);
  const bool tsv = run.tsv;
  const bench::PeakEstimate peak = tsv && !peak_only ? bench::PeakEstimate{} : bench::estimate_fp32_peak();
  if (peak_only) {
    if (tsv) {
      fmt::print("peak\t{:.4g}\t{:.3g}\t{}\t{:.3f}\t{}\n", peak.gflops(), peak.flops_per_cycle, peak.isa, peak.ghz,
                 peak.kernels_isa);
      return 0;
    }
    fmt::print("kernels compiled for: {} (this build's flags)\n", peak.kernels_isa);
    fmt::print("clock: {:.2f} GHz (measured: dependent integer multiplies)\n", peak.ghz);
    for (const auto& m : peak.measured)
      fmt::print("FP32 peak per core, {:<8}: {:7.1f} GFLOP/s = {:5.1f} FLOP/cycle (14 independent FMA chains)\n",
                 m.isa, m.gflops, m.flops_per_cycle);
    if (peak.measured.empty()) fmt::print("FP32 peak: not measured (not an x86-64 build)\n");
    return 0;
  }
  const nn::AttentionCore core = core_name == "composed" ? nn::AttentionCore::Composed : nn::AttentionCore::Fused;

  if (!tsv) {
    fmt::print("nn::MultiHeadAttention forward + backward, float32, need_weights = false, {} core\n",
               core == nn::AttentionCore::Fused ? "fused" : "composed");
    fmt::print("kernels compiled for {}; FP32 peak per core ({}, measured): {:.1f} FLOP/cycle x {:.2f} GHz = "
               "{:.1f} GFLOP/s\n\n", peak.kernels_isa, peak.isa, peak.flops_per_cycle, peak.ghz, peak.gflops());
    fmt::print("{:<14} {:>7} {:>12} {:>10} {:>12}\n", "shape", "threads", "time/step", "GFLOP/s",
               "% of peak*");
  }
  run.for_each_run([&](const bench::AttentionShape& s, int n) {
    bench::AttentionStep step(s, core);
    for (int i = 0; i < 3; ++i) step();  // warm up: grads and caches exist
    const int reps = bench::calibrate(step, run.min_time);
    std::vector<double> times;
    for (int i = 0; i < run.samples; ++i) times.push_back(bench::sample(step, reps));
    const double med = bench::median(times);
    std::vector<double> cpu;
    for (int i = 0; i < std::max(3, run.samples / 2); ++i) cpu.push_back(bench::sample_cpu(step, reps));
    const double cpu_med = bench::median(cpu);
    const double gflops = bench::attention_flops(s) / med / 1e9;
    if (tsv) {
      fmt::print("ours\t{}\t{}\t{:.9g}\t{:.4g}\t{:.9g}\t{:.9g}\n", s.name, n, med, gflops, fmt::join(times, ","),
                 cpu_med);
    } else {
      // % of peak against the CPU time used (robust to other processes' load): FLOPs per
      // CPU-second over one core's peak.
      fmt::print("{:<14} {:>7} {:>9.1f} µs {:>10.2f} {:>11.1f}%\n", s.name, n, med * 1e6, gflops,
                 100.0 * bench::attention_flops(s) / cpu_med / 1e9 / peak.gflops());
    }
  });
  return 0;
}
