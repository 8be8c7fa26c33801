#pragma once
// A cache of freed tensor buffers, so that a training loop with fixed shapes stops calling the
// system allocator for tensor buffers once warm (internal, not installed).
//
// Buffers are kept per thread, in exact-size buckets (sizes are already rounded to 64 bytes by
// Storage): step N+1 of a fixed-shape loop asks for the sizes step N freed, so exact buckets
// are reused without the memory waste of power-of-two classes. A buffer freed on another thread
// goes to that thread's cache. Each thread keeps at most kMaxCachedBytes; past that, freed
// buffers go back to the system. The cache is empty for builds with AddressSanitizer, so that
// a use after free is still caught.
#include <cstddef>

namespace autograd::detail {

// A 64-byte aligned buffer of `bytes` (a positive multiple of 64); throws std::bad_alloc.
void* buffer_alloc(std::size_t bytes);
// Returns a buffer from buffer_alloc with the same `bytes`.
void buffer_free(void* p, std::size_t bytes) noexcept;

}  // namespace autograd::detail
