#include "report_terminal.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include <fmt/format.h>

namespace heads {

Progress::Progress(bool enabled, std::int64_t total, std::string label)
    : enabled_(enabled), tty_(::isatty(STDERR_FILENO) != 0), total_(total), label_(std::move(label)),
      start_(std::chrono::steady_clock::now()) {}

void Progress::update(std::int64_t step, double loss, double accuracy, bool force) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  const bool due = tty_ ? now - last_ > std::chrono::milliseconds(100)
                        : (step % std::max<std::int64_t>(total_ / 10, 1) == 0);
  if (!due && !force) return;
  last_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double rate = elapsed > 0 ? static_cast<double>(step) / elapsed : 0.0;
  const std::string line = fmt::format("[{}] step {:>5}/{}  loss {:.4f}  acc {:5.1f}%  {:.0f} steps/s", label_, step,
                                       total_, loss, 100 * accuracy, rate);
  if (tty_) {
    fmt::print(stderr, "\r{:<78}", line);
  } else {
    fmt::print(stderr, "{}\n", line);
  }
  std::fflush(stderr);
}

void Progress::finish() {
  if (enabled_ && tty_) fmt::print(stderr, "\n");
}

void print_job(const JobInfo& job) {
  fmt::print("task:  {}  (sequences of {} random tokens from {}; each position t >= 1 needs the previous\n"
             "       token and the first token at once)\n",
             job.task, job.seq_len, job.vocab);
  fmt::print("model: embeddings -> 1 block ({}) -> LayerNorm -> readout; d_model {}, {} steps, seed {}, {} thread{}\n\n",
             job.mlp ? "causal attention + MLP, pre-LayerNorm, residual" : "causal attention, pre-LayerNorm, residual",
             job.d_model, job.steps, job.seed, job.threads, job.threads == 1 ? "" : "s");
  std::fflush(stdout);  // the header before the progress lines (stderr), also when piped
}

namespace {

// A small shaded map per head, side by side: rows are query positions, columns key positions,
// each row labelled with its token.
void print_attention_map(const RunRecord& r) {
  const char* shades[] = {" ", "░", "▒", "▓", "█"};
  const AttentionSample& w = r.sample;
  const std::int64_t T = w.length;
  std::vector<std::string> titles;
  for (std::int64_t h = 0; h < w.heads; ++h)
    titles.push_back(fmt::format("head {}: {}", h + 1, r.focus[static_cast<std::size_t>(h)].label));
  auto title_width = [&](std::int64_t h) {
    return std::max<std::int64_t>(2 * T + 6, static_cast<std::int64_t>(titles[static_cast<std::size_t>(h)].size()) + 2);
  };
  fmt::print("  attention on a test sequence (rows: query positions, labelled by their token; columns: key position; ░▒▓█ = more weight)\n");
  std::string header = "    ";
  for (std::int64_t h = 0; h < w.heads; ++h) {
    std::string title = titles[static_cast<std::size_t>(h)];
    title.resize(static_cast<std::size_t>(title_width(h)), ' ');
    header += title;
  }
  fmt::print("{}\n", header);
  for (std::int64_t t = 0; t < T; ++t) {
    std::string line = fmt::format("  {:>2}", w.tokens[static_cast<std::size_t>(t)]);
    for (std::int64_t h = 0; h < w.heads; ++h) {
      line += " |";
      for (std::int64_t s = 0; s < T; ++s) {
        const int level = std::clamp(static_cast<int>(std::lround(w.at(h, t, s) * 4)), 0, 4);
        line += shades[level];
        line += shades[level];
      }
      line += "|";
      line += std::string(static_cast<std::size_t>(std::max<std::int64_t>(title_width(h) - 2 * T - 3, 1)), ' ');
    }
    fmt::print("{}\n", line);
  }
}

}  // namespace

void print_run(const RunRecord& r, const JobInfo& job) {
  fmt::print("{} head{} (d_k = {}, {} parameters): test accuracy {:.1f}%, test loss {:.4f}, {:.1f} s\n", r.heads,
             r.heads == 1 ? "" : "s", job.d_model / r.heads, r.parameters, 100 * r.accuracy, r.test_loss, r.seconds);
  for (std::size_t h = 0; h < r.focus.size(); ++h) {
    const auto& f = r.focus[h];
    fmt::print("  head {}: {:<15} mean weight {:.2f}   (previous {:.2f}, first {:.2f}, current {:.2f})\n", h + 1,
               f.label, f.mean_weight, f.previous, f.first, f.current);
    if (h < r.ablation.size())
      fmt::print("          ablated: test accuracy {:.1f}% with its z set to 0, {:.1f}% with z set to its mean\n",
                 100 * r.ablation[h].zero, 100 * r.ablation[h].mean);
  }
  print_attention_map(r);
  fmt::print("\n");
  std::fflush(stdout);
}

void print_comparison(const std::vector<RunRecord>& runs) {
  if (runs.size() < 2) return;
  const auto& one = runs.front();
  const auto& many = runs.back();
  fmt::print("{} heads vs 1 head: {:.1f}% vs {:.1f}% test accuracy ({:+.1f} points), same d_model and parameter "
             "count ({} vs {})\n",
             many.heads, 100 * many.accuracy, 100 * one.accuracy, 100 * (many.accuracy - one.accuracy), many.parameters,
             one.parameters);
}

}  // namespace heads
