#!/usr/bin/env bash
# Fuzzes the checkpoint reader (nn/src/checkpoint.cpp, safetensors*.cpp, atomic_file.cpp) with
# libFuzzer for a bounded time.
# Usage: fuzz/run.sh [seconds=60] [main-build-dir=build] [out-dir=build-fuzz]
#
# The reader and the harness are compiled with clang++ -fsanitize=fuzzer,address,undefined
# (coverage-guided where it matters); the rest of headgrad is linked from the main build's
# static libraries (scripts/test.sh builds them), so nothing else is rebuilt.
# Exit status 0: the time ran out with no crash, hang, leak, sanitizer report or partial load.
# Otherwise the offending input is saved as <out-dir>/crash-* / timeout-* / leak-*.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
seconds=${1:-60}
main_build=${2:-build}
out=${3:-build-fuzz}

scripts/install_packages.sh clang nlohmann-json3-dev

libs=("$main_build/nn/libheadgrad_nn.a" "$main_build/autograd/libheadgrad_autograd.a")
for lib in "${libs[@]}"; do
  [ -f "$lib" ] || { echo "fuzz/run.sh: $lib not found; build first (scripts/setup.sh $main_build)" >&2; exit 2; }
done
# Same code generation as the main build, so that Eigen's inline code agrees across objects.
flags=(-std=c++20 -O1 -g -DNDEBUG -DFMT_SHARED -fno-omit-frame-pointer -fno-sanitize-recover=undefined
       -Iautograd/include -Inn/include -isystem /usr/include/eigen3)
grep -q '^HEADGRAD_NATIVE:BOOL=ON' "$main_build/CMakeCache.txt" && flags+=(-march=native)
link=("${libs[@]}" -lfmt -lgomp -lpthread)
# The BLAS the main build's headgrad_autograd calls (empty when it was built without one).
blas=$(sed -n 's/^HEADGRAD_BLAS_LINK:INTERNAL=//p' "$main_build/CMakeCache.txt")
[ -n "$blas" ] && link+=("$blas")

mkdir -p "$out/corpus"
rm -rf "$out/seeds"
mkdir -p "$out/seeds"
echo "compiling the fuzz target..."
# The checkpoint sources given here take the place of their copies in libheadgrad_nn.a.
checkpoint_sources=(nn/src/checkpoint.cpp nn/src/safetensors.cpp nn/src/safetensors_header.cpp nn/src/atomic_file.cpp)
clang++ "${flags[@]}" -fsanitize=fuzzer,address,undefined fuzz/fuzz_checkpoint.cpp "${checkpoint_sources[@]}" \
  "${link[@]}" -o "$out/fuzz_checkpoint"
clang++ "${flags[@]}" fuzz/make_seeds.cpp "${link[@]}" -o "$out/make_seeds"
"$out/make_seeds" "$out/seeds"
cp tests/data/*.safetensors "$out/seeds"/

# -timeout: one input taking over 10 s is a hang; -rss_limit_mb: no input may blow up memory.
cd "$out"
status=0
ASAN_OPTIONS=detect_leaks=1 ./fuzz_checkpoint corpus seeds \
  -dict="$root/fuzz/safetensors.dict" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -max_len=4096 -print_final_stats=1 >fuzz.log 2>&1 || status=$?
grep -E "INITED|DONE|ERROR|SUMMARY|stat::number_of_executed_units|stat::average_exec_per_sec|Done [0-9]+ runs" fuzz.log || true
if [ "$status" -ne 0 ]; then
  echo "fuzz_checkpoint FAILED (status $status); see $out/fuzz.log" >&2
  tail -40 fuzz.log >&2
fi
exit "$status"
