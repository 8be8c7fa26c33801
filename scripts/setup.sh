#!/usr/bin/env bash
# Installs the Debian packages headgrad needs (when missing), configures and builds it.
# Usage: scripts/setup.sh [build-dir] [extra cmake args...]   (default build dir: build)
set -euo pipefail
cd "$(dirname "$0")/.."

# libopenblas-openmp-dev: the OpenMP build of OpenBLAS for large matrix products (HEADGRAD_BLAS;
# without it the build falls back to Eigen's own). Not libopenblas-dev, which brings the pthreads
# build.
scripts/install_packages.sh cmake make g++ pkg-config libeigen3-dev libfmt-dev libboost-test-dev libopenblas-openmp-dev nlohmann-json3-dev

build_dir=${1:-build}
shift || true
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$build_dir" -j"$(nproc)"
