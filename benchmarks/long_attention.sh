#!/usr/bin/env bash
# Long sequences: one training step of multi-head self-attention (float32, need_weights = false,
# loss = sum of the output, backward) at T = 1k..16k, headgrad against PyTorch (pip)'s
# nn.MultiheadAttention, whose step runs its CPU flash kernel. For each shape and thread count,
# our samples (a bench_attention process) and PyTorch's alternate `rounds` times; medians. Also
# the peak resident memory of one step above each process's baseline, our attention part's
# GFLOP/s against the FP32 peak, and the peak memory of the series T = 1k, 2k, 4k, 8k, 16k.
# Prints docs/benchmarks.md's tables at the end.
#
#   benchmarks/long_attention.sh [build-dir]          (default build-dir: build-bench)
#   env: JOBS (build jobs, default 2), THREADS (default 1,2), MAX_GIB (default 8: a process whose
#        resident memory passes it is stopped and its side reads "over the limit"),
#        SHAPES (default: the `long` group), MEMORY_SHAPES (default: the `memory` group; "none": skip),
#        ROUNDS x SAMPLES per side for T <= 4096 (default 3 x 3), LONG_ROUNDS x LONG_SAMPLES for
#        T = 8192 (default 2 x 2), HUGE_ROUNDS x HUGE_SAMPLES for T = 16384 (default 1 x 3),
#        DROPOUT (default 0: dropout p on the attention weights, both sides; PyTorch's step then
#        leaves its flash kernel for the O(T^2) math path: seconds and GiB at T = 8k)
#
# A step takes seconds at T = 8k and more at 16k: the whole run takes some minutes. Run it alone.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-bench}
threads=${THREADS:-1,2}
max_gib=${MAX_GIB:-8}
shapes=${SHAPES:-long-1k long-4k-causal long-8k-causal long-16k-causal}
memory_shapes=${MEMORY_SHAPES:-memory}

mkdir -p "$build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
nice -n 10 cmake --build "$build" -j"${JOBS:-2}" --target bench_attention
bin=$build/benchmarks/bench_attention
compare=(python3 "$root/benchmarks/compare_torch.py" --ours "$bin" --max-gib "$max_gib" --dropout "${DROPOUT:-0}")

results=$build/long_attention_results.tsv
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uptime | sed 's/.*load/load/'), dropout ${DROPOUT:-0}" | tee "$results"
"$bin" --peak | sed 's/^/# /'
"$bin" --peak --tsv >>"$results"
"$bin" --memory-check | sed 's/^/# headgrad: /'
python3 "$root/benchmarks/compare_torch.py" --memory-check | sed 's/^/# PyTorch: /'
python3 "$root/benchmarks/compare_torch.py" --kernels --shapes long-1k,long-4k-causal 2>/dev/null |
  sed 's/^/# PyTorch step calls: /' || echo "# (could not list the kernels PyTorch's step calls)"
for shape in ${shapes//,/ }; do
  case $shape in
    *8k*) rounds=${LONG_ROUNDS:-2} samples=${LONG_SAMPLES:-2} ;;
    *16k*) rounds=${HUGE_ROUNDS:-1} samples=${HUGE_SAMPLES:-3} ;;
    *) rounds=${ROUNDS:-3} samples=${SAMPLES:-3} ;;
  esac
  echo "# $shape: $rounds rounds x $samples samples per side, threads $threads ..."
  # Exit code 3: PyTorch's process passed --max-gib (its line says so); go on with the next shape.
  "${compare[@]}" --shapes "$shape" --threads "$threads" --rounds "$rounds" --samples "$samples" \
    --step-memory --cpu-samples 0 | tee -a "$results" || [[ ${PIPESTATUS[0]} == 3 ]]
done
if [[ "$memory_shapes" != none ]]; then
  echo "# peak memory of one step, 1 thread: $memory_shapes ..."
  for shape in ${memory_shapes//,/ }; do
    "${compare[@]}" --shapes "$shape" --threads 1 --memory-only | tee -a "$results" ||
      [[ ${PIPESTATUS[0]} == 3 ]]
  done
fi
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uptime | sed 's/.*load/load/')" | tee -a "$results"

echo
echo "One training step of self-attention, float32, need_weights = false, loss = sum; medians;"
echo "ratios > 1 mean headgrad is faster; peak = resident memory of one step above the process's baseline:"
echo
python3 "$root/benchmarks/compare_torch.py" --long-table "$results"
