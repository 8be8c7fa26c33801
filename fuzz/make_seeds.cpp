// Writes the fuzzer's seed corpus: valid files for the Target module of target_module.hpp (so the
// fuzzer starts from the success path), and a few near misses. Usage: make_seeds <dir>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

#include "target_module.hpp"

namespace ag = autograd;

namespace {

void write(const std::string& dir, const std::string& name, const std::string& bytes) {
  std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds <dir>\n");
    return 2;
  }
  const std::string dir = argv[1];
  fuzz::Target model(2, 0.5, 3.0);
  write(dir, "parameters.safetensors", nn::serialize_safetensors(model.named_parameters(), {{"note", "seed"}}));
  nn::Adam adam(model.parameters(), {.lr = 1e-2});
  ag::sum(model.layer->forward(ag::ones({2, 3}))).backward();
  ag::sum(model.scale * 3.0).backward();
  adam.step();
  const std::string ckpt = dir + "/checkpoint.safetensors";
  nn::save_checkpoint(ckpt, model, adam, {{"step", "1"}});
  auto wrong_shape = model.named_parameters();
  wrong_shape[0].second = ag::zeros({4, 2});
  write(dir, "wrong_shape.safetensors", nn::serialize_safetensors(wrong_shape));
  write(dir, "empty_header.safetensors", nn::serialize_safetensors({}));
  write(dir, "f64.safetensors", nn::serialize_safetensors({{"layer.weight", ag::zeros({3, 2}, ag::Dtype::Float64)}}));
  return 0;
}
