#include "corpus.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include <fmt/format.h>

namespace char_gpt {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("char_gpt: cannot read {}", path));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) throw std::runtime_error(fmt::format("char_gpt: error reading {}", path));
  return std::move(bytes).str();
}

}  // namespace

std::vector<std::string> corpus_files(const std::string& path) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::exists(status))
    throw std::runtime_error(fmt::format("char_gpt: no corpus at {} ({}); the default is the English texts of "
                                         "Debian's `fortunes` package (scripts/setup.sh installs it), or pass "
                                         "--data FILE",
                                         path, ec ? ec.message() : "no such file or directory"));
  if (!fs::is_directory(status)) return {path};
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(path)) {
    const std::string name = entry.path().filename().string();
    if (ends_with(name, ".dat") || ends_with(name, ".u8")) continue;  // fortune indexes and links
    if (!entry.is_regular_file() || entry.is_symlink()) continue;
    names.push_back(name);
  }
  if (names.empty()) throw std::runtime_error(fmt::format("char_gpt: directory {} holds no text file", path));
  std::sort(names.begin(), names.end());  // byte order: the same concatenation everywhere
  std::vector<std::string> files;
  for (const auto& n : names) files.push_back((fs::path(path) / n).string());
  return files;
}

std::u32string load_corpus(const std::string& path) {
  std::u32string text;
  for (const auto& file : corpus_files(path)) text += decode_utf8(read_file(file), file);
  if (text.empty()) throw std::runtime_error(fmt::format("char_gpt: the corpus at {} is empty", path));
  return text;
}

std::u32string decode_utf8(const std::string& bytes, const std::string& source) {
  std::u32string out;
  out.reserve(bytes.size());
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const std::size_t n = bytes.size();
  for (std::size_t i = 0; i < n;) {
    const unsigned char b = s[i];
    const int extra = b < 0x80 ? 0 : (b >> 5) == 0x6 ? 1 : (b >> 4) == 0xE ? 2 : (b >> 3) == 0x1E ? 3 : -1;
    char32_t c = extra == 0 ? b : extra == 1 ? (b & 0x1F) : extra == 2 ? (b & 0x0F) : (b & 0x07);
    bool ok = extra >= 0;
    for (int k = 1; ok && k <= extra; ++k) {
      if (i + static_cast<std::size_t>(k) >= n || (s[i + k] & 0xC0) != 0x80) ok = false;
      else c = (c << 6) | (s[i + k] & 0x3F);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8 either.
    static constexpr char32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (ok && (c < kMin[extra] || (c >= 0xD800 && c <= 0xDFFF) || c > 0x10FFFF)) ok = false;
    if (!ok)
      throw std::runtime_error(
          fmt::format("char_gpt: {} is not UTF-8 text: invalid byte sequence at byte {} (0x{:02x})", source, i, b));
    out.push_back(c);
    i += static_cast<std::size_t>(extra) + 1;
  }
  return out;
}

std::string encode_utf8(const std::u32string& text) {
  std::string out;
  for (char32_t c : text) {
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if (c < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (c >> 12)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (c >> 18)));
      out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

// ---- Vocabulary ----

Vocabulary::Vocabulary(const std::u32string& text) : chars_(text) {
  std::sort(chars_.begin(), chars_.end());
  chars_.erase(std::unique(chars_.begin(), chars_.end()), chars_.end());
  if (chars_.empty()) throw std::invalid_argument("Vocabulary: the text is empty");
  index_.assign(static_cast<std::size_t>(chars_.back()) + 1, -1);
  for (std::size_t i = 0; i < chars_.size(); ++i) index_[chars_[i]] = static_cast<std::int32_t>(i);
}

bool Vocabulary::contains(char32_t c) const { return c < index_.size() && index_[c] >= 0; }

std::vector<std::int32_t> Vocabulary::encode(const std::u32string& text) const {
  std::vector<std::int32_t> out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (!contains(text[i]))
      throw std::invalid_argument(fmt::format("Vocabulary::encode: character U+{:04X} at position {} is not in the "
                                              "vocabulary of {} characters",
                                              static_cast<std::uint32_t>(text[i]), i, chars_.size()));
    out.push_back(index_[text[i]]);
  }
  return out;
}

std::u32string Vocabulary::decode(const std::vector<std::int32_t>& tokens) const {
  std::u32string out;
  for (auto t : tokens) {
    if (t < 0 || t >= size())
      throw std::invalid_argument(fmt::format("Vocabulary::decode: token {} is outside [0, {})", t, size()));
    out.push_back(chars_[static_cast<std::size_t>(t)]);
  }
  return out;
}

Split split_tokens(const std::vector<std::int32_t>& tokens) {
  const auto n_train = static_cast<std::ptrdiff_t>(tokens.size() * 9 / 10);
  return {{tokens.begin(), tokens.begin() + n_train}, {tokens.begin() + n_train, tokens.end()}};
}

// ---- BatchSampler ----

BatchSampler::BatchSampler(std::int64_t batch, std::int64_t block, std::uint64_t seed)
    : batch_(batch), block_(block), gen_(seed) {
  if (batch <= 0 || block <= 0)
    throw std::invalid_argument(fmt::format("BatchSampler: batch and block must be positive, got {} and {}", batch,
                                            block));
}

void BatchSampler::fill(const std::vector<std::int32_t>& data, ag::Tensor& x, ag::Tensor& y) {
  const auto n = static_cast<std::int64_t>(data.size());
  if (n <= block_)
    throw std::invalid_argument(fmt::format("BatchSampler: the data has {} tokens, not more than the block of {}",
                                            n, block_));
  const ag::Shape want{batch_, block_};
  for (const ag::Tensor* t : {&x, &y})
    if (!t->defined() || t->shape() != want || t->dtype() != ag::Dtype::Float32)
      throw std::invalid_argument(fmt::format("BatchSampler: x and y must be Float32 tensors of shape {}",
                                              ag::shape_str(want)));
  float* xs = x.data<float>();
  float* ys = y.data<float>();
  const auto range = static_cast<std::uint64_t>(n - block_);
  for (std::int64_t b = 0; b < batch_; ++b) {
    const auto start = static_cast<std::size_t>(gen_.next_u64() % range);
    for (std::int64_t t = 0; t < block_; ++t) {
      xs[b * block_ + t] = static_cast<float>(data[start + static_cast<std::size_t>(t)]);
      ys[b * block_ + t] = static_cast<float>(data[start + static_cast<std::size_t>(t) + 1]);
    }
  }
  x.mark_modified();
  y.mark_modified();
}

std::pair<ag::Tensor, ag::Tensor> BatchSampler::next(const std::vector<std::int32_t>& data) {
  ag::Tensor x = ag::zeros({batch_, block_});
  ag::Tensor y = ag::zeros({batch_, block_});
  fill(data, x, y);
  return {x, y};
}

}  // namespace char_gpt
