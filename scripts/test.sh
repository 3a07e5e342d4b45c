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
# Default: everything without a GPU, then the parser tests again under AddressSanitizer and
# UBSan (build-asan: no LibTorch, no Ceres). Arguments replace both (e.g. -LE "gpu|slow": the
# in-process tests of build/ only).
if [[ $# -gt 0 ]]; then
  ctest --output-on-failure "$@"
  exit
fi
ctest --output-on-failure -LE gpu
cd ..
if [[ ! -f build-asan/build.ninja ]]; then
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTEPCAST_SANITIZE=ON \
    -DSTEPCAST_WITH_TORCH=OFF -DSTEPCAST_WITH_CUDA=OFF -DSTEPCAST_WITH_CERES=OFF >/dev/null
fi
cmake --build build-asan -j "$(nproc)" --target stepcast_fuzz stepcast_tests planner
cd build-asan
ctest --output-on-failure -R '^(fuzz|unit|planner_cli)$'
