#!/usr/bin/env bash
# The portable build (-DHEADGRAD_NATIVE=OFF: compiled for baseline x86-64, kernels chosen at run
# time) against the native build (-march=native), on the short shapes of benchmarks/run.sh and the
# toy model's training step. The two builds' runs alternate `rounds` times; the table gives the
# median CPU time per step of each (wall time for the training step) and portable / native
# (1.00 = as fast; the goal is <= 1.10).
#
#   benchmarks/portable.sh [native-build-dir] [portable-build-dir]
#       (defaults: build-bench and build-portable, both Release)
#   env: JOBS (build jobs, default 2), ROUNDS (default 5), THREADS (default 1), SHAPES (default
#        seed,tiny,toy,medium,large,medium-causal,large-causal)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
native=${1:-$root/build-bench}
portable=${2:-$root/build-portable}
rounds=${ROUNDS:-5}
threads=${THREADS:-1}
shapes=${SHAPES:-seed,tiny,toy,medium,large,medium-causal,large-causal}

for pair in "$native:ON" "$portable:OFF"; do
  dir=${pair%:*}
  mkdir -p "$dir"
  cmake -S "$root" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DHEADGRAD_NATIVE="${pair#*:}" \
    >"$dir/configure.log" 2>&1 || { cat "$dir/configure.log"; exit 1; }
  nice -n 10 cmake --build "$dir" -j"${JOBS:-2}" --target bench_attention bench_engine >/dev/null
done

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uptime | sed 's/.*load/load/')"
"$portable/benchmarks/bench_attention" --peak | sed 's/^/# portable build: /'
for ((r = 1; r <= rounds; r++)); do
  for side in native portable; do
    dir=$native
    [[ $side == portable ]] && dir=$portable
    # bench_attention --tsv: ours, shape, threads, wall median, GFLOP/s, samples, CPU-time median
    "$dir/benchmarks/bench_attention" --shapes "$shapes" --threads "$threads" --tsv |
      awk -v s=$side -F'\t' '{print s "\t" $2 "\t" $NF}' >>"$out/all.tsv"
    # bench_engine train --tsv: the toy model's training step, median wall time in µs (third column)
    "$dir/benchmarks/bench_engine" train --threads "$threads" --tsv | grep "training step (" |
      awk -v s=$side -F'\t' '{print s "\ttoy model training step (wall)\t" $3 * 1e-6}' >>"$out/all.tsv"
  done
done
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(uptime | sed 's/.*load/load/')"

python3 - "$out/all.tsv" "$rounds" "$threads" <<'PY'
import collections, statistics, sys
times = collections.defaultdict(list)
for line in open(sys.argv[1]):
    side, shape, t = line.rstrip("\n").split("\t")
    times[(side, shape)].append(float(t))
shapes = list(dict.fromkeys(shape for _, shape in times))
print(f"\nCPU time per step (the training step: wall time), medians of {sys.argv[2]} alternating runs, {sys.argv[3]} thread(s):\n")
print("| shape | native | portable | portable / native |")
print("| --- | ---: | ---: | ---: |")
for shape in shapes:
    n = statistics.median(times[("native", shape)])
    p = statistics.median(times[("portable", shape)])
    print(f"| {shape} | {n * 1e6:,.1f} µs | {p * 1e6:,.1f} µs | {p / n:.3f} |")
PY
