#!/usr/bin/env bash
# Loads a page in headless Chromium (Debian's `chromium`) and checks the DOM it renders:
#   - no script errors: <html data-script-errors="0"> and an empty <pre id="script-errors">;
#   - the page's script ran to its end: <html data-js-ready="1">, and the contents list it builds;
#   - what EXPECT (a bash file of at_least / exactly / absent lines, see below) asks for.
# Then saves a screenshot (1280 x 2400). Exits 1 naming every failed check.
# Usage: tests/browser/check_page.sh PAGE.html EXPECT SCREENSHOT.png [TERMINAL_OUTPUT]
#   EXPECT may read $TERMINAL (the program's terminal output, when given) and $DOM (the rendered DOM).
set -uo pipefail
if (($# < 3)); then
  echo "usage: $0 PAGE.html EXPECT SCREENSHOT.png [TERMINAL_OUTPUT]" >&2
  exit 2
fi
page=$(realpath "$1") expect=$2 screenshot=$3
TERMINAL=${4:-}
browser=$(command -v chromium || command -v chromium-browser || true)
if [[ -z $browser ]]; then
  echo "check_page.sh: chromium not found: install it (apt-get install chromium; .ci/run does) to run the browser tests" >&2
  exit 1
fi
[[ -f $page ]] || { echo "check_page.sh: no page at $page" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
DOM=$work/dom.html

# Root needs --no-sandbox; a profile of its own lets several checks run side by side.
run_browser() {
  timeout 180 "$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$work/profile" \
    --virtual-time-budget=3000 "$@" "file://$page" 2>"$work/browser.log"
}
if ! run_browser --dump-dom >"$DOM" || [[ ! -s $DOM ]]; then
  echo "check_page.sh: chromium could not load $page:" >&2
  tail -5 "$work/browser.log" >&2
  exit 1
fi

failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
count() { grep -o -F -- "$1" "$DOM" | wc -l; }
at_least() {  # at_least N STRING: STRING occurs N times or more in the rendered DOM
  local n
  n=$(count "$2")
  ((n >= $1)) || fail "wanted '$2' at least $1 times, found $n"
}
exactly() {
  local n
  n=$(count "$2")
  ((n == $1)) || fail "wanted '$2' exactly $1 times, found $n"
}
absent() { exactly 0 "$1"; }

exactly 1 'data-script-errors="0"'
exactly 1 '<pre id="script-errors" hidden=""></pre>'
if ! grep -q -F 'data-script-errors="0"' "$DOM"; then
  echo "script errors reported by the page:"
  sed -n '/<pre id="script-errors"/,/<\/pre>/p' "$DOM" | head -20
fi
exactly 1 'data-js-ready="1"'
at_least 2 '<li><a href="#section-'  # the contents list, built by the page's script
exactly 1 'id="tooltip"'             # made by the page's script
# shellcheck source=/dev/null
source "$expect"

if ! run_browser --window-size=1280,2400 --screenshot="$screenshot" >/dev/null ||
   [[ $(head -c 4 "$screenshot" 2>/dev/null | od -An -c | tr -d ' ') != '211PNG' ]]; then
  fail "no screenshot written to $screenshot"
fi
if ((failures)); then
  echo "check_page.sh: $failures check(s) failed for $page"
  exit 1
fi
echo "check_page.sh: $page renders with no script errors and all expected content; screenshot $screenshot"
