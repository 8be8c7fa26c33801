#!/usr/bin/env bash
# The browser tests (ctest label "browser"): the examples write their pages with --report, headless
# Chromium renders them, and tests/browser/check_page.sh checks the rendered DOM (no script errors,
# the expected pictures and labels, content the page's script made) and saves a screenshot.
# Usage: scripts/test_browser.sh CASE BUILD_DIR OUT_DIR
#   train_heads     train_heads --steps 150 (1 head, then 2 heads) --report
#   worked_example  worked_example --report, and its numbers against its terminal output
#   negative        broken copies of a page that the checker must reject, each for its reason; and
#                   --report paths the examples refuse, with messages naming them
#   broken          one page with a script error through the checker (fails: a WILL_FAIL test)
#   viewer          nn::viewer's pictures (tests/browser/viewer_page.cpp), and a page without its
#                   script or with a wrong value rejected
# Pages, terminal output and screenshots stay in OUT_DIR.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
check=$here/tests/browser/check_page.sh
if (($# != 3)); then
  echo "usage: $0 train_heads|worked_example|negative|broken|viewer BUILD_DIR OUT_DIR" >&2
  exit 2
fi
case_name=$1 build=$2 out=$3
mkdir -p "$out"

worked_page() {  # worked_example's page and terminal output in OUT_DIR
  "$build/examples/worked_example" --report "$out/worked_example.html" >"$out/worked_example.txt"
}

# check_rejects NAME REASON: the checker must fail on OUT_DIR/NAME.html, saying REASON.
check_rejects() {
  local log=$out/$1.log
  if "$check" "$out/$1.html" "$here/tests/browser/worked_example.expect" "$out/$1.png" "$out/worked_example.txt" \
    >"$log" 2>&1; then
    echo "negative control '$1': the checker accepted a broken page" >&2
    exit 1
  fi
  if ! grep -q -F -- "$2" "$log"; then
    echo "negative control '$1': the checker failed, but not with '$2':" >&2
    cat "$log" >&2
    exit 1
  fi
  echo "negative control '$1': rejected ($2)"
}

# refuses MESSAGE COMMAND...: COMMAND fails, saying MESSAGE on stderr.
refuses() {
  local message=$1 err
  shift
  if err=$("$@" 2>&1 >/dev/null); then
    echo "'$*' succeeded; it should have failed with '$message'" >&2
    exit 1
  fi
  grep -q -F -- "$message" <<<"$err" || { echo "'$*' failed, but said '$err', not '$message'" >&2; exit 1; }
  echo "refused: $message"
}

case $case_name in
  train_heads)
    OMP_NUM_THREADS=1 "$build/examples/train_heads" --steps 150 --no-files --quiet \
      --report "$out/train_heads.html" >"$out/train_heads.txt"
    "$check" "$out/train_heads.html" "$here/tests/browser/train_heads.expect" "$out/train_heads.png" \
      "$out/train_heads.txt"
    ;;
  worked_example)
    worked_page
    "$check" "$out/worked_example.html" "$here/tests/browser/worked_example.expect" "$out/worked_example.png" \
      "$out/worked_example.txt"
    ;;
  negative)
    worked_page
    page=$out/worked_example.html
    sed 's|</body>|<script>no_such_function();</script></body>|' "$page" >"$out/neg_script_error.html"
    check_rejects neg_script_error "wanted 'data-script-errors=\"0\"' exactly 1 times, found 0"
    grep -q 'ReferenceError\|no_such_function' "$out/neg_script_error.log" ||
      { echo "negative control 'neg_script_error': the error's message is not shown" >&2; exit 1; }
    sed 's|</body>|<script>Promise.reject(new Error("nobody waits"));</script></body>|' "$page" >"$out/neg_rejection.html"
    check_rejects neg_rejection "unhandled rejection: nobody waits"
    # The page without its last script (the one that builds the contents, the tooltip, the sliders).
    awk '/<script>/ { n++ } { lines[NR] = $0; at[n] = at[n] ? at[n] : NR } END {
           for (i = 1; i < at[n]; i++) print lines[i]; print "</body></html>" }' "$page" >"$out/neg_no_script.html"
    check_rejects neg_no_script "wanted 'data-js-ready=\"1\"' exactly 1 times, found 0"
    sed 's/class="colour-scale"/class="gone"/g' "$page" >"$out/neg_no_colour_scale.html"
    check_rejects neg_no_colour_scale "wanted 'class=\"colour-scale\"' at least 40 times"
    sed 's/1\.340/1.341/g' "$page" >"$out/neg_wrong_number.html"
    check_rejects neg_wrong_number "wanted '[1.340, 0.660]' at least 1 times, found 0"
    refuses "--report $out/no_such_dir/r.html: directory $out/no_such_dir does not exist" \
      "$build/examples/train_heads" --steps 1 --no-files --report "$out/no_such_dir/r.html"
    refuses "--report $out: is a directory" "$build/examples/train_heads" --steps 1 --no-files --report "$out"
    refuses "cannot write $out/no_such_dir/w.html: No such file or directory" \
      "$build/examples/worked_example" --report "$out/no_such_dir/w.html"
    ;;
  viewer)
    "$build/tests/viewer_page" "$out/viewer.html"
    "$check" "$out/viewer.html" "$here/tests/browser/viewer.expect" "$out/viewer.png"
    # The same checks must reject the page with a value changed or without its last script.
    sed 's|(0): 1</title>|(0): 0.9</title>|' "$out/viewer.html" >"$out/neg_viewer_value.html"
    if "$check" "$out/neg_viewer_value.html" "$here/tests/browser/viewer.expect" "$out/neg_viewer_value.png" >"$out/neg_viewer_value.log" 2>&1; then
      echo "negative control 'neg_viewer_value': the checker accepted a changed value" >&2
      exit 1
    fi
    echo "negative control 'neg_viewer_value': rejected"
    ;;
  broken)
    worked_page
    sed 's|</body>|<script>no_such_function();</script></body>|' "$out/worked_example.html" >"$out/broken.html"
    exec "$check" "$out/broken.html" "$here/tests/browser/worked_example.expect" "$out/broken.png" \
      "$out/worked_example.txt"
    ;;
  *)
    echo "$0: unknown case '$case_name'" >&2
    exit 2
    ;;
esac
