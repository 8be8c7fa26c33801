// How messages speak of tensors: names with every byte visible, quoted names, and what an
// undefined tensor is.
//
// An undefined tensor's handle holds no TensorImpl. The one grad() returns before a gradient
// exists, and the one Tensor::undefined() makes, still own a small control block (allocated from
// the engine's pool) whose deleter deletes nothing and holds a note: whose .grad() this is, or
// why the tensor holds nothing. std::get_deleter reads the note back when an error is reported.
// Copies of tensors and defined() are unchanged: the handle is the same shared pointer, its
// stored pointer null.
#include "autograd/tensor.hpp"

#include "autograd/graph.hpp"
#include "autograd/detail/small_pool.hpp"

namespace autograd {

namespace {

// The note an undefined handle carries: the tensor whose .grad() it stands for, or a reason.
struct UndefinedNote {
  std::weak_ptr<TensorImpl> grad_of;  // set by grad(): whose gradient is missing
  const char* why = nullptr;          // set by Tensor::undefined()
  void operator()(TensorImpl*) const noexcept {}  // owns nothing
};

std::shared_ptr<TensorImpl> noted_null(UndefinedNote note) {
  return std::shared_ptr<TensorImpl>(nullptr, std::move(note), detail::PoolAllocator<TensorImpl>{});
}

// "the .grad() of 'attn.W_Q' [4, 4]" and why it is undefined, from the owner as it is now.
struct MissingGrad {
  std::string what;
  std::string why;
};

MissingGrad missing_grad(const std::weak_ptr<TensorImpl>& grad_of) {
  const std::shared_ptr<TensorImpl> owner = grad_of.lock();
  if (!owner) return {"the .grad() of a tensor that no longer exists", "no backward had reached it"};
  const std::string who = owner->name.empty() ? fmt::format("a tensor of shape {}", shape_str(owner->shape))
                                              : fmt::format("{} {}", quoted(owner->name), shape_str(owner->shape));
  MissingGrad m{"the .grad() of " + who, {}};
  if (owner->grad_fn && !owner->retains_grad) {
    m.why = fmt::format("it is not a leaf (made by '{}'), and a non-leaf keeps no .grad() unless retain_grad() "
                        "is called on it before backward()", printable(owner->grad_fn->name()));
  } else if (!owner->grad_fn && !owner->requires_grad) {
    m.why = "the tensor does not require grad (call requires_grad_() on it before the forward pass)";
  } else {
    m.why = "no backward has reached it yet (call backward() on a loss that depends on it)";
  }
  return m;
}

const UndefinedNote* note_of(const std::shared_ptr<TensorImpl>& impl) { return std::get_deleter<UndefinedNote>(impl); }

}  // namespace

std::string printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      if (c == '\\') out += '\\';
      out += c;
    }
  }
  return out;
}

std::string quoted(std::string_view s) {
  std::string out = "'";
  for (const char c : printable(s)) {
    if (c == '\'') out += '\\';
    out += c;
  }
  return out + "'";
}

Tensor Tensor::grad() const {
  check_defined("grad");
  if (impl_->grad) [[likely]]
    return Tensor(impl_->grad);
  return Tensor(noted_null({impl_, nullptr}));
}

Tensor Tensor::undefined(const char* why) { return Tensor(noted_null({{}, why})); }

std::string undefined_description(const Tensor& t) {
  if (t.defined()) return "a defined tensor";
  const UndefinedNote* note = note_of(t.impl());
  if (note && note->why) return fmt::format("an undefined tensor ({})", note->why);
  if (note) {
    const MissingGrad m = missing_grad(note->grad_of);
    return fmt::format("{}, which is undefined: {}", m.what, m.why);
  }
  return "an undefined tensor (default-constructed: no value)";
}

void Tensor::undefined_error(std::string_view op) const {
  const UndefinedNote* note = note_of(impl_);
  if (note && !note->why) {
    const MissingGrad m = missing_grad(note->grad_of);
    fail(op, "{} is undefined: {}", m.what, m.why);
  }
  fail(op, "called on {}", undefined_description(*this));
}

}  // namespace autograd
