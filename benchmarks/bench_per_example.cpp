// Per-example gradients (nn::per_example_gradients) of the toy model at batch 64, against 64
// separate backwards, one thread by default, float32, medians of the samples.
//
//   bench_per_example                         the table
//   bench_per_example --samples 9 --threads 1 --batch 64
//   bench_per_example --tsv                   lines: <method> <batch> <threads> <median s>
//
// The toy model: bench_attention's toy shape (T = 32, E = 64, 4 heads) as a small language model,
// Embedding(16, 64) -> pre-LayerNorm TransformerBlock (d_ff 256, causal) -> LayerNorm ->
// Linear(64, 16), each example's loss its mean next-token cross entropy. The same model in
// PyTorch with torch.func's vmap(grad): benchmarks/per_example_torch.py.
// Methods:
//   fast            per_example_gradients, the default options (with its two checks)
//   fast-unchecked  per_example_gradients with verify = false (one forward, one backward)
//   backwards       one forward, then 64 backwards through it, the b-th seeded with e_b
//                   (PerExampleMethod::Fallback: "64 separate backwards")
//   alone           each example's forward and backward alone, 64 times (batch of one)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

#include "bench_common.hpp"

namespace {

namespace ag = autograd;

constexpr std::int64_t kVocab = 16, kT = 32, kE = 64, kH = 4, kFF = 256;

class ToyLM : public nn::Module {
 public:
  explicit ToyLM(ag::Generator& gen) : nn::Module("ToyLM") {
    embed_ = register_module("embed", std::make_shared<nn::Embedding>(nn::EmbeddingOptions{kVocab, kE}, gen));
    block_ = register_module("block", std::make_shared<nn::TransformerBlock>(
                                          nn::TransformerBlockOptions{.d_model = kE, .num_heads = kH, .d_ff = kFF}, gen));
    ln_ = register_module("ln_final", std::make_shared<nn::LayerNorm>(kE));
    unembed_ = register_module("unembed", std::make_shared<nn::Linear>(nn::LinearOptions{kE, kVocab}, gen));
  }
  ag::Tensor forward(const ag::Tensor& tokens) const {
    const ag::Tensor h = block_->forward(embed_->forward(tokens), {.need_weights = false, .is_causal = true}).output;
    return unembed_->forward(ln_->forward(h));  // (B, T, V)
  }

 private:
  std::shared_ptr<nn::Embedding> embed_;
  std::shared_ptr<nn::TransformerBlock> block_;
  std::shared_ptr<nn::LayerNorm> ln_;
  std::shared_ptr<nn::Linear> unembed_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"per-example gradients of the toy model against separate backwards"};
  int samples = 7, threads = 1;
  std::int64_t batch = 64;
  bool tsv = false;
  std::vector<std::string> only;
  app.add_option("--samples", samples, "timed calls per method (the median is reported)")->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "kernel threads")->check(CLI::Range(1, 256));
  app.add_option("--batch", batch, "examples per batch")->check(CLI::PositiveNumber);
  app.add_flag("--tsv", tsv, "machine-readable lines");
  app.add_option("--methods", only, "only these methods, comma-separated (fast, fast-unchecked, backwards, alone)")->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  ag::set_num_threads(threads);

  ag::Generator gen(1);
  ToyLM model(gen);
  std::vector<std::int64_t> tok, tgt;
  for (std::int64_t i = 0; i < batch * kT; ++i) {
    tok.push_back(static_cast<std::int64_t>(gen.next_u64() % kVocab));
    tgt.push_back(static_cast<std::int64_t>(gen.next_u64() % kVocab));
  }
  const ag::Tensor tokens = ag::tensor(tok, ag::Shape{batch, kT});
  const ag::Tensor targets = ag::tensor(tgt, ag::Shape{batch, kT});
  const auto losses = [&](const ag::Tensor& x) {
    const ag::Tensor ce = ag::cross_entropy(model.forward(x), ag::narrow(targets, 0, 0, x.size(0)),
                                            {.reduction = ag::Reduction::None});  // (B, T)
    return ag::mean(ce, 1);                                                      // (B)
  };
  ag::TensorList params;
  for (auto& [name, p] : model.named_parameters()) params.push_back(p);

  struct Method {
    std::string name;
    std::function<void()> run;
  };
  std::vector<Method> methods = {
      {"fast", [&] { (void)nn::per_example_gradients(model, tokens, losses); }},
      {"fast-unchecked", [&] { (void)nn::per_example_gradients(model, tokens, losses, {.verify = false}); }},
      {"backwards",
       [&] { (void)nn::per_example_gradients(model, tokens, losses, {.method = nn::PerExampleMethod::Fallback}); }},
      {"alone",
       [&] {
         for (std::int64_t b = 0; b < batch; ++b) {
           const ag::Tensor one = ag::narrow(tokens, 0, b, 1);
           const ag::Tensor ce = ag::cross_entropy(model.forward(one), ag::narrow(targets, 0, b, 1));
           (void)ag::grad({ce}, params);
         }
       }},
  };
  const auto first = nn::per_example_gradients(model, tokens, losses);
  if (!tsv) {
    fmt::print("toy model: B={}, T={}, E={}, {} heads, d_ff {}, vocab {}, {} parameters, float32, {} thread(s)\n",
               batch, kT, kE, kH, kFF, kVocab, model.num_parameters(), threads);
    fmt::print("fast path: {} parameters, fallback: {}\n", first.fast.size(), first.fallback.size());
    for (const auto& f : first.fallback) fmt::print("  fallback {}: {}\n", f.name, f.reason);
  }
  std::vector<double> t;
  for (auto& m : methods) {
    if (!only.empty() && std::find(only.begin(), only.end(), m.name) == only.end()) {
      t.push_back(0.0);
      continue;
    }
    m.run();  // warm-up
    t.push_back(bench::sample(m.run, samples));
  }
  for (std::size_t i = 0; i < methods.size(); ++i) {
    if (t[i] == 0.0) continue;
    if (tsv)
      fmt::print("{}\t{}\t{}\t{:.6f}\n", methods[i].name, batch, threads, t[i]);
    else
      fmt::print("{:<16} {:10.2f} ms   {}x faster than backwards, {}x than alone\n", methods[i].name, t[i] * 1e3,
                 t[2] > 0 ? fmt::format("{:6.1f}", t[2] / t[i]) : "  -", t[3] > 0 ? fmt::format("{:6.1f}", t[3] / t[i]) : "  -");
  }
  return 0;
}
