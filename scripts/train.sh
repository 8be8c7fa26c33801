#!/usr/bin/env bash
# Builds what the main job needs (installing what is missing) and runs it: the toy training run
# that compares one attention head with two. Extra arguments go to train_heads.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --target train_heads build
build/examples/train_heads "$@"
