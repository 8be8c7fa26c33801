// libFuzzer target for the checkpoint reader (nn/checkpoint.hpp): any bytes must give either a
// clean load or an nn::CheckpointError — no crash, no hang, no sanitizer report, no partial load
// (a failed load leaves every parameter and the optimizer state bit-for-bit unchanged), and no
// loaded optimizer state that a run cannot produce (a NaN or infinite moment, a negative second moment).
//
// Each input is read three ways: parse_safetensors on the bytes, load_parameters into a small
// module, load_checkpoint into that module and an Adam optimizer (the files go through a memfd,
// not the disk). Build and run with fuzz/run.sh.
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <autograd/autograd.hpp>
#include <nn/nn.hpp>

#include "target_module.hpp"

namespace ag = autograd;

namespace {

// The module the seed corpus was written for, with values other than the seeds' (a load changes them).
fuzz::Target make_target() { return fuzz::Target(1, 1.5, -2.0); }

std::vector<std::vector<double>> snapshot(const nn::NamedTensors& tensors) {
  std::vector<std::vector<double>> out;
  for (const auto& [name, t] : tensors) out.push_back(t.to_vector());
  return out;
}

// Bit-for-bit comparison (NaN-safe).
bool same_bits(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size()) return false;
    if (!a[i].empty() && std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(double)) != 0) return false;
  }
  return true;
}

[[noreturn]] void violation(const char* what) {
  fmt::print(stderr, "fuzz_checkpoint: {}\n", what);
  std::abort();
}

// A file holding `bytes`, readable by path, in memory.
class MemFile {
 public:
  explicit MemFile(std::string_view bytes) : fd_(memfd_create("fuzz_checkpoint", 0)) {
    if (fd_ < 0) violation("memfd_create failed");
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = write(fd_, bytes.data() + done, bytes.size() - done);
      if (n <= 0) violation("write to memfd failed");
      done += static_cast<std::size_t>(n);
    }
  }
  ~MemFile() { close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  std::string path() const { return fmt::format("/proc/self/fd/{}", fd_); }

 private:
  int fd_;
};

void parse_only(std::string_view bytes) {
  try {
    const auto data = nn::parse_safetensors(bytes, "fuzz");
    for (const auto& [name, t] : data.tensors) (void)t.to_vector();  // touch every byte it claims
  } catch (const nn::CheckpointError&) {
  }
}

void load_parameters_all_or_nothing(std::string_view bytes, const std::string& path) {
  fuzz::Target model = make_target();
  const auto before = snapshot(model.named_parameters());
  try {
    nn::load_parameters(model, path);
  } catch (const nn::CheckpointError&) {
    if (!same_bits(before, snapshot(model.named_parameters()))) violation("a failed load_parameters changed a parameter");
    return;
  }
  // A load that succeeded loaded everything: each parameter now holds the file's values.
  const auto data = nn::parse_safetensors(bytes, "fuzz");
  for (const auto& [name, p] : model.named_parameters()) {
    bool found = false;
    for (const auto& [stored_name, t] : data.tensors) {
      if (stored_name != name) continue;
      found = true;
      if (!same_bits({t.to_vector()}, {p.to_vector()})) violation("a successful load_parameters left a parameter unloaded");
    }
    if (!found) violation("load_parameters succeeded without a tensor for every parameter");
  }
}

void load_checkpoint_all_or_nothing(const std::string& path) {
  fuzz::Target model = make_target();
  nn::Adam adam(model.parameters(), {.lr = 1e-3});
  // One step so that the optimizer has state to lose.
  ag::sum(model.layer->forward(ag::ones({1, 3})) * 2.0).backward();
  ag::sum(model.scale * model.scale).backward();
  adam.step();
  const auto params = snapshot(model.named_parameters());
  const auto state = snapshot(adam.state_dict());
  const auto steps = adam.step_count();
  try {
    nn::load_checkpoint(path, model, adam);
  } catch (const nn::CheckpointError&) {
    if (!same_bits(params, snapshot(model.named_parameters()))) violation("a failed load_checkpoint changed a parameter");
    if (!same_bits(state, snapshot(adam.state_dict())) || adam.step_count() != steps)
      violation("a failed load_checkpoint changed the optimizer");
    return;
  }
  // A load that succeeded holds only state a run can produce: finite moments, second moments >= 0.
  for (const auto& [name, t] : adam.state_dict()) {
    const bool second_moment = name.ends_with("exp_avg_sq");
    for (const double v : t.to_vector())
      if (!std::isfinite(v) || (second_moment && v < 0)) violation("load_checkpoint accepted impossible optimizer state");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  parse_only(bytes);
  const MemFile file(bytes);
  load_parameters_all_or_nothing(bytes, file.path());
  load_checkpoint_all_or_nothing(file.path());
  return 0;
}
