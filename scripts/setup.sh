#!/usr/bin/env bash
# Installs the Debian packages headgrad needs (when missing), configures a build directory and
# builds it: everything, or only the targets named with --target.
# Usage: scripts/setup.sh [--target NAME]... [build-dir] [extra cmake args...]   (default build dir: build)
# HEADGRAD_WERROR=ON in the environment configures with -DHEADGRAD_WERROR=ON (CI does).
set -euo pipefail
cd "$(dirname "$0")/.."

targets=()
while [[ ${1:-} == --target ]]; do
  targets+=("$2")
  shift 2
done

# libopenblas-openmp-dev: the OpenMP build of OpenBLAS for large matrix products (HEADGRAD_BLAS;
# without it the build falls back to Eigen's own). Not libopenblas-dev, which brings the pthreads
# build. libxsmm-dev: JIT kernels for the mid-sized products (HEADGRAD_LIBXSMM, found when
# installed; without it those products run our own kernels). libcli11-dev: the examples' and
# benchmarks' command lines. nlohmann-json3-dev: JSON (checkpoint headers, the examples'
# summaries). fortunes: the English fortune-cookie texts under /usr/share/games/fortunes,
# char_gpt's default training corpus.
scripts/install_packages.sh cmake make g++ pkg-config libeigen3-dev libfmt-dev libboost-test-dev \
  libopenblas-openmp-dev libxsmm-dev libcli11-dev nlohmann-json3-dev fortunes

build_dir=${1:-build}
shift || true
# Configure quietly: CMake's warnings and errors still reach stderr.
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release ${HEADGRAD_WERROR:+-DHEADGRAD_WERROR="$HEADGRAD_WERROR"} \
  "$@" >/dev/null
cmake --build "$build_dir" -j"$(nproc)" ${targets[@]+--target "${targets[@]}"}
