#!/usr/bin/env bash
# Runs of induction_heads and grokking that must fail with a message naming the flag at fault and a
# nonzero exit, writing no --summary (ctest example_canonical_bad_runs): a --period-max so large
# that twice it overflows, a one-token period (no repeated token to predict), and a grokking run
# whose weights diverge by the last step. The control: the same grokking flags with a sane --lr
# run to the end and write the summary.
# Usage: tests/examples/canonical_bad_runs.sh INDUCTION_HEADS GROKKING OUT_DIR
set -uo pipefail
if (($# != 3)); then
  echo "usage: $0 INDUCTION_HEADS GROKKING OUT_DIR" >&2
  exit 2
fi
induction=$1 grokking=$2 out=$3
mkdir -p "$out"
failures=0

# expect_failure NAME TEXT COMMAND...: COMMAND exits nonzero, says TEXT on stderr, writes no summary.
expect_failure() {
  local name=$1 text=$2
  shift 2
  rm -f "$out/$name.json"
  "$@" --summary "$out/$name.json" >"$out/$name.out" 2>"$out/$name.err"
  local rc=$?
  if ((rc == 0)) || ((rc >= 128)); then
    echo "$name: exit $rc, expected a refusal (1 or 2)" >&2
    failures=$((failures + 1))
  elif ! grep -q -F -- "$text" "$out/$name.err"; then
    echo "$name: stderr lacks '$text':" >&2
    cat "$out/$name.err" >&2
    failures=$((failures + 1))
  elif [[ -e $out/$name.json ]]; then
    echo "$name: wrote a summary although it failed" >&2
    failures=$((failures + 1))
  else
    echo "$name: refused ($(head -c 200 "$out/$name.err"))"
  fi
}

expect_failure period_max_overflow "--period-max 4611686018427387904" \
  "$induction" --period-max 4611686018427387904 --steps 1 --quiet
expect_failure period_one "--period-min 1" "$induction" --period-min 1 --period-max 1 --seq-len 4 --steps 1 --quiet
expect_failure grokking_diverges "lower --lr" "$grokking" --p 11 --lr 1e3 --weight-decay 0 --steps 2 --quiet

# The control: the grokking flags above with the default --lr run and write their summary.
if "$grokking" --p 11 --weight-decay 0 --steps 2 --quiet --summary "$out/control.json" >"$out/control.out" 2>&1 &&
   [[ -s $out/control.json ]]; then
  echo "control: ran, summary written"
else
  echo "control: the sane run failed:" >&2
  cat "$out/control.out" >&2
  failures=$((failures + 1))
fi
exit $((failures > 0))
