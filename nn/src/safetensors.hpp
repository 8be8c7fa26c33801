#pragma once
// The pieces of the safetensors format shared by safetensors.cpp (the byte layout: length prefix,
// data section, whole files) and safetensors_header.cpp (the JSON header, through nlohmann-json).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <autograd/autograd.hpp>

#include "names.hpp"
#include "nn/checkpoint.hpp"

namespace nn::detail {

// One tensor's header entry: dtype, shape, and its bytes [begin, end) in the data section.
struct TensorEntry {
  std::string name;
  ag::Dtype dtype = ag::Dtype::Float32;
  ag::Shape shape;
  std::uint64_t begin = 0, end = 0;
};

struct Header {
  std::vector<TensorEntry> entries;  // in no particular order
  Metadata metadata;
};

// The format's name of a dtype: "F32" or "F64".
std::string_view safetensors_dtype(ag::Dtype d);

// Parses and checks the header's bytes (all N of them, as the length prefix gives N): strict JSON
// with unique keys and at most 64 levels of nesting, followed by nothing but spaces (0x20), the
// only padding the format allows; every entry with a known dtype, a shape whose element and byte
// counts fit in 64 bits, and data_offsets spanning exactly those bytes. How the entries' ranges
// fit together is left to the caller. `source` names the file in error messages (CheckpointError).
Header parse_header(std::string_view text, std::string_view source);

// The header's JSON text (unpadded) for entries in the given order, byte for byte as Python's
// safetensors writes it. Names and metadata must be valid UTF-8 (check_for_saving checks them).
std::string format_header(const std::vector<TensorEntry>& entries, const Metadata& metadata);

// A file's header alone (entries sorted by offset and checked to tile the data exactly, and the
// metadata), without reading any tensor's bytes.
Header read_header(const std::string& path);

// serialize_safetensors and save_safetensors for the function `op` the user called: its name
// starts their errors (a name or metadata string that is not valid UTF-8, a repeated name, ...).
std::string serialize(std::string_view op, const NamedTensors& tensors, const Metadata& metadata);
void write_safetensors(std::string_view op, const std::string& path, const NamedTensors& tensors,
                       const Metadata& metadata);

// Names for a message: the first 20, then "and N more".
std::string join_names(const std::vector<std::string>& names);

// The metadata keys of self-describing files (nn/checkpoint.hpp).
inline constexpr const char* kConfigKey = "headgrad.config";
inline constexpr const char* kNamingKey = "headgrad.naming";
inline constexpr const char* kCheckpointFormat = "headgrad.checkpoint";

// The caller's metadata with the module's config and the naming ("headgrad" or "torch") added.
// Throws CheckpointError(`op`: ...) when a string of the config (a module's type name or
// extra_repr()) is not valid UTF-8.
Metadata describe_file(std::string_view op, const Module& module, const Metadata& metadata, const char* naming);

// module_config_json for `op`.
std::string config_json(std::string_view op, const Module& module);

// Which function loads a file that `op` was given by mistake, or "" when nothing says so: a
// training checkpoint (metadata "format"), a file of the other naming (metadata
// "headgrad.naming", or names that are exactly the module's names in the other naming).
// `op` is "load_parameters", "load_torch_state_dict" or "load_checkpoint".
std::string wrong_loader_hint(std::string_view op, const Module& module, const SafetensorsData& file);

}  // namespace nn::detail
