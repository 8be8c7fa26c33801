#pragma once
// Checkpoints in the safetensors format (https://github.com/huggingface/safetensors), so that
// Python reads what headgrad writes and the other way round:
//
//   [8 bytes: N, little-endian u64][N bytes: JSON header, padded with spaces][tensor bytes]
//   header = {"__metadata__": {"key": "value", ...},                       (optional, strings only)
//             "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
//
// Offsets count from the first byte after the header; the tensors tile the data exactly (no
// gaps, no overlaps), little-endian, row-major. headgrad reads and writes "F32", "F64" and "I64"
// (Int64, exactly); it writes the tensors sorted by dtype size (F64 and I64 first) and then by
// name and pads the header to 8 bytes, exactly as Python's safetensors does, so the same tensors
// give the same bytes.
//
//   nn::save_parameters(model, "model.safetensors");      // Python: safetensors.torch.load_file(...)
//   nn::load_parameters(model, "model.safetensors");
//   nn::save_checkpoint("run.safetensors", model, optimizer, {{"step", "1000"}});
//   auto metadata = nn::load_checkpoint("run.safetensors", model, optimizer);
//
// These files use headgrad's parameter names; for PyTorch's names and layouts see
// nn/torch_state_dict.hpp. Every saved file also carries the model's configuration in its
// metadata ("headgrad.config", see "self-describing files" below).
//
// Saving is atomic: the bytes go to a temporary file in the same directory (a short name,
// ".headgrad-<16 hex digits>.tmp", so any file name the directory allows can be saved), which is
// flushed to disk (fsync) and then renamed over the target, so a crash mid-save leaves the
// previous file intact; an existing file keeps its permission bits. Saving to a symbolic link
// writes through it, as PyTorch does: the link stays, and the file at the end of the chain of
// links is replaced (atomically, in its own directory). A target that is not a regular file (a
// directory, a device, a FIFO) is refused.
// Loading reads only regular files: a directory, a device such as /dev/zero or a FIFO is refused
// before a byte is read (and without blocking). It reads the 8-byte header length first and checks
// it against the file's size, then the header, and the tensor data only once the header is known
// to be right (syntax, dtypes, shapes whose sizes fit in 64 bits, offsets, sizes, and that the
// names match the module's parameters one for one). Checkpoint loads also refuse optimizer state
// that no run can produce (a NaN or infinite moment, a negative second moment). Nothing is copied
// unless everything is right: a failed load leaves every parameter and the optimizer unchanged.
// Errors are nn::CheckpointError (a std::runtime_error) saying what is wrong and in which file.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <autograd/autograd.hpp>

#include "nn/module.hpp"
#include "nn/optim.hpp"

namespace nn {

class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

using Metadata = std::map<std::string, std::string>;

struct SafetensorsData {
  NamedTensors tensors;  // in the order of their data offsets
  Metadata metadata;
};

// ---- the format ----
// The file's bytes for these tensors (names unique, tensors defined, Float32/Float64).
std::string serialize_safetensors(const NamedTensors& tensors, const Metadata& metadata = {});
// Parses a whole file's bytes; `source` names it in error messages. Throws CheckpointError.
SafetensorsData parse_safetensors(std::string_view bytes, std::string_view source = "<memory>");
// Writes atomically (see above); reads a whole file.
void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata = {});
SafetensorsData load_safetensors(const std::string& path);

// ---- modules ----
struct LoadOptions {
  // Strict: the file holds exactly the module's parameters. Otherwise missing and extra names
  // are allowed (shapes and dtypes of the names in common must still match).
  bool strict = true;
  // Convert a tensor whose dtype differs from its parameter's; otherwise that is an error. An I64
  // entry never loads into a float parameter (nor a float entry into an Int64 one).
  bool convert_dtype = false;
};

// The module's parameters under their named_parameters() names (plus metadata).
void save_parameters(const Module& module, const std::string& path, const Metadata& metadata = {});
// Returns the file's metadata. A training checkpoint (save_checkpoint) or a file in PyTorch's
// naming (save_torch_state_dict, or PyTorch's own state_dict for this module) is refused with a
// message saying which function loads it.
Metadata load_parameters(Module& module, const std::string& path, const LoadOptions& options = {});

// ---- training checkpoints: parameters and optimizer state in one file ----
// Parameters are stored as "model.<name>", the optimizer's state_dict() as "optimizer.<name>";
// metadata gets "format" = "headgrad.checkpoint" and "optimizer" = the optimizer's name, plus the
// caller's entries (e.g. the step and the data generator's state).
void save_checkpoint(const std::string& path, const Module& module, const Optimizer& optimizer,
                     const Metadata& metadata = {});
// Checks the module part and the optimizer part in full (the optimizer's own check_state_dict,
// then the values) before changing either. Returns the metadata.
Metadata load_checkpoint(const std::string& path, Module& module, Optimizer& optimizer);

// ---- self-describing files ----
// save_parameters, save_checkpoint and save_torch_state_dict (nn/torch_state_dict.hpp) write the
// module tree's configuration into the metadata: "headgrad.config" holds it as JSON text, and
// "headgrad.naming" is "headgrad" (our parameter names) or "torch" (PyTorch's). Both keys are
// headgrad's: values the caller gives for them are replaced. The JSON, one object per module:
//   {"type": "TransformerBlock", "dtype": "float64",
//    "options": {"d_model": 8, "num_heads": 2, "d_ff": 32, "dropout": 0.0, "gelu": true, ...},
//    "children": {"ln_1": {...}, "attn": {...}, ...}}            (children in registration order)
// Options are the constructor's, for Linear, Embedding, LayerNorm, MultiHeadAttention,
// TransformerBlock, TransformerLM (its TransformerLMConfig) and GELU; other modules (a user's) give their type, their children and, if
// non-empty, "repr" (extra_repr()). Python reads it with json.loads(metadata["headgrad.config"]).
struct ModuleConfig {
  std::string type;   // the module's type_name()
  std::string dtype;  // "float32" or "float64" (its first parameter's), "" without parameters
  std::map<std::string, std::string> options;  // each option's JSON text: "8", "true", "1e-05", "[3,4]"
  std::string repr;                            // extra_repr() of a module that is not one of nn's
  std::vector<std::pair<std::string, ModuleConfig>> children;

  // Declared here and defined where ModuleConfig is complete (model_config.cpp): defined
  // implicitly, they would need std::pair<std::string, ModuleConfig> complete inside this very
  // class, which clang refuses.
  ModuleConfig();
  ModuleConfig(const ModuleConfig&);
  ModuleConfig(ModuleConfig&&) noexcept;
  ModuleConfig& operator=(const ModuleConfig&);
  ModuleConfig& operator=(ModuleConfig&&) noexcept;
  ~ModuleConfig();

  // A descendant by dotted name ("block.attn"); throws CheckpointError listing the children.
  const ModuleConfig& child(const std::string& dotted_name) const;
  bool has_child(const std::string& name) const;
  // An option as a number, a flag, text or a shape; throws CheckpointError when it is absent or
  // of another kind, naming the module type and the option.
  std::int64_t integer(const std::string& key) const;
  double number(const std::string& key) const;
  bool flag(const std::string& key) const;
  std::string text(const std::string& key) const;
  ag::Shape shape(const std::string& key) const;
  ag::Dtype parameter_dtype() const;  // Float32 when the module has no parameters
};

ModuleConfig module_config(const Module& module);
std::string module_config_json(const Module& module);  // what "headgrad.config" holds
// Parses a "headgrad.config" text; `source` names it in messages. Throws CheckpointError.
ModuleConfig parse_module_config(std::string_view json, std::string_view source = "<memory>");
// The configuration saved in a file; throws CheckpointError when it has none.
ModuleConfig read_module_config(const std::string& path);
// A new module of nn's types (Linear, Embedding, LayerNorm, MultiHeadAttention, TransformerBlock,
// TransformerLM, ReLU, GELU, and Sequential and ModuleList of those) with freshly initialised
// parameters, from its config.
// A user's type throws CheckpointError: rebuild it with its own code from config.child(...).
std::shared_ptr<Module> build_module(const ModuleConfig& config);
// build_module from a file's config, then its parameters loaded (load_parameters or
// load_torch_state_dict, as its "headgrad.naming" says).
std::shared_ptr<Module> load_module(const std::string& path);

namespace detail {
// Test hook: called before each chunk of a save's bytes goes to the temporary file, with the
// number of bytes written so far; it may throw (a failed write) or end the process (a crash).
// Pass an empty function to remove it.
void set_save_hook(std::function<void(std::size_t bytes_written)> hook);
}  // namespace detail

}  // namespace nn
