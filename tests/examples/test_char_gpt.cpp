// examples/char_gpt's parts: the corpus reader (UTF-8, a directory's files in name order), the
// vocabulary, the batch sampler, the sampling distribution and the AdamW with decay groups.
#define BOOST_TEST_MODULE char_gpt
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nn/nn.hpp>

#include "corpus.hpp"
#include "gpt.hpp"
#include "optimizer.hpp"
#include "sample.hpp"
#include "test_support.hpp"

using namespace test_support::prelude;
using namespace char_gpt;
namespace fs = std::filesystem;

namespace {

// A scratch directory, removed at the end of the test.
struct ScratchDir {
  fs::path path;
  explicit ScratchDir(const std::string& name) : path(fs::temp_directory_path() / ("char_gpt_test_" + name)) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScratchDir() { fs::remove_all(path); }
  void write(const std::string& name, const std::string& bytes) const {
    std::ofstream(path / name, std::ios::binary) << bytes;
  }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(corpus)

BOOST_AUTO_TEST_CASE(utf8_round_trips_and_decodes_to_code_points) {
  const std::string text = "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80z";  // a é € 😀 z
  const std::u32string cps = decode_utf8(text);
  BOOST_TEST((cps == std::u32string{U'a', 0xE9, 0x20AC, 0x1F600, U'z'}));
  BOOST_TEST(encode_utf8(cps) == text);
}

BOOST_AUTO_TEST_CASE(invalid_utf8_is_refused_naming_the_source_and_byte) {
  const std::pair<std::string, std::string> cases[] = {
      {"ab\x80", "byte 2"},            // a lone continuation byte
      {"abc\xc0\x80", "byte 3"},       // overlong NUL
      {"\xed\xa0\x80", "byte 0"},      // a surrogate
      {"x\xe2\x82", "byte 1"},         // cut short
      {"\xf4\x90\x80\x80", "byte 0"},  // past U+10FFFF
      {"\xff", "byte 0"}};
  for (const auto& c : cases)
    check_throws<std::runtime_error>([&] { decode_utf8(c.first, "notes.txt"); }, {"notes.txt", "not UTF-8", c.second});
}

BOOST_AUTO_TEST_CASE(a_directory_is_its_text_files_in_name_order_without_fortune_indexes) {
  ScratchDir dir("files");
  dir.write("b", "second\n");
  dir.write("a", "first\n");
  dir.write("a.dat", "\x01\x02index");
  fs::create_symlink(dir.path / "b", dir.path / "b.u8");
  fs::create_symlink(dir.path / "a", dir.path / "link");  // links are not read twice
  fs::create_directories(dir.path / "sub");
  const auto files = corpus_files(dir.path.string());
  BOOST_REQUIRE_EQUAL(files.size(), 2u);
  BOOST_TEST(fs::path(files[0]).filename() == "a");
  BOOST_TEST(fs::path(files[1]).filename() == "b");
  BOOST_TEST((load_corpus(dir.path.string()) == U"first\nsecond\n"));
  BOOST_TEST((load_corpus((dir.path / "b").string()) == U"second\n"));  // a file is itself
}

BOOST_AUTO_TEST_CASE(a_missing_or_empty_corpus_is_an_error_naming_it) {
  ScratchDir dir("empty");
  check_throws<std::runtime_error>([&] { corpus_files((dir.path / "nope").string()); }, {"no corpus at", "nope",
                                                                                         "fortunes"});
  check_throws<std::runtime_error>([&] { corpus_files(dir.path.string()); }, {"holds no text file"});
  dir.write("empty.txt", "");
  check_throws<std::runtime_error>([&] { load_corpus(dir.path.string()); }, {"is empty"});
}

BOOST_AUTO_TEST_CASE(the_committed_test_text_reads_as_ascii) {
  const std::u32string text = load_corpus(HEADGRAD_TEST_DATA_DIR "/char_gpt/public_domain.txt");
  BOOST_TEST(text.size() > 3000u);
  for (char32_t c : text) BOOST_TEST((c < 128), "U+" << static_cast<unsigned>(c));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(vocabulary)

BOOST_AUTO_TEST_CASE(sorted_distinct_characters_encode_and_decode) {
  const Vocabulary v(U"hello, world");
  BOOST_TEST((v.chars() == U" ,dehlorw"));
  const auto tokens = v.encode(U"hold");
  BOOST_TEST((tokens == std::vector<std::int32_t>{4, 6, 5, 2}));
  BOOST_TEST((v.decode(tokens) == U"hold"));
  check_message([&] { v.encode(U"ho z"); }, "U+007A at position 3");
  check_message([&] { v.decode({0, 9}); }, "token 9 is outside [0, 9)");
}

BOOST_AUTO_TEST_CASE(the_split_is_the_first_ninety_percent) {
  std::vector<std::int32_t> tokens(25);
  for (int i = 0; i < 25; ++i) tokens[static_cast<std::size_t>(i)] = i;
  const Split s = split_tokens(tokens);
  BOOST_REQUIRE_EQUAL(s.train.size(), 22u);  // 25 * 9 / 10
  BOOST_TEST(s.train.back() == 21);
  BOOST_TEST(s.val.front() == 22);
  BOOST_TEST(s.val.size() == 3u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(batches)

BOOST_AUTO_TEST_CASE(windows_start_where_the_splitmix_generator_says) {
  std::vector<std::int32_t> data(100);
  for (int i = 0; i < 100; ++i) data[static_cast<std::size_t>(i)] = i;
  BatchSampler sampler(3, 5, 42);
  ag::Generator reference(42);  // the second route: the same draws by hand
  for (int round = 0; round < 4; ++round) {
    auto [x, y] = sampler.next(data);
    const auto xs = x.to_vector(), ys = y.to_vector();
    for (int b = 0; b < 3; ++b) {
      const auto start = static_cast<double>(reference.next_u64() % 95);
      for (int t = 0; t < 5; ++t) {
        BOOST_TEST(xs[static_cast<std::size_t>(b * 5 + t)] == start + t);
        BOOST_TEST(ys[static_cast<std::size_t>(b * 5 + t)] == start + t + 1);  // the next token
      }
    }
  }
  BOOST_TEST(sampler.state() == reference.state());
}

BOOST_AUTO_TEST_CASE(the_state_restores_the_sequence) {
  std::vector<std::int32_t> data(50, 0);
  for (int i = 0; i < 50; ++i) data[static_cast<std::size_t>(i)] = (i * 7) % 13;
  BatchSampler a(2, 4, 9);
  a.next(data);
  const auto saved = a.state();
  const auto expected = a.next(data).first.to_vector();
  BatchSampler b(2, 4, 123);
  b.set_state(saved);
  BOOST_TEST(b.next(data).first.to_vector() == expected);
}

BOOST_AUTO_TEST_CASE(bad_data_or_tensors_are_refused) {
  BatchSampler s(2, 4, 1);
  const std::vector<std::int32_t> short_data(4, 0);
  check_message([&] { s.next(short_data); }, "the data has 4 tokens, not more than the block of 4");
  const std::vector<std::int32_t> data(10, 0);
  ag::Tensor x = ag::zeros({2, 3}), y = ag::zeros({2, 4});
  check_message([&] { s.fill(data, x, y); }, "Float32 tensors of shape [2, 4]");
  check_message([] { BatchSampler(0, 4, 1); }, "batch and block must be positive, got 0 and 4");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(sampling)

BOOST_AUTO_TEST_CASE(temperature_and_top_k_from_first_principles) {
  const std::vector<double> logits = {1.0, 3.0, 2.0, 3.0};
  // k = 3 at temperature 0.5: weights exp((l - 3) / 0.5) over {3, 2, 3}, index 0 dropped.
  const double e = std::exp(-2.0), z = 2.0 + e;
  const auto p = next_token_probabilities(logits, 0.5, 3);
  const std::vector<double> want = {0.0, 1.0 / z, e / z, 1.0 / z};
  for (std::size_t i = 0; i < 4; ++i) BOOST_TEST(std::abs(p[i] - want[i]) < 1e-15, i << ": " << p[i]);
  // k = 1 keeps every logit tied with the largest (nanoGPT's `logits < v[-1]` rule).
  const auto top1 = next_token_probabilities(logits, 1.0, 1);
  BOOST_TEST((top1 == std::vector<double>{0.0, 0.5, 0.0, 0.5}));
  // k above the vocabulary keeps all: the plain softmax at temperature 1.
  const auto all = next_token_probabilities(logits, 1.0, 100);
  double s = 0;
  for (double l : logits) s += std::exp(l);
  for (std::size_t i = 0; i < 4; ++i) BOOST_TEST(std::abs(all[i] - std::exp(logits[i]) / s) < 1e-15);
}

BOOST_AUTO_TEST_CASE(bad_settings_are_refused) {
  check_message([] { SampleOptions{.temperature = 0}.check(); }, "temperature must be positive");
  check_message([] { SampleOptions{.top_k = 0}.check(); }, "top_k must be >= 1, got 0");
  check_message([] { SampleOptions{.max_new_tokens = -1}.check(); }, "max_new_tokens must be >= 0");
  ag::Generator gen(1);
  Gpt model(GptConfig{.vocab_size = 4, .block_size = 4, .n_layer = 1, .n_head = 1, .n_embd = 4}, gen);
  check_message([&] { generate(model, {}, {}); }, "the context is empty");
  check_message([&] { generate(model, {1, 4}, {}); }, "token 4 is outside [0, 4)");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(model_and_optimizer)

BOOST_AUTO_TEST_CASE(bad_configurations_are_refused_naming_the_setting) {
  check_message([] { GptConfig{.vocab_size = 4, .n_head = 3, .n_embd = 8}.check(); },
                "n_embd 8 is not a multiple of n_head 3");
  check_message([] { GptConfig{.vocab_size = 0}.check(); }, "vocab_size must be positive, got 0");
  check_message([] { GptConfig{.vocab_size = 4, .dropout = 1.0}.check(); }, "dropout must be in [0, 1), got 1");
  ag::Generator gen(1);
  Gpt model(GptConfig{.vocab_size = 4, .block_size = 3, .n_layer = 1, .n_head = 1, .n_embd = 4}, gen);
  check_message([&] { model.forward(ag::zeros({1, 4})); }, "sequence length 4 is outside [1, block_size 3]");
  check_message([&] { model.forward(ag::zeros({4})); }, "tokens must be (B, T), got [4]");
}

BOOST_AUTO_TEST_CASE(parameters_are_named_and_initialised_as_nanogpt) {
  ag::Generator gen(3);
  const GptConfig c{.vocab_size = 50, .block_size = 32, .n_layer = 3, .n_head = 2, .n_embd = 64};
  Gpt model(c, gen);
  const auto named = model.named_parameters();
  BOOST_TEST(named.front().first == "wte.weight");  // the head is tied: no lm_head.weight
  for (const auto& [name, p] : named) BOOST_TEST(name != "lm_head.weight");
  auto stddev = [](const ag::Tensor& t) {
    const auto v = t.to_vector();
    double s = 0;
    for (double x : v) s += x * x;
    return std::sqrt(s / static_cast<double>(v.size()));
  };
  BOOST_TEST(std::abs(stddev(model.parameter("wte.weight")) - 0.02) < 0.002);
  BOOST_TEST(std::abs(stddev(model.parameter("h.1.fc_1.weight")) - 0.02) < 0.001);
  const double residual = 0.02 / std::sqrt(6.0);  // 0.02 / sqrt(2 n_layer)
  BOOST_TEST(std::abs(stddev(model.parameter("h.2.attn.W_O")) - residual) < 0.001);
  BOOST_TEST(std::abs(stddev(model.parameter("h.0.fc_2.weight")) - residual) < 0.0005);
  BOOST_TEST(model.parameter("ln_f.weight").to_vector() == std::vector<double>(64, 1.0));
  const auto mask = decay_mask(named);
  for (std::size_t i = 0; i < named.size(); ++i) BOOST_TEST(mask[i] == (named[i].second.dim() >= 2), named[i].first);
}

// GroupedAdamW with every flag set is nn::AdamW, and with none nn::AdamW without decay, bit for bit.
BOOST_AUTO_TEST_CASE(grouped_adamw_is_nn_adamw_on_each_group) {
  auto run = [](bool grouped, bool decay) {
    ag::Generator gen(5);
    std::vector<Tensor> params = {ag::randn({4, 3}, Dtype::Float32, gen).requires_grad_(),
                                  ag::randn({7}, Dtype::Float32, gen).requires_grad_()};
    const double wd = 0.1;
    std::unique_ptr<nn::Optimizer> opt;
    if (grouped)
      opt = std::make_unique<GroupedAdamW>(params, std::vector<bool>{decay, decay},
                                           GroupedAdamWOptions{.lr = 1e-2, .beta2 = 0.99, .weight_decay = wd});
    else
      opt = std::make_unique<nn::AdamW>(params, nn::AdamWOptions{.lr = 1e-2, .beta2 = 0.99,
                                                                 .weight_decay = decay ? wd : 0.0});
    for (int step = 0; step < 6; ++step) {
      for (auto& p : params) p.set_grad(ag::randn(ag::Shape(p.shape().begin(), p.shape().end()), Dtype::Float32, gen));
      opt->step();
    }
    return std::vector<std::vector<double>>{params[0].to_vector(), params[1].to_vector()};
  };
  for (bool decay : {true, false}) BOOST_TEST((run(true, decay) == run(false, decay)), "decay " << decay);
  BOOST_TEST((run(true, true) != run(true, false)));  // the flag matters
}

BOOST_AUTO_TEST_CASE(grouped_adamw_refuses_bad_settings) {
  std::vector<Tensor> params = {ag::zeros({2}).requires_grad_()};
  check_message([&] { GroupedAdamW(params, {true, false}); }, "2 decay flags for 1 parameters");
  check_message([&] { GroupedAdamW(params, {true}, {.beta2 = 1.0}); }, "beta2 must be in [0, 1), got 1");
  check_message([&] { GroupedAdamW(params, {true}, {.eps = 0}); }, "eps must be positive");
  check_message([&] { GroupedAdamW(params, {true}, {.weight_decay = -1}); }, "weight_decay must be in");
}

BOOST_AUTO_TEST_SUITE_END()
