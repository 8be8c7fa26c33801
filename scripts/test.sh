#!/usr/bin/env bash
# Builds all of headgrad (installing what is missing): libraries, tests, examples, benchmarks;
# then runs the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
ctest --test-dir build --output-on-failure -j"$(nproc)"
