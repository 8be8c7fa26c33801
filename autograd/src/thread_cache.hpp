#pragma once
// What the engine's two per-thread caches (buffer_pool.cpp for tensor buffers, small_pool.cpp
// for small objects) share (internal, not installed).
//
// HEADGRAD_ASAN is defined in builds with AddressSanitizer: there the caches keep nothing, so
// that every free reaches the sanitizer and a use after free is still caught.
#include "autograd/detail/sanitizer.hpp"

namespace autograd::detail {

// This thread's T, made on first use; null once thread exit has destroyed it. A block freed
// after that (by a thread_local destructor that runs later, e.g. a tensor held by another
// thread_local) must then go straight back to the system; it is never revived.
template <class T>
T* this_thread_cache() {
  struct Holder {
    explicit Holder(bool* alive) : alive(alive) { *alive = true; }
    ~Holder() { *alive = false; }  // before `value` is destroyed: its frees see null
    Holder(const Holder&) = delete;
    Holder& operator=(const Holder&) = delete;
    bool* alive;
    T value;
  };
  static thread_local bool alive = false;
  static thread_local bool made = false;
  if (!alive) {
    if (made) return nullptr;
    made = true;
  }
  static thread_local Holder holder(&alive);
  return &holder.value;
}

}  // namespace autograd::detail
