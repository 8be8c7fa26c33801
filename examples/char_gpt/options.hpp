#pragma once
// char_gpt's command line: nanoGPT's flag names (with dashes) for the settings, plus the
// program's own (--data, --out, --resume, --sample, --threads, ...).
#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "sample.hpp"
#include "trainer.hpp"

namespace char_gpt {

struct Options {
  TrainConfig config;
  std::string data = kDefaultCorpus;
  std::string out = "char_gpt_out";
  std::int64_t log_interval = 10;
  int threads = 1;
  bool resume = false;       // continue <out>/ckpt.safetensors
  bool sample_only = false;  // --sample: only sample from <out>/ckpt.safetensors
  bool quiet = false;
  bool full_eval = true;     // the full validation loss at the end
  std::int64_t stop_at = 0;  // > 0: stop (save and exit) at this step, as if interrupted
  std::string save_init;     // the initial parameters, for benchmarks/char_gpt_torch.py parity
  std::string start = "\n";  // the sample's prompt
  bool start_given = false;  // --start on the command line
  SampleOptions sample;
  std::vector<std::string> given_settings;  // setting flags given on the command line

  std::string checkpoint() const;
};

void add_options(CLI::App& app, Options& o);
// Checks that involve several options; throws std::invalid_argument saying what is wrong.
void finish_options(const CLI::App& app, Options& o);
// A resumed run keeps the checkpoint's settings: any setting flag but --max-iters is refused
// (std::invalid_argument naming it); --max-iters moves the end, with the learning-rate schedule
// pinned to the checkpoint's.
TrainConfig resumed_config(const Options& o, const TrainConfig& checkpoint);
// The sample's prompt (--start) as tokens of vocab: std::invalid_argument naming --start and the
// first character the corpus does not have. An empty prompt, and the default one (a newline) when
// the corpus has no newline, is the vocabulary's first character.
std::vector<std::int32_t> prompt_tokens(const Options& o, const Vocabulary& vocab);

}  // namespace char_gpt
