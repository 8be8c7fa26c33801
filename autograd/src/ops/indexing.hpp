#pragma once
// Index lists (internal): what index_select, embedding and gather read their indices into.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "autograd/tensor.hpp"
#include "buffer_pool.hpp"
#include "ops/checks.hpp"

namespace autograd {

// A list of indices in a buffer from the tensor buffer cache: a fixed-shape loop reuses it
// (no allocation once warm). Move-only; the backward rule owns it.
class Indices {
 public:
  Indices(std::string_view op, std::size_t n)
      : n_(n), bytes_(buffer_bytes(op, n)), data_(static_cast<std::int64_t*>(detail::buffer_alloc(bytes_))) {}
  Indices(std::string_view op, const std::vector<std::int64_t>& values) : Indices(op, values.size()) {
    std::copy(values.begin(), values.end(), data_);
  }
  Indices(Indices&& o) noexcept : n_(o.n_), bytes_(o.bytes_), data_(std::exchange(o.data_, nullptr)) {}
  Indices(const Indices&) = delete;
  Indices& operator=(const Indices&) = delete;
  Indices& operator=(Indices&&) = delete;
  ~Indices() {
    if (data_ != nullptr) detail::buffer_free(data_, bytes_);
  }
  Indices copy(std::string_view op) const {
    Indices out(op, n_);
    std::copy(data_, data_ + n_, out.data_);
    return out;
  }
  std::size_t size() const { return n_; }
  std::int64_t operator[](std::size_t i) const { return data_[i]; }
  std::int64_t& operator[](std::size_t i) { return data_[i]; }

 private:
  // n indices rounded up to the buffers' 64-byte granule (at least one).
  static std::size_t buffer_bytes(std::string_view op, std::size_t n) {
    const auto count = static_cast<std::int64_t>(std::max<std::size_t>(n, 1));
    const std::int64_t bytes = checked_mul(op, count, static_cast<std::int64_t>(sizeof(std::int64_t)));
    return static_cast<std::size_t>(checked_add(op, bytes, 63) / 64 * 64);
  }
  std::size_t n_, bytes_;
  std::int64_t* data_;
};

// The values of an index tensor as integers: an Int64 tensor's as they are; a float tensor's
// each must be a whole number.
inline Indices to_indices(std::string_view op, const Tensor& index) {
  check_defined(op, index, "the index");
  Indices out(op, static_cast<std::size_t>(index.numel()));
  if (index.dtype() == Dtype::Int64) {
    const std::int64_t* values = index.data<std::int64_t>();
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = values[i];
    return out;
  }
  dispatch(index.dtype(), [&](auto zero) {
    using T = decltype(zero);
    const T* values = index.data<T>();
    for (std::size_t i = 0; i < out.size(); ++i) {
      const double v = static_cast<double>(values[i]);
      if (!std::isfinite(v) || v != std::floor(v) || std::fabs(v) > 9.0e15)
        fail(op, "indices must hold integral values, got {} at position {} of index shape {}", v, i,
             shape_str(index.shape()));
      out[i] = static_cast<std::int64_t>(v);
    }
  });
  return out;
}

}  // namespace autograd
