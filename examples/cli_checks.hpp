#pragma once
// The examples' command-line checks of numbers: CLI11 validators whose messages say what the
// flag allows and what came ("--lr: must be a positive finite number, got '0'"), instead of a
// range ending in the largest double. Integers are read in decimal, in full ("010" is ten, "1e3"
// and "12abc" are refused); numbers must be finite (no "nan", "inf"). And the checks of the output
// files a program is asked to write, made before it does the work.
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "html_page.hpp"

namespace cli_checks {

namespace detail {

inline bool parse_integer(const std::string& text, std::int64_t& n) {
  const char* end = text.data() + text.size();
  const auto parsed = std::from_chars(text.data(), end, n);
  return parsed.ec == std::errc{} && parsed.ptr == end;
}

inline bool parse_finite(const std::string& text, double& x) {
  const char* end = text.data() + text.size();
  const auto parsed = std::from_chars(text.data(), end, x);
  return parsed.ec == std::errc{} && parsed.ptr == end && std::isfinite(x);
}

}  // namespace detail

// An integer in [low, high].
inline CLI::Validator integer_in(std::int64_t low, std::int64_t high = std::numeric_limits<std::int64_t>::max()) {
  const bool unbounded = high == std::numeric_limits<std::int64_t>::max();
  const std::string wanted = unbounded ? fmt::format("an integer >= {}", low)
                                       : fmt::format("an integer from {} to {}", low, high);
  return {[low, high, wanted](std::string& text) -> std::string {
            std::int64_t n = 0;
            if (!detail::parse_integer(text, n) || n < low || n > high)
              return fmt::format("must be {}, got '{}'", wanted, text);
            text = std::to_string(n);  // decimal, as written
            return {};
          },
          unbounded ? fmt::format("INT >= {}", low) : fmt::format("INT in [{}, {}]", low, high)};
}

inline CLI::Validator integer_at_least(std::int64_t low) { return integer_in(low); }

// A finite number > 0.
inline CLI::Validator positive_number() {
  return {[](std::string& text) -> std::string {
            double x = 0;
            if (!detail::parse_finite(text, x) || !(x > 0))
              return fmt::format("must be a positive finite number, got '{}'", text);
            return {};
          },
          "NUMBER > 0"};
}

// A finite number >= 0.
inline CLI::Validator non_negative_number() {
  return {[](std::string& text) -> std::string {
            double x = 0;
            if (!detail::parse_finite(text, x) || !(x >= 0))
              return fmt::format("must be a finite number >= 0, got '{}'", text);
            return {};
          },
          "NUMBER >= 0"};
}

// A number in [low, high) (high itself excluded).
inline CLI::Validator number_below(double low, double high) {
  return {[low, high](std::string& text) -> std::string {
            double x = 0;
            if (!detail::parse_finite(text, x) || !(x >= low && x < high))
              return fmt::format("must be a number >= {} and below {}, got '{}'", low, high, text);
            return {};
          },
          fmt::format("NUMBER in [{}, {})", low, high)};
}

// A number strictly between low and high.
inline CLI::Validator number_between(double low, double high) {
  return {[low, high](std::string& text) -> std::string {
            double x = 0;
            if (!detail::parse_finite(text, x) || !(x > low && x < high))
              return fmt::format("must be a number above {} and below {}, got '{}'", low, high, text);
            return {};
          },
          fmt::format("NUMBER in ({}, {})", low, high)};
}

// What is wrong with AdamW's lr and weight decay together (empty when nothing): its decoupled decay
// multiplies every weight by 1 - lr·weight_decay at each step, which must stay above 0.
inline std::string decay_problem(double lr, double weight_decay) {
  if (!(lr * weight_decay >= 1)) return {};
  return fmt::format("--lr {} times --weight-decay {} is {} >= 1: each step would multiply the weights by 1 - {} <= 0",
                     lr, weight_decay, lr * weight_decay, lr * weight_decay);
}

// A file name that is not empty (an output flag given with "" would otherwise write nothing).
inline CLI::Validator file_name() {
  return {[](std::string& text) -> std::string { return text.empty() ? "must be a file name, got ''" : ""; },
          ""};
}

// The last words of a program: "PROGRAM: MESSAGE" on stderr, without throwing even when stderr
// cannot be written (fmt::print would throw from inside the handler of the first error).
inline void report_error(const std::string& program, const std::string& message) noexcept {
  const std::string prefix = program + ": ";
  const std::string line = (message.starts_with(prefix) ? "" : prefix) + message + "\n";
  std::fputs(line.c_str(), stderr);
}

// A program's exit code once its work is done: 1, saying so on stderr, when what it printed to
// stdout could not all be written (a full disk, /dev/full), else `code`.
inline int finish_stdout(const std::string& program, int code) noexcept {
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    report_error(program, "writing the results to standard output failed");
    return 1;
  }
  return code;
}

// An output path given with `flag`, checked before the work (its directory exists, it is not a
// directory, a file can be written there) so that a typo does not cost the run; an existing file
// stays as it is. An empty path (the output not asked for) passes. Throws std::invalid_argument
// naming the flag and the path.
inline void check_output(const std::string& flag, const std::string& path) {
  if (path.empty()) return;
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)  // a name too long, a loop of links, ...
    throw std::invalid_argument(fmt::format("{} {}: {}", flag, path, ec.message()));
  if (std::filesystem::is_directory(status))
    throw std::invalid_argument(fmt::format("{} {}: is a directory, wanted a file name", flag, path));
  try {
    html::check_writable(path);
  } catch (const std::exception& e) {
    throw std::invalid_argument(fmt::format("{} {}: {}", flag, path, e.what()));
  }
}

// Each output (flag, path) checked by check_output, and no two of them the same file (throws
// naming both flags and the path); empty paths are skipped.
inline void check_outputs(const std::vector<std::pair<std::string, std::string>>& outputs) {
  for (const auto& [flag, path] : outputs) check_output(flag, path);
  // The file each path would write: its links followed, also a link to a file not there yet.
  const auto file = [](const std::string& path) {
    std::error_code ec;
    const auto absolute = std::filesystem::absolute(html::link_target(path), ec);
    const auto canonical = std::filesystem::weakly_canonical(absolute, ec);
    return ec ? absolute.lexically_normal() : canonical;
  };
  for (std::size_t i = 0; i < outputs.size(); ++i)
    for (std::size_t j = i + 1; j < outputs.size(); ++j)
      if (!outputs[i].second.empty() && !outputs[j].second.empty() &&
          file(outputs[i].second) == file(outputs[j].second))
        throw std::invalid_argument(fmt::format("{} and {} name the same file, {}", outputs[i].first,
                                                outputs[j].first, outputs[j].second));
}

}  // namespace cli_checks
