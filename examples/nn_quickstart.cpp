// A small model in nn, end to end: a Module subclass with registered children, self-attention,
// cross-entropy, AdamW, a gradcheck of the attention layer in float64, and a checkpoint that
// saves and resumes the model with its optimizer. The README's nn example is this program.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

namespace ag = autograd;

// Linear in-projection -> self-attention (with a residual) -> linear read-out.
struct TinyModel : nn::Module {
  TinyModel() : nn::Module("TinyModel") {}  // the name it prints as
  std::shared_ptr<nn::Linear> in = register_module("in", std::make_shared<nn::Linear>(5, 8));
  std::shared_ptr<nn::MultiHeadAttention> attn =
      register_module("attn", std::make_shared<nn::MultiHeadAttention>(8, 2));
  std::shared_ptr<nn::Linear> out = register_module("out", std::make_shared<nn::Linear>(8, 3));

  ag::Tensor forward(const ag::Tensor& x) {  // x: (B, T, 5) -> logits (B, T, 3)
    ag::Tensor h = (*in)(x);
    return (*out)(h + attn->forward(h));  // forward(x): self-attention, output alone; (*attn)(q, k, v): {output, weights}
  }
};

int main() {
  ag::manual_seed(0);
  TinyModel model;
  nn::AdamW opt(model.named_parameters(), {.lr = 1e-2});  // named: messages name the parameter
  const ag::Tensor x = ag::randn({2, 4, 5});
  const std::vector<std::int64_t> targets = {0, 1, 2, 0, 1, 2, 0, 1};  // one class per (b, t)

  double first = 0, last = 0;
  for (int step = 0; step < 50; ++step) {
    opt.zero_grad();
    ag::Tensor loss = nn::cross_entropy(ag::reshape(model.forward(x), {8, 3}), targets);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item();
  }
  std::printf("%lld parameters; loss %.4f -> %.6f in 50 AdamW steps\n",
              static_cast<long long>(model.num_parameters()), first, last);
  if (!(last < first / 100)) return 1;

  // The attention layer's gradients against central differences, in float64.
  nn::MultiHeadAttention attn(4, 2);
  attn.to(ag::Dtype::Float64);
  const ag::Tensor q = ag::randn({1, 3, 4}, ag::Dtype::Float64).requires_grad_();
  const auto check = ag::gradcheck([&](const ag::TensorList& in) { return ag::sum(attn.forward(in[0])); }, {q});
  std::printf("%s\n", check.ok ? "gradcheck of the attention layer: ok" : "gradcheck FAILED");

  // Save, train on, resume: the resumed pair continues exactly like the original would.
  const char* path = "nn_quickstart.safetensors";
  nn::save_checkpoint(path, model, opt);
  TinyModel resumed;
  nn::AdamW resumed_opt(resumed.named_parameters(), {.lr = 1e-2});
  nn::load_checkpoint(path, resumed, resumed_opt);
  for (auto* m : {&model, &resumed}) {
    nn::AdamW& o = m == &model ? opt : resumed_opt;
    o.zero_grad();
    nn::cross_entropy(ag::reshape(m->forward(x), {8, 3}), targets).backward();
    o.step();
  }
  const double diff = ag::max(ag::abs(model.out->weight() - resumed.out->weight())).item();
  std::printf("after one more step, original and resumed differ by %g\n", diff);
  std::remove(path);
  return check.ok && diff == 0 ? 0 : 1;
}
