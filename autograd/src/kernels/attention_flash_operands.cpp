// The tiled attention core's per-thread copies of one slice's operands (SliceOperands in
// attention_flash.hpp): rows next to each other, and the keys and values transposed.
#include <algorithm>
#include <atomic>

#include "kernels/attention_flash.hpp"

namespace autograd::sdpa {

namespace {

std::atomic<std::uint64_t> calls{0};

// dst [L, cols] = rows of src (row stride sr).
template <class T>
void copy_rows(const T* src, std::int64_t sr, std::int64_t L, std::int64_t cols, Scratch<T>& dst) {
  dst.resize(static_cast<std::size_t>(L * cols));
  for (std::int64_t i = 0; i < L; ++i) std::copy(src + i * sr, src + i * sr + cols, dst.data() + i * cols);
}

// dst [L, cols] = scale · rows of src (row stride sr).
template <class T>
void copy_scaled_rows(const T* src, std::int64_t sr, std::int64_t L, std::int64_t cols, T scale, Scratch<T>& dst) {
  dst.resize(static_cast<std::size_t>(L * cols));
  for (std::int64_t i = 0; i < L; ++i)
    for (std::int64_t c = 0; c < cols; ++c) dst[static_cast<std::size_t>(i * cols + c)] = scale * src[i * sr + c];
}

// dst = the transpose of src's [L, cols] (row stride sr) in panels of `panel` of its L rows: the
// panel of rows j0.. is [cols, w] (w = min(panel, L − j0)) at dst + j0·cols. Copied in 16 x 16
// blocks that stay in cache while they are read and written.
template <class T>
void copy_panels(const T* src, std::int64_t sr, std::int64_t L, std::int64_t cols, std::int64_t panel,
                 Scratch<T>& dst) {
  dst.resize(static_cast<std::size_t>(L * cols));
  constexpr std::int64_t step = 16;
  for (std::int64_t p0 = 0; p0 < L; p0 += panel) {
    const std::int64_t w = std::min(panel, L - p0);
    T* out = dst.data() + p0 * cols;
    for (std::int64_t j0 = p0; j0 < p0 + w; j0 += step)
      for (std::int64_t c0 = 0; c0 < cols; c0 += step) {
        const std::int64_t j1 = std::min(p0 + w, j0 + step), c1 = std::min(cols, c0 + step);
        for (std::int64_t c = c0; c < c1; ++c)
          for (std::int64_t j = j0; j < j1; ++j) out[c * w + (j - p0)] = src[j * sr + c];
      }
  }
}

}  // namespace

std::uint64_t next_call() { return calls.fetch_add(1, std::memory_order_relaxed) + 1; }

template <class T>
void SliceOperands<T>::load(const Dims& d, std::uint64_t call_id, std::int64_t slice, std::int64_t panel_cols,
                            T scale, const T* q_in, const T* k_in, const T* v_in, const T* dout_in) {
  if (call == call_id && bh == slice && panel == panel_cols) return;
  const std::int64_t b = slice / d.H, h = slice % d.H;
  copy_scaled_rows(q_in + d.q.at(b, h), d.q.sr, d.T, d.d_k, scale, q);
  copy_panels(k_in + d.k.at(b, h), d.k.sr, d.S, d.d_k, panel_cols, kt);
  if (dout_in == nullptr) {
    copy_rows(v_in + d.v.at(b, h), d.v.sr, d.S, d.d_v, v);
  } else {
    copy_scaled_rows(k_in + d.k.at(b, h), d.k.sr, d.S, d.d_k, scale, k);
    copy_panels(v_in + d.v.at(b, h), d.v.sr, d.S, d.d_v, panel_cols, vt);
    copy_rows(dout_in + d.out.at(b, h), d.out.sr, d.T, d.d_v, dout);
  }
  call = call_id;
  bh = slice;
  panel = panel_cols;
}

template <class T>
SliceOperands<T>& thread_operands() {
  thread_local SliceOperands<T> operands;
  return operands;
}

template <class T>
void trim_thread_operands() {
  SliceOperands<T>& o = thread_operands<T>();
  const std::size_t bytes =
      (o.q.capacity() + o.k.capacity() + o.kt.capacity() + o.v.capacity() + o.vt.capacity() + o.dout.capacity()) *
      sizeof(T);
  if (bytes > kKeptScratchBytes) o = SliceOperands<T>();
}

template struct SliceOperands<float>;
template struct SliceOperands<double>;
template SliceOperands<float>& thread_operands<float>();
template SliceOperands<double>& thread_operands<double>();
template void trim_thread_operands<float>();
template void trim_thread_operands<double>();

}  // namespace autograd::sdpa
