#pragma once
// JSON read strictly, for the texts nn takes from files (the safetensors header, the
// "headgrad.config" metadata): nlohmann's SAX events build the value, refusing what nlohmann's own
// DOM parser lets through: a key that appears twice in an object (it keeps the last), nesting
// deeper than a bound, integers that do not fit in 64 bits (it turns them into doubles, so the
// value read is not the value written), and a NUL byte (nlohmann's reader takes it for the end
// of the text, so whatever follows it would be ignored).
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "names.hpp"
#include "nn/checkpoint.hpp"

namespace nn::detail {

// `prefix` starts every message ("model.safetensors: corrupt header: "); `what` names the text in
// them ("header": "at header byte 12", "after the header object").
template <class Json>
class StrictJsonReader final : public nlohmann::json_sax<Json> {
  using Base = nlohmann::json_sax<Json>;

 public:
  StrictJsonReader(std::string prefix, std::string what, std::size_t max_depth)
      : prefix_(std::move(prefix)), what_(std::move(what)), max_depth_(max_depth) {}

  // Parses the whole of text; throws CheckpointError on every error.
  Json read(std::string_view text) {
    if (const auto nul = text.find('\0'); nul != std::string_view::npos)
      fail(fmt::format("a NUL byte at {} byte {}: JSON text holds none", what_, nul));
    nlohmann::json_sax<Json>* self = this;
    Json::sax_parse(text.begin(), text.end(), self);
    return std::move(root_);
  }

  bool null() override { return add(nullptr); }
  bool boolean(bool v) override { return add(v); }
  bool number_integer(typename Base::number_integer_t v) override { return add(v); }
  bool number_unsigned(typename Base::number_unsigned_t v) override { return add(v); }
  bool number_float(typename Base::number_float_t v, const typename Base::string_t& text) override {
    const std::size_t digits = !text.empty() && text[0] == '-' ? 1 : 0;
    if (text.size() > digits && text.find_first_not_of("0123456789", digits) == std::string::npos)
      fail(fmt::format("the integer {} does not fit in 64 bits", text));
    return add(v);
  }
  bool string(typename Base::string_t& v) override { return add(std::move(v)); }
  bool binary(typename Base::binary_t& v) override { return add(std::move(v)); }  // JSON text has none
  bool start_object(std::size_t) override { return open(Json::object()); }
  bool start_array(std::size_t) override { return open(Json::array()); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(typename Base::string_t& k) override {
    if (open_.back()->contains(k)) fail(fmt::format("key \"{}\" appears twice", printable_text(k)));
    key_ = std::move(k);
    return true;
  }

  bool parse_error(std::size_t byte, const std::string&, const nlohmann::detail::exception& e) override {
    if (closed_) fail(fmt::format("unexpected characters after the {} object (at {} byte {})", what_, what_, byte));
    std::string what = e.what();
    if (what.find("ill-formed UTF-8") != std::string::npos) fail(fmt::format("not valid UTF-8 (at {} byte {})", what_, byte));
    // nlohmann's text reads "[json.exception.parse_error.101] parse error at line 1, column 9:
    // syntax error while parsing value - invalid literal; last read: '...'". Only the part that
    // says what is wrong is kept (the bytes last read need not be valid UTF-8).
    if (const auto p = what.find("] "); p != std::string::npos) what.erase(0, p + 2);
    if (what.starts_with("parse error at ")) {
      if (const auto p = what.find(": "); p != std::string::npos) what.erase(0, p + 2);
    }
    if (const auto p = what.find("; last read"); p != std::string::npos) what.erase(p);
    fail(fmt::format("{} (at {} byte {})", printable_text(what), what_, byte));
    return false;  // (not reached: fail throws)
  }

 private:
  [[noreturn]] void fail(const std::string& message) const { throw CheckpointError(prefix_ + message); }

  bool add(Json v) {
    place(std::move(v));
    return true;
  }
  Json* place(Json v) {
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Json& top = *open_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    return &(top[key_] = std::move(v));
  }
  // (A pointer into the innermost container stays valid: nothing is added to its parent until it closes.)
  bool open(Json container) {
    if (open_.size() >= max_depth_) fail(fmt::format("nesting is deeper than {} levels", max_depth_));
    open_.push_back(place(std::move(container)));
    return true;
  }
  bool close() {
    open_.pop_back();
    closed_ = open_.empty();
    return true;
  }

  std::string prefix_, what_;
  std::size_t max_depth_;
  Json root_;
  std::vector<Json*> open_;  // the containers being filled, innermost last
  std::string key_;          // the key of the next member of the innermost object
  bool closed_ = false;      // the outermost value is complete
};

}  // namespace nn::detail
