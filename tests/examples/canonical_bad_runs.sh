#!/usr/bin/env bash
# Runs of induction_heads and grokking that must fail with a message naming the flag at fault and a
# nonzero exit, writing no --summary (ctest example_canonical_bad_runs): a --period-max so large
# that twice it overflows, a one-token period (no repeated token to predict), a grokking run whose
# weights diverge by the last step, a decay that zeroes the weights, sizes and snapshot counts too
# large, an empty output name, two outputs through a dangling link to one file, an unwritable
# stderr or stdout. The control: the first grokking flags with a sane --lr run to the end and
# write the summary.
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

expect_failure induction_decay_zeroes "--lr 1 times --weight-decay 1 is 1 >= 1" \
  "$induction" --lr 1 --weight-decay 1 --steps 2 --quiet
expect_failure seq_len_huge "--seq-len 9223372036854775807 is too large" \
  "$induction" --seq-len 9223372036854775807 --steps 1 --quiet
expect_failure snapshots_too_many "--snapshot-interval 1 over --steps 25000" \
  "$grokking" --p 5 --steps 25000 --snapshot-interval 1 --quiet
expect_failure empty_report "--report: must be a file name, got ''" "$grokking" --p 5 --steps 1 --report ""

# Two outputs through a link to a file not there yet are the same file: refused, nothing written.
rm -f "$out/target.st" "$out/link.st"
ln -s target.st "$out/link.st"
expect_failure dangling_link_grokking "--save-initial and --save-model name the same file" \
  "$grokking" --p 5 --steps 1 --quiet --save-initial "$out/target.st" --save-model "$out/link.st"
expect_failure dangling_link_induction "--save-initial and --save-model name the same file" \
  "$induction" --steps 1 --test-sequences 4 --quiet --save-initial "$out/target.st" --save-model "$out/link.st"
if [[ -e $out/target.st ]]; then
  echo "dangling_link: a refused run wrote $out/target.st" >&2
  failures=$((failures + 1))
fi

# An unwritable stderr or stdout: exit 1, not a crash (an error printed into a full stderr used to
# throw from the handler and abort).
for program in "$induction" "$grokking"; do
  "$program" --steps 0 2>/dev/full
  rc=$?
  if ((rc != 1)); then
    echo "$(basename "$program") with a bad flag and stderr on /dev/full: exit $rc, expected 1" >&2
    failures=$((failures + 1))
  fi
done
"$grokking" --p 5 --steps 2 --quiet >/dev/full 2>"$out/full_stdout.err"
rc=$?
if ((rc != 1)) || ! grep -q -F "writing the results to standard output failed" "$out/full_stdout.err"; then
  echo "grokking with stdout on /dev/full: exit $rc, expected 1 saying so:" >&2
  cat "$out/full_stdout.err" >&2
  failures=$((failures + 1))
fi

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
