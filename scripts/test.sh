#!/usr/bin/env bash
# Builds all of headgrad (installing what is missing): libraries, tests, examples, benchmarks;
# then runs the whole test suite, the browser tests included (the examples' --report pages rendered
# by Debian's headless chromium, installed here when missing) and the docs checks (python3,
# tests/check_docs.py).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install_packages.sh chromium fonts-dejavu-core python3
scripts/setup.sh build
ctest --test-dir build --output-on-failure -j"$(nproc)"
