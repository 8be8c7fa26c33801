// docs/guide.md, "Checkpoints": a model's parameters alone (save_parameters / load_parameters,
// the file Python's safetensors reads), a training checkpoint with the optimizer and the caller's
// metadata that resumes bit for bit (save_checkpoint / load_checkpoint), loading into another
// dtype, and what a load that does not fit says.
// The guide shows this program's code and output; CI runs it.
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

namespace ag = autograd;

struct Net : nn::Module {
  std::shared_ptr<nn::Linear> fc_1, fc_2;
  explicit Net(std::int64_t hidden) : nn::Module("Net") {
    fc_1 = register_module("fc_1", std::make_shared<nn::Linear>(3, hidden));
    fc_2 = register_module("fc_2", std::make_shared<nn::Linear>(hidden, 2));
  }
  ag::Tensor forward(const ag::Tensor& x) const { return (*fc_2)(ag::relu((*fc_1)(x))); }
};

// One AdamW step on a fixed batch; returns the loss.
double train_step(Net& net, nn::Optimizer& opt, const ag::Tensor& x, const std::vector<std::int64_t>& y) {
  opt.zero_grad();
  ag::Tensor loss = nn::cross_entropy(net.forward(x), y);
  loss.backward();
  opt.step();
  return loss.item();
}

int main() {
  ag::manual_seed(0);
  const ag::Tensor x = ag::randn({6, 3});
  const std::vector<std::int64_t> y = {0, 1, 1, 0, 1, 0};

  Net net(8);
  nn::AdamW opt(net.named_parameters(), {.lr = 1e-2});
  for (int step = 0; step < 10; ++step) train_step(net, opt, x, y);

  // Parameters only, under their named_parameters() names.
  nn::save_parameters(net, "net.safetensors", {{"hidden", "8"}});
  Net restored(8);
  const nn::Metadata meta = nn::load_parameters(restored, "net.safetensors");
  fmt::print("loaded parameters, metadata hidden = {}; outputs equal: {}\n", meta.at("hidden"),
             ag::max(ag::abs(restored.forward(x) - net.forward(x))).item() == 0);

  // Into a Float64 model: convert_dtype says the conversion is wanted.
  Net wide(8);
  wide.to(ag::Dtype::Float64);
  nn::load_parameters(wide, "net.safetensors", {.convert_dtype = true});
  fmt::print("Float64 copy: {}\n", ag::dtype_name(wide.fc_1->weight().dtype()));

  // A training checkpoint: parameters, the optimizer's moments and step count, and our metadata.
  nn::save_checkpoint("run.safetensors", net, opt, {{"step", "10"}});
  Net resumed(8);
  nn::AdamW resumed_opt(resumed.named_parameters(), {.lr = 1e-2});
  const nn::Metadata run = nn::load_checkpoint("run.safetensors", resumed, resumed_opt);
  fmt::print("resumed at step {} (optimizer step count {})\n", run.at("step"), resumed_opt.step_count());
  double a = 0, b = 0;
  for (int step = 0; step < 5; ++step) {
    a = train_step(net, opt, x, y);
    b = train_step(resumed, resumed_opt, x, y);
  }
  fmt::print("5 steps later: loss {:.6f} and {:.6f}, bit for bit equal: {}\n", a, b, a == b);

  // A model that does not fit the file: nothing is loaded, and the error says why.
  Net other(16);
  try {
    nn::load_parameters(other, "net.safetensors");
  } catch (const nn::CheckpointError& e) {
    fmt::print("error: {}\n", e.what());
  }
  std::remove("net.safetensors");
  std::remove("run.safetensors");
  return a == b ? 0 : 1;
}
