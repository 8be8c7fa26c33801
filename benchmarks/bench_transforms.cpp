// A Jacobian-vector product through nn::MultiHeadAttention against a plain forward, at the
// benchmark shapes (toy and medium by default), float32, self-attention, need_weights = false.
//
//   forward:  out = attention(x)                       (under NoGradGuard: no graph)
//   jvp:      ag::jvp(x -> attention(x), {x}, {v})     (out and J·v with respect to the input x;
//             the double-vjp construction: one forward, a backward that builds a graph
//             (create_graph), and a backward of that)
// Samples of the two alternate, so that the machine's load hits both alike; medians.
//
//   bench_transforms                      toy and medium at 1 thread, as a table
//   bench_transforms --shapes toy --threads 1,2 --samples 21
//   bench_transforms --tsv                machine-readable lines (transforms_torch.py reads them):
//       ours <shape> <threads> <median s forward> <median s jvp> <forward samples> <jvp samples>
//            <median CPU s forward> <median CPU s jvp> <CPU samples forward> <CPU samples jvp>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fmt/format.h>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

#include "bench_common.hpp"

namespace {

namespace ag = autograd;

struct JvpBench {
  nn::MultiHeadAttention mha;
  ag::Tensor x, v;
  nn::AttentionOptions options;

  explicit JvpBench(const bench::AttentionShape& s)
      : mha(nn::MultiHeadAttentionOptions{.embed_dim = s.E, .num_heads = s.H}) {
    ag::Generator gen(42);
    x = ag::randn({s.B, s.T, s.E}, ag::Dtype::Float32, gen);
    v = ag::randn({s.B, s.T, s.E}, ag::Dtype::Float32, gen);
    options.need_weights = false;
    options.is_causal = s.causal;
  }

  ag::TensorList attention(const ag::TensorList& in) { return {mha.forward(in[0], options).output}; }

  void forward() {
    ag::NoGradGuard no_grad;
    if (attention({x})[0].numel() != x.numel()) std::abort();
  }

  void jvp() {
    const ag::JvpResult r = ag::jvp([this](const ag::TensorList& in) { return attention(in); }, {x}, {v});
    if (r.tangents.size() != 1) std::abort();
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("A Jacobian-vector product through nn::MultiHeadAttention against a plain forward.", "bench_transforms");
  bench::AttentionRunOptions run;
  run.shapes = {"toy", "medium"};
  run.threads = {1};
  bench::add_attention_run_options(app, run);
  CLI11_PARSE(app, argc, argv);
  if (!run.tsv) {
    fmt::print("nn::MultiHeadAttention, float32, self-attention, need_weights = false; ag::jvp with respect to the input\n");
    fmt::print("{:<22} {:>14} {:>14} {:>12} {:>14} {:>14} {:>12}\n", "", "wall forward", "wall jvp", "ratio",
               "CPU forward", "CPU jvp", "ratio");
    fmt::print("{:<14} {:>7}\n", "shape", "threads");
  }
  run.for_each_run([&](const bench::AttentionShape& s, int n) {
    JvpBench b(s);
    auto forward = [&] { b.forward(); };
    auto jvp = [&] { b.jvp(); };
    for (int i = 0; i < 3; ++i) forward(), jvp();  // warm up
    const int reps_fwd = bench::calibrate(forward, run.min_time), reps_jvp = bench::calibrate(jvp, run.min_time);
    std::vector<double> t_fwd, t_jvp, c_fwd, c_jvp;
    for (int i = 0; i < run.samples; ++i) {  // alternating
      t_fwd.push_back(bench::sample(forward, reps_fwd));
      t_jvp.push_back(bench::sample(jvp, reps_jvp));
    }
    for (int i = 0; i < run.samples; ++i) {
      c_fwd.push_back(bench::sample_cpu(forward, reps_fwd));
      c_jvp.push_back(bench::sample_cpu(jvp, reps_jvp));
    }
    const double m_fwd = bench::median(t_fwd), m_jvp = bench::median(t_jvp);
    const double cm_fwd = bench::median(c_fwd), cm_jvp = bench::median(c_jvp);
    if (run.tsv) {
      fmt::print("ours\t{}\t{}\t{:.9g}\t{:.9g}\t{:.9g}\t{:.9g}\t{:.9g}\t{:.9g}\t{:.9g}\t{:.9g}\n", s.name, n, m_fwd,
                 m_jvp, fmt::join(t_fwd, ","), fmt::join(t_jvp, ","), cm_fwd, cm_jvp, fmt::join(c_fwd, ","),
                 fmt::join(c_jvp, ","));
    } else {
      fmt::print("{:<14} {:>7} {:>11.1f} µs {:>11.1f} µs {:>11.2f}× {:>11.1f} µs {:>11.1f} µs {:>11.2f}×\n", s.name, n,
                 m_fwd * 1e6, m_jvp * 1e6, m_jvp / m_fwd, cm_fwd * 1e6, cm_jvp * 1e6, cm_jvp / cm_fwd);
    }
  });
  return 0;
}
