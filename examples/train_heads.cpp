// train_heads — does attention need several heads? A measured answer to the seed's claim that
// one head "can only average the values one way", while several heads can each learn a
// different relationship ("one head might learn to look at the previous word, another at the
// sentence's subject").
//
// The task: sequences of T random tokens x_0 .. x_{T-1} from a vocabulary of V; at every
// position t >= 1 the model must output y_t = x_{t-1} - x_0, the signed difference between the
// previous token and the first token (2V - 1 classes). Each position needs two relationships at
// once — "previous token" and "first token" — and in order: averaging the two tokens loses
// which one is subtracted.
//
// The model: token + position embeddings, ONE pre-LayerNorm transformer block (causal multi-head
// self-attention and an MLP, each added back into the residual stream), a final LayerNorm and a
// linear readout. The 1-head and 2-head models have the same d_model, the same parameter count
// (the split is only a reshape of the projections), the same initial weights (drawn from the same
// seed) and see the same training batches: only the split differs. Each head's focus is measured
// afterwards from its attention weights on held-out sequences, not assumed.
//
//   train_heads                          # 1 head, then 2 heads, and the comparison
//   train_heads --heads 2 --seed 7 --summary run.json
//   train_heads --help
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nn/nn.hpp>

namespace ag = autograd;

namespace {

struct Config {
  std::vector<std::int64_t> heads = {1, 2};  // --heads N trains only N
  std::uint64_t seed = 1;
  std::int64_t vocab = 24;
  std::int64_t seq_len = 12;
  std::int64_t d_model = 32;
  std::int64_t d_ff = 128;
  std::int64_t batch = 64;
  std::int64_t steps = 2000;
  std::int64_t warmup = 100;
  double lr = 3e-3;
  double weight_decay = 0.01;
  double clip = 1.0;
  std::int64_t test_sequences = 1024;
  int threads = 1;
  std::string summary;
  std::string out_dir = "train_heads_out";
  bool write_files = true;  // pictures and trained models in out_dir
  bool quiet = false;
  std::string task = "difference";
  bool mlp = true;
};

void usage(const char* argv0) {
  fmt::print(
      "usage: {} [options]\n"
      "Trains a one-block transformer with 1 head and with 2 heads (same d_model, same parameter\n"
      "count, same initial weights, same data) on y_t = x_(t-1) - x_0, and reports test accuracy\n"
      "and where each head attends.\n\n"
      "  --heads N          train only an N-head model (default: 1 head, then 2 heads)\n"
      "  --seed S           seed for weights and data (default 1)\n"
      "  --summary FILE     write a JSON summary\n"
      "  --out DIR          directory for the pictures and trained models (default train_heads_out)\n"
      "  --no-files         write no pictures or models\n"
      "  --steps N          training steps (default 2000)\n"
      "  --batch N          sequences per step (default 64)\n"
      "  --seq-len T        sequence length (default 12)\n"
      "  --vocab V          vocabulary size (default 24)\n"
      "  --d-model D        model width (default 32)\n"
      "  --d-ff F           MLP width (default 128)\n"
      "  --lr X             peak learning rate of AdamW, warmup then cosine (default 3e-3)\n"
      "  --task NAME        difference (default): y = x_(t-1) - x_0;  modular: (x_(t-1) - x_0) mod V;\n"
      "                     pair: y = (x_0, x_(t-1)) as one of V*V classes\n"
      "  --attention-only   no MLP in the block: attention, residual, LayerNorm, linear readout\n"
      "  --threads N        kernel threads (default 1: this model is so small that more threads\n"
      "                     only add synchronisation); same seed and thread count give the same\n"
      "                     losses bit for bit\n"
      "  --quiet            no progress line\n",
      argv0);
}

Config parse_args(int argc, char** argv) {
  Config c;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) throw std::invalid_argument(fmt::format("{} needs a value", argv[i]));
    return argv[++i];
  };
  auto integer = [&](int& i, std::int64_t low) {
    const std::string name = argv[i], v = value(i);
    std::size_t used = 0;
    std::int64_t n = 0;
    try {
      n = std::stoll(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != v.size() || n < low) throw std::invalid_argument(fmt::format("{} wants an integer >= {}, got '{}'", name, low, v));
    return n;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      usage(argv[0]);
      std::exit(0);
    } else if (a == "--heads") {
      c.heads = {integer(i, 1)};
    } else if (a == "--seed") {
      c.seed = static_cast<std::uint64_t>(integer(i, 0));
    } else if (a == "--summary") {
      c.summary = value(i);
    } else if (a == "--out") {
      c.out_dir = value(i);
    } else if (a == "--no-files") {
      c.write_files = false;
    } else if (a == "--steps") {
      c.steps = integer(i, 1);
    } else if (a == "--batch") {
      c.batch = integer(i, 1);
    } else if (a == "--seq-len") {
      c.seq_len = integer(i, 3);
    } else if (a == "--vocab") {
      c.vocab = integer(i, 2);
    } else if (a == "--d-model") {
      c.d_model = integer(i, 1);
    } else if (a == "--d-ff") {
      c.d_ff = integer(i, 1);
    } else if (a == "--lr") {
      const std::string v = value(i);
      c.lr = std::stod(v);
      if (!(c.lr > 0)) throw std::invalid_argument("--lr must be positive");
    } else if (a == "--threads") {
      c.threads = static_cast<int>(integer(i, 1));
    } else if (a == "--task") {
      c.task = value(i);
    } else if (a == "--attention-only") {
      c.mlp = false;
    } else if (a == "--quiet") {
      c.quiet = true;
    } else {
      throw std::invalid_argument(fmt::format("unknown option '{}' (try --help)", a));
    }
  }
  if (c.task != "difference" && c.task != "modular" && c.task != "pair")
    throw std::invalid_argument(fmt::format("--task '{}' is not one of difference, modular, pair", c.task));
  for (auto h : c.heads)
    if (c.d_model % h != 0)
      throw std::invalid_argument(fmt::format("--d-model {} is not divisible by {} heads", c.d_model, h));
  c.warmup = std::min(c.warmup, c.steps / 10);
  return c;
}

// ---- the task ----

struct Batch {
  std::int64_t size = 0;
  std::vector<std::int64_t> tokens;   // (B, T) row-major
  std::vector<std::int64_t> targets;  // (B, T); position 0 has no target (ignore_index)
  ag::Tensor token_tensor;            // (B, T), the indices as values
};

constexpr std::int64_t kIgnore = -100;

std::string task_text(const Config& c) {
  if (c.task == "modular") return fmt::format("y_t = (x_(t-1) - x_0) mod {}", c.vocab);
  if (c.task == "pair") return fmt::format("y_t = (x_0, x_(t-1)), one of {} classes", c.vocab * c.vocab);
  return fmt::format("y_t = x_(t-1) - x_0, from -{0} to {0}", c.vocab - 1);
}

// Random tokens and, for t >= 1, the target of the chosen task (see task_text).
Batch make_batch(ag::Generator& gen, const Config& c, std::int64_t size) {
  Batch b;
  b.size = size;
  const std::int64_t T = c.seq_len, V = c.vocab;
  b.tokens.resize(static_cast<std::size_t>(size * T));
  b.targets.resize(b.tokens.size());
  std::vector<double> values(b.tokens.size());
  for (std::int64_t s = 0; s < size; ++s) {
    std::int64_t* x = b.tokens.data() + s * T;
    std::int64_t* y = b.targets.data() + s * T;
    for (std::int64_t t = 0; t < T; ++t) x[t] = static_cast<std::int64_t>(gen.next_u64() % static_cast<std::uint64_t>(V));
    y[0] = kIgnore;
    for (std::int64_t t = 1; t < T; ++t) {
      if (c.task == "difference") {
        y[t] = x[t - 1] - x[0] + (V - 1);  // the signed difference, shifted to a class index
      } else if (c.task == "modular") {
        y[t] = ((x[t - 1] - x[0]) % V + V) % V;
      } else {  // pair
        y[t] = x[0] * V + x[t - 1];
      }
    }
  }
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>(b.tokens[i]);
  b.token_tensor = ag::tensor(values, {size, T});
  return b;
}

std::int64_t classes(const Config& c) {
  if (c.task == "pair") return c.vocab * c.vocab;
  if (c.task == "modular") return c.vocab;
  return 2 * c.vocab - 1;  // difference: -(V-1) .. V-1
}

// ---- the model ----

struct Model : nn::Module {
  std::shared_ptr<nn::Embedding> tok, pos;
  std::shared_ptr<nn::LayerNorm> ln_1;              // attention-only model
  std::shared_ptr<nn::MultiHeadAttention> attn;
  std::shared_ptr<nn::TransformerBlock> block;      // --mlp: a full transformer block instead
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> readout;
  ag::Tensor positions;

  Model(const Config& c, std::int64_t heads, ag::Generator& gen) : Module("HeadsModel") {
    tok = register_module("tok", std::make_shared<nn::Embedding>(nn::EmbeddingOptions{c.vocab, c.d_model}, gen));
    pos = register_module("pos", std::make_shared<nn::Embedding>(nn::EmbeddingOptions{c.seq_len, c.d_model}, gen));
    if (c.mlp) {
      block = register_module(
          "block", std::make_shared<nn::TransformerBlock>(
                       nn::TransformerBlockOptions{.d_model = c.d_model, .num_heads = heads, .d_ff = c.d_ff}, gen));
    } else {
      ln_1 = register_module("ln_1", std::make_shared<nn::LayerNorm>(c.d_model));
      nn::MultiHeadAttentionOptions mha;
      mha.embed_dim = c.d_model;
      mha.num_heads = heads;
      attn = register_module("attn", std::make_shared<nn::MultiHeadAttention>(mha, gen));
    }
    ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(c.d_model));
    readout = register_module("readout", std::make_shared<nn::Linear>(nn::LinearOptions{c.d_model, classes(c)}, gen));
    positions = ag::arange(static_cast<double>(c.seq_len));
  }

  struct Output {
    ag::Tensor logits;   // (B, T, classes)
    ag::Tensor weights;  // (B, H, T, T) per head, when asked for
  };

  Output forward(const ag::Tensor& tokens, bool need_weights) const {
    const ag::Tensor x = ag::add(tok->forward(tokens), pos->forward(positions));  // (B, T, D) the residual stream
    nn::AttentionOptions opt;
    opt.is_causal = true;  // position t sees 0 .. t: the previous and the first token are both visible
    opt.need_weights = need_weights;
    opt.average_attn_weights = false;
    ag::Tensor r;
    ag::Tensor weights;
    if (block) {
      auto out = block->forward(x, opt);
      r = out.output;
      weights = out.weights;
    } else {
      const ag::Tensor h = ln_1->forward(x);                          // (B, T, D)
      auto a = attn->forward(h, h, h, opt);                           // (B, T, D), weights (B, H, T, T)
      r = ag::add(x, a.output);                                       // added back into the residual stream
      weights = a.weights;
    }
    return {readout->forward(ln_f->forward(r)), weights};            // (B, T, classes)
  }
};

// ---- measuring ----

struct Focus {
  std::string label;        // "previous token", "first token", "current token" or "mixed"
  double mean_weight = 0;   // mean weight on the labelled position (the largest of the three)
  double previous = 0, first = 0, current = 0;
};

// Mean attention weight of each head on the previous, the first and the current position, over
// query positions t ≥ 2 (where those three are different positions) of every test sequence.
std::vector<Focus> measure_focus(const ag::Tensor& weights) {
  const std::int64_t B = weights.size(0), H = weights.size(1), T = weights.size(2), S = weights.size(3);
  const auto w = weights.to_vector();
  std::vector<Focus> out(static_cast<std::size_t>(H));
  for (std::int64_t h = 0; h < H; ++h) {
    Focus& f = out[static_cast<std::size_t>(h)];
    double n = 0;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t t = 2; t < T; ++t) {
        const double* row = w.data() + ((b * H + h) * T + t) * S;
        f.previous += row[t - 1];
        f.first += row[0];
        f.current += row[t];
        n += 1;
      }
    f.previous /= n;
    f.first /= n;
    f.current /= n;
    const std::pair<double, const char*> options[] = {
        {f.previous, "previous token"}, {f.first, "first token"}, {f.current, "current token"}};
    const auto best = *std::max_element(std::begin(options), std::end(options),
                                        [](const auto& a, const auto& b) { return a.first < b.first; });
    f.mean_weight = best.first;
    f.label = best.first >= 0.5 ? best.second : "mixed";
  }
  return out;
}

struct RunResult {
  std::int64_t heads = 0;
  std::int64_t parameters = 0;
  double accuracy = 0;
  double test_loss = 0;
  double final_loss = 0;  // mean training loss over the last 50 steps
  double seconds = 0;
  std::vector<double> losses;  // per step
  std::vector<Focus> focus;
  ag::Tensor sample_weights;              // (H, T, T) on the first test sequence
  std::vector<std::int64_t> sample_tokens;  // that sequence
};

// ---- progress ----

class Progress {
 public:
  Progress(bool enabled, std::int64_t total, std::string label)
      : enabled_(enabled), tty_(::isatty(STDERR_FILENO) != 0), total_(total), label_(std::move(label)),
        start_(std::chrono::steady_clock::now()) {}

  void update(std::int64_t step, double loss, double acc, bool force = false) {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    const bool due = tty_ ? now - last_ > std::chrono::milliseconds(100) : (step % std::max<std::int64_t>(total_ / 10, 1) == 0);
    if (!due && !force) return;
    last_ = now;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const double rate = elapsed > 0 ? static_cast<double>(step) / elapsed : 0.0;
    const std::string line = fmt::format("[{}] step {:>5}/{}  loss {:.4f}  acc {:5.1f}%  {:.0f} steps/s", label_, step,
                                         total_, loss, 100 * acc, rate);
    if (tty_) {
      fmt::print(stderr, "\r{:<78}", line);
    } else {
      fmt::print(stderr, "{}\n", line);
    }
    std::fflush(stderr);
  }
  void finish() {
    if (enabled_ && tty_) fmt::print(stderr, "\n");
  }

 private:
  bool enabled_, tty_;
  std::int64_t total_;
  std::string label_;
  std::chrono::steady_clock::time_point start_, last_{};
};

double batch_accuracy(const ag::Tensor& logits, const std::vector<std::int64_t>& targets) {
  const std::int64_t V = logits.size(-1);
  const auto v = logits.to_vector();
  std::int64_t right = 0, counted = 0;
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] == kIgnore) continue;
    const double* row = v.data() + static_cast<std::int64_t>(i) * V;
    const auto best = std::max_element(row, row + V) - row;
    right += best == targets[i];
    ++counted;
  }
  return counted ? static_cast<double>(right) / static_cast<double>(counted) : 0.0;
}

RunResult train(const Config& c, std::int64_t heads) {
  RunResult r;
  r.heads = heads;
  // Same seeds for every head count: identical initial weights and identical batches.
  ag::Generator init_gen(c.seed);
  ag::Generator data_gen(c.seed * 0x9E3779B97F4A7C15ull + 1);
  ag::Generator test_gen(c.seed * 0x9E3779B97F4A7C15ull + 2);
  Model model(c, heads, init_gen);
  r.parameters = model.num_parameters();
  nn::AdamW opt(model.parameters(), {.lr = c.lr, .weight_decay = c.weight_decay});
  nn::LRScheduler sched(opt, nn::warmup_cosine_lr(c.lr, c.warmup, c.steps, c.lr * 0.05));
  const std::string label = fmt::format("{} head{}", heads, heads == 1 ? "" : "s");
  Progress progress(!c.quiet, c.steps, label);
  const auto start = std::chrono::steady_clock::now();
  nn::CrossEntropyOptions ce{.ignore_index = kIgnore};
  double batch_acc = 0.0;
  const std::vector<ag::Tensor> params = model.parameters();
  for (std::int64_t step = 1; step <= c.steps; ++step) {
    const Batch b = make_batch(data_gen, c, c.batch);
    const auto out = model.forward(b.token_tensor, false);
    ag::Tensor loss = nn::cross_entropy(out.logits, b.targets, ce);
    opt.zero_grad();
    loss.backward();
    nn::clip_grad_norm_(params, c.clip);
    opt.step();
    sched.step();
    r.losses.push_back(loss.item());
    if (!c.quiet) {
      const bool last = step == c.steps;
      if (step % 10 == 1 || last) batch_acc = batch_accuracy(out.logits, b.targets);  // refreshed every 10 steps
      progress.update(step, r.losses.back(), batch_acc, last);
    }
  }
  progress.finish();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::size_t tail = std::min<std::size_t>(50, r.losses.size());
  for (std::size_t i = r.losses.size() - tail; i < r.losses.size(); ++i) r.final_loss += r.losses[i] / static_cast<double>(tail);

  // Held-out sequences, never trained on (a separate random stream).
  ag::NoGradGuard no_grad;
  model.eval();
  const Batch test = make_batch(test_gen, c, c.test_sequences);
  const auto out = model.forward(test.token_tensor, true);
  r.accuracy = batch_accuracy(out.logits, test.targets);
  r.test_loss = nn::cross_entropy(out.logits, test.targets, ce).item();
  r.focus = measure_focus(out.weights);
  r.sample_weights = ag::narrow(out.weights, 0, 0, 1).detach();
  r.sample_weights = ag::reshape(r.sample_weights, {heads, c.seq_len, c.seq_len});
  r.sample_tokens.assign(test.tokens.begin(), test.tokens.begin() + c.seq_len);
  if (c.write_files) {
    // The trained parameters, readable by Python: safetensors.torch.load_file(path)
    std::filesystem::create_directories(c.out_dir);
    nn::save_parameters(model, fmt::format("{}/model_{}_heads.safetensors", c.out_dir, heads),
                        {{"task", task_text(c)}, {"num_heads", std::to_string(heads)},
                         {"test_accuracy", fmt::format("{:.4f}", r.accuracy)}});
  }
  return r;
}

// ---- reporting ----

// A small shaded map per head: rows are query positions, columns key positions.
void print_terminal_map(const RunResult& r) {
  const char* shades[] = {" ", "░", "▒", "▓", "█"};
  const std::int64_t H = r.sample_weights.size(0), T = r.sample_weights.size(1);
  const auto w = r.sample_weights.to_vector();
  fmt::print("  attention on a test sequence (rows: query position, columns: key position; ░▒▓█ = more weight)\n");
  std::string header = "    ";
  for (std::int64_t h = 0; h < H; ++h) {
    std::string title = fmt::format("head {}: {}", h + 1, r.focus[static_cast<std::size_t>(h)].label);
    title.resize(static_cast<std::size_t>(std::max<std::int64_t>(2 * T + 6, static_cast<std::int64_t>(title.size()) + 2)), ' ');
    header += title;
  }
  fmt::print("{}\n", header);
  for (std::int64_t t = 0; t < T; ++t) {
    std::string line = fmt::format("  {:>2}", r.sample_tokens[static_cast<std::size_t>(t)]);
    for (std::int64_t h = 0; h < H; ++h) {
      line += " |";
      for (std::int64_t s = 0; s < T; ++s) {
        const double v = w[static_cast<std::size_t>((h * T + t) * T + s)];
        const int level = std::clamp(static_cast<int>(std::lround(v * 4)), 0, 4);
        line += shades[level];
        line += shades[level];
      }
      line += "|";
      const std::int64_t title_width = std::max<std::int64_t>(
          2 * T + 6, static_cast<std::int64_t>(fmt::format("head {}: {}", h + 1, r.focus[static_cast<std::size_t>(h)].label).size()) + 2);
      line += std::string(static_cast<std::size_t>(std::max<std::int64_t>(title_width - 2 * T - 3, 1)), ' ');
    }
    fmt::print("{}\n", line);
  }
}

std::string svg_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

void write_attention_svg(const RunResult& r, const std::string& path) {
  const std::int64_t H = r.sample_weights.size(0), T = r.sample_weights.size(1);
  const auto w = r.sample_weights.to_vector();
  const double cell = 22, margin = 40, gap = 50, title_h = 46;
  const double map = cell * static_cast<double>(T);
  const double width = std::max(600.0, margin * 2 + static_cast<double>(H) * map + static_cast<double>(H - 1) * gap);
  const double height = title_h + margin + map + 30;
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" font-family=\"sans-serif\" "
      "font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      width, height);
  s += fmt::format("<text x=\"{}\" y=\"18\" font-size=\"14\">Attention weights, {} head{}, on a test sequence "
                   "(row: query position t, column: key position)</text>\n",
                   margin, r.heads, r.heads == 1 ? "" : "s");
  for (std::int64_t h = 0; h < H; ++h) {
    const double x0 = margin + static_cast<double>(h) * (map + gap), y0 = title_h + margin - 10;
    const Focus& f = r.focus[static_cast<std::size_t>(h)];
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\">head {}: {} ({:.2f})</text>\n", x0, y0 - 18,
                     h + 1, svg_escape(f.label), f.mean_weight);
    for (std::int64_t t = 0; t < T; ++t) {
      const auto tok = r.sample_tokens[static_cast<std::size_t>(t)];
      s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", x0 - 4,
                       y0 + (static_cast<double>(t) + 0.7) * cell, tok);
      s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
                       x0 + (static_cast<double>(t) + 0.5) * cell, y0 - 3, tok);
      for (std::int64_t k = 0; k < T; ++k) {
        const double v = std::clamp(w[static_cast<std::size_t>((h * T + t) * T + k)], 0.0, 1.0);
        // white (0) to deep blue (1)
        const int red = static_cast<int>(std::lround(255 - 222 * v)), green = static_cast<int>(std::lround(255 - 180 * v));
        const int blue = static_cast<int>(std::lround(255 - 75 * v));
        s += fmt::format(
            "<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{}\" height=\"{}\" fill=\"rgb({},{},{})\" stroke=\"#ddd\" "
            "stroke-width=\"0.5\"><title>query {} -> key {}: {:.3f}</title></rect>\n",
            x0 + static_cast<double>(k) * cell, y0 + static_cast<double>(t) * cell, cell, cell, red, green, blue, t, k, v);
      }
    }
  }
  s += fmt::format("<text x=\"{}\" y=\"{:.0f}\" fill=\"#555\">tokens label the rows and columns; darker = more weight "
                   "(hover a cell for its value)</text>\n",
                   margin, height - 8);
  s += "</svg>\n";
  std::ofstream(path) << s;
}

void write_loss_svg(const std::vector<RunResult>& runs, const std::string& path, double chance_loss) {
  const double W = 640, H = 360, left = 60, right = 20, top = 40, bottom = 45;
  double ymax = chance_loss * 1.15;
  for (const auto& r : runs)
    for (double l : r.losses) ymax = std::max(ymax, std::min(l, chance_loss * 1.5));
  const std::size_t steps = runs.front().losses.size();
  auto X = [&](double step) { return left + (W - left - right) * step / static_cast<double>(steps); };
  auto Y = [&](double loss) { return top + (H - top - bottom) * (1 - std::clamp(loss, 0.0, ymax) / ymax); };
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" font-family=\"sans-serif\" "
      "font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      W, H);
  s += fmt::format("<text x=\"{}\" y=\"22\" font-size=\"14\">Training loss (cross entropy, moving average of 25 "
                   "steps)</text>\n",
                   left);
  // axes and ticks
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"black\"/>\n", left, top, H - bottom);
  s += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{2}\" y2=\"{1}\" stroke=\"black\"/>\n", left, H - bottom, W - right);
  for (int i = 0; i <= 5; ++i) {
    const double v = ymax * i / 5;
    s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#eee\"/>\n", left, Y(v),
                     W - right, Y(v));
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"end\">{:.1f}</text>\n", left - 5, Y(v) + 4, v);
    const double st = static_cast<double>(steps) * i / 5;
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{:.0f}</text>\n", X(st), H - bottom + 15, st);
  }
  s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">step</text>\n", (left + W - right) / 2, H - 8);
  s += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#999\" stroke-dasharray=\"4 3\"/>"
                   "<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"#777\" text-anchor=\"end\">chance (ln classes)</text>\n",
                   left, Y(chance_loss), W - right, Y(chance_loss), W - right - 4, Y(chance_loss) - 4);
  const char* colors[] = {"#d62728", "#1f77b4", "#2ca02c", "#9467bd"};
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const auto& r = runs[i];
    std::string points;
    double avg = 0;
    for (std::size_t k = 0; k < r.losses.size(); ++k) {
      const std::size_t lo = k >= 24 ? k - 24 : 0;
      avg = 0;
      for (std::size_t j = lo; j <= k; ++j) avg += r.losses[j];
      avg /= static_cast<double>(k - lo + 1);
      points += fmt::format("{:.1f},{:.1f} ", X(static_cast<double>(k + 1)), Y(avg));
    }
    const char* color = colors[i % 4];
    s += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>\n", color, points);
    s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" fill=\"{}\">{} head{}: test accuracy {:.1f}%</text>\n", W - right - 220,
                     top + 80 + 16 * static_cast<double>(i), color, r.heads, r.heads == 1 ? "" : "s", 100 * r.accuracy);
  }
  s += "</svg>\n";
  std::ofstream(path) << s;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string run_json(const RunResult& r, const Config& c, const std::string& indent) {
  std::string heads;
  for (std::size_t h = 0; h < r.focus.size(); ++h) {
    const auto& f = r.focus[h];
    heads += fmt::format("{}{}  {{\"head\": {}, \"focus\": {}, \"mean_weight\": {:.4f}, \"weight_on_previous\": {:.4f}, "
                         "\"weight_on_first\": {:.4f}, \"weight_on_current\": {:.4f}}}",
                         h ? ",\n" : "", indent, h + 1, json_string(f.label), f.mean_weight, f.previous, f.first, f.current);
  }
  return fmt::format(
      "{0}\"num_heads\": {1},\n{0}\"accuracy\": {2:.4f},\n{0}\"final_loss\": {3:.4f},\n{0}\"test_loss\": {4:.4f},\n"
      "{0}\"heads\": [\n{5}\n{0}],\n{0}\"parameters\": {6},\n{0}\"d_model\": {7},\n{0}\"head_dim\": {8},\n"
      "{0}\"steps\": {9},\n{0}\"seconds\": {10:.2f},\n{0}\"steps_per_second\": {11:.1f}",
      indent, r.heads, r.accuracy, r.final_loss, r.test_loss, heads, r.parameters, c.d_model, c.d_model / r.heads,
      c.steps, r.seconds, static_cast<double>(c.steps) / r.seconds);
}

void write_summary(const std::vector<RunResult>& runs, const Config& c, const std::string& path) {
  // The top level describes the run with the most heads; "runs" lists every run.
  const RunResult& main = runs.back();
  std::string s = "{\n" + run_json(main, c, "  ") + ",\n";
  s += fmt::format("  \"task\": {},\n  \"mlp\": {},\n  \"vocab\": {},\n  \"seq_len\": {},\n  \"seed\": {},\n"
                   "  \"threads\": {},\n",
                   json_string(task_text(c)), c.mlp, c.vocab, c.seq_len, c.seed, ag::get_num_threads());
  if (runs.size() > 1)
    s += fmt::format("  \"accuracy_gain_points\": {:.2f},\n", 100 * (main.accuracy - runs.front().accuracy));
  s += "  \"runs\": [\n";
  for (std::size_t i = 0; i < runs.size(); ++i)
    s += "    {\n" + run_json(runs[i], c, "      ") + "\n    }" + (i + 1 < runs.size() ? ",\n" : "\n");
  s += "  ]\n}\n";
  std::ofstream out(path);
  if (!out) throw std::runtime_error(fmt::format("cannot write {}", path));
  out << s;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Config c = parse_args(argc, argv);
    if (c.threads > 0) ag::set_num_threads(c.threads);
    fmt::print("task:  {}  (sequences of {} random tokens from {}; each position t >= 1 needs the previous\n"
               "       token and the first token at once)\n",
               task_text(c), c.seq_len, c.vocab);
    fmt::print("model: embeddings -> 1 block ({}) -> LayerNorm -> readout; d_model {}, {} steps, seed {}, {} thread{}\n\n",
               c.mlp ? "causal attention + MLP, pre-LayerNorm, residual" : "causal attention, pre-LayerNorm, residual",
               c.d_model, c.steps, c.seed, ag::get_num_threads(), ag::get_num_threads() == 1 ? "" : "s");
    std::fflush(stdout);  // the header before the progress lines (stderr), also when piped
    std::vector<RunResult> runs;
    for (auto heads : c.heads) {
      RunResult r = train(c, heads);
      fmt::print("{} head{} (d_k = {}, {} parameters): test accuracy {:.1f}%, test loss {:.4f}, {:.1f} s\n", heads,
                 heads == 1 ? "" : "s", c.d_model / heads, r.parameters, 100 * r.accuracy, r.test_loss, r.seconds);
      for (std::size_t h = 0; h < r.focus.size(); ++h) {
        const auto& f = r.focus[h];
        fmt::print("  head {}: {:<15} mean weight {:.2f}   (previous {:.2f}, first {:.2f}, current {:.2f})\n", h + 1,
                   f.label, f.mean_weight, f.previous, f.first, f.current);
      }
      print_terminal_map(r);
      fmt::print("\n");
      std::fflush(stdout);
      runs.push_back(std::move(r));
    }
    if (runs.size() > 1) {
      const auto& one = runs.front();
      const auto& many = runs.back();
      fmt::print("{} heads vs 1 head: {:.1f}% vs {:.1f}% test accuracy ({:+.1f} points), same d_model and parameter "
                 "count ({} vs {})\n",
                 many.heads, 100 * many.accuracy, 100 * one.accuracy, 100 * (many.accuracy - one.accuracy), many.parameters,
                 one.parameters);
    }
    if (c.write_files) {
      std::filesystem::create_directories(c.out_dir);
      for (const auto& r : runs) write_attention_svg(r, fmt::format("{}/attention_{}_heads.svg", c.out_dir, r.heads));
      write_loss_svg(runs, c.out_dir + "/loss.svg", std::log(static_cast<double>(classes(c))));
      fmt::print("pictures: {0}/loss.svg, {0}/attention_<N>_heads.svg; trained models: {0}/model_<N>_heads.safetensors\n",
                 c.out_dir);
    }
    if (!c.summary.empty()) {
      write_summary(runs, c, c.summary);
      fmt::print("summary: {}\n", c.summary);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "train_heads: {}\n", e.what());
    return 1;
  }
  return 0;
}
