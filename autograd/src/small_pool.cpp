#include "autograd/detail/small_pool.hpp"

#include <array>
#include <new>

#include "thread_cache.hpp"

namespace autograd::detail {
namespace {

constexpr std::size_t kGranule = 16;
constexpr std::size_t kClasses = kSmallObjectMax / kGranule;
#ifdef HEADGRAD_ASAN
constexpr std::size_t kSmallListMax = 0;
#else
constexpr std::size_t kSmallListMax = 4096;  // per size, per thread: at most 4 MiB at 1024 bytes
#endif

struct FreeBlock {
  FreeBlock* next;
};

struct Lists {
  std::array<FreeBlock*, kClasses> head{};
  std::array<std::size_t, kClasses> count{};
  ~Lists();
};

Lists::~Lists() {
  for (FreeBlock* b : head)
    while (b != nullptr) {
      FreeBlock* next = b->next;
      ::operator delete(b);
      b = next;
    }
}

// This thread's lists, or null once they were destroyed (thread exit).
Lists* this_thread_lists() { return this_thread_cache<Lists>(); }

}  // namespace

void* small_alloc(std::size_t bytes) {
  if (bytes == 0 || bytes > kSmallObjectMax) return ::operator new(bytes);
  const std::size_t c = (bytes - 1) / kGranule;
  if (Lists* l = this_thread_lists(); l != nullptr && l->head[c] != nullptr) {
    FreeBlock* b = l->head[c];
    l->head[c] = b->next;
    --l->count[c];
    return b;
  }
  return ::operator new((c + 1) * kGranule);
}

void small_free(void* p, std::size_t bytes) noexcept {
  if (p == nullptr) return;
  if (bytes == 0 || bytes > kSmallObjectMax) {
    ::operator delete(p);
    return;
  }
  const std::size_t c = (bytes - 1) / kGranule;
  Lists* l = this_thread_lists();
  if (l == nullptr || l->count[c] >= kSmallListMax) {
    ::operator delete(p);
    return;
  }
  auto* b = static_cast<FreeBlock*>(p);
  b->next = l->head[c];
  l->head[c] = b;
  ++l->count[c];
}

}  // namespace autograd::detail
