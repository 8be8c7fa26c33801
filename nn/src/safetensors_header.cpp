// The safetensors header: JSON text <-> tensor entries and metadata, through nlohmann-json.
#include <limits>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "safetensors.hpp"
#include "strict_json.hpp"

namespace nn::detail {

namespace {

using json = nlohmann::json;
constexpr std::size_t kMaxDepth = 64;

template <class... Args>
[[noreturn]] void corrupt(std::string_view source, fmt::format_string<Args...> f, Args&&... args) {
  throw CheckpointError(fmt::format("{}: corrupt header: {}", source, fmt::format(f, std::forward<Args>(args)...)));
}

const char* kind_name(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

// A non-negative integer that fits in 64 bits.
std::uint64_t read_u64(const json& v, std::string_view source, const std::string& what) {
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  if (!v.is_number()) corrupt(source, "{} is {}, not an integer", what, kind_name(v));
  corrupt(source, "{} is {}, not a non-negative integer", what, v.dump());
}

void read_metadata(const json& v, std::string_view source, Metadata& out) {
  if (v.is_null()) return;
  if (!v.is_object()) corrupt(source, "__metadata__ is {}, not an object", kind_name(v));
  for (const auto& item : v.items()) {
    if (!item.value().is_string())
      corrupt(source, "metadata \"{}\" is {}, not a string", printable_text(item.key()), kind_name(item.value()));
    out[item.key()] = item.value().get<std::string>();
  }
}

ag::Dtype read_dtype(const json& v, std::string_view source, const std::string& what) {
  if (!v.is_string()) corrupt(source, "{}'s dtype is not a string", what);
  const auto& name = v.get_ref<const std::string&>();
  if (name == "F32") return ag::Dtype::Float32;
  if (name == "F64") return ag::Dtype::Float64;
  if (name == "I64") return ag::Dtype::Int64;
  static const std::set<std::string, std::less<>> known = {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
                                                           "F4", "F6_E2M3", "F6_E3M2", "I16", "U16", "F16",
                                                           "BF16", "I32", "U32", "U64", "C64"};
  if (known.count(name))
    throw CheckpointError(fmt::format("{}: {} has dtype {}; headgrad reads F32 and F64 only, plus I64 for integer tensors", source, what, name));
  corrupt(source, "{} has an unknown dtype \"{}\"", what, printable_text(name));
}

// The shape, whose element and byte counts must fit in 64 bits, and so must every product of its
// trailing dims (the row-major strides), which a zero dim would hide from the element count.
ag::Shape read_shape(const json& v, ag::Dtype dtype, std::string_view source, const std::string& what) {
  if (!v.is_array()) corrupt(source, "{}'s shape is not an array", what);
  std::vector<std::uint64_t> dims;
  for (std::size_t i = 0; i < v.size(); ++i)
    dims.push_back(read_u64(v[i], source, fmt::format("{}'s shape[{}]", what, i)));
  auto too_large = [&] {
    corrupt(source, "{}'s shape [{}] is too large: its size in bytes does not fit in 64 bits", what,
            fmt::join(dims, ", "));
  };
  ag::Shape shape, nonzero;
  for (const std::uint64_t d : dims) {
    if (d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) too_large();
    shape.push_back(static_cast<std::int64_t>(d));
    nonzero.push_back(d == 0 ? 1 : static_cast<std::int64_t>(d));
  }
  try {
    ag::checked_numel("shape", shape);
    ag::checked_mul("shape", ag::checked_numel("shape", nonzero), static_cast<std::int64_t>(ag::dtype_size(dtype)));
  } catch (const std::invalid_argument&) {
    too_large();
  }
  return shape;
}

TensorEntry read_entry(const std::string& name, const json& info, std::string_view source) {
  const std::string what = "tensor " + quote_name(name);
  if (!info.is_object()) corrupt(source, "{} is {}, not an object", what, kind_name(info));
  const json *dtype = nullptr, *shape = nullptr, *offsets = nullptr;
  for (const auto& field : info.items()) {
    if (field.key() == "dtype") dtype = &field.value();
    else if (field.key() == "shape") shape = &field.value();
    else if (field.key() == "data_offsets") offsets = &field.value();
    else corrupt(source, "{} has an unknown field \"{}\"", what, printable_text(field.key()));
  }
  if (!dtype || !shape || !offsets)
    corrupt(source, "{} lacks \"{}\"", what, !dtype ? "dtype" : !shape ? "shape" : "data_offsets");
  TensorEntry e;
  e.name = name;
  e.dtype = read_dtype(*dtype, source, what);
  e.shape = read_shape(*shape, e.dtype, source, what);
  if (!offsets->is_array() || offsets->size() != 2) corrupt(source, "{}'s data_offsets must be [begin, end]", what);
  e.begin = read_u64((*offsets)[0], source, what + "'s data_offsets[0]");
  e.end = read_u64((*offsets)[1], source, what + "'s data_offsets[1]");
  if (e.end < e.begin) corrupt(source, "{}'s data_offsets [{}, {}] end before they begin", what, e.begin, e.end);
  // Fits: read_shape checked the byte count.
  const auto expected = static_cast<std::uint64_t>(ag::shape_numel(e.shape)) * ag::dtype_size(e.dtype);
  if (e.end - e.begin != expected)
    corrupt(source, "{} {} {} needs {} bytes but data_offsets [{}, {}] hold {}", what, safetensors_dtype(e.dtype),
            ag::shape_str(e.shape), expected, e.begin, e.end, e.end - e.begin);
  return e;
}

// A JSON string exactly as serde_json (Python's safetensors) writes it: nlohmann's compact form
// escapes the same characters the same way (\" \\ \b \f \n \r \t, other control bytes as \u00xx).
std::string json_text(const json& v, const char* what) {
  try {
    return v.dump(-1, ' ', false, json::error_handler_t::strict);
  } catch (const json::type_error&) {
    throw CheckpointError(fmt::format("save_safetensors: {} is not valid UTF-8", what));
  }
}

// The format pads the header's JSON with spaces (0x20) and nothing else, not even the other JSON
// whitespace, so no bytes hide inside the header's declared length: the byte at `at` is refused.
[[noreturn]] void bad_padding(std::string_view text, std::size_t at, std::string_view source) {
  corrupt(source, "byte 0x{:02x} at file offset {} (header byte {}): a header holds JSON text followed only by spaces "
          "(0x20) up to its declared length of {} bytes", static_cast<unsigned char>(text[at]), 8 + at, at, text.size());
}

}  // namespace

std::string_view safetensors_dtype(ag::Dtype d) {
  return d == ag::Dtype::Float32 ? "F32" : d == ag::Dtype::Float64 ? "F64" : "I64";
}

Header parse_header(std::string_view text, std::string_view source) {
  if (text.empty() || text[0] != '{') corrupt(source, "it does not start with '{{'");
  // A NUL byte is refused before nlohmann reads the text: its reader takes a NUL for the end of the
  // text, and would accept whatever garbage follows it.
  if (const auto nul = text.find('\0'); nul != std::string_view::npos) bad_padding(text, nul, source);
  const std::string_view json_part = text.substr(0, text.find_last_not_of(' ') + 1);
  StrictJsonReader<json> reader(fmt::format("{}: corrupt header: ", source), "header", kMaxDepth);
  const json root = reader.read(json_part);  // the reader throws on every error
  // json_part is one object: what follows its closing brace is JSON whitespace, of which only
  // spaces are padding.
  const std::size_t end = json_part.find_last_of('}') + 1;
  if (const auto other = json_part.find_first_not_of(' ', end); other != std::string_view::npos)
    bad_padding(text, other, source);
  Header out;
  for (const auto& item : root.items()) {
    if (item.key() == "__metadata__") read_metadata(item.value(), source, out.metadata);
    else out.entries.push_back(read_entry(item.key(), item.value(), source));
  }
  return out;
}

std::string format_header(const std::vector<TensorEntry>& entries, const Metadata& metadata) {
  std::string out = "{";
  if (!metadata.empty()) out += "\"__metadata__\":" + json_text(json(metadata), "metadata");  // keys sorted
  for (const auto& e : entries) {
    if (out.size() > 1) out += ',';
    // Fields in the order Python writes them; names escaped by nlohmann, numbers written by fmt.
    out += fmt::format("{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                       json_text(json(e.name), "a tensor name"), safetensors_dtype(e.dtype), fmt::join(e.shape, ","),
                       e.begin, e.end);
  }
  return out + '}';
}

}  // namespace nn::detail
