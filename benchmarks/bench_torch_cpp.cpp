// headgrad against libtorch in one process: forward + backward of multi-head self-attention
// (float32, need_weights = false, loss = sum), ours and torch::nn::MultiheadAttention
// interleaved sample by sample, both sides set to the same thread count.
// Built only when CMake finds Torch (benchmarks/CMakeLists.txt); the libtorch side is in
// torch_mha_step.cpp.
//
//   bench_torch_cpp [--shapes a,b|all] [--threads 1,2] [--samples N] [--min-time S] [--tsv]
//   --tsv lines: libtorch <shape> <threads> <our median s> <libtorch median s> <libtorch / ours>
//
// libtorch's C++ module is sequence-first, (T, B, E); the causal shapes pass the (T, T) -inf
// mask, since its C++ forward has no is_causal flag.
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

#include "bench_common.hpp"
#include "torch_mha_step.hpp"

int main(int argc, char** argv) {
  CLI::App app("headgrad against libtorch's torch::nn::MultiheadAttention, interleaved in one process.",
               "bench_torch_cpp");
  bench::AttentionRunOptions run;
  bench::add_attention_run_options(app, run);
  CLI11_PARSE(app, argc, argv);
  if (!run.tsv)
    fmt::print("{:<14} {:>7} {:>12} {:>12} {:>14}\n", "shape", "threads", "headgrad", "libtorch", "libtorch/ours");
  run.for_each_run([&](const bench::AttentionShape& s, int n) {
    bench::TorchMhaStep::set_num_threads(n);
    bench::AttentionStep ours(s, nn::AttentionCore::Fused);
    bench::TorchMhaStep theirs(s.B, s.T, s.E, s.H, s.causal);
    for (int i = 0; i < 3; ++i) {
      ours();
      theirs();
    }
    const int reps_ours = bench::calibrate(ours, run.min_time), reps_theirs = bench::calibrate(theirs, run.min_time);
    std::vector<double> t_ours, t_theirs;
    for (int i = 0; i < run.samples; ++i) {  // interleaved: a load change hits both alike
      t_ours.push_back(bench::sample(ours, reps_ours));
      t_theirs.push_back(bench::sample(theirs, reps_theirs));
    }
    const double a = bench::median(t_ours), b = bench::median(t_theirs);
    if (run.tsv)
      fmt::print("libtorch\t{}\t{}\t{:.9g}\t{:.9g}\t{:.4g}\n", s.name, n, a, b, b / a);
    else
      fmt::print("{:<14} {:>7} {:>9.1f} µs {:>9.1f} µs {:>13.2f}x\n", s.name, n, a * 1e6, b * 1e6, b / a);
  });
  return 0;
}
