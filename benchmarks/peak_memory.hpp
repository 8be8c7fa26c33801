#pragma once
// Peak resident memory of one call above the process's baseline, and a limit on the process's
// resident memory, both from Linux's /proc (elsewhere the peak reads NaN and the limit is off).
//
// Writing "5" to /proc/self/clear_refs resets the process's high-water mark (VmHWM in
// /proc/self/status) to its current resident size (VmRSS); after the call VmHWM is the peak since.
// The baseline is VmRSS just before the call, after the calling thread's cache of freed tensor
// buffers is emptied (autograd::release_cached_buffers) and glibc has handed its free heap back to
// the system (malloc_trim): memory that an earlier call freed but an allocator kept would otherwise
// be counted in the baseline and reused unseen. compare_torch.py measures PyTorch the same way.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <utility>

#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <unistd.h>

#include <autograd/autograd.hpp>

namespace bench {

// A "VmRSS:"-style field of /proc/self/status in MiB; NaN when it cannot be read.
inline double proc_status_mib(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == field + ":") {
      double kib = 0;
      if (in >> kib) return kib / 1024.0;
      break;
    }
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return std::numeric_limits<double>::quiet_NaN();
}

// Resets VmHWM to the current VmRSS; false when the kernel does not allow it.
inline bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  if (!out) return false;
  out << "5" << std::flush;
  return static_cast<bool>(out);
}

inline void release_free_heap() {
  autograd::release_cached_buffers();
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

// Keeps the compiler from dropping the writes to *p (a buffer written and never read).
inline void do_not_optimize(void* p) {
#if defined(__GNUC__)
  asm volatile("" : : "r"(p) : "memory");
#else
  static void* volatile sink;
  sink = p;
#endif
}

// MiB by which f() raised the process's resident memory at its peak above the baseline.
template <class F>
double peak_mib_above_baseline(F&& f) {
  release_free_heap();
  if (!reset_peak_rss()) return std::numeric_limits<double>::quiet_NaN();
  const double base = proc_status_mib("VmRSS");
  f();
  return proc_status_mib("VmHWM") - base;
}

// The process's resident bytes from /proc/self/statm (cheaper to read than status); 0 if unknown.
inline std::uint64_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  std::uint64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
}

// While alive, a thread checks the process's resident memory every 10 ms; above `max_gib` GiB
// it prints `message` to stdout and ends the process with exit code 3 (a running step cannot be
// stopped any other way). max_gib <= 0: no limit, no thread.
class ResidentLimit {
 public:
  ResidentLimit(double max_gib, std::string message) : message_(std::move(message)) {
    if (max_gib <= 0) return;
    const auto limit = static_cast<std::uint64_t>(max_gib * 1024.0 * 1024.0 * 1024.0);
    watcher_ = std::thread([this, limit] {
      while (!stop_.load(std::memory_order_relaxed)) {
        if (resident_bytes() > limit) {
          std::fputs(message_.c_str(), stdout);
          std::fflush(stdout);
          std::_Exit(3);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    });
  }
  ResidentLimit(const ResidentLimit&) = delete;
  ResidentLimit& operator=(const ResidentLimit&) = delete;
  ~ResidentLimit() {
    stop_.store(true, std::memory_order_relaxed);
    if (watcher_.joinable()) watcher_.join();
  }

 private:
  std::string message_;
  std::atomic<bool> stop_{false};
  std::thread watcher_;
};

}  // namespace bench
