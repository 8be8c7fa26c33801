// Training end to end: a small transformer learns, and a run resumed from a checkpoint gives the
// same losses, bit for bit, as the run that was never interrupted.
#define BOOST_TEST_MODULE training
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nn/nn.hpp>

namespace ag = autograd;
namespace fs = std::filesystem;

namespace {

constexpr std::int64_t V = 8, T = 6, D = 16, B = 16;

// Embeddings -> one transformer block (causal) -> LayerNorm -> readout.
struct TinyTransformer : nn::Module {
  std::shared_ptr<nn::Embedding> tok, pos;
  std::shared_ptr<nn::TransformerBlock> block;
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> readout;

  explicit TinyTransformer(std::uint64_t seed) : Module("TinyTransformer") {
    ag::Generator gen(seed);
    tok = register_module("tok", std::make_shared<nn::Embedding>(nn::EmbeddingOptions{V, D}, gen));
    pos = register_module("pos", std::make_shared<nn::Embedding>(nn::EmbeddingOptions{T, D}, gen));
    block = register_module("block", std::make_shared<nn::TransformerBlock>(
                                         nn::TransformerBlockOptions{.d_model = D, .num_heads = 2, .d_ff = 32}, gen));
    ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(D));
    readout = register_module("readout", std::make_shared<nn::Linear>(nn::LinearOptions{D, V}, gen));
  }

  ag::Tensor forward(const ag::Tensor& tokens) const {
    const ag::Tensor x = ag::add(tok->forward(tokens), pos->forward(ag::arange(static_cast<double>(T))));
    nn::AttentionOptions opt;
    opt.is_causal = true;
    opt.need_weights = false;
    return readout->forward(ln_f->forward(block->forward(x, opt).output));
  }
};

// The task: at t ≥ 1 predict the previous token (t = 0 is ignored).
struct Batch {
  ag::Tensor tokens;
  std::vector<std::int64_t> targets;
};

Batch make_batch(ag::Generator& gen) {
  std::vector<double> x(B * T);
  Batch b;
  b.targets.resize(B * T);
  for (std::int64_t s = 0; s < B; ++s)
    for (std::int64_t t = 0; t < T; ++t) {
      x[static_cast<std::size_t>(s * T + t)] = static_cast<double>(gen.next_u64() % V);
      b.targets[static_cast<std::size_t>(s * T + t)] =
          t == 0 ? -100 : static_cast<std::int64_t>(x[static_cast<std::size_t>(s * T + t - 1)]);
    }
  b.tokens = ag::tensor(x, {B, T});
  return b;
}

struct Trainer {
  TinyTransformer model;
  nn::AdamW opt;
  nn::LRScheduler sched;
  ag::Generator data;

  Trainer(std::uint64_t seed, std::int64_t total_steps)
      : model(seed), opt(model.parameters(), {.lr = 1e-2}),
        sched(opt, nn::warmup_cosine_lr(1e-2, 10, total_steps)), data(1234) {}

  double step() {
    const Batch b = make_batch(data);
    ag::Tensor loss = nn::cross_entropy(model.forward(b.tokens), b.targets);
    opt.zero_grad();
    loss.backward();
    nn::clip_grad_norm_(model.parameters(), 1.0);
    opt.step();
    sched.step();
    return loss.item();
  }
};

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("headgrad_training_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

}  // namespace

BOOST_AUTO_TEST_CASE(short_run_learns_the_previous_token_task) {
  ag::set_num_threads(1);
  Trainer tr(7, 300);
  double first = tr.step(), last = 0;
  for (int i = 1; i < 300; ++i) last = tr.step();
  BOOST_TEST_MESSAGE("loss " << first << " -> " << last);
  BOOST_CHECK_GT(first, 1.8);   // about ln 8 = 2.08 at the start
  BOOST_CHECK_LT(last, 0.1);    // the previous token is learnt
}

BOOST_AUTO_TEST_CASE(resumed_run_gives_the_same_losses_as_an_uninterrupted_one) {
  ag::set_num_threads(1);
  constexpr int half = 15;
  Trainer straight(7, 2 * half);
  std::vector<double> expected;
  for (int i = 0; i < 2 * half; ++i) expected.push_back(straight.step());

  TempDir dir;
  const std::string path = (dir.path / "resume.safetensors").string();
  {
    Trainer first(7, 2 * half);
    for (int i = 0; i < half; ++i) {
      const double l = first.step();
      BOOST_REQUIRE_EQUAL(l, expected[static_cast<std::size_t>(i)]);
    }
    nn::save_checkpoint(path, first.model, first.opt,
                        {{"step", std::to_string(first.sched.current_step())},
                         {"data_state", std::to_string(first.data.state())}});
  }  // the first process "ends" here

  Trainer resumed(99, 2 * half);  // different initial weights: all must come from the file
  const auto meta = nn::load_checkpoint(path, resumed.model, resumed.opt);
  resumed.sched.set_step(std::stoll(meta.at("step")));
  resumed.data.manual_seed(std::stoull(meta.at("data_state")));
  for (int i = half; i < 2 * half; ++i) {
    const double l = resumed.step();
    BOOST_CHECK_MESSAGE(std::memcmp(&l, &expected[static_cast<std::size_t>(i)], sizeof l) == 0,
                        "step " << i << ": resumed " << l << " vs uninterrupted " << expected[static_cast<std::size_t>(i)]);
  }
  // and the parameters end up identical
  const auto a = straight.model.named_parameters(), b = resumed.model.named_parameters();
  for (std::size_t i = 0; i < a.size(); ++i) BOOST_CHECK(a[i].second.to_vector() == b[i].second.to_vector());
}

BOOST_AUTO_TEST_CASE(same_seed_gives_bit_identical_losses) {
  ag::set_num_threads(2);
  Trainer a(3, 20), b(3, 20);
  for (int i = 0; i < 20; ++i) {
    const double la = a.step(), lb = b.step();
    BOOST_CHECK(std::memcmp(&la, &lb, sizeof la) == 0);
  }
}
