#!/usr/bin/env bash
# Installs the Debian packages given as arguments that are not installed yet (apt-get; sudo
# when not root). Prints one line naming them; apt's own output appears only if it fails.
# Used by scripts/setup.sh and fuzz/run.sh.
# Usage: scripts/install_packages.sh package...
set -euo pipefail
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
((${#missing[@]})) || exit 0

echo "installing: ${missing[*]}"
sudo=()
[ "$(id -u)" -ne 0 ] && sudo=(sudo)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { "${sudo[@]}" apt-get update -qq &&
       "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
     } >"$log" 2>&1; then
  cat "$log" >&2
  echo "install_packages.sh: apt-get could not install ${missing[*]}" >&2
  exit 1
fi
