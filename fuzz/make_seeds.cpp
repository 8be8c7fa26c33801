// Writes the fuzzer's seed corpus: valid files for fuzz_checkpoint.cpp's Target module (so the
// fuzzer starts from the success path), and a few near misses. Usage: make_seeds <dir>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

namespace ag = autograd;

namespace {

struct Target : nn::Module {
  std::shared_ptr<nn::Linear> layer;
  ag::Tensor scale;
  Target() : nn::Module("Target") {
    ag::Generator gen(2);
    layer = register_module("layer", std::make_shared<nn::Linear>(nn::LinearOptions{3, 2}, gen));
    scale = register_parameter("scale", ag::tensor({0.5, 3.0}, {2}, ag::Dtype::Float64));
  }
};

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
  Target model;
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
