#pragma once
// Counts every heap allocation of the process, for the benchmarks that report allocations per
// step. Include it in exactly one source file of a program: it replaces operator new and delete,
// and defines the wrappers of the C allocators (tensor storage uses aligned_alloc, Eigen's
// temporaries malloc), which the link wraps (-Wl,--wrap=..., benchmarks/CMakeLists.txt), so
// every call from the program and the static headgrad libraries is caught.
#include <execinfo.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>

#include <fmt/core.h>

namespace {
std::atomic<std::uint64_t> g_allocations{0};
std::atomic<std::uint64_t> g_allocated_bytes{0};
// While set, each allocation prints its call stack to stderr (addresses; pipe through
// `c++filt` and `addr2line -e <program>` to read them).
bool g_trace = false;
thread_local bool t_in_trace = false;
void count(std::size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  g_allocated_bytes.fetch_add(size, std::memory_order_relaxed);
  if (g_trace && !t_in_trace) {
    t_in_trace = true;  // backtrace() may allocate on its first call
    void* frames[24];
    const int n = backtrace(frames, 24);
    fmt::print(stderr, "allocation of {} bytes:\n", size);
    std::fflush(stderr);
    backtrace_symbols_fd(frames, n, 2);
    t_in_trace = false;
  }
}
}  // namespace

extern "C" {
void* __real_malloc(std::size_t size);
void* __real_calloc(std::size_t n, std::size_t size);
void* __real_realloc(void* p, std::size_t size);
void* __real_aligned_alloc(std::size_t align, std::size_t size);
int __real_posix_memalign(void** p, std::size_t align, std::size_t size);
void* __wrap_malloc(std::size_t size) {
  count(size);
  return __real_malloc(size);
}
void* __wrap_calloc(std::size_t n, std::size_t size) {
  count(n * size);
  return __real_calloc(n, size);
}
void* __wrap_realloc(void* p, std::size_t size) {
  count(size);
  return __real_realloc(p, size);
}
void* __wrap_aligned_alloc(std::size_t align, std::size_t size) {
  count(size);
  return __real_aligned_alloc(align, size);
}
int __wrap_posix_memalign(void** p, std::size_t align, std::size_t size) {
  count(size);
  return __real_posix_memalign(p, align, size);
}
}

namespace {
void* counted_alloc(std::size_t size, std::size_t align) {
  count(size);
  if (size == 0) size = 1;
  void* p = nullptr;
  if (align <= alignof(std::max_align_t)) {
    p = __real_malloc(size);
  } else {
    size = (size + align - 1) / align * align;  // aligned_alloc wants a multiple of the alignment
    p = __real_aligned_alloc(align, size);
  }
  if (!p) throw std::bad_alloc();
  return p;
}
}  // namespace

void* operator new(std::size_t n) { return counted_alloc(n, alignof(std::max_align_t)); }
void* operator new[](std::size_t n) { return counted_alloc(n, alignof(std::max_align_t)); }
void* operator new(std::size_t n, std::align_val_t a) { return counted_alloc(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted_alloc(n, static_cast<std::size_t>(a)); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted_alloc(n, alignof(std::max_align_t));
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
