#!/usr/bin/env bash
# char_gpt against its PyTorch peer (benchmarks/char_gpt_torch.py), on the same corpus, batches,
# architecture, initialisation scheme, optimizer and schedule:
#   speed    training steps per second, heap allocations per warm step and peak memory, at
#            nanoGPT's CPU configuration (4 layers, 4 heads, n_embd 128, block 64, batch 12) and a
#            long-context one (4 layers, 4 heads, n_embd 256, block 1024, batch 4), at 1 and 2
#            threads, each pair measured interleaved (ours, then PyTorch's, ROUNDS times)
#   quality  the validation loss after ITERS steps (nanoGPT's CPU run: 2000) for SEEDS, both sides
# then prints the tables (char_gpt_torch.py table).
#
#   benchmarks/char_gpt.sh [build-dir] [speed] [quality]     (default build-bench, both parts)
#   env: JOBS (build jobs, default 2), THREADS (default "1 2"), ROUNDS (default 3),
#        SEEDS (default "1 2 3"), ITERS (default 2000), QUALITY_THREADS (default 1),
#        DATA (default /usr/share/games/fortunes), NICE (niceness of the quality runs, default 0),
#        OMP_WAIT_POLICY (default passive: on a shared machine a spinning OpenMP thread that waits
#        steals the core another process's thread needs, for both sides alike)
# Results: <build-dir>/char_gpt_bench/ (speed.tsv, one summary JSON per quality run).
# Needs python3 with torch.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-bench
if [[ $# -gt 0 && $1 != speed && $1 != quality ]]; then
  build=$1
  shift
fi
parts=("$@")
((${#parts[@]})) || parts=(speed quality)
threads=${THREADS:-1 2}
rounds=${ROUNDS:-3}
seeds=${SEEDS:-1 2 3}
iters=${ITERS:-2000}
data=${DATA:-/usr/share/games/fortunes}
peer="$root/benchmarks/char_gpt_torch.py"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

mkdir -p "$build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j"${JOBS:-2}" --target char_gpt bench_char_gpt bench_attention
results=$build/char_gpt_bench
mkdir -p "$results"

stamp() { echo "# $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(uptime | sed 's/.*load/load/'), OMP_WAIT_POLICY=$OMP_WAIT_POLICY"; }

# The machine, so that every table names it: CPU model, family and model numbers, vector ISA,
# the OpenBLAS core the environment forces (if any), clock and FP32 peak.
"$build/benchmarks/bench_attention" --peak | sed 's/^/# /'

speed() {
  local out=$results/speed.tsv
  stamp | tee "$out"
  # name, flags, warm-up steps, timed steps per round
  local configs=("cpu|--n-layer 4 --n-head 4 --n-embd 128 --block-size 64 --batch-size 12|5|20"
                 "long|--n-layer 4 --n-head 4 --n-embd 256 --block-size 1024 --batch-size 4|2|5")
  for entry in "${configs[@]}"; do
    IFS='|' read -r name flags warm steps <<<"$entry"
    for t in $threads; do
      for ((r = 1; r <= rounds; r++)); do
        # shellcheck disable=SC2086
        "$build/benchmarks/bench_char_gpt" $flags --threads "$t" --warmup "$warm" --steps "$steps" --data "$data" |
          sed "s/^/$name\t/" | tee -a "$out"
        # shellcheck disable=SC2086
        OMP_NUM_THREADS=$t python3 "$peer" bench $flags --threads "$t" --warmup "$warm" --steps "$steps" \
          --data "$data" | sed "s/^/$name\t/" | tee -a "$out"
      done
    done
  done
  stamp | tee -a "$out"
}

quality() {
  stamp | tee "$results/quality.log"
  for s in $seeds; do
    nice -n "${NICE:-0}" "$build/examples/char_gpt/char_gpt" --seed "$s" --max-iters "$iters" --data "$data" \
      --threads "${QUALITY_THREADS:-1}" --out "$results/headgrad_seed$s" --quiet --max-new-tokens 300 |
      tail -n 8 | tee -a "$results/quality.log"
    cp "$results/headgrad_seed$s/summary.json" "$results/headgrad_seed$s.json"
    nice -n "${NICE:-0}" python3 "$peer" train --seed "$s" --max-iters "$iters" --data "$data" \
      --threads "${QUALITY_THREADS:-1}" --log-interval 100000 --summary "$results/pytorch_seed$s.json" |
      tail -n 2 | tee -a "$results/quality.log"
  done
  stamp | tee -a "$results/quality.log"
}

for p in "${parts[@]}"; do "$p"; done
python3 "$peer" table "$results"
