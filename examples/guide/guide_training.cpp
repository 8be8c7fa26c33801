// docs/guide.md, "Training": a small causal transformer (embeddings, one pre-LayerNorm block,
// a final LayerNorm, a linear read-out) trained with AdamW, a warmup-cosine schedule and gradient
// clipping on a toy task (at each position, the largest token so far), then evaluated; and the
// same run at 1 and 2 threads, which gives the same losses bit for bit.
// The guide shows this program's code and output; CI runs it.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

namespace ag = autograd;

constexpr std::int64_t V = 8, T = 8, B = 32;  // token values, sequence length, batch size

struct TinyGPT : nn::Module {
  std::shared_ptr<nn::Embedding> tok, pos;
  std::shared_ptr<nn::TransformerBlock> block;
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> head;

  TinyGPT(std::int64_t d_model, std::int64_t num_heads) : nn::Module("TinyGPT") {
    tok = register_module("tok", std::make_shared<nn::Embedding>(V, d_model));
    pos = register_module("pos", std::make_shared<nn::Embedding>(T, d_model));
    block = register_module("block", std::make_shared<nn::TransformerBlock>(nn::TransformerBlockOptions{
                                         .d_model = d_model, .num_heads = num_heads, .d_ff = 2 * d_model}));
    ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(d_model));
    head = register_module("head", std::make_shared<nn::Linear>(d_model, V));
  }
  // token ids (B, T), Int64 -> logits (B, T, V)
  ag::Tensor forward(const ag::Tensor& tokens) const {
    ag::Tensor h = (*tok)(tokens) + (*pos)(ag::arange(static_cast<double>(tokens.size(1)), ag::Dtype::Int64));
    h = block->forward(h, {.need_weights = false, .is_causal = true}).output;
    return (*head)((*ln_f)(h));
  }
};

// Random sequences and their targets: y_t = max(x_0, ..., x_t).
struct Batch {
  ag::Tensor tokens;   // (B, T) Int64 token ids
  ag::Tensor targets;  // (B, T) Int64 class indices
};

Batch make_batch(ag::Generator& gen) {
  std::vector<std::int64_t> x(B * T), y(B * T);
  Batch batch;
  for (std::int64_t b = 0; b < B; ++b) {
    std::int64_t running_max = 0;
    for (std::int64_t t = 0; t < T; ++t) {
      const auto token = static_cast<std::int64_t>(gen.uniform() * V);
      running_max = t == 0 ? token : std::max(running_max, token);
      x[b * T + t] = token;
      y[b * T + t] = running_max;
    }
  }
  batch.tokens = ag::tensor(x, {B, T});
  batch.targets = ag::tensor(y, {B, T});
  return batch;
}

std::vector<double> train(int threads, bool verbose) {
  ag::set_num_threads(threads);
  ag::manual_seed(0);  // the initialisation
  ag::Generator data(1);
  TinyGPT model(/*d_model=*/32, /*num_heads=*/2);
  const std::int64_t steps = 200;
  nn::AdamW opt(model.named_parameters(), {.lr = 3e-3, .weight_decay = 0.01});
  nn::LRScheduler schedule(opt, nn::warmup_cosine_lr(/*peak_lr=*/3e-3, /*warmup_steps=*/20, steps));
  std::vector<double> losses;
  model.train();
  for (std::int64_t step = 0; step < steps; ++step) {
    const Batch batch = make_batch(data);
    opt.zero_grad();
    ag::Tensor loss = nn::cross_entropy(model.forward(batch.tokens), batch.targets);  // (B, T, V) with (B, T)
    loss.backward();
    const double norm = nn::clip_grad_norm_(model.parameters(), /*max_norm=*/1.0);  // returns the norm before
    if (verbose && (step % 50 == 0 || step == steps - 1))
      fmt::print("step {:3}  loss {:.4f}  grad norm {:.3f}  lr {:.2e}\n", step, loss.item(), norm, opt.lr());
    opt.step();
    schedule.step();  // after opt.step(), as in PyTorch
    losses.push_back(loss.item());
  }

  model.eval();  // no dropout here, but eval() is where it would stop
  ag::NoGradGuard no_grad;
  const Batch test = make_batch(data);
  const ag::Tensor predicted = ag::argmax(model.forward(test.tokens), -1);  // (B, T) Int64
  const auto right = ag::sum(ag::eq(predicted, test.targets)).item<std::int64_t>();
  if (verbose) fmt::print("{} parameters, test accuracy {:.1f} %\n", model.num_parameters(), 100.0 * right / (B * T));
  return losses;
}

int main() {
  const std::vector<double> one = train(1, true);
  const std::vector<double> two = train(2, false);
  fmt::print("losses at 1 and 2 threads identical: {}\n", one == two);
  return one == two ? 0 : 1;
}
