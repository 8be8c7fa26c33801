#!/usr/bin/env bash
# Builds headgrad with AddressSanitizer + UndefinedBehaviorSanitizer (-DHEADGRAD_SANITIZE=ON)
# and runs the whole test suite under them, leak detection included. Any report fails the run.
# Usage: scripts/test_sanitize.sh [build-dir=build-asan] [ctest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build-asan}
shift || true

# Examples and benchmarks are not tests; the installed-package test rebuilds a consumer without
# the sanitizer flags, which proves nothing more here than in the normal run.
# -O1 -g1 (line tables only): the usual sanitizer setting; -O2 -g takes several times longer to
# compile the Eigen kernels and finds nothing more.
scripts/setup.sh "$build_dir" -DCMAKE_BUILD_TYPE=Sanitize -DCMAKE_CXX_FLAGS_SANITIZE="-O1 -g1" \
  -DHEADGRAD_SANITIZE=ON -DHEADGRAD_BUILD_EXAMPLES=OFF -DHEADGRAD_BUILD_BENCHMARKS=OFF

# detect_stack_use_after_return=1 puts stack frames on ASan's fake stack, so a pointer kept to a
# returned frame is reported. With GCC it needs the build without AVX-512 that CMakeLists.txt
# selects for HEADGRAD_SANITIZE (GCC otherwise reads some fake-frame slots with misaligned
# 64-byte moves, which fault).
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS=suppressions=$(pwd)/scripts/lsan.supp
ctest --test-dir "$build_dir" --output-on-failure -j"$(nproc)" -E '^(installed_package_consumer|test_allocations)$' "$@"
