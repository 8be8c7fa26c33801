#!/usr/bin/env bash
# Builds the threading, determinism, training and graph tests (concurrent and nested backward
# included) with ThreadSanitizer and runs them;
# any data race reported fails the run.
# Usage: scripts/test_thread_sanitize.sh [build-dir=build-tsan]
#
# How OpenMP is made visible to the sanitizer. GCC's OpenMP runtime (libgomp) is not built with
# ThreadSanitizer: its barriers and the hand-over of work to the team are invisible to it, so
# every parallel region would be reported as a race between the threads that wrote a result and
# the thread that reads it after the region. Suppressing those reports would also hide real
# races in our own loops. Instead this build uses clang with LLVM's OpenMP runtime (libomp) and
# its Archer tool (libarcher, loaded by libomp through OMP_TOOL_LIBRARIES), which tells the
# sanitizer about every OpenMP synchronisation (region start and end, barriers, reductions,
# tasks). The races it reports are real, inside OpenMP regions and between std::threads alike,
# and no suppression file is needed. ignore_noninstrumented_modules=1 makes it skip the memory
# accesses made inside libraries that were not built with it (libomp, libstdc++, fmt, Boost.Test),
# as Archer's documentation asks; the synchronisation they do is still seen.
# OpenBLAS is left out (HEADGRAD_BLAS=OFF): Debian's OpenMP build of it links libgomp, which
# cannot share a process with libomp; products then go through Eigen, cut into pieces among the
# threads the same way. The tests run at 1, 2, 3 and 7 threads as they ask (the machine's core
# count does not limit a thread count).
# -O1 -g1: the usual sanitizer setting. Examples and benchmarks are off; only the four test
# programs and the libraries are built. The four tests take about 2 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build-tsan}

scripts/install_packages.sh cmake make clang libomp-dev libeigen3-dev libfmt-dev libboost-test-dev nlohmann-json3-dev

archer=$(ls /usr/lib/llvm-*/lib/libarcher.so 2>/dev/null | sort -V | tail -n 1)
if [[ -z "$archer" ]]; then
  echo "libarcher.so not found (it comes with libomp-dev)" >&2
  exit 1
fi
llvm_lib=$(dirname "$archer")

cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=ThreadSanitize \
  -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_CXX_FLAGS_THREADSANITIZE="-O1 -g1 -fsanitize=thread -fno-omit-frame-pointer" \
  -DCMAKE_EXE_LINKER_FLAGS_THREADSANITIZE="-fsanitize=thread -Wl,-rpath,$llvm_lib" \
  -DOpenMP_CXX_FLAGS="-fopenmp=libomp" -DOpenMP_CXX_LIB_NAMES=omp -DOpenMP_omp_LIBRARY="$llvm_lib/libomp.so" \
  -DHEADGRAD_BLAS=OFF -DHEADGRAD_BUILD_EXAMPLES=OFF -DHEADGRAD_BUILD_BENCHMARKS=OFF >/dev/null

tests=(test_threading test_determinism test_training test_graph test_concurrent_backward test_nested_backward test_hook_programs)
cmake --build "$build_dir" -j"$(nproc)" --target "${tests[@]}"

export OMP_TOOL_LIBRARIES=$archer
export TSAN_OPTIONS="halt_on_error=1 abort_on_error=1 second_deadlock_stack=1 ignore_noninstrumented_modules=1 history_size=4"
export ARCHER_OPTIONS="verbose=0"
export OMP_WAIT_POLICY=passive
failed=0
for t in "${tests[@]}"; do
  echo "== $t under ThreadSanitizer =="
  if ! "$build_dir/tests/$t"; then
    failed=1
  fi
done
exit "$failed"
