// The full Jacobian of a transformer's feed-forward residual block, (64 -> 64), in both modes:
//
//   block:    y = x + W2 · gelu(W1 · x + b1) + b2     x [64], W1 [256, 64], b1 [256],
//                                                      W2 [64, 256], b2 [64]; gelu exact by default
//   reverse:  ag::jacobian(block, {x}, {.mode = Reverse})   64 backwards (one per output element)
//                                                            through the graph of one forward
//   forward:  ag::jacobian(block, {x}, {.mode = Forward})   64 jvps (one per input element) through
//                                                            the graph of one backward with create_graph
// The Jacobian is with respect to x only; the weights are constants (they do not require grad).
// float32 and float64, the weights and x drawn once in float64 from seed 42 (W1 and W2 scaled by
// 1/√fan_in, the biases by 0.1) and rounded to float32 for the float32 row, so that both rows and
// PyTorch's side (jacobian_torch.py) see the same values. Samples of the two modes alternate, so
// that the machine's load hits both alike; wall-clock medians.
//
//   bench_jacobian                        float32 and float64 at 1 thread, as a table
//   bench_jacobian --dtypes float32 --threads 1,2 --samples 21 --gelu tanh
//   bench_jacobian --tsv                  machine-readable lines (jacobian_torch.py reads them):
//       ours <dtype> <threads> <median s reverse> <median s forward> <reverse samples> <forward samples>
//   bench_jacobian --save FILE            writes the block and our Jacobians to FILE and exits, as
//       raw little-endian float64, in this order: x [64], W1 [256·64], b1 [256], W2 [64·256],
//       b2 [64], then the four Jacobians [64·64] (row o, column k = dy_o/dx_k): float64 reverse,
//       float64 forward, float32 reverse, float32 forward (the float32 ones widened). Row-major.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <fmt/format.h>

#include <autograd/autograd.hpp>

#include "bench_common.hpp"

namespace {

namespace ag = autograd;

constexpr std::int64_t kDim = 64, kHidden = 256;

// The block's parameters and input in float64 (the values both dtypes and PyTorch share).
struct BlockData {
  ag::Tensor x, W1, b1, W2, b2;

  BlockData() {
    ag::Generator gen(42);
    x = ag::randn({kDim}, ag::Dtype::Float64, gen);
    W1 = ag::mul(ag::randn({kHidden, kDim}, ag::Dtype::Float64, gen), 1.0 / std::sqrt(double(kDim)));
    b1 = ag::mul(ag::randn({kHidden}, ag::Dtype::Float64, gen), 0.1);
    W2 = ag::mul(ag::randn({kDim, kHidden}, ag::Dtype::Float64, gen), 1.0 / std::sqrt(double(kHidden)));
    b2 = ag::mul(ag::randn({kDim}, ag::Dtype::Float64, gen), 0.1);
  }
};

struct JacobianBench {
  ag::Tensor x, W1t, b1, W2t, b2;  // W1t = W1ᵀ [64, 256], W2t = W2ᵀ [256, 64]: ag::linear's (in, out) layout
  ag::GeluApproximation approximate;

  JacobianBench(const BlockData& d, ag::Dtype dtype, ag::GeluApproximation a)
      : x(d.x.to(dtype)),
        W1t(ag::transpose(d.W1, 0, 1).to(dtype)),
        b1(d.b1.to(dtype)),
        W2t(ag::transpose(d.W2, 0, 1).to(dtype)),
        b2(d.b2.to(dtype)),
        approximate(a) {}

  ag::Tensor block(const ag::TensorList& in) const {
    const ag::Tensor& v = in[0];
    return ag::add(v, ag::linear(ag::gelu(ag::linear(v, W1t, b1), approximate), W2t, b2));
  }

  ag::Tensor jacobian(ag::JacobianMode mode) const {
    const ag::TensorList J = ag::jacobian([this](const ag::TensorList& in) { return block(in); }, {x}, {.mode = mode});
    if (J.size() != 1 || J[0].numel() != kDim * kDim) std::abort();
    return J[0];
  }
};

void append(std::vector<double>& out, const ag::Tensor& t) {
  const std::vector<double> v = t.to_vector();
  out.insert(out.end(), v.begin(), v.end());
}

// --save: see the header comment for the layout.
int save(const std::string& path, ag::GeluApproximation approximate) {
  const BlockData d;
  std::vector<double> out;
  for (const ag::Tensor* t : {&d.x, &d.W1, &d.b1, &d.W2, &d.b2}) append(out, *t);
  for (ag::Dtype dtype : {ag::Dtype::Float64, ag::Dtype::Float32}) {
    const JacobianBench b(d, dtype, approximate);
    append(out, b.jacobian(ag::JacobianMode::Reverse));
    append(out, b.jacobian(ag::JacobianMode::Forward));
  }
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f || std::fwrite(out.data(), sizeof(double), out.size(), f) != out.size() || std::fclose(f) != 0) {
    fmt::print(stderr, "bench_jacobian: cannot write {}\n", path);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("The full Jacobian of a (64 -> 64) MLP residual block, reverse and forward mode.", "bench_jacobian");
  std::vector<std::string> dtypes{"float32", "float64"};
  std::vector<int> threads{1};
  int samples = 11;
  double min_time = 0.03;
  bool tsv = false;
  std::string gelu = "none", save_path;
  app.add_option("--dtypes", dtypes, "comma-separated: float32, float64 (default both)")
      ->delimiter(',')->check(CLI::IsMember({"float32", "float64"}))->type_name("float32,float64");
  app.add_option("--threads", threads, "comma-separated thread counts (default 1)")
      ->delimiter(',')->check(CLI::Range(1, 1 << 16))->type_name("1,2");
  app.add_option("--samples", samples, "samples per measurement (default 11)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--min-time", min_time, "seconds per sample, at least one call (default 0.03)")
      ->check(CLI::PositiveNumber)->type_name("S");
  app.add_flag("--tsv", tsv, "machine-readable lines instead of a table");
  app.add_option("--gelu", gelu, "gelu: none (exact, default) or tanh (the tanh approximation)")
      ->check(CLI::IsMember({"none", "tanh"}));
  app.add_option("--save", save_path, "write x, the weights and our Jacobians to FILE (raw float64) and exit")
      ->type_name("FILE");
  CLI11_PARSE(app, argc, argv);
  const auto approximate = gelu == "tanh" ? ag::GeluApproximation::Tanh : ag::GeluApproximation::None;
  if (!save_path.empty()) return save(save_path, approximate);

  const BlockData data;
  if (!tsv) {
    fmt::print("y = x + W2·gelu(W1·x + b1) + b2, x [{}], hidden {}, gelu {} (none: exact, erf; tanh: the approximation); ag::jacobian with respect to x\n", kDim,
               kHidden, gelu);
    fmt::print("{:<10} {:>7} {:>14} {:>14} {:>16}\n", "dtype", "threads", "reverse", "forward", "forward/reverse");
  }
  for (int n : threads) {
    ag::set_num_threads(n);
    for (const std::string& name : dtypes) {
      const JacobianBench b(data, name == "float64" ? ag::Dtype::Float64 : ag::Dtype::Float32, approximate);
      auto rev = [&] { b.jacobian(ag::JacobianMode::Reverse); };
      auto fwd = [&] { b.jacobian(ag::JacobianMode::Forward); };
      for (int i = 0; i < 3; ++i) rev(), fwd();  // warm up
      const int reps_rev = bench::calibrate(rev, min_time), reps_fwd = bench::calibrate(fwd, min_time);
      std::vector<double> t_rev, t_fwd;
      for (int i = 0; i < samples; ++i) {  // alternating
        t_rev.push_back(bench::sample(rev, reps_rev));
        t_fwd.push_back(bench::sample(fwd, reps_fwd));
      }
      const double m_rev = bench::median(t_rev), m_fwd = bench::median(t_fwd);
      if (tsv) {
        fmt::print("ours\t{}\t{}\t{:.9g}\t{:.9g}\t{:.9g}\t{:.9g}\n", name, n, m_rev, m_fwd, fmt::join(t_rev, ","),
                   fmt::join(t_fwd, ","));
      } else {
        fmt::print("{:<10} {:>7} {:>11.1f} µs {:>11.1f} µs {:>15.2f}×\n", name, n, m_rev * 1e6, m_fwd * 1e6,
                   m_fwd / m_rev);
      }
      std::fflush(stdout);
    }
  }
  return 0;
}
