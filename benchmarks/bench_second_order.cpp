// A Hessian-vector product through nn::MultiHeadAttention against one forward + backward, at the
// benchmark shapes (toy and medium by default), float32, self-attention, need_weights = false.
//
//   loss L = ½·Σ out²  (out = attention(x) of a fixed x that requires grad, as inside a network)
//   forward + backward:  L.backward()                             (fills every .grad)
//   HVP:                 H·v = d(∇L·v)/dθ over the parameters θ (ag::hvp: one forward, a
//                        backward that builds a graph (create_graph), and a backward of that)
// Samples of the two alternate, so that the machine's load hits both alike; medians.
//
//   bench_second_order                     toy and medium at 1 thread, as a table
//   bench_second_order --shapes toy --threads 1,2 --samples 21 --core composed
//   bench_second_order --tsv               machine-readable lines (second_order_torch.py reads them):
//       ours <shape> <threads> <median s fwd+bwd> <median s HVP> <fwd+bwd samples> <HVP samples>
//            <median CPU s fwd+bwd> <median CPU s HVP> <CPU samples fwd+bwd> <CPU samples HVP>
#include <cstdio>
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

struct SecondOrderBench {
  nn::MultiHeadAttention mha;
  ag::Tensor x;
  nn::AttentionOptions options;
  std::vector<ag::Tensor> params, v;

  SecondOrderBench(const bench::AttentionShape& s, nn::AttentionCore core)
      : mha(nn::MultiHeadAttentionOptions{.embed_dim = s.E, .num_heads = s.H, .core = core}) {
    ag::Generator gen(42);
    x = ag::randn({s.B, s.T, s.E}, ag::Dtype::Float32, gen).requires_grad_();
    options.need_weights = false;
    options.is_causal = s.causal;
    params = mha.parameters();
    for (const auto& p : params) v.push_back(ag::randn(p.shape(), ag::Dtype::Float32, gen));
  }

  ag::Tensor loss() {
    const ag::Tensor out = mha.forward(x, options).output;  // (B, T, E)
    return ag::sum(out * out) * 0.5;
  }

  void forward_backward() {
    mha.zero_grad();
    if (x.grad().defined()) x.grad().zero_();
    loss().backward();
  }

  void hvp() {
    const std::vector<ag::Tensor> hv = ag::hvp([this](const std::vector<ag::Tensor>&) { return loss(); }, params, v);
    if (hv.size() != params.size()) std::abort();
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("A Hessian-vector product through nn::MultiHeadAttention against one forward + backward.",
               "bench_second_order");
  bench::AttentionRunOptions run;
  run.shapes = {"toy", "medium"};
  run.threads = {1};
  bench::add_attention_run_options(app, run);
  std::string core_name = "fused";
  app.add_option("--core", core_name, "attention core (default fused)")->check(CLI::IsMember({"fused", "composed"}));
  CLI11_PARSE(app, argc, argv);
  const nn::AttentionCore core = core_name == "composed" ? nn::AttentionCore::Composed : nn::AttentionCore::Fused;
  if (!run.tsv) {
    fmt::print("nn::MultiHeadAttention, float32, self-attention, need_weights = false, {} core, loss ½·Σ out²\n",
               core_name);
    fmt::print("{:<22} {:>14} {:>14} {:>12} {:>14} {:>14} {:>12}\n", "", "wall fwd+bwd", "wall HVP", "ratio",
               "CPU fwd+bwd", "CPU HVP", "ratio");
    fmt::print("{:<14} {:>7}\n", "shape", "threads");
  }
  run.for_each_run([&](const bench::AttentionShape& s, int n) {
    SecondOrderBench b(s, core);
    auto step = [&] { b.forward_backward(); };
    auto hvp = [&] { b.hvp(); };
    for (int i = 0; i < 3; ++i) step(), hvp();  // warm up
    const int reps_step = bench::calibrate(step, run.min_time), reps_hvp = bench::calibrate(hvp, run.min_time);
    std::vector<double> t_step, t_hvp;
    for (int i = 0; i < run.samples; ++i) {  // alternating
      t_step.push_back(bench::sample(step, reps_step));
      t_hvp.push_back(bench::sample(hvp, reps_hvp));
    }
    // CPU seconds too: on a loaded machine a long call is interrupted more often than a short one,
    // which inflates the wall-time ratio; the process's CPU time counts only the work.
    std::vector<double> c_step, c_hvp;
    for (int i = 0; i < run.samples; ++i) {
      c_step.push_back(bench::sample_cpu(step, reps_step));
      c_hvp.push_back(bench::sample_cpu(hvp, reps_hvp));
    }
    const double m_step = bench::median(t_step), m_hvp = bench::median(t_hvp);
    const double cm_step = bench::median(c_step), cm_hvp = bench::median(c_hvp);
    if (run.tsv) {
      fmt::print("ours\t{}\t{}\t{:.9g}\t{:.9g}\t{:.9g}\t{:.9g}\t{:.9g}\t{:.9g}\t{:.9g}\t{:.9g}\n", s.name, n, m_step,
                 m_hvp, fmt::join(t_step, ","), fmt::join(t_hvp, ","), cm_step, cm_hvp, fmt::join(c_step, ","),
                 fmt::join(c_hvp, ","));
    } else {
      fmt::print("{:<14} {:>7} {:>11.1f} µs {:>11.1f} µs {:>11.2f}× {:>11.1f} µs {:>11.1f} µs {:>11.2f}×\n", s.name, n,
                 m_step * 1e6, m_hvp * 1e6, m_hvp / m_step, cm_step * 1e6, cm_hvp * 1e6, cm_hvp / cm_step);
    }
  });
  return 0;
}
