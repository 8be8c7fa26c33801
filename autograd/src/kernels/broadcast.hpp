#pragma once
// The loops of a broadcast, shared by the op files and the exact kernels (internal, not installed).
//
// map<K>(shape, {in_0, ..., in_K-1}, f): a new tensor of `shape` with
//   out[i] = f(in_0[i'], ..., in_K-1[i'])    (each input broadcast to `shape`, NumPy rules)
//
// The output index space is collapsed (size-1 dims dropped, dims that are contiguous in every
// input merged) and cut into runs along the innermost collapsed dim. Along one run every input
// either advances one element at a time or stays on one element (it is broadcast there), so f
// is called once per run with Eigen array expressions: a Map for an advancing input, a Constant
// for a fixed one. Same-shape inputs make a single run, a scalar is one Constant, a row
// broadcast ([M, N] with [N]) makes M runs of N — all vectorised, nothing allocated per element.
// Large outputs are split across the OpenMP threads.
//
// f is written once, generically:
//   map<2>(out_shape, {a, b}, [](const auto& x, const auto& y) { return x * y; });
// and may name its scalar type as scalar_t<decltype(x)>.
#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include <Eigen/Core>
#include <omp.h>

#include "autograd/shape.hpp"
#include "autograd/tensor.hpp"
#include "kernels/eigen_views.hpp"

namespace autograd::broadcast {

// The scalar type of an Eigen expression handed to a kernel lambda.
template <class E>
using scalar_t = typename std::decay_t<E>::Scalar;

// The iteration plan of a K-input broadcast over an output shape.
template <std::size_t K>
struct BroadcastPlan {
  Shape sizes;                    // collapsed output dims, outermost first (at least one)
  std::array<Shape, K> strides;   // per input, per collapsed dim, in elements (0 = broadcast)
  std::int64_t numel = 0;
};

template <std::size_t K>
BroadcastPlan<K> make_plan(const Shape& out, const std::array<const Shape*, K>& in) {
  const std::size_t rank = out.size();
  BroadcastPlan<K> plan;
  plan.numel = shape_numel(out);
  // Strides of each input seen through the output's dims (right-aligned, 0 where broadcast).
  std::array<Shape, K> full;
  for (std::size_t k = 0; k < K; ++k) {
    const Shape& s = *in[k];
    full[k].assign(rank, 0);
    std::int64_t stride = 1;
    for (std::size_t j = 0; j < s.size(); ++j) {
      const std::size_t src = s.size() - 1 - j, dst = rank - 1 - j;
      full[k][dst] = s[src] == 1 ? 0 : stride;
      stride *= s[src];
    }
  }
  // Drop size-1 output dims and merge a dim into its outer neighbour when every input walks
  // both as one (outer stride == inner stride * inner size; holds for 0/0 too).
  for (std::size_t d = 0; d < rank; ++d) {
    if (out[d] == 1) continue;
    bool merge = !plan.sizes.empty();
    for (std::size_t k = 0; k < K && merge; ++k) merge = plan.strides[k].back() == full[k][d] * out[d];
    if (merge) {
      plan.sizes.back() *= out[d];
      for (std::size_t k = 0; k < K; ++k) plan.strides[k].back() = full[k][d];
    } else {
      plan.sizes.push_back(out[d]);
      for (std::size_t k = 0; k < K; ++k) plan.strides[k].push_back(full[k][d]);
    }
  }
  if (plan.sizes.empty()) {  // one element
    plan.sizes.push_back(1);
    for (std::size_t k = 0; k < K; ++k) plan.strides[k].push_back(0);
  }
  return plan;
}

// Calls run(out_offset, in_offsets, length) for each run of output elements [begin, end).
template <std::size_t K, class Run>
void for_each_run(const BroadcastPlan<K>& plan, std::int64_t begin, std::int64_t end, Run&& run) {
  if (begin >= end) return;
  const std::size_t rank = plan.sizes.size();
  const std::int64_t inner = plan.sizes.back();
  // Multi-index of `begin` over the collapsed dims.
  Shape index(rank);  // inline storage: no allocation per call
  for (std::size_t d = rank, rest = static_cast<std::size_t>(begin); d-- > 0;) {
    index[d] = static_cast<std::int64_t>(rest % static_cast<std::size_t>(plan.sizes[d]));
    rest /= static_cast<std::size_t>(plan.sizes[d]);
  }
  std::array<std::int64_t, K> offset{};
  for (std::size_t k = 0; k < K; ++k)
    for (std::size_t d = 0; d < rank; ++d) offset[k] += index[d] * plan.strides[k][d];

  std::int64_t pos = begin;
  while (pos < end) {
    const std::int64_t len = std::min(inner - index[rank - 1], end - pos);
    run(pos, offset, len);
    pos += len;
    index[rank - 1] += len;
    for (std::size_t k = 0; k < K; ++k) offset[k] += len * plan.strides[k][rank - 1];
    // Carry into the outer dims.
    for (std::size_t d = rank - 1; d > 0 && index[d] == plan.sizes[d]; --d) {
      index[d] = 0;
      ++index[d - 1];
      for (std::size_t k = 0; k < K; ++k)
        offset[k] += plan.strides[k][d - 1] - plan.sizes[d] * plan.strides[k][d];
    }
  }
}

// Splits [0, numel) over the threads (in cache-line multiples) when the work is large enough.
template <class Chunk>
void parallel_chunks(std::int64_t numel, Chunk&& chunk) {
  isa::choose();  // on the calling thread, before any region (see parallel_for)
  const int threads = numel >= kParallelElementwise && threads_available() ? omp_get_max_threads() : 1;
  if (threads <= 1) {
    chunk(std::int64_t{0}, numel);
    return;
  }
  const std::int64_t step = ((numel + threads - 1) / threads + 15) / 16 * 16;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int t = 0; t < threads; ++t) {
    isa::clear_upper_state();
    const std::int64_t b = std::min(numel, t * step), e = std::min(numel, b + step);
    chunk(b, e);
  }
}

namespace detail {

// Binds input I of a run as an Eigen expression (Map or Constant) and recurses to the next.
template <class T, std::size_t K, std::size_t I = 0, class Done, class... Exprs>
void bind_inputs(const std::array<const T*, K>& ptr, const std::array<bool, K>& fixed, Eigen::Index len,
                 Done& done, const Exprs&... exprs) {
  if constexpr (I == K) {
    done(exprs...);
  } else if (fixed[I]) {
    bind_inputs<T, K, I + 1>(ptr, fixed, len, done, exprs..., Array1<T>::Constant(len, *ptr[I]));
  } else {
    bind_inputs<T, K, I + 1>(ptr, fixed, len, done, exprs..., ConstArrayView<T>(ptr[I], len));
  }
}

}  // namespace detail

// The typed core: out (contiguous, plan.numel elements) = f(inputs...) under `plan`.
template <class T, std::size_t K, class F>
void map_into(const BroadcastPlan<K>& plan, T* out, const std::array<const T*, K>& in, F&& f) {
  std::array<bool, K> fixed{};
  for (std::size_t k = 0; k < K; ++k) fixed[k] = plan.strides[k].back() == 0;
  parallel_chunks(plan.numel, [&](std::int64_t begin, std::int64_t end) {
    for_each_run(plan, begin, end, [&](std::int64_t out_off, const std::array<std::int64_t, K>& in_off, std::int64_t len) {
      std::array<const T*, K> ptr;
      for (std::size_t k = 0; k < K; ++k) ptr[k] = in[k] + in_off[k];
      ArrayView<T> dst(out + out_off, len);
      auto assign = [&](const auto&... exprs) { dst = f(exprs...); };
      detail::bind_inputs<T, K>(ptr, fixed, len, assign);
    });
  });
}

// A new tensor of `shape` (dtype of the inputs, which must all share it; the caller checks),
// out = f(inputs broadcast to shape).
template <std::size_t K, class F>
Tensor map(const Shape& shape, const std::array<Tensor, K>& in, F&& f) {
  const Dtype dtype = in[0].dtype();
  Tensor out = Tensor::empty(shape, dtype);
  bool same_shapes = true;  // the common case: one run over contiguous arrays, no plan
  for (std::size_t k = 0; k < K; ++k) same_shapes = same_shapes && in[k].shape() == shape;
  dispatch(dtype, [&](auto zero) {
    using T = decltype(zero);
    std::array<const T*, K> ptr;
    for (std::size_t k = 0; k < K; ++k) ptr[k] = in[k].template data<T>();
    T* dst_data = out.data<T>();
    if (same_shapes) {
      const std::array<bool, K> fixed{};
      parallel_chunks(out.numel(), [&](std::int64_t begin, std::int64_t end) {
        std::array<const T*, K> p;
        for (std::size_t k = 0; k < K; ++k) p[k] = ptr[k] + begin;
        ArrayView<T> dst(dst_data + begin, end - begin);
        auto assign = [&](const auto&... exprs) { dst = f(exprs...); };
        detail::bind_inputs<T, K>(p, fixed, end - begin, assign);
      });
      return;
    }
    std::array<const Shape*, K> shapes;
    for (std::size_t k = 0; k < K; ++k) shapes[k] = &in[k].shape();
    map_into<T, K>(make_plan<K>(shape, shapes), dst_data, ptr, f);
  });
  return out;
}

// Elementwise over one tensor: y = f(x), same shape.
template <class F>
Tensor map1(const Tensor& x, F&& f) {
  return map<1>(x.shape(), {x}, std::forward<F>(f));
}

}  // namespace autograd::broadcast
