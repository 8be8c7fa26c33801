#include "buffer_pool.hpp"

#include <cstdlib>
#include <new>
#include <unordered_map>
#include <vector>

#include "autograd/tensor.hpp"
#include "thread_cache.hpp"

namespace autograd {
namespace detail {
namespace {

#ifdef HEADGRAD_ASAN
constexpr std::size_t kMaxCachedBytes = 0;  // every free goes back to the system: ASan sees it
#else
constexpr std::size_t kMaxCachedBytes = std::size_t{256} << 20;  // per thread
#endif

struct Cache {
  std::unordered_map<std::size_t, std::vector<void*>> buckets;  // size in bytes -> free buffers
  std::size_t bytes = 0;

  void release() {
    for (auto& [size, list] : buckets)
      for (void* p : list) std::free(p);
    buckets.clear();
    bytes = 0;
  }
  ~Cache() { release(); }
};

Cache* thread_cache() { return this_thread_cache<Cache>(); }

}  // namespace

void* buffer_alloc(std::size_t bytes) {
  if (Cache* c = thread_cache()) {
    auto it = c->buckets.find(bytes);
    if (it != c->buckets.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      c->bytes -= bytes;
      return p;
    }
  }
  void* p = std::aligned_alloc(64, bytes);
  if (p == nullptr) {
    // Out of memory: give back what the cache holds and try once more.
    if (Cache* c = thread_cache()) c->release();
    p = std::aligned_alloc(64, bytes);
    if (p == nullptr) throw std::bad_alloc();
  }
  return p;
}

void buffer_free(void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return;
  Cache* c = thread_cache();
  if (c == nullptr || c->bytes + bytes > kMaxCachedBytes) {
    std::free(p);
    return;
  }
  try {
    c->buckets[bytes].push_back(p);
    c->bytes += bytes;
  } catch (...) {  // no memory for the bookkeeping: free it instead
    std::free(p);
  }
}

}  // namespace detail

std::size_t cached_buffer_bytes() {
  detail::Cache* c = detail::thread_cache();
  return c != nullptr ? c->bytes : 0;
}

void release_cached_buffers() {
  if (detail::Cache* c = detail::thread_cache()) c->release();
}

}  // namespace autograd
