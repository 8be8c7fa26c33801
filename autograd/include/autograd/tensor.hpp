#pragma once
// A Tensor is a cheap handle: copying one copies a shared pointer, not the data.
//
//   Tensor ──> TensorImpl { shape, dtype, Storage (shared, contiguous, row-major),
//                           grad_fn (the graph node that made it, if any),
//                           requires_grad / grad (for leaves and retain_grad) }
//
// Two handles to the same TensorImpl are the same tensor (in-place changes and .grad are
// shared). detach() makes a new TensorImpl over the same Storage, outside the graph.
// Every kernel sees the data as a contiguous row-major buffer, through Eigen::Map.
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <Eigen/Core>

#include "autograd/dtype.hpp"
#include "autograd/shape.hpp"

namespace autograd {

class Node;
class Tensor;

// The options of Tensor::backward. ag::grad's GradOptions (graph.hpp) has these two fields too,
// with the same names, defaults and meaning; keep the two structs in step.
struct BackwardOptions {
  // Keep the graph walked (its saved tensors), so that it can be walked again.
  bool retain_graph = false;
  // The gradients (and the .grad they leave) are part of a graph, so they can be differentiated
  // again; implies retain_graph.
  bool create_graph = false;
};

// A contiguous, 64-byte aligned buffer. `version` counts in-place writes, so that a backward
// rule can tell that a tensor it saved was changed after it was saved.
struct Storage {
  Storage(Dtype dtype, std::int64_t numel);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  Dtype dtype;
  std::int64_t numel;
  void* data;
  std::uint64_t version = 0;
};

// Freed buffers are kept for reuse by the thread that freed them (up to 256 MiB per thread), so
// a fixed-shape training loop stops calling the system allocator for tensor buffers once warm
// (other allocations, such as matmul's batching plan, are not cached here). These report and
// empty the calling thread's cache.
std::size_t cached_buffer_bytes();
void release_cached_buffers();

using TensorHook = std::function<Tensor(const Tensor& grad)>;

struct TensorImpl {
  Shape shape;
  Dtype dtype = Dtype::Float32;
  std::shared_ptr<Storage> storage;

  // Graph: a non-leaf knows the node that made it and which of that node's outputs it is.
  std::shared_ptr<Node> grad_fn;
  std::uint32_t output_nr = 0;
  bool requires_grad = false;                 // leaves only; non-leaves require grad via grad_fn
  std::weak_ptr<Node> grad_accumulator;        // leaves: the node that adds into .grad
  std::shared_ptr<TensorImpl> grad;            // leaves, and non-leaves after retain_grad()
  bool retains_grad = false;
  std::vector<TensorHook> leaf_hooks;          // leaves: run on the gradient before it is added
  std::string name;                            // optional label, shown by to_dot
};

template <class T>
using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using MatrixMap = Eigen::Map<RowMatrix<T>, Eigen::Aligned64>;
template <class T>
using ConstMatrixMap = Eigen::Map<const RowMatrix<T>, Eigen::Aligned64>;
template <class T>
using ArrayMap = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>, Eigen::Aligned64>;

class Tensor {
 public:
  Tensor() = default;  // undefined: "no tensor" (e.g. no mask)
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}
  // An undefined tensor that says why it holds nothing, in every error it causes ("called on an
  // undefined tensor (<why>)"). why must outlive the tensor (a string literal).
  static Tensor undefined(const char* why);

  // Fresh, uninitialised storage of the given shape (kernels fill it). A shape with a negative
  // size, or whose element or byte count does not fit in 64 bits, is std::invalid_argument
  // starting with `op` (the op that asked for the tensor).
  static Tensor empty(const Shape& shape, Dtype dtype = Dtype::Float32, std::string_view op = "empty");

  bool defined() const { return impl_ != nullptr; }
  explicit operator bool() const = delete;  // ambiguous: use defined()

  // (The accessors a kernel calls on every op are inline: one branch, no call.)
  const Shape& shape() const {
    check_defined("shape");
    return impl_->shape;
  }
  std::int64_t dim() const { return static_cast<std::int64_t>(shape().size()); }
  std::int64_t size(std::int64_t d) const;  // negative d counts from the end
  std::int64_t numel() const {
    check_defined("numel");
    return impl_->storage->numel;
  }
  Dtype dtype() const {
    check_defined("dtype");
    return impl_->dtype;
  }

  // Raw data, row-major. T must match dtype() (checked).
  template <class T>
  T* data() const;
  void* raw_data() const;

  // A 2-D tensor seen as an Eigen matrix, no copy. Writing through the map does not bump the
  // version counter; call mark_modified() if it is done to a tensor a graph may have saved.
  template <class T>
  MatrixMap<T> as_matrix() const;
  // Every element, in row-major order, seen as a flat Eigen array, no copy (any rank; the same
  // caveat on mark_modified()).
  template <class T>
  ArrayMap<T> as_array() const;

  std::vector<double> to_vector() const;  // Int64 values above 2^53 in magnitude are rounded
  double item() const;  // one-element tensors only
  // The one element as T, which must match dtype() (checked): item<std::int64_t>() is exact.
  template <class T>
  T item() const;

  // Differentiable between Float32 and Float64; returns *this when dtype already matches.
  // Float to Int64 truncates toward zero (as PyTorch); a NaN, infinite or out-of-range value is
  // std::invalid_argument naming it. The Int64 result is outside the graph.
  Tensor to(Dtype dtype) const;
  Tensor detach() const;         // same storage, no graph
  Tensor clone() const;          // new storage, differentiable

  // ---- autograd ----
  bool requires_grad() const { return impl_ && (impl_->requires_grad || impl_->grad_fn); }  // leaf flag, or grad_fn
  Tensor& requires_grad_(bool on = true);  // Float32 and Float64 only (an Int64 tensor is an error)
  bool is_leaf() const;
  // Undefined until a backward reached this tensor; that undefined tensor remembers whose
  // .grad() it is, so an error on it names the tensor and says why there is no gradient.
  Tensor grad() const;
  void set_grad(const Tensor& g) const;  // replace (undefined clears)
  const std::shared_ptr<Node>& grad_fn() const {
    check_defined("grad_fn");
    return impl_->grad_fn;
  }
  std::uint32_t output_nr() const;

  // Adds d(this)/d(leaf) into each leaf's .grad: t.backward(), t.backward(grad),
  // t.backward({.create_graph = true}), t.backward(grad, {.retain_graph = true}). Without a
  // gradient (or with an undefined one) the tensor must have one element and the seed is 1.
  void backward(const BackwardOptions& options = {}) const;
  void backward(const Tensor& grad, const BackwardOptions& options = {}) const;
  Tensor& retain_grad();  // keep .grad on a non-leaf
  // The hook sees the gradient arriving at this tensor; returning a defined tensor replaces it.
  void register_hook(TensorHook hook);

  Tensor& set_name(std::string name);  // any bytes; messages and to_dot show it through printable()
  const std::string& name() const;

  // ---- in place (bump the version counter) ----
  Tensor& copy_(const Tensor& src);  // same shape; dtype converted (as to() converts)
  Tensor& fill_(double value);       // into Int64: truncated toward zero, as to()
  Tensor& zero_() { return fill_(0.0); }
  Tensor& add_(const Tensor& other, double alpha = 1.0);  // same shape; Float32 and Float64 only
  Tensor& mul_(double value);                             // Float32 and Float64 only
  // Replaces this tensor's data, shape and dtype by other's (sharing other's storage), keeping
  // the handle: every copy of this handle sees the change (PyTorch's `t.data = other`).
  // Clears .grad. Not recorded in any graph. A graph recorded before still reaches the leaf while
  // shape and dtype stay; after a change, its backward refuses (the gradient is of the old shape).
  Tensor& set_data(const Tensor& other);
  void mark_modified() const;
  std::uint64_t version() const;

  const std::shared_ptr<TensorImpl>& impl() const { return impl_; }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }

 private:
  void check_defined(std::string_view op) const {
    if (!impl_) [[unlikely]]
      undefined_error(op);
  }
  [[noreturn]] void undefined_error(std::string_view op) const;
  // Undefined: null, or null with a control block whose deleter says what the tensor is (see
  // grad() and undefined()); either way impl_.get() is null, so defined() is one test.
  std::shared_ptr<TensorImpl> impl_;
};

template <class T>
T* Tensor::data() const {
  if (!impl_) [[unlikely]]
    undefined_error("data");
  if (impl_->dtype != dtype_of<T>()) [[unlikely]]
    fail("data", "tensor holds {} but {} was asked for", dtype_name(dtype()), dtype_name(dtype_of<T>()));
  return static_cast<T*>(impl_->storage->data);
}

template <class T>
T Tensor::item() const {
  if (impl_ && impl_->dtype != dtype_of<T>()) [[unlikely]]
    fail("item", "tensor holds {} but {} was asked for; convert with .to(Dtype::{}) first, or ask for the type "
         "that matches the tensor's dtype", dtype_name(dtype()), dtype_name(dtype_of<T>()), dtype_name(dtype_of<T>()));
  const T* p = data<T>();
  if (numel() != 1) fail("item", "needs a tensor with one element, got shape {}", shape_str(shape()));
  return p[0];
}

template <class T>
MatrixMap<T> Tensor::as_matrix() const {
  if (dim() != 2) fail("as_matrix", "needs a 2-D tensor, got shape {}", shape_str(shape()));
  return MatrixMap<T>(data<T>(), shape()[0], shape()[1]);
}

template <class T>
ArrayMap<T> Tensor::as_array() const {
  return ArrayMap<T>(data<T>(), numel());
}

// s as messages and labels quote it: a byte that would not print as itself (a control byte such
// as NUL, or DEL) is written as \xNN and a backslash as \\, so nothing in a name is cut or hidden.
std::string printable(std::string_view s);
// s as messages quote a name: printable(s) in single quotes, a quote inside escaped as \'.
std::string quoted(std::string_view s);

// What an undefined tensor is, as messages put it after "is": "an undefined tensor
// (default-constructed: no value)", or for a gradient not computed yet "the .grad() of 'attn.W_Q'
// [4, 4], which is undefined: no backward has reached it yet (call backward() on a loss that
// depends on it)". t must be undefined.
std::string undefined_description(const Tensor& t);

// ---- factories ----
// values are row-major; their count must equal the product of shape. Into Int64 each value is
// truncated toward zero, as to() converts.
Tensor tensor(const std::vector<double>& values, const Shape& shape, Dtype dtype = Dtype::Float32);
Tensor tensor(const std::vector<double>& values, std::initializer_list<std::int64_t> shape,
              Dtype dtype = Dtype::Float32);
// An Int64 tensor holding values exactly (indices, class targets):
//   std::vector<std::int64_t> ids = {3, 1, 4};  Tensor t = tensor(ids, {3});
// (A template only so that a braced list of numbers, tensor({1, 2}, {2}), still means the
// double overload above.)
Tensor tensor_int64(const std::vector<std::int64_t>& values, const Shape& shape);
template <class V>
  requires std::is_same_v<V, std::vector<std::int64_t>>
Tensor tensor(const V& values, const Shape& shape) {
  return tensor_int64(values, shape);
}
Tensor scalar_tensor(double value, Dtype dtype = Dtype::Float32);  // shape []
Tensor zeros(const Shape& shape, Dtype dtype = Dtype::Float32);
Tensor ones(const Shape& shape, Dtype dtype = Dtype::Float32);
Tensor full(const Shape& shape, double value, Dtype dtype = Dtype::Float32);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
// [start, end) in steps of step (nonzero). With floating-point arguments the values are
// start + i·step computed in doubles; into Int64 with integral arguments they are counted
// exactly. With integer arguments (any integer types, chosen by overload) they are counted
// exactly in 64-bit integers, over the whole Int64 range, whatever the dtype (a Float32 or
// Float64 tensor then holds each value rounded to the nearest). A count past 2^63 - 1, or an
// argument outside the Int64 range, throws.
Tensor arange(double end, Dtype dtype = Dtype::Float32);
Tensor arange(double start, double end, double step = 1.0, Dtype dtype = Dtype::Float32);

namespace detail {
Tensor arange_exact(std::int64_t start, std::int64_t end, std::int64_t step, Dtype dtype);
[[noreturn]] void arange_argument_out_of_range(const char* what, std::uint64_t value);
template <class I>
std::int64_t arange_argument(const char* what, I value) {
  if constexpr (std::is_unsigned_v<I>)
    if (static_cast<std::uint64_t>(value) > static_cast<std::uint64_t>(INT64_MAX))
      arange_argument_out_of_range(what, static_cast<std::uint64_t>(value));
  return static_cast<std::int64_t>(value);
}
}  // namespace detail

template <class I>
concept ArangeInteger = std::is_integral_v<I> && !std::is_same_v<I, bool>;

template <ArangeInteger A, ArangeInteger B, ArangeInteger C>
Tensor arange(A start, B end, C step, Dtype dtype = Dtype::Float32) {
  const std::int64_t first = detail::arange_argument("start", start);  // checked in this order
  const std::int64_t last = detail::arange_argument("end", end);
  return detail::arange_exact(first, last, detail::arange_argument("step", step), dtype);
}
template <ArangeInteger A, ArangeInteger B>
Tensor arange(A start, B end) {
  return arange(start, end, std::int64_t{1});
}
template <ArangeInteger A>
Tensor arange(A end, Dtype dtype = Dtype::Float32) {
  return arange(std::int64_t{0}, end, std::int64_t{1}, dtype);
}

// Copies an Eigen matrix (any storage order) into a new 2-D tensor.
template <class Derived>
Tensor from_eigen(const Eigen::MatrixBase<Derived>& m) {
  using T = typename Derived::Scalar;
  Tensor t = Tensor::empty({m.rows(), m.cols()}, dtype_of<T>());
  t.as_matrix<T>() = m;
  return t;
}

// A list of tensors: what ops that take or return several tensors, grad and the transforms use.
using TensorList = std::vector<Tensor>;

}  // namespace autograd
