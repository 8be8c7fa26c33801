#include "nn/module.hpp"

#include <stdexcept>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "names.hpp"

namespace nn {

namespace detail {

namespace {

// The length of the well-formed UTF-8 sequence at s[i] (1 to 4), or 0 when there is none there
// (the ranges of the Unicode standard's table 3-7).
std::size_t utf8_sequence_length(std::string_view s, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = byte(i);
  if (b0 < 0x80) return 1;
  std::size_t n = 0;
  unsigned char low = 0x80, high = 0xbf;  // the range of the second byte
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    n = 2;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    n = 3;
    if (b0 == 0xe0) low = 0xa0;
    if (b0 == 0xed) high = 0x9f;  // no UTF-16 surrogates
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    n = 4;
    if (b0 == 0xf0) low = 0x90;
    if (b0 == 0xf4) high = 0x8f;  // nothing past U+10FFFF
  } else {
    return 0;
  }
  if (s.size() - i < n) return 0;
  if (byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (std::size_t k = 2; k < n; ++k)
    if (byte(i + k) < 0x80 || byte(i + k) > 0xbf) return 0;
  return n;
}

void append_escaped(std::string& out, unsigned char byte) { out += fmt::format("\\x{:02x}", byte); }

}  // namespace

std::size_t invalid_utf8_at(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t n = utf8_sequence_length(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string printable_text(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const auto byte = static_cast<unsigned char>(s[i]);
    const std::size_t n = utf8_sequence_length(s, i);
    if (n == 0) {  // not UTF-8: the byte alone, escaped
      append_escaped(out, byte);
      ++i;
    } else if (n == 1) {
      if (byte < 0x20 || byte == 0x7f) {
        append_escaped(out, byte);
      } else {
        if (byte == '\\') out += '\\';
        out += s[i];
      }
      ++i;
    } else {
      // U+0080..U+009F (C2 80..C2 9F) are the C1 controls, which terminals may act on (U+009B is CSI).
      const bool c1 = n == 2 && byte == 0xc2 && static_cast<unsigned char>(s[i + 1]) <= 0x9f;
      for (std::size_t k = 0; k < n; ++k) {
        if (c1) append_escaped(out, static_cast<unsigned char>(s[i + k]));
        else out += s[i + k];
      }
      i += n;
    }
  }
  return out;
}

}  // namespace detail

std::string quote_name(std::string_view name) {
  std::string out = "'";
  for (const char c : detail::printable_text(name)) {
    if (c == '\'') out += '\\';
    out += c;
  }
  return out + "'";
}


namespace {

// PyTorch's rule for attribute names, plus no NUL byte (it would cut the name in C strings) and
// valid UTF-8 (saved files hold names as JSON text, which is UTF-8).
void check_name(std::string_view op, const char* what, const std::string& name) {
  if (name.empty() || name.find('.') != std::string::npos || name.find('\0') != std::string::npos)
    ag::fail(op, "{} name {} must be non-empty and contain no '.' and no NUL byte", what, quote_name(name));
  if (const std::size_t at = detail::invalid_utf8_at(name); at != std::string::npos)
    ag::fail(op, "{} name {} is not valid UTF-8 (byte 0x{:02x} at position {}): names are saved as JSON text, "
             "which is UTF-8", what, quote_name(name), static_cast<unsigned char>(name[at]), at);
}

std::string join_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// True when `name` is one of `dotted` or the end of one after a dot: a name that a walk from
// this module or from one of its descendants gives the tensor, so one this code gave it earlier.
bool is_walk_name(const std::string& name, const std::vector<std::string>& dotted) {
  for (const auto& d : dotted)
    if (d == name || (d.size() > name.size() && d.ends_with(name) && d[d.size() - name.size() - 1] == '.'))
      return true;
  return false;
}

// Gives every parameter of m's tree its dotted name as tensor name: the first name the walk
// meets (named_parameters' name for a tied tensor). A name that is not one of the tensor's walk
// names (a user's set_name) is kept.
void name_parameters(const Module& m) {
  std::vector<std::pair<ag::Tensor, std::vector<std::string>>> tensors;  // in the walk's order
  std::unordered_map<const void*, std::size_t> index;
  for (auto& [name, p] : m.named_parameters(true, false)) {
    auto [it, inserted] = index.emplace(p.impl().get(), tensors.size());
    if (inserted) tensors.emplace_back(p, std::vector<std::string>{});
    tensors[it->second].second.push_back(std::move(name));
  }
  for (auto& [p, names] : tensors) {
    const std::string& current = p.name();
    if (current != names.front() && (current.empty() || is_walk_name(current, names))) p.set_name(names.front());
  }
}

}  // namespace

ag::Tensor Module::register_parameter(std::string name, ag::Tensor t, bool requires_grad) {
  check_name("register_parameter", "parameter", name);
  if (!t.defined()) ag::fail("register_parameter", "parameter {} is undefined", quote_name(name));
  for (const auto& [n, p] : params_)
    if (n == name) ag::fail("register_parameter", "parameter {} is already registered", quote_name(name));
  if (requires_grad && !ag::is_floating(t.dtype()))
    ag::fail("register_parameter", "parameter {} is {} {}: a parameter that requires grad must be Float32 or "
             "Float64", quote_name(name), ag::dtype_name(t.dtype()), ag::shape_str(t.shape()));
  if (!t.is_leaf()) t = t.detach();
  t.requires_grad_(requires_grad);
  params_.emplace_back(std::move(name), t);
  name_parameters(*this);
  return t;
}

void Module::register_child(std::string name, std::shared_ptr<Module> module) {
  check_name("register_module", "module", name);
  if (!module) ag::fail("register_module", "module {} is null", quote_name(name));
  for (const auto& [n, m] : children_)
    if (n == name) ag::fail("register_module", "module {} is already registered", quote_name(name));
  // A module tree has no cycles: walks over it (parameters, train, zero_grad) must end.
  if (module->contains(this))
    ag::fail("register_module", "module {} ({}) is this {} or contains it; a module cannot contain itself",
             quote_name(name), module->type_name(), type_name_);
  children_.emplace_back(std::move(name), std::move(module));
  name_parameters(*this);
}

bool Module::contains(const Module* module) const {
  if (module == this) return true;
  for (const auto& entry : children_)
    if (entry.second->contains(module)) return true;
  return false;
}

void Module::collect_modules(const std::string& prefix, bool remove_duplicate,
                             std::vector<std::pair<std::string, const Module*>>& out) const {
  if (remove_duplicate)
    for (const auto& entry : out)
      if (entry.second == this) return;
  out.emplace_back(prefix, this);
  for (const auto& [name, child] : children_) child->collect_modules(join_name(prefix, name), remove_duplicate, out);
}

std::vector<std::pair<std::string, const Module*>> Module::named_modules(bool remove_duplicate) const {
  std::vector<std::pair<std::string, const Module*>> out;
  collect_modules("", remove_duplicate, out);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules(bool remove_duplicate) {
  std::vector<std::pair<std::string, Module*>> out;
  for (auto& [name, m] : std::as_const(*this).named_modules(remove_duplicate))
    out.emplace_back(std::move(name), const_cast<Module*>(m));  // this walk started from a non-const module
  return out;
}

NamedTensors Module::named_parameters(bool recurse, bool remove_duplicate) const {
  std::vector<std::pair<std::string, const Module*>> modules;
  if (recurse) {
    collect_modules("", remove_duplicate, modules);
  } else {
    modules.emplace_back("", this);
  }
  NamedTensors out;
  std::unordered_set<const void*> seen;
  for (const auto& [prefix, m] : modules)
    for (const auto& [name, p] : m->params_)
      if (!remove_duplicate || seen.insert(p.impl().get()).second) out.emplace_back(join_name(prefix, name), p);
  return out;
}

std::vector<ag::Tensor> Module::parameters(bool recurse) const {
  std::vector<ag::Tensor> out;
  for (auto& entry : named_parameters(recurse)) out.push_back(std::move(entry.second));
  return out;
}

std::int64_t Module::num_parameters() const {
  std::int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

ag::Tensor Module::parameter(const std::string& dotted_name) const {
  for (auto& [name, p] : named_parameters(true, false))
    if (name == dotted_name) return p;
  ag::fail("parameter", "no parameter named {} in {}", quote_name(dotted_name), type_name_);
}

void Module::zero_grad(bool set_to_none) {
  ag::NoGradGuard no_grad;
  // Walks the tree in place (no list of parameters built: a training step allocates nothing).
  for (auto& entry : params_) {
    ag::Tensor& p = entry.second;
    if (set_to_none || !p.grad().defined()) {
      p.set_grad(ag::Tensor());
    } else {
      p.grad().zero_();
    }
  }
  for (auto& entry : children_) entry.second->zero_grad(set_to_none);
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

Module& Module::to(ag::Dtype dtype) {
  if (!ag::is_floating(dtype))
    ag::fail("Module::to", "parameters must be Float32 or Float64, got {}", ag::dtype_name(dtype));
  ag::NoGradGuard no_grad;
  for (auto& p : parameters())  // floating tensors only: Int64 ones (counters, ids) keep their values
    if (ag::is_floating(p.dtype()) && p.dtype() != dtype) p.set_data(p.detach().to(dtype));
  return *this;
}

void Module::print(std::string& out, const std::string& name, int indent) const {
  const std::string pad(static_cast<std::size_t>(indent) * 2, ' ');
  out += fmt::format("{}{}{}({})  [{} parameters]\n", pad, name.empty() ? "" : name + ": ", type_name_,
                     extra_repr(), num_parameters());
  for (const auto& [n, p] : params_)
    out += fmt::format("{}  {} {} {}\n", pad, n, ag::shape_str(p.shape()), ag::dtype_name(p.dtype()));
  for (const auto& [n, child] : children_) child->print(out, n, indent + 1);
}

std::string Module::to_string() const {
  std::string out;
  print(out, "", 0);
  if (!out.empty()) out.pop_back();
  return out;
}

}  // namespace nn
