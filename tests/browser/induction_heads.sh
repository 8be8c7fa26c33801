#!/usr/bin/env bash
# The browser test of induction_heads' page (ctest browser_induction_heads): a short run writes
# its --report, tests/browser/check_page.sh checks the rendered DOM against induction_heads.expect
# and saves a screenshot; the same checks must reject the page without its path-ablation table
# and with a path-ablation number changed (the negative controls).
# Usage: tests/browser/induction_heads.sh PROGRAM OUT_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if (($# != 2)); then
  echo "usage: $0 INDUCTION_HEADS OUT_DIR" >&2
  exit 2
fi
program=$1 out=$2
mkdir -p "$out"
expect=$here/induction_heads.expect
"$program" --steps 300 --test-sequences 128 --threads 1 --report "$out/induction_heads.html" >"$out/induction_heads.txt"
"$here/check_page.sh" "$out/induction_heads.html" "$expect" "$out/induction_heads.png" "$out/induction_heads.txt"

# check_rejects NAME REASON: the checker must fail on OUT_DIR/NAME.html, saying REASON.
check_rejects() {
  local log=$out/$1.log
  if "$here/check_page.sh" "$out/$1.html" "$expect" "$out/$1.png" "$out/induction_heads.txt" >"$log" 2>&1; then
    echo "negative control '$1': the checker accepted a broken page" >&2
    exit 1
  fi
  grep -q -F -- "$2" "$log" || { echo "negative control '$1': the checker failed, but not with '$2':" >&2; cat "$log" >&2; exit 1; }
  echo "negative control '$1': rejected ($2)"
}
sed 's/id="path-ablation"/id="gone"/' "$out/induction_heads.html" >"$out/neg_no_ablation.html"
check_rejects neg_no_ablation "wanted 'id=\"path-ablation\"' exactly 1 times, found 0"
keys=$(grep -o "removed from layer 1's keys: induction score [0-9.]*" "$out/induction_heads.txt" | grep -o '[0-9.]*$')
sed "s|<td>$keys</td>|<td>9.999</td>|g" "$out/induction_heads.html" >"$out/neg_wrong_number.html"
check_rejects neg_wrong_number "wanted '<td>$keys</td>' at least 1 times, found 0"
