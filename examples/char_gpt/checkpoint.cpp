// char_gpt's checkpoints: nn::save_checkpoint's file (parameters and optimizer state) with the
// rest of a run's state in its metadata, as strings:
//   char_gpt.config     the settings (TrainConfig::to_json)
//   char_gpt.vocab      the vocabulary's characters in order, UTF-8
//   char_gpt.corpus     the number of tokens and token_hash() of the corpus
//   char_gpt.step       optimizer steps taken
//   char_gpt.generators the batch sampler's state, then each dropout generator's (JSON array)
//   char_gpt.history    the training losses and the evaluations (JSON)
#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "trainer.hpp"

namespace char_gpt {

namespace {

const std::string& entry(const nn::Metadata& meta, const std::string& key, const std::string& path) {
  const auto it = meta.find(key);
  if (it == meta.end())
    throw std::runtime_error(fmt::format("char_gpt: {} is not a char_gpt checkpoint (no metadata '{}')", path, key));
  return it->second;
}

nlohmann::json parse_entry(const nn::Metadata& meta, const std::string& key, const std::string& path) {
  try {
    return nlohmann::json::parse(entry(meta, key, path));
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(fmt::format("char_gpt: {}: metadata '{}' is not valid JSON: {}", path, key, e.what()));
  }
}

// The settings a run must share with its checkpoint to resume it: all but where it ends.
nlohmann::json resumable_json(const TrainConfig& c) {
  nlohmann::json j = c.to_json();
  j.erase("max_iters");
  j["lr_decay_iters"] = c.decay_iters();
  return j;
}

nlohmann::json history_json(const History& h) {
  nlohmann::json evals = nlohmann::json::array();
  for (const auto& e : h.evals) evals.push_back({e.step, e.train, e.val});
  return {{"train_losses", h.train_losses}, {"evals", evals}};
}

History history_from(const nlohmann::json& j) {
  History h;
  j.at("train_losses").get_to(h.train_losses);
  for (const auto& e : j.at("evals")) h.evals.push_back({e.at(0).get<std::int64_t>(), e.at(1), e.at(2)});
  return h;
}

}  // namespace

nn::Metadata Trainer::metadata() const {
  nlohmann::json generators = nlohmann::json::array({sampler_.state()});
  for (const ag::Generator* g : model_->dropout_generators()) generators.push_back(g->state());
  return {{"char_gpt.config", config_.to_json().dump()},
          {"char_gpt.vocab", encode_utf8(vocab_.chars())},
          {"char_gpt.corpus", nlohmann::json{data_.train.size() + data_.val.size(), data_hash_}.dump()},
          {"char_gpt.step", std::to_string(step_)},
          {"char_gpt.generators", generators.dump()},
          {"char_gpt.history", history_json(history_).dump()}};
}

void Trainer::save(const std::string& path) const { nn::save_checkpoint(path, *model_, *optimizer_, metadata()); }

void Trainer::load(const std::string& path) {
  // Everything is checked against this trainer before anything changes.
  const CheckpointInfo info = read_checkpoint_info(path);
  if (resumable_json(info.config) != resumable_json(config_))
    throw std::runtime_error(fmt::format("char_gpt: {} was trained with other settings: {} (this run: {})", path,
                                         resumable_json(info.config).dump(), resumable_json(config_).dump()));
  if (info.vocab.chars() != vocab_.chars())
    throw std::runtime_error(fmt::format("char_gpt: {} has another vocabulary ({} characters; this corpus: {})",
                                         path, info.vocab.size(), vocab_.size()));
  const nn::Metadata meta = nn::load_safetensors(path).metadata;
  const nlohmann::json corpus = parse_entry(meta, "char_gpt.corpus", path);
  const nlohmann::json here = {data_.train.size() + data_.val.size(), data_hash_};
  if (corpus != here)
    throw std::runtime_error(fmt::format("char_gpt: {} was trained on another corpus (tokens and hash {}, this "
                                         "corpus {})",
                                         path, corpus.dump(), here.dump()));
  const nlohmann::json generators = parse_entry(meta, "char_gpt.generators", path);
  const auto dropout = model_->dropout_generators();
  History history;
  try {
    if (!generators.is_array() || generators.size() != dropout.size() + 1)
      throw std::runtime_error(fmt::format("{} generator states for {}", generators.size(), dropout.size() + 1));
    history = history_from(parse_entry(meta, "char_gpt.history", path));
    if (static_cast<std::int64_t>(history.train_losses.size()) != info.step)
      throw std::runtime_error(fmt::format("{} losses for {} steps", history.train_losses.size(), info.step));
  } catch (const std::exception& e) {
    throw std::runtime_error(fmt::format("char_gpt: {}: damaged run state: {}", path, e.what()));
  }
  nn::load_checkpoint(path, *model_, *optimizer_);  // checks every tensor first, then changes them
  sampler_.set_state(generators.at(0).get<std::uint64_t>());
  for (std::size_t i = 0; i < dropout.size(); ++i) dropout[i]->manual_seed(generators.at(i + 1).get<std::uint64_t>());
  step_ = info.step;
  history.train_losses.reserve(static_cast<std::size_t>(config_.max_iters));
  history_ = std::move(history);
  scheduler_->set_step(step_);
}

CheckpointInfo read_checkpoint_info(const std::string& path) {
  const nn::Metadata meta = nn::load_safetensors(path).metadata;
  CheckpointInfo info;
  try {
    info.config = TrainConfig::from_json(parse_entry(meta, "char_gpt.config", path));
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(fmt::format("char_gpt: {}: {}", path, e.what()));
  }
  const std::u32string chars = decode_utf8(entry(meta, "char_gpt.vocab", path), path + " (vocabulary)");
  info.vocab = Vocabulary(chars);
  if (info.vocab.chars() != chars || info.vocab.size() != info.config.model.vocab_size)
    throw std::runtime_error(fmt::format("char_gpt: {}: the vocabulary ({} characters) is not sorted and distinct "
                                         "or does not match vocab_size {}",
                                         path, chars.size(), info.config.model.vocab_size));
  const std::string& step = entry(meta, "char_gpt.step", path);
  try {
    std::size_t used = 0;
    info.step = std::stoll(step, &used);
    if (used != step.size() || info.step < 0) throw std::invalid_argument("not a count");
  } catch (const std::exception&) {
    throw std::runtime_error(fmt::format("char_gpt: {}: step '{}' is not a count of steps", path, step));
  }
  return info;
}

std::unique_ptr<Gpt> load_model(const std::string& path, const CheckpointInfo& info) {
  ag::Generator gen(0);  // the values are replaced by the checkpoint's
  auto model = std::make_unique<Gpt>(info.config.model, gen);
  const nn::NamedTensors named = model->named_parameters();
  GroupedAdamW optimizer(named, decay_mask(named), {.lr = info.config.lr});
  nn::load_checkpoint(path, *model, optimizer);
  return model;
}

}  // namespace char_gpt
