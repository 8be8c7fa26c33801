#pragma once
// Per-thread free lists for the engine's small objects (tensor handles' impls, storages, graph
// nodes and their edge lists), so that once a fixed-shape loop is warm, making and dropping them
// does not call the system allocator.
//
// Sizes up to kSmallObjectMax bytes are rounded up to 16 and kept in one list per size; larger
// ones go straight to operator new. A block freed on another thread joins that thread's list.
// Each list keeps at most kSmallListMax blocks. With AddressSanitizer the lists stay empty, so
// a use after free is still caught.
#include <cstddef>

namespace autograd::detail {

inline constexpr std::size_t kSmallObjectMax = 1024;

void* small_alloc(std::size_t bytes);
void small_free(void* p, std::size_t bytes) noexcept;

// A std allocator over small_alloc/small_free (for std::allocate_shared and containers).
template <class T>
struct PoolAllocator {
  using value_type = T;
  PoolAllocator() noexcept = default;
  template <class U>
  PoolAllocator(const PoolAllocator<U>&) noexcept {}  // NOLINT: rebinding is implicit by design
  T* allocate(std::size_t n) { return static_cast<T*>(small_alloc(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) noexcept { small_free(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const PoolAllocator<U>&) const noexcept {
    return true;
  }
};

}  // namespace autograd::detail
