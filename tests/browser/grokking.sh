#!/usr/bin/env bash
# The browser test of grokking's page (ctest browser_grokking): a --quick run writes its --report,
# tests/browser/check_page.sh checks the rendered DOM against grokking.expect (the log-scale loss
# chart, the accuracy chart, the Fourier spectrum with every key frequency labelled and no two
# labels overlapping, the progress measures, the numbers the terminal printed) and saves a
# screenshot; the same checks must reject the page without its spectrum, with its key frequencies
# changed, and with two frequency labels overlapping (the negative controls).
# Usage: tests/browser/grokking.sh PROGRAM OUT_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if (($# != 2)); then
  echo "usage: $0 GROKKING OUT_DIR" >&2
  exit 2
fi
program=$1 out=$2
mkdir -p "$out"
expect=$here/grokking.expect
"$program" --quick --threads 1 --report "$out/grokking.html" >"$out/grokking.txt"
"$here/check_page.sh" "$out/grokking.html" "$expect" "$out/grokking.png" "$out/grokking.txt"

# check_rejects NAME REASON: the checker must fail on OUT_DIR/NAME.html, saying REASON.
check_rejects() {
  local log=$out/$1.log
  if "$here/check_page.sh" "$out/$1.html" "$expect" "$out/$1.png" "$out/grokking.txt" >"$log" 2>&1; then
    echo "negative control '$1': the checker accepted a broken page" >&2
    exit 1
  fi
  grep -q -F -- "$2" "$log" || { echo "negative control '$1': the checker failed, but not with '$2':" >&2; cat "$log" >&2; exit 1; }
  echo "negative control '$1': rejected ($2)"
}
sed 's/id="fourier-spectrum"/id="gone"/' "$out/grokking.html" >"$out/neg_no_spectrum.html"
check_rejects neg_no_spectrum "wanted 'id=\"fourier-spectrum\"' exactly 1 times, found 0"
keys=$(sed -n 's/^key frequencies of the embedding: \([0-9, ]*\) (.*/\1/p' "$out/grokking.txt")
sed "s|<td>$keys (|<td>$keys, 0 (|" "$out/grokking.html" >"$out/neg_wrong_keys.html"
check_rejects neg_wrong_keys "wanted '<td>$keys (' at least 1 times, found 0"
# The second frequency label drawn on top of the first.
awk '/class="x-tick" data-frequency="/ && ++n <= 2 {
       match($0, /x="[0-9.]*" y="[0-9.]*"/)
       if (n == 1) at = substr($0, RSTART, RLENGTH); else sub(/x="[0-9.]*" y="[0-9.]*"/, at)
     } { print }' "$out/grokking.html" >"$out/neg_overlap.html"
check_rejects neg_overlap "frequency labels overlap"
