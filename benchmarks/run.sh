#!/usr/bin/env bash
# Builds the benchmarks (Release, optimised for this machine) and prints the speed table:
# headgrad against PyTorch from pip (and libtorch, when CMake finds it), each pair timed
# interleaved in one run, at 1 and 2 threads; then the engine micro-benchmarks.
#
#   benchmarks/run.sh [build-dir]          (default build-dir: build-bench)
#   env: JOBS (build jobs, default 2), THREADS (default 1,2), SHAPES (default all),
#        ROUNDS (alternations per shape, default 3), SAMPLES (per side per round, default 5)
#
# Needs python3 with torch for the PyTorch columns; without it only headgrad's times are shown.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-bench}
threads=${THREADS:-1,2}
shapes=${SHAPES:-all}
rounds=${ROUNDS:-3}
samples=${SAMPLES:-5}

mkdir -p "$build"
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null || true)
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release ${torch_prefix:+-DCMAKE_PREFIX_PATH="$torch_prefix"} \
  >"$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
targets=(bench_attention bench_engine)
target_list=$(cmake --build "$build" --target help)
if [[ "$target_list" == *bench_torch_cpp* ]]; then targets+=(bench_torch_cpp); fi
cmake --build "$build" -j"${JOBS:-2}" --target "${targets[@]}"
bin=$build/benchmarks

results=$build/bench_results.tsv
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uptime | sed 's/.*load/load/')" | tee "$results"
"$bin/bench_attention" --peak | sed 's/^/# /'
"$bin/bench_attention" --peak --tsv >>"$results"
if [[ -n "$torch_prefix" ]]; then
  if [[ -x "$bin/bench_torch_cpp" ]]; then
    echo "# headgrad vs libtorch, same process, interleaved ..."
    "$bin/bench_torch_cpp" --tsv --shapes "$shapes" --threads "$threads" --samples $((rounds * samples)) |
      tee -a "$results"
  fi
  echo "# headgrad vs PyTorch (pip), interleaved rounds ..."
  python3 "$root/benchmarks/compare_torch.py" --ours "$bin/bench_attention" --shapes "$shapes" \
    --threads "$threads" --rounds "$rounds" --samples "$samples" | tee -a "$results"
else
  "$bin/bench_attention" --tsv --shapes "$shapes" --threads "$threads" | tee -a "$results"
fi
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uptime | sed 's/.*load/load/')" | tee -a "$results"

echo
echo "Forward + backward of multi-head self-attention, float32, need_weights = false, loss = sum;"
echo "medians; ratios > 1 mean headgrad is faster (each measured interleaved with its peer):"
echo
python3 "$root/benchmarks/compare_torch.py" --table "$results"

echo
"$bin/bench_engine" --threads 1
"$bin/bench_engine" memory
if [[ -n "$torch_prefix" ]]; then
  echo "PyTorch (pip), 1 thread:"
  python3 "$root/benchmarks/compare_torch.py" --micro | cut -f2- | column -t -s$'\t'
  python3 "$root/benchmarks/compare_torch.py" --memory | cut -f2- | column -t -s$'\t'
fi
