#!/usr/bin/env bash
# Builds (incrementally) and runs the whole test suite that runs without a GPU.
# GPU tests carry the ctest label `gpu` and run on the GPU machine (scripts/gpu_build.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ! -f build/build.ninja ]]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
cmake --build build -j "$(nproc)"
cd build
# Default: everything without a GPU. Arguments replace it (e.g. -LE "gpu|slow": the in-process tests only).
if [[ $# -eq 0 ]]; then set -- -LE gpu; fi
ctest --output-on-failure "$@"
