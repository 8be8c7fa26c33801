#!/usr/bin/env bash
# Builds headgrad (installing what is missing) and runs the main job: the toy training run
# that compares one attention head with two. Extra arguments go to train_heads.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
build/examples/train_heads "$@"
