#pragma once
// HEADGRAD_ASAN is defined when the code is built with AddressSanitizer (GCC says so with
// __SANITIZE_ADDRESS__, Clang with __has_feature). The engine's caches switch off under it, and
// tests that count or measure allocations read it.
#if defined(__SANITIZE_ADDRESS__)
#define HEADGRAD_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HEADGRAD_ASAN 1
#endif
#endif
