#pragma once
// char_gpt's data: a text corpus read from a file or a directory of files, its character
// vocabulary, the train/validation split and the seeded batch sampler.
//
// The corpus is UTF-8 text, decoded into Unicode code points (the characters). A directory is
// read as the concatenation of its regular files in byte order of their names, skipping the
// fortune index files (*.dat) and the *.u8 links Debian's `fortunes` package puts beside the
// texts, so /usr/share/games/fortunes gives the same corpus on every machine.
// benchmarks/char_gpt_torch.py reads it the same way.
#include <cstdint>
#include <string>
#include <vector>

#include <autograd/autograd.hpp>

namespace char_gpt {

namespace ag = autograd;

// Where the English fortune texts of Debian's `fortunes` package live.
inline constexpr const char* kDefaultCorpus = "/usr/share/games/fortunes";

// The files a path stands for: itself when it is a file, else a directory's files as above.
// Throws std::runtime_error naming the path when it does not exist or holds no text file.
std::vector<std::string> corpus_files(const std::string& path);

// The corpus as code points. Throws std::runtime_error naming the file and the byte offset of
// the first sequence that is not valid UTF-8, or when the corpus is empty.
std::u32string load_corpus(const std::string& path);

// UTF-8 to code points and back; decode_utf8 throws std::runtime_error naming `source` and the
// byte offset of an invalid sequence.
std::u32string decode_utf8(const std::string& bytes, const std::string& source = "<text>");
std::string encode_utf8(const std::u32string& text);

// The distinct characters of a text, sorted by code point (nanoGPT's vocabulary): token i is
// chars()[i].
class Vocabulary {
 public:
  Vocabulary() = default;
  explicit Vocabulary(const std::u32string& text);

  std::int64_t size() const { return static_cast<std::int64_t>(chars_.size()); }
  const std::u32string& chars() const { return chars_; }
  bool contains(char32_t c) const;
  // Throws std::invalid_argument naming the first character outside the vocabulary.
  std::vector<std::int32_t> encode(const std::u32string& text) const;
  std::u32string decode(const std::vector<std::int32_t>& tokens) const;  // tokens in [0, size())

 private:
  std::u32string chars_;
  std::vector<std::int32_t> index_;  // code point -> token, -1 when absent (up to the largest)
};

// The first 90 % of the tokens train, the rest validate (integer arithmetic: n * 9 / 10).
struct Split {
  std::vector<std::int32_t> train, val;
};
Split split_tokens(const std::vector<std::int32_t>& tokens);

// Batches of `batch` windows of `block` tokens: window b starts at i_b = next_u64() % (n - block)
// of a SplitMix64 generator (ag::Generator), x = tokens[i_b, i_b + block), y the same shifted by
// one. The generator's state is the sampler's whole state, so a checkpoint can carry it.
class BatchSampler {
 public:
  BatchSampler(std::int64_t batch, std::int64_t block, std::uint64_t seed);

  // Fills x and y, (batch, block) Float32 tensors holding token indices as values, in place:
  // a training loop reuses the same two tensors and allocates nothing. Throws
  // std::invalid_argument when the data is not longer than a window or the tensors are shaped
  // otherwise.
  void fill(const std::vector<std::int32_t>& data, ag::Tensor& x, ag::Tensor& y);
  // Two fresh tensors, filled.
  std::pair<ag::Tensor, ag::Tensor> next(const std::vector<std::int32_t>& data);

  std::uint64_t state() const { return gen_.state(); }
  void set_state(std::uint64_t state) { gen_.manual_seed(state); }
  std::int64_t batch() const { return batch_; }
  std::int64_t block() const { return block_; }

 private:
  std::int64_t batch_, block_;
  ag::Generator gen_;
};

}  // namespace char_gpt
