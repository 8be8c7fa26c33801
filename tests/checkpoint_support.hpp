#pragma once
// Helpers shared by the checkpoint tests: scratch directories, hand-made files, a small module
// with two dtypes, bit-for-bit snapshots, and the check that a bad file is refused cleanly.
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nn/nn.hpp>

namespace checkpoint_support {

namespace ag = autograd;
namespace fs = std::filesystem;

constexpr auto F32 = ag::Dtype::Float32;
constexpr auto F64 = ag::Dtype::Float64;

// A fresh directory per test case, removed afterwards.
struct TempDir {
  fs::path path;
  TempDir() {
    static int counter = 0;
    path = fs::temp_directory_path() / fmt::format("headgrad_ckpt_{}_{}", ::getpid(), counter++);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::size_t entries() const {
    return static_cast<std::size_t>(std::distance(fs::directory_iterator(path), fs::directory_iterator()));
  }
};

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file from a header text and data bytes (the length prefix computed).
inline std::string make_file(const std::string& header, const std::string& data) {
  std::string out;
  const std::uint64_t n = header.size();
  for (int b = 0; b < 8; ++b) out += static_cast<char>((n >> (8 * b)) & 0xFF);
  return out + header + data;
}

inline std::string f32_bytes(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// Two layers of different dtypes: "fc.weight" (2 x 3) and "fc.bias" (3) Float32, "scale" (2) Float64.
struct Tiny : nn::Module {
  std::shared_ptr<nn::Linear> fc;
  ag::Tensor scale;
  explicit Tiny(std::uint64_t seed) : Module("Tiny") {
    ag::Generator gen(seed);
    fc = register_module("fc", std::make_shared<nn::Linear>(nn::LinearOptions{2, 3, true, F32}, gen));
    scale = register_parameter("scale", ag::randn({2}, F64, gen));
  }
};

// Every parameter's values, bit for bit.
inline std::vector<std::vector<double>> snapshot(const nn::Module& m) {
  std::vector<std::vector<double>> out;
  for (const auto& p : m.parameters()) out.push_back(p.to_vector());
  return out;
}

inline bool same_bits(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size()) return false;
    if (std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(double)) != 0) return false;
  }
  return true;
}

// Loading `bytes` into a Tiny must throw CheckpointError mentioning `fragment` and leave the
// module exactly as it was.
inline void expect_rejected(const std::string& bytes, const std::string& fragment) {
  TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  write_bytes(path, bytes);
  Tiny model(1);
  const auto before = snapshot(model);
  try {
    nn::load_parameters(model, path);
    BOOST_ERROR("no error; expected one mentioning: " << fragment);
  } catch (const nn::CheckpointError& e) {
    const std::string what = e.what();
    BOOST_CHECK_MESSAGE(what.find(fragment) != std::string::npos, "message: " << what << "\nexpected: " << fragment);
    BOOST_CHECK_MESSAGE(what.find(path) != std::string::npos, "message does not name the file: " << what);
  }
  BOOST_CHECK(same_bits(snapshot(model), before));
}

// The bytes of a valid file for Tiny, with its header text, so that tests can corrupt either.
struct GoodFile {
  std::string header;
  std::string data;
};

inline GoodFile good_file() {
  Tiny source(99);
  const std::string bytes = nn::serialize_safetensors(source.named_parameters());
  std::uint64_t n = 0;
  for (int b = 7; b >= 0; --b) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(b)]);
  return {bytes.substr(8, n), bytes.substr(8 + n)};
}

inline std::string replace(std::string s, const std::string& from, const std::string& to) {
  const auto pos = s.find(from);
  BOOST_REQUIRE_MESSAGE(pos != std::string::npos, "'" << from << "' not in '" << s << "'");
  return s.replace(pos, from.size(), to);
}

}  // namespace checkpoint_support
