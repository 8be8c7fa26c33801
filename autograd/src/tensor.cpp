#include "autograd/tensor.hpp"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include "autograd/grad_mode.hpp"
#include "autograd/graph.hpp"
#include "autograd/ops.hpp"
#include "autograd/detail/small_pool.hpp"
#include "buffer_pool.hpp"
#include "convert.hpp"
#include "ops/checks.hpp"

namespace autograd {

// ---- Storage ----

namespace {
// Bytes of the buffer behind `n` elements: a positive multiple of 64 (the alignment). Only for
// counts already checked (see Storage's constructor).
std::size_t buffer_bytes(Dtype dt, std::int64_t n) {
  const std::size_t bytes = (static_cast<std::size_t>(n) * dtype_size(dt) + 63) / 64 * 64;
  return bytes == 0 ? 64 : bytes;
}

// The most elements of dt whose buffer (rounded up to 64 bytes) has a byte count that fits in 64 bits.
std::int64_t max_elements(Dtype dt) {
  return (std::numeric_limits<std::int64_t>::max() - 63) / static_cast<std::int64_t>(dtype_size(dt));
}
}  // namespace

Storage::Storage(Dtype dt, std::int64_t n) : dtype(dt), numel(n) {
  if (n < 0) fail("Storage", "negative element count {}", n);
  checked_add("Storage", checked_mul("Storage", n, static_cast<std::int64_t>(dtype_size(dt))), 63);  // bytes fit
  data = detail::buffer_alloc(buffer_bytes(dt, n));
}

Storage::~Storage() { detail::buffer_free(data, buffer_bytes(dtype, numel)); }

// ---- construction ----

Tensor Tensor::empty(const Shape& shape, Dtype dtype, std::string_view op) {
  const std::int64_t numel = checked_numel(op, shape);
  if (numel > max_elements(dtype))
    fail(op, "shape {} of {} needs more bytes than a 64-bit count can hold", shape_str(shape), dtype_name(dtype));
  auto impl = std::allocate_shared<TensorImpl>(detail::PoolAllocator<TensorImpl>{});
  impl->shape = shape;
  impl->dtype = dtype;
  impl->storage = std::allocate_shared<Storage>(detail::PoolAllocator<Storage>{}, dtype, numel);
  return Tensor(std::move(impl));
}

std::int64_t Tensor::size(std::int64_t d) const { return shape()[normalize_dim("size", d, dim())]; }


void* Tensor::raw_data() const {
  check_defined("raw_data");
  return impl_->storage->data;
}

std::vector<double> Tensor::to_vector() const {
  check_defined("to_vector");
  std::vector<double> out(static_cast<std::size_t>(numel()));
  dispatch_all(dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* p = data<T>();
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<double>(p[i]);
  });
  return out;
}

double Tensor::item() const {
  check_defined("item");
  if (numel() != 1) fail("item", "needs a tensor with one element, got shape {}", shape_str(shape()));
  double value = 0.0;
  dispatch_all(dtype(), [&](auto zero) { value = static_cast<double>(data<decltype(zero)>()[0]); });
  return value;
}

Tensor Tensor::to(Dtype target) const {
  check_defined("to");
  if (dtype() == target) return *this;
  Tensor out = Tensor::empty(shape(), target);
  dispatch_all(dtype(), [&](auto src_zero) {
    using S = decltype(src_zero);
    dispatch_all(target, [&](auto dst_zero) {
      using D = decltype(dst_zero);
      detail::convert_values("to", data<S>(), out.data<D>(), numel());
    });
  });
  if (is_floating(target) && needs_grad(*this)) {  // an integer result has no gradient
    const Dtype source = dtype();
    // y = convert(x)  =>  dx = convert_back(dy)
    return record("to", {*this}, out,
                  [source](const TensorList& g, const Node&) { return TensorList{g[0].to(source)}; });
  }
  return out;
}

Tensor Tensor::detach() const {
  check_defined("detach");
  auto impl = std::allocate_shared<TensorImpl>(detail::PoolAllocator<TensorImpl>{});
  impl->shape = impl_->shape;
  impl->dtype = impl_->dtype;
  impl->storage = impl_->storage;
  return Tensor(std::move(impl));
}

Tensor Tensor::clone() const {
  check_defined("clone");
  Tensor out = Tensor::empty(shape(), dtype());
  std::memcpy(out.raw_data(), raw_data(), static_cast<std::size_t>(numel()) * dtype_size(dtype()));
  if (needs_grad(*this)) {
    // y = x  =>  dx = dy
    return record("clone", {*this}, out, [](const TensorList& g, const Node&) { return TensorList{g[0]}; });
  }
  return out;
}

Tensor clone(const Tensor& x) { return x.clone(); }

// ---- autograd ----


Tensor& Tensor::requires_grad_(bool on) {
  check_defined("requires_grad_");
  if (on && !is_floating(dtype()))
    fail("requires_grad_", "only Float32 and Float64 tensors can require grad, got an {} tensor {} "
         "(integers are not differentiable)", dtype_name(dtype()), shape_str(shape()));
  if (impl_->grad_fn)
    fail("requires_grad_", "only leaf tensors can change requires_grad; this one was made by '{}' "
         "(use detach() to get a leaf)", printable(impl_->grad_fn->name()));
  impl_->requires_grad = on;
  return *this;
}

bool Tensor::is_leaf() const { return impl_ && !impl_->grad_fn; }

void Tensor::set_grad(const Tensor& g) const {
  check_defined("set_grad");
  if (g.defined() && !is_floating(g.dtype()))
    fail("set_grad", "the gradient is {} {}; gradients are Float32 or Float64 (convert with .to(Dtype::{}))",
         shape_str(g.shape()), dtype_name(g.dtype()), is_floating(dtype()) ? dtype_name(dtype()) : "Float32");
  if (g.defined() && (g.shape() != shape() || g.dtype() != dtype()))
    fail("set_grad", "gradient {} {} does not match tensor {} {}", shape_str(g.shape()), dtype_name(g.dtype()),
         shape_str(shape()), dtype_name(dtype()));
  impl_->grad = g.defined() ? g.impl() : nullptr;  // an undefined g's note is not kept
}


std::uint32_t Tensor::output_nr() const {
  check_defined("output_nr");
  return impl_->output_nr;
}

void Tensor::backward(const BackwardOptions& options) const {
  check_defined("backward");
  if (numel() != 1)
    throw std::runtime_error(fmt::format(
        "backward: a gradient can be created implicitly only for a one-element tensor, got shape {}; "
        "pass a gradient: t.backward(grad)", shape_str(shape())));
  const Tensor seed = ones(shape(), dtype());
  run_backward(std::span<const Tensor>(this, 1), std::span<const Tensor>(&seed, 1), options.retain_graph,
               options.create_graph);
}

void Tensor::backward(const Tensor& grad, const BackwardOptions& options) const {
  check_defined("backward");
  if (!grad.defined()) {
    backward(options);
    return;
  }
  if (grad.shape() != shape() || grad.dtype() != dtype())
    fail("backward", "gradient {} {} does not match tensor {} {}", shape_str(grad.shape()),
         dtype_name(grad.dtype()), shape_str(shape()), dtype_name(dtype()));
  run_backward(std::span<const Tensor>(this, 1), std::span<const Tensor>(&grad, 1), options.retain_graph,
               options.create_graph);
}

Tensor& Tensor::retain_grad() {
  check_defined("retain_grad");
  if (!requires_grad()) fail("retain_grad", "tensor does not require grad");
  if (is_leaf() || impl_->retains_grad) return *this;
  impl_->retains_grad = true;
  std::weak_ptr<TensorImpl> weak = impl_;
  register_hook([weak](const Tensor& g) {
    if (!backward_accumulates_grad()) return Tensor();  // grad() writes no .grad
    if (auto impl = weak.lock()) {
      if (is_grad_enabled()) {  // create_graph: .grad is part of the graph, added out of place
        impl->grad = impl->grad ? add(Tensor(impl->grad), g).impl() : g.clone().impl();
      } else if (impl->grad) {
        Tensor(impl->grad).add_(g);
      } else {
        impl->grad = g.detach().clone().impl();
      }
    }
    return Tensor();
  });
  return *this;
}

void Tensor::register_hook(TensorHook hook) {
  check_defined("register_hook");
  if (!requires_grad()) fail("register_hook", "tensor does not require grad, so no gradient will reach it");
  if (impl_->grad_fn) {
    auto& hooks = impl_->grad_fn->output_hooks;
    if (hooks.size() <= impl_->output_nr) hooks.resize(impl_->output_nr + 1);
    hooks[impl_->output_nr].push_back(std::move(hook));
  } else {
    impl_->leaf_hooks.push_back(std::move(hook));  // on the tensor: its accumulator may be remade
  }
}

Tensor& Tensor::set_name(std::string name) {
  check_defined("set_name");
  impl_->name = std::move(name);
  return *this;
}

const std::string& Tensor::name() const {
  check_defined("name");
  return impl_->name;
}

// ---- in place ----

namespace {
void check_in_place(std::string_view op, const Tensor& t) {
  if (is_grad_enabled() && t.requires_grad())
    fail(op, "in-place change of a tensor that requires grad {}; do it under NoGradGuard",
         shape_str(t.shape()));
}
}  // namespace

void Tensor::mark_modified() const {
  check_defined("mark_modified");
  ++impl_->storage->version;
}

std::uint64_t Tensor::version() const {
  check_defined("version");
  return impl_->storage->version;
}

Tensor& Tensor::copy_(const Tensor& src) {
  check_defined("copy_");
  if (!src.defined()) fail("copy_", "the source is {}", undefined_description(src));
  if (src.shape() != shape())
    fail("copy_", "shapes differ: destination {} and source {}", shape_str(shape()), shape_str(src.shape()));
  check_in_place("copy_", *this);
  dispatch_all(src.dtype(), [&](auto src_zero) {
    using S = decltype(src_zero);
    dispatch_all(dtype(), [&](auto dst_zero) {
      using D = decltype(dst_zero);
      const S* s = src.data<S>();
      D* d = data<D>();
      if (static_cast<const void*>(s) == static_cast<const void*>(d)) return;
      detail::convert_values("copy_", s, d, numel());
    });
  });
  mark_modified();
  return *this;
}

Tensor& Tensor::fill_(double value) {
  check_defined("fill_");
  check_in_place("fill_", *this);
  dispatch_all(dtype(), [&](auto zero) {
    using T = decltype(zero);
    T* d = data<T>();
    std::fill(d, d + numel(), detail::from_double<T>("fill_", value));
  });
  mark_modified();
  return *this;
}

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  check_defined("add_");
  check_floating("add_", *this);
  if (!other.defined()) fail("add_", "the other tensor is {}", undefined_description(other));
  if (other.shape() != shape())
    fail("add_", "shapes differ: {} and {}", shape_str(shape()), shape_str(other.shape()));
  if (other.dtype() != dtype())
    fail("add_", "dtypes differ: {} and {}", dtype_name(dtype()), dtype_name(other.dtype()));
  check_in_place("add_", *this);
  dispatch(dtype(), [&](auto zero) {
    using T = decltype(zero);
    const std::int64_t n = numel();
    Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>> d(data<T>(), n);
    Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>> s(other.data<T>(), n);
    if (alpha == 1.0) {
      d += s;
    } else {
      d += static_cast<T>(alpha) * s;
    }
  });
  mark_modified();
  return *this;
}

Tensor& Tensor::mul_(double value) {
  check_defined("mul_");
  check_floating("mul_", *this);
  check_in_place("mul_", *this);
  dispatch(dtype(), [&](auto zero) {
    using T = decltype(zero);
    Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>(data<T>(), numel()) *= static_cast<T>(value);
  });
  mark_modified();
  return *this;
}

Tensor& Tensor::set_data(const Tensor& other) {
  check_defined("set_data");
  if (!other.defined()) fail("set_data", "the source is {}", undefined_description(other));
  if (impl_->requires_grad && !is_floating(other.dtype()))
    fail("set_data", "this tensor requires grad, so its data cannot become {} (shape {}): integers are not "
         "differentiable", dtype_name(other.dtype()), shape_str(other.shape()));
  // A graph recorded before keeps adding into this leaf while the shape and dtype stay (as in
  // PyTorch); when they change, graphs recorded from now on get a new accumulator, and the old
  // one refuses the gradients of the old shape (AccumulateGrad::apply).
  if (impl_->shape != other.shape() || impl_->dtype != other.dtype()) impl_->grad_accumulator.reset();
  impl_->shape = other.shape();
  impl_->dtype = other.dtype();
  impl_->storage = other.impl()->storage;
  impl_->grad.reset();
  return *this;
}

}  // namespace autograd
