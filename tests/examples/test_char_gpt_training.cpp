// examples/char_gpt end to end on a small committed text (tests/data/char_gpt/public_domain.txt,
// 3.2 KB of public-domain prose and verse): a tiny GPT learns it, a run resumed from a mid-run
// checkpoint continues bit for bit, samples hold only vocabulary characters, and the model's
// gradients pass gradcheck in float64.
#define BOOST_TEST_MODULE char_gpt_training
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <nn/nn.hpp>

#include "corpus.hpp"
#include "sample.hpp"
#include "test_support.hpp"
#include "trainer.hpp"

using namespace test_support::prelude;
using namespace char_gpt;
namespace fs = std::filesystem;

namespace {

struct Text {
  Vocabulary vocab;
  Split split;
};

const Text& text() {
  static const Text t = [] {
    const std::u32string chars = load_corpus(HEADGRAD_TEST_DATA_DIR "/char_gpt/public_domain.txt");
    Vocabulary v(chars);
    return Text{v, split_tokens(v.encode(chars))};
  }();
  return t;
}

// A tiny GPT: 2 blocks of width 64, 2 heads, context 16, batches of 8.
TrainConfig tiny(std::int64_t steps) {
  TrainConfig c;
  c.model = GptConfig{.block_size = 16, .n_layer = 2, .n_head = 2, .n_embd = 64};
  c.batch_size = 8;
  c.max_iters = steps;
  c.lr = 3e-3;
  c.min_lr = 1e-4;
  c.warmup_iters = std::min<std::int64_t>(20, steps);
  c.eval_iters = 10;
  c.seed = 7;
  return c;
}

// The model is small: one thread is the fastest (and results do not depend on the count).
struct OneThread {
  test_support::ThreadCount one{1};
};

fs::path scratch(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("char_gpt_training_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

}  // namespace

BOOST_GLOBAL_FIXTURE(OneThread);

// From ln(vocabulary) ≈ 4.1 to below 2.5 on the training split's fixed evaluation batches in
// 300 steps. Measured 2.242 with this seed (2.24-2.34 over seeds 1-7, the same bits at one
// thread and two), so the bound leaves a margin of 0.26 over the measurement (0.16 over the worst
// seed). A model that learns only the characters' frequencies stays near 2.97 (measured with a
// learning rate too high to learn more), one that learns nothing near 4.1.
BOOST_AUTO_TEST_CASE(a_tiny_gpt_learns_the_text) {
  Trainer t(tiny(300), text().vocab, text().split);
  const EvalRecord before = t.evaluate();
  BOOST_TEST(std::abs(before.train - std::log(static_cast<double>(text().vocab.size()))) < 0.3);
  for (int i = 0; i < 300; ++i) t.train_step();
  const EvalRecord after = t.evaluate();
  BOOST_TEST_MESSAGE("train-split loss " << before.train << " -> " << after.train << ", validation " << before.val
                                         << " -> " << after.val);
  BOOST_TEST(after.train < 2.5);
  BOOST_TEST(t.history().train_losses.size() == 300u);
}

// 40 steps straight against 20 steps, a checkpoint, a fresh trainer loading it, 20 more: the same
// losses and parameters bit for bit. Dropout is on, so the dropout generators' states count too.
BOOST_AUTO_TEST_CASE(a_resumed_run_continues_bit_for_bit) {
  TrainConfig c = tiny(40);
  c.model.dropout = 0.1;
  c.eval_interval = 10;
  Trainer straight(c, text().vocab, text().split);
  for (int i = 0; i < 40; ++i) straight.train_step();

  const fs::path dir = scratch("resume");
  const std::string path = (dir / "ckpt.safetensors").string();
  {
    Trainer first(c, text().vocab, text().split);
    for (int i = 0; i < 20; ++i) first.train_step();
    first.evaluate();
    first.save(path);
  }
  Trainer resumed(c, text().vocab, text().split);
  resumed.load(path);
  BOOST_TEST(resumed.step() == 20);
  BOOST_TEST(resumed.history().evals.size() == 1u);
  for (int i = 0; i < 20; ++i) resumed.train_step();
  BOOST_TEST(resumed.history().train_losses == straight.history().train_losses);  // all 40, exactly
  const auto a = straight.model().named_parameters(), b = resumed.model().named_parameters();
  for (std::size_t i = 0; i < a.size(); ++i) BOOST_TEST(a[i].second.to_vector() == b[i].second.to_vector(), a[i].first);
  fs::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(a_checkpoint_of_another_run_is_refused_and_changes_nothing) {
  const fs::path dir = scratch("refuse");
  const std::string path = (dir / "ckpt.safetensors").string();
  Trainer saved(tiny(10), text().vocab, text().split);
  saved.train_step();
  saved.save(path);
  TrainConfig other = tiny(10);
  other.seed = 8;
  Trainer t(other, text().vocab, text().split);
  const auto before = t.model().parameter("wte.weight").to_vector();
  check_throws<std::runtime_error>([&] { t.load(path); }, {path, "other settings", "\"seed\":7"});
  BOOST_TEST(t.model().parameter("wte.weight").to_vector() == before);
  BOOST_TEST(t.step() == 0);
  Split shifted = text().split;  // the same settings on another corpus
  std::swap(shifted.train[0], shifted.train[1]);
  Trainer elsewhere(tiny(10), text().vocab, shifted);
  check_throws<std::runtime_error>([&] { elsewhere.load(path); }, {"another corpus"});
  check_throws<nn::CheckpointError>([&] { read_checkpoint_info((dir / "missing").string()); }, {"missing"});
  fs::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(samples_hold_only_vocabulary_characters_and_follow_their_seed) {
  Trainer t(tiny(100), text().vocab, text().split);
  for (int i = 0; i < 100; ++i) t.train_step();
  const auto& vocab = text().vocab;
  const std::vector<std::int32_t> prompt = vocab.encode(U"Four");
  const SampleOptions options{.max_new_tokens = 120, .temperature = 1.0, .top_k = 10, .seed = 3};
  const auto tokens = generate(t.model(), prompt, options);
  BOOST_REQUIRE_EQUAL(tokens.size(), prompt.size() + 120);
  BOOST_TEST((std::vector<std::int32_t>(tokens.begin(), tokens.begin() + 4) == prompt));
  for (auto tok : tokens) BOOST_TEST((tok >= 0 && tok < vocab.size()));
  const std::u32string sampled = vocab.decode(tokens);
  for (char32_t ch : sampled) BOOST_TEST(vocab.contains(ch));
  BOOST_TEST(t.model().is_training());  // generate restores the mode
  BOOST_TEST(generate(t.model(), prompt, options) == tokens);
  auto other = options;
  other.seed = 4;
  BOOST_TEST(generate(t.model(), prompt, other) != tokens);
  // top_k = 1 is greedy decoding: the second route takes the argmax of the last logits by hand
  // (over contexts longer than block_size, so the window's cropping is covered too).
  other.top_k = 1;
  other.max_new_tokens = 24;
  const auto greedy = generate(t.model(), prompt, other);
  std::vector<std::int32_t> manual = prompt;
  t.model().eval();
  ag::NoGradGuard no_grad;
  while (manual.size() < greedy.size()) {
    const auto T = std::min<std::int64_t>(16, static_cast<std::int64_t>(manual.size()));
    const std::vector<double> window(manual.end() - T, manual.end());
    const auto logits = ag::narrow(t.model().forward(ag::tensor(window, {1, T})), 1, T - 1, 1).to_vector();
    manual.push_back(static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  }
  BOOST_TEST(greedy == manual);
}

// The whole model's gradients, every parameter, against float64 central differences: biases on,
// tied and untied heads, and a second step's worth of causal context (T = 4, block_size 4).
BOOST_AUTO_TEST_CASE(the_model_passes_gradcheck_in_float64) {
  for (bool tie : {true, false}) {
    ag::Generator gen(11);
    const GptConfig c{.vocab_size = 5, .block_size = 4, .n_layer = 2, .n_head = 2, .n_embd = 4, .bias = true,
                      .tie_weights = tie, .dtype = Dtype::Float64};
    Gpt model(c, gen);
    // Larger weights than the 0.02 initialisation, so every path carries a gradient well above
    // the tolerance.
    for (auto& p : model.parameters()) {
      ag::NoGradGuard no_grad;
      p.copy_(ag::randn(ag::Shape(p.shape().begin(), p.shape().end()), Dtype::Float64, gen) * 0.5 +
              (p.dim() == 1 ? 1.0 : 0.0));
    }
    const Tensor tokens = ag::tensor({0, 3, 1, 4, 2, 2, 0, 1}, {2, 4});
    const Tensor targets = ag::tensor({3, 1, 4, 1, 2, 0, 1, 3}, {2, 4});
    const auto params = model.parameters();
    const ag::GradcheckResult r =
        ag::gradcheck([&](const TensorList&) { return model.loss(tokens, targets); }, params);
    BOOST_TEST(r.ok, (tie ? "tied: " : "untied: ") << r.message);
    BOOST_TEST(!r.projected);
    BOOST_TEST(r.elements_checked == model.num_parameters());
    BOOST_TEST_MESSAGE("worst abs error " << r.max_abs_error << ", rel " << r.max_rel_error);
  }
}
