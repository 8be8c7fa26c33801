#pragma once
// nn::Module: a tree of modules, each owning named parameters (PyTorch's register_parameter /
// register_module). named_parameters() walks the tree and names children's parameters with
// dots ("block.attn.W_Q"). Parameters are tensor handles: the module and anyone holding a copy
// of the handle see the same data.
//
// Shared (tied) weights follow PyTorch's rule: a tensor registered under several names, or a
// child module registered twice, is listed once by parameters() and named_parameters() (under
// the first name met, in the walk's order), so an optimizer or gradient clipping sees it once.
// named_parameters(recurse, false) lists every name. A module cannot contain itself.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <autograd/autograd.hpp>
#include <fmt/format.h>

#include "nn/hooks.hpp"

namespace nn {

namespace ag = autograd;

using NamedTensors = std::vector<std::pair<std::string, ag::Tensor>>;

// A module's handle to one of its parameters, as the layers' accessors give it (linear.weight()):
// a tensor in every way, and in-place writes through it (copy_, fill_, zero_, add_, set_data)
// change the module's parameter, as in PyTorch:
//   { ag::NoGradGuard no_grad; linear.weight().copy_(w); }
// Assigning another tensor to it does not compile: the module and its optimizer would go on
// using the registered tensor, so `linear.weight() = w` could only mislead. A copy
// (`ag::Tensor w = linear.weight();`) is an ordinary handle to the same parameter.
class Parameter : public ag::Tensor {
 public:
  Parameter() = default;
  Parameter(const Parameter&) = default;
  Parameter& operator=(const Parameter&) = delete;
  Parameter& operator=(const ag::Tensor&) = delete;
  // For the module that owns it, in its constructor: the handle register_parameter returned.
  void bind(ag::Tensor registered) { static_cast<ag::Tensor&>(*this) = std::move(registered); }
};

// name in single quotes with every byte visible: control bytes (NUL, ESC and the rest of C0, DEL,
// the C1 controls U+0080..U+009F) and bytes that are not part of valid UTF-8 as \xNN, quotes and
// backslashes escaped, so a message never hides or cuts part of a name, nor sends a terminal
// escape sequence, and is itself valid UTF-8. Valid UTF-8 otherwise shows as it is.
std::string quote_name(std::string_view name);

class Module {
 public:
  explicit Module(std::string type_name = "Module") : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  Module(Module&&) = default;
  Module& operator=(Module&&) = default;

  // Registers t as a parameter (a leaf that requires grad) and returns the handle. Names (here and
  // in register_module) must be non-empty, hold no '.' and no NUL byte, and be valid UTF-8 (saved
  // files hold them as JSON text, which is UTF-8): else std::invalid_argument naming the name.
  // The same tensor may be registered under several names (tied weights). Each parameter's
  // tensor name is its dotted name in named_parameters() ("block.attn.W_Q", set again whenever a
  // module is registered above it), unless it had a name of its own (set_name) when registered.
  ag::Tensor register_parameter(std::string name, ag::Tensor t, bool requires_grad = true);
  template <class M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module) {
    register_child(std::move(name), module);
    return module;
  }

  // Each tensor once, first name wins; remove_duplicate = false lists every name of every tensor.
  NamedTensors named_parameters(bool recurse = true, bool remove_duplicate = true) const;
  std::vector<ag::Tensor> parameters(bool recurse = true) const;  // named_parameters()' tensors
  std::int64_t num_parameters() const;  // total element count, each tensor once
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const { return children_; }
  // This module (named "") and its descendants in pre-order, with dotted names; each module once
  // (first name wins) unless remove_duplicate is false.
  std::vector<std::pair<std::string, const Module*>> named_modules(bool remove_duplicate = true) const;
  std::vector<std::pair<std::string, Module*>> named_modules(bool remove_duplicate = true);
  ag::Tensor parameter(const std::string& dotted_name) const;  // any of its names; throws if absent

  // Sets every parameter's .grad to zero (kept allocated), or to none.
  void zero_grad(bool set_to_none = false);
  virtual void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Converts every floating parameter to dtype (Float32 or Float64) in place: handles and names
  // stay valid. Int64 parameters (counters, ids) keep their dtype and values, as in PyTorch.
  Module& to(ag::Dtype dtype);

  const std::string& type_name() const { return type_name_; }
  // One line for this module's own settings, e.g. "embed_dim=4, num_heads=2".
  virtual std::string extra_repr() const { return {}; }
  // A readable tree with shapes and parameter counts.
  std::string to_string() const;

  // ---- hook points (nn/hooks.hpp) ----
  // Every hook point of this module and its descendants, dotted ("block.attn.pattern"), in the
  // order of named_modules().
  std::vector<std::string> hook_point_names() const;
  // An unknown name throws listing the names there are; a null hook throws.
  HookHandle add_hook(const std::string& dotted_name, ForwardHook hook);
  HookHandle add_backward_hook(const std::string& dotted_name, BackwardHook hook);
  void remove_hooks();  // every hook of this module and its descendants
  std::size_t hook_count() const;  // forward and backward hooks on this module and its descendants

 protected:
  void register_child(std::string name, std::shared_ptr<Module> module);
  // A subclass names its own hook points once, in its constructor, and runs them in forward
  // through hook_points().run(i, value) when hook_points().any().
  void declare_hook_points(std::vector<std::string> names);
  const HookPoints& hook_points() const { return hook_points_; }

 private:
  void collect_modules(const std::string& prefix, bool remove_duplicate,
                       std::vector<std::pair<std::string, const Module*>>& out) const;
  bool contains(const Module* module) const;  // module is this one or a descendant
  void print(std::string& out, const std::string& name, int indent) const;
  // The descendant (or this) and its point that a dotted hook-point name refers to; throws
  // listing every name when there is none.
  std::pair<Module*, std::size_t> find_hook_point(std::string_view op, const std::string& dotted_name);

  std::string type_name_;
  NamedTensors params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
  HookPoints hook_points_;
};

}  // namespace nn

template <class M>
  requires std::is_base_of_v<nn::Module, M>
struct fmt::formatter<M> : fmt::formatter<std::string_view> {
  fmt::format_context::iterator format(const M& m, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(m.to_string(), ctx);
  }
};
