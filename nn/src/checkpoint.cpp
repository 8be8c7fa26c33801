#include "nn/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <utility>
#include <vector>

namespace nn {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; headgrad's reader and writer assume a little-endian host");

namespace {

[[noreturn]] void fail_file(std::string_view source, const std::string& message) {
  throw CheckpointError(fmt::format("{}: {}", source, message));
}

// ---- a small JSON reader: enough for any safetensors header, strict about syntax ----

struct Json {
  // Special members defined out of line, after Json is complete: clang (with libstdc++) cannot
  // instantiate std::pair<std::string, Json> inside Json's own definition (fuzz/run.sh builds
  // this file with clang).
  Json();
  Json(const Json&);
  Json(Json&&) noexcept;
  Json& operator=(const Json&);
  Json& operator=(Json&&) noexcept;
  ~Json();

  enum class Kind { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  std::string text;  // a string's value, or a number's literal text
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> members;  // in file order, keys unique
};
Json::Json() = default;
Json::Json(const Json&) = default;
Json::Json(Json&&) noexcept = default;
Json& Json::operator=(const Json&) = default;
Json& Json::operator=(Json&&) noexcept = default;
Json::~Json() = default;

const char* kind_name(Json::Kind k) {
  switch (k) {
    case Json::Kind::Null: return "null";
    case Json::Kind::Bool: return "a boolean";
    case Json::Kind::Number: return "a number";
    case Json::Kind::String: return "a string";
    case Json::Kind::Array: return "an array";
    case Json::Kind::Object: return "an object";
  }
  return "?";
}

class JsonParser {
 public:
  JsonParser(std::string_view text, std::string_view source) : s_(text), source_(source) {}

  Json parse_document() {
    skip_space();
    Json v = parse_value(0);
    skip_space();
    if (pos_ != s_.size()) error("unexpected characters after the header object");
    return v;
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    fail_file(source_, fmt::format("corrupt header: {} (at header byte {})", what, pos_));
  }
  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }
  void skip_space() {
    while (!at_end() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  void expect(char c) {
    if (peek() != c) error(at_end() ? fmt::format("expected '{}' but the header ended", c)
                                    : fmt::format("expected '{}', found '{}'", c, s_[pos_]));
    ++pos_;
  }
  void expect_word(std::string_view w) {
    if (s_.substr(pos_, w.size()) != w) error("invalid literal");
    pos_ += w.size();
  }

  Json parse_value(int depth) {
    if (depth > 64) error("nesting is deeper than 64 levels");
    Json v;
    switch (peek()) {
      case '{': parse_object(v, depth); break;
      case '[': parse_array(v, depth); break;
      case '"': v.kind = Json::Kind::String; v.text = parse_string(); break;
      case 't': expect_word("true"); v.kind = Json::Kind::Bool; v.boolean = true; break;
      case 'f': expect_word("false"); v.kind = Json::Kind::Bool; break;
      case 'n': expect_word("null"); break;
      default:
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) {
          v.kind = Json::Kind::Number;
          v.text = parse_number();
        } else {
          error(at_end() ? "the header ended where a value was expected" : "expected a value");
        }
    }
    return v;
  }

  void parse_object(Json& v, int depth) {
    v.kind = Json::Kind::Object;
    expect('{');
    skip_space();
    if (peek() == '}') { ++pos_; return; }
    std::set<std::string> keys;
    while (true) {
      skip_space();
      if (peek() != '"') error("expected a string key");
      std::string key = parse_string();
      if (!keys.insert(key).second) error(fmt::format("key \"{}\" appears twice", key));
      skip_space();
      expect(':');
      skip_space();
      Json value = parse_value(depth + 1);
      v.members.emplace_back(std::move(key), std::move(value));
      skip_space();
      if (peek() == ',') { ++pos_; continue; }
      expect('}');
      return;
    }
  }

  void parse_array(Json& v, int depth) {
    v.kind = Json::Kind::Array;
    expect('[');
    skip_space();
    if (peek() == ']') { ++pos_; return; }
    while (true) {
      skip_space();
      v.items.push_back(parse_value(depth + 1));
      skip_space();
      if (peek() == ',') { ++pos_; continue; }
      expect(']');
      return;
    }
  }

  std::string parse_number() {
    const std::size_t start = pos_;
    auto digits = [&] {
      const std::size_t d = pos_;
      while (!at_end() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      return pos_ - d;
    };
    if (peek() == '-') ++pos_;
    if (peek() == '0') {
      ++pos_;
    } else if (digits() == 0) {
      error("invalid number");
    }
    if (peek() == '.') {
      ++pos_;
      if (digits() == 0) error("invalid number: no digits after '.'");
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (digits() == 0) error("invalid number: no digits in the exponent");
    }
    return std::string(s_.substr(start, pos_ - start));
  }

  unsigned parse_hex4() {
    if (pos_ + 4 > s_.size()) error("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<unsigned>(c - 'A' + 10);
      else error("invalid \\u escape");
    }
    return v;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string parse_string() {
    expect('"');
    std::string out;
    while (true) {
      if (at_end()) error("unterminated string");
      const char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) error("control character inside a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_end()) error("unterminated escape");
      const char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = parse_hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (s_.substr(pos_, 2) != "\\u") error("unpaired surrogate in \\u escape");
            pos_ += 2;
            const unsigned low = parse_hex4();
            if (low < 0xDC00 || low > 0xDFFF) error("unpaired surrogate in \\u escape");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            error("unpaired surrogate in \\u escape");
          }
          append_utf8(out, cp);
          break;
        }
        default: error(fmt::format("invalid escape '\\{}'", e));
      }
    }
  }

  std::string_view s_;
  std::string_view source_;
  std::size_t pos_ = 0;
};

bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n;
    std::uint32_t cp;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xE0) == 0xC0) { n = 1; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { n = 2; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { n = 3; cp = c & 0x07; }
    else return false;
    if (i + n >= s.size()) return false;
    for (std::size_t k = 1; k <= n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += n + 1;
  }
  return true;
}

// ---- JSON writing (serde_json's escaping, so headers match Python's byte for byte) ----

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)));
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

std::string_view st_dtype(ag::Dtype d) { return d == ag::Dtype::Float32 ? "F32" : "F64"; }

// ---- reading helpers ----

// A non-negative integer literal that fits in 64 bits.
std::uint64_t as_u64(const Json& v, std::string_view source, const std::string& what) {
  if (v.kind != Json::Kind::Number) fail_file(source, fmt::format("corrupt header: {} is {}, not an integer", what, kind_name(v.kind)));
  const std::string& t = v.text;
  if (t.empty() || !std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; }))
    fail_file(source, fmt::format("corrupt header: {} is {}, not a non-negative integer", what, t));
  std::uint64_t out = 0;
  for (const char c : t) {
    const auto d = static_cast<std::uint64_t>(c - '0');
    if (out > (std::numeric_limits<std::uint64_t>::max() - d) / 10)
      fail_file(source, fmt::format("corrupt header: {} ({}) does not fit in 64 bits", what, t));
    out = out * 10 + d;
  }
  return out;
}

struct Entry {
  std::string name;
  ag::Dtype dtype;
  ag::Shape shape;
  std::uint64_t begin, end;
};

std::function<void(std::size_t)>& save_hook() {
  static std::function<void(std::size_t)> hook;
  return hook;
}

void write_atomically(const std::string& path, std::string_view bytes) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  if (target.filename().empty()) throw CheckpointError(fmt::format("{}: not a file name", path));
  static std::atomic<unsigned> counter{0};
  const std::string tmp = fmt::format("{}.tmp.{}.{}", path, ::getpid(), counter++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0)
    throw CheckpointError(fmt::format("{}: cannot create the temporary file {}: {}", path, tmp, std::strerror(errno)));
  try {
    constexpr std::size_t chunk = std::size_t{1} << 16;
    std::size_t written = 0;
    while (written < bytes.size()) {
      if (save_hook()) save_hook()(written);
      const std::size_t n = std::min(chunk, bytes.size() - written);
      const ssize_t r = ::write(fd, bytes.data() + written, n);
      if (r < 0) {
        if (errno == EINTR) continue;
        throw CheckpointError(fmt::format("{}: writing {} failed: {}", path, tmp, std::strerror(errno)));
      }
      written += static_cast<std::size_t>(r);
    }
    if (::fsync(fd) != 0)
      throw CheckpointError(fmt::format("{}: flushing {} to disk failed: {}", path, tmp, std::strerror(errno)));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw CheckpointError(fmt::format("{}: closing {} failed: {}", path, tmp, std::strerror(err)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw CheckpointError(fmt::format("{}: renaming {} over it failed: {}", path, tmp, std::strerror(err)));
  }
  // Make the rename itself durable.
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw CheckpointError(fmt::format("{}: read error", path));
  return bytes;
}

// Pairs each parameter with its tensor from the file after checking names, shapes and dtypes;
// collects every problem into one message.
std::vector<std::pair<ag::Tensor, ag::Tensor>> plan_parameter_load(const NamedTensors& params,
                                                                   const NamedTensors& stored,
                                                                   const LoadOptions& options,
                                                                   const std::string& where,
                                                                   const std::string& prefix = "") {
  std::vector<std::pair<ag::Tensor, ag::Tensor>> plan;
  std::vector<std::string> missing, extra, problems;
  std::set<std::string> param_names;
  for (const auto& [name, p] : params) param_names.insert(name);
  for (const auto& [name, p] : params) {
    // (an init-capture: clang before 16 cannot capture a structured binding)
    const auto it = std::find_if(stored.begin(), stored.end(), [&n = name](const auto& e) { return e.first == n; });
    if (it == stored.end()) {
      missing.push_back("'" + prefix + name + "'");
      continue;
    }
    const ag::Tensor& t = it->second;
    if (t.shape() != p.shape()) {
      problems.push_back(fmt::format("'{}{}' has shape {} in the file but the parameter is {}", prefix, name,
                                     ag::shape_str(t.shape()), ag::shape_str(p.shape())));
      continue;
    }
    if (t.dtype() != p.dtype() && !options.convert_dtype) {
      problems.push_back(fmt::format("'{}{}' is {} in the file but the parameter is {}", prefix, name,
                                     st_dtype(t.dtype()), st_dtype(p.dtype())));
      continue;
    }
    plan.emplace_back(p, t);
  }
  for (const auto& [name, t] : stored)
    if (!param_names.count(name)) extra.push_back("'" + prefix + name + "'");
  std::string message;
  auto add = [&](const std::string& part) { message += (message.empty() ? "" : "; ") + part; };
  auto join = [](const std::vector<std::string>& xs) {
    std::string s;
    for (std::size_t i = 0; i < xs.size() && i < 20; ++i) s += (i ? ", " : "") + xs[i];
    if (xs.size() > 20) s += fmt::format(" and {} more", xs.size() - 20);
    return s;
  };
  if (options.strict && !missing.empty()) add("missing tensors " + join(missing));
  if (options.strict && !extra.empty()) add("unexpected tensors " + join(extra));
  for (const auto& p : problems) add(p);
  if (!message.empty()) throw CheckpointError(fmt::format("{}: {}; no parameter was changed", where, message));
  return plan;
}

void apply_plan(const std::vector<std::pair<ag::Tensor, ag::Tensor>>& plan) {
  ag::NoGradGuard no_grad;
  for (const auto& [param, value] : plan) {
    ag::Tensor p = param;
    p.copy_(value);
  }
}

}  // namespace

// ---- the format ----

std::string serialize_safetensors(const NamedTensors& tensors, const Metadata& metadata) {
  std::vector<std::size_t> order(tensors.size());
  std::set<std::string> names;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    if (name == "__metadata__") throw CheckpointError("save_safetensors: '__metadata__' is reserved, not a tensor name");
    if (!t.defined()) throw CheckpointError(fmt::format("save_safetensors: tensor '{}' is undefined", name));
    if (!names.insert(name).second) throw CheckpointError(fmt::format("save_safetensors: tensor name '{}' appears twice", name));
    if (!valid_utf8(name)) throw CheckpointError("save_safetensors: a tensor name is not valid UTF-8");
    order[i] = i;
  }
  for (const auto& [k, v] : metadata)
    if (!valid_utf8(k) || !valid_utf8(v)) throw CheckpointError("save_safetensors: metadata is not valid UTF-8");
  // Python's order: larger dtype first, then by name.
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const auto sa = ag::dtype_size(tensors[a].second.dtype()), sb = ag::dtype_size(tensors[b].second.dtype());
    if (sa != sb) return sa > sb;
    return tensors[a].first < tensors[b].first;
  });
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!first) header += ',';
      first = false;
      append_json_string(header, k);
      header += ':';
      append_json_string(header, v);
    }
    header += "}";
  }
  std::uint64_t offset = 0;
  for (std::size_t i : order) {
    const auto& [name, t] = tensors[i];
    const std::uint64_t bytes = static_cast<std::uint64_t>(t.numel()) * ag::dtype_size(t.dtype());
    if (header.size() > 1) header += ',';
    append_json_string(header, name);
    header += fmt::format(":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}", st_dtype(t.dtype()),
                          fmt::join(t.shape(), ","), offset, offset + bytes);
    offset += bytes;
  }
  header += '}';
  header.append((8 - header.size() % 8) % 8, ' ');

  std::string out;
  out.reserve(8 + header.size() + offset);
  const std::uint64_t n = header.size();
  for (int b = 0; b < 8; ++b) out += static_cast<char>((n >> (8 * b)) & 0xFF);
  out += header;
  for (std::size_t i : order) {
    const ag::Tensor& t = tensors[i].second;
    out.append(static_cast<const char*>(t.raw_data()), static_cast<std::size_t>(t.numel()) * ag::dtype_size(t.dtype()));
  }
  return out;
}

SafetensorsData parse_safetensors(std::string_view bytes, std::string_view source) {
  if (bytes.size() < 8)
    fail_file(source, fmt::format("file is {} bytes, too short for the 8-byte header length (truncated?)", bytes.size()));
  std::uint64_t n = 0;
  for (int b = 7; b >= 0; --b) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(b)]);
  const std::uint64_t available = bytes.size() - 8;
  if (n > available)
    fail_file(source, fmt::format("header length {} is more than the {} bytes after it: the file is truncated or corrupt",
                                  n, available));
  if (n > (std::uint64_t{100} << 20)) fail_file(source, fmt::format("header length {} is over 100 MB: corrupt", n));
  const std::string_view header = bytes.substr(8, static_cast<std::size_t>(n));
  if (header.empty() || header[0] != '{') fail_file(source, "corrupt header: it does not start with '{'");
  if (!valid_utf8(header)) fail_file(source, "corrupt header: not valid UTF-8");
  const Json root = JsonParser(header, source).parse_document();
  if (root.kind != Json::Kind::Object) fail_file(source, "corrupt header: not a JSON object");

  const std::string_view data = bytes.substr(8 + static_cast<std::size_t>(n));
  SafetensorsData out;
  std::vector<Entry> entries;
  for (const auto& [name, info] : root.members) {
    if (name == "__metadata__") {
      if (info.kind == Json::Kind::Null) continue;
      if (info.kind != Json::Kind::Object) fail_file(source, fmt::format("corrupt header: __metadata__ is {}, not an object", kind_name(info.kind)));
      for (const auto& [k, v] : info.members) {
        if (v.kind != Json::Kind::String)
          fail_file(source, fmt::format("corrupt header: metadata \"{}\" is {}, not a string", k, kind_name(v.kind)));
        out.metadata[k] = v.text;
      }
      continue;
    }
    const std::string what = fmt::format("tensor '{}'", name);
    if (info.kind != Json::Kind::Object) fail_file(source, fmt::format("corrupt header: {} is {}, not an object", what, kind_name(info.kind)));
    const Json *dtype = nullptr, *shape = nullptr, *offsets = nullptr;
    for (const auto& [k, v] : info.members) {
      if (k == "dtype") dtype = &v;
      else if (k == "shape") shape = &v;
      else if (k == "data_offsets") offsets = &v;
      else fail_file(source, fmt::format("corrupt header: {} has an unknown field \"{}\"", what, k));
    }
    if (!dtype || !shape || !offsets)
      fail_file(source, fmt::format("corrupt header: {} lacks \"{}\"", what, !dtype ? "dtype" : !shape ? "shape" : "data_offsets"));
    if (dtype->kind != Json::Kind::String) fail_file(source, fmt::format("corrupt header: {}'s dtype is not a string", what));
    Entry e;
    e.name = name;
    if (dtype->text == "F32") {
      e.dtype = ag::Dtype::Float32;
    } else if (dtype->text == "F64") {
      e.dtype = ag::Dtype::Float64;
    } else {
      static const std::set<std::string> known = {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F4", "F6_E2M3",
                                                  "F6_E3M2", "I16", "U16", "F16", "BF16", "I32", "U32", "I64", "U64", "C64"};
      if (known.count(dtype->text))
        fail_file(source, fmt::format("{} has dtype {}; headgrad reads F32 and F64 only", what, dtype->text));
      fail_file(source, fmt::format("corrupt header: {} has an unknown dtype \"{}\"", what, dtype->text));
    }
    if (shape->kind != Json::Kind::Array) fail_file(source, fmt::format("corrupt header: {}'s shape is not an array", what));
    std::uint64_t numel = 1;
    bool overflow = false;
    for (std::size_t i = 0; i < shape->items.size(); ++i) {
      const std::uint64_t d = as_u64(shape->items[i], source, fmt::format("{}'s shape[{}]", what, i));
      if (d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) overflow = true;
      if (d != 0 && numel > std::numeric_limits<std::uint64_t>::max() / 8 / d) overflow = true;
      numel *= d;
      e.shape.push_back(static_cast<std::int64_t>(d));
    }
    if (overflow) fail_file(source, fmt::format("corrupt header: {}'s shape {} is too large", what, ag::shape_str(e.shape)));
    if (offsets->kind != Json::Kind::Array || offsets->items.size() != 2)
      fail_file(source, fmt::format("corrupt header: {}'s data_offsets must be [begin, end]", what));
    e.begin = as_u64(offsets->items[0], source, what + "'s data_offsets[0]");
    e.end = as_u64(offsets->items[1], source, what + "'s data_offsets[1]");
    if (e.end < e.begin)
      fail_file(source, fmt::format("corrupt header: {}'s data_offsets [{}, {}] end before they begin", what, e.begin, e.end));
    const std::uint64_t expected = numel * ag::dtype_size(e.dtype);
    if (e.end - e.begin != expected)
      fail_file(source, fmt::format("corrupt header: {} {} {} needs {} bytes but data_offsets [{}, {}] hold {}", what,
                                    dtype->text, ag::shape_str(e.shape), expected, e.begin, e.end, e.end - e.begin));
    entries.push_back(std::move(e));
  }
  // The tensors must tile the data section exactly.
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t cursor = 0;
  for (const auto& e : entries) {
    if (e.begin < cursor)
      fail_file(source, fmt::format("corrupt header: tensor '{}' at bytes [{}, {}] overlaps the tensor before it", e.name,
                                    e.begin, e.end));
    if (e.begin > cursor)
      fail_file(source, fmt::format("corrupt header: {} bytes of data before tensor '{}' belong to no tensor",
                                    e.begin - cursor, e.name));
    cursor = e.end;
  }
  if (cursor > data.size())
    fail_file(source, fmt::format("the tensors need {} bytes of data but the file has {} after the header: the file is "
                                  "truncated", cursor, data.size()));
  if (cursor < data.size())
    fail_file(source, fmt::format("{} bytes of data after the last tensor belong to no tensor: the file is corrupt",
                                  data.size() - cursor));
  for (const auto& e : entries) {
    ag::Tensor t = ag::Tensor::empty(e.shape, e.dtype);
    if (e.end > e.begin) std::memcpy(t.raw_data(), data.data() + e.begin, static_cast<std::size_t>(e.end - e.begin));
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata) {
  write_atomically(path, serialize_safetensors(tensors, metadata));
}

SafetensorsData load_safetensors(const std::string& path) { return parse_safetensors(read_file(path), path); }

// ---- modules ----

void save_parameters(const Module& module, const std::string& path, const Metadata& metadata) {
  NamedTensors tensors;
  for (const auto& [name, p] : module.named_parameters()) tensors.emplace_back(name, p.detach());
  save_safetensors(path, tensors, metadata);
}

Metadata load_parameters(Module& module, const std::string& path, const LoadOptions& options) {
  SafetensorsData data = load_safetensors(path);
  const auto plan = plan_parameter_load(module.named_parameters(), data.tensors, options,
                                        fmt::format("load_parameters: {}", path));
  apply_plan(plan);
  return data.metadata;
}

// ---- checkpoints ----

namespace {
constexpr const char* kFormat = "headgrad.checkpoint";
}

void save_checkpoint(const std::string& path, const Module& module, const Optimizer& optimizer, const Metadata& metadata) {
  Metadata meta = metadata;
  for (const char* key : {"format", "optimizer"})
    if (meta.count(key)) throw CheckpointError(fmt::format("save_checkpoint: metadata key '{}' is reserved", key));
  meta["format"] = kFormat;
  meta["optimizer"] = optimizer.name();
  NamedTensors tensors;
  for (const auto& [name, p] : module.named_parameters()) tensors.emplace_back("model." + name, p.detach());
  for (auto& [name, t] : optimizer.state_dict()) tensors.emplace_back("optimizer." + name, t);
  save_safetensors(path, tensors, meta);
}

Metadata load_checkpoint(const std::string& path, Module& module, Optimizer& optimizer) {
  const std::string where = fmt::format("load_checkpoint: {}", path);
  SafetensorsData data = load_safetensors(path);
  const auto format = data.metadata.find("format");
  if (format == data.metadata.end() || format->second != kFormat)
    throw CheckpointError(fmt::format("{}: not a headgrad checkpoint (metadata \"format\" is not \"{}\"); a plain "
                                      "parameter file loads with load_parameters",
                                      where, kFormat));
  const auto opt_name = data.metadata.find("optimizer");
  if (opt_name == data.metadata.end() || opt_name->second != optimizer.name())
    throw CheckpointError(fmt::format("{}: the checkpoint holds {} state but the optimizer is {}; nothing was changed",
                                      where, opt_name == data.metadata.end() ? "no optimizer" : opt_name->second,
                                      optimizer.name()));
  NamedTensors model_part, optimizer_part;
  std::vector<std::string> stray;
  for (auto& [name, t] : data.tensors) {
    if (name.rfind("model.", 0) == 0) model_part.emplace_back(name.substr(6), t);
    else if (name.rfind("optimizer.", 0) == 0) optimizer_part.emplace_back(name.substr(10), t);
    else stray.push_back("'" + name + "'");
  }
  if (!stray.empty())
    throw CheckpointError(fmt::format("{}: unexpected tensors {} (neither model.* nor optimizer.*); nothing was changed",
                                      where, fmt::join(stray, ", ")));
  const auto plan = plan_parameter_load(module.named_parameters(), model_part, LoadOptions{}, where, "model.");
  try {
    optimizer.check_state_dict(optimizer_part);
  } catch (const std::invalid_argument& e) {
    throw CheckpointError(fmt::format("{}: optimizer state: {}; nothing was changed", where, e.what()));
  }
  apply_plan(plan);
  optimizer.load_state_dict(optimizer_part);
  return data.metadata;
}

namespace detail {
void set_save_hook(std::function<void(std::size_t)> hook) { save_hook() = std::move(hook); }
}  // namespace detail

}  // namespace nn
