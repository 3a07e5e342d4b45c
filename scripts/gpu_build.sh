#!/usr/bin/env bash
# Builds Stepcast on the GPU machine (Ubuntu 24.04, CUDA 13, Python torch 2.x
# carrying LibTorch and NCCL) and runs the gpu-labelled tests.
#
# Header-only and small dependencies travel as Debian packages in .deps/
# (make it here once with `bash scripts/gpu_build.sh --download`), unpacked
# into /tmp/deps there. Ceres is not available there: the fit runs on the CPU
# machine, from the JSONL the GPU runs bring back.
#
# The tree arrives without .git: pass the commit for the run records as
# STEPCAST_GIT_COMMIT=<sha> (the build stamps it into `train`).
#
# Usage there: [STEPCAST_GIT_COMMIT=sha] bash scripts/gpu_build.sh [--test | --tools]
# --tools builds only train, microbench, planner and calibrate (what measuring needs; about
# half the time of the whole build).
# A target that fails to compile is reported and the others are still built;
# the exit status is non-zero if any failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ "${1:-}" == "--download" ]]; then
  grep -qx '/.deps/' .git/info/exclude 2>/dev/null || echo '/.deps/' >> .git/info/exclude
  mkdir -p .deps
  (cd .deps && apt-get download libtomlplusplus-dev libtomlplusplus3 libcli11-dev nlohmann-json3-dev doctest-dev libeigen3-dev)
  exit 0
fi

if [[ ! -d /tmp/deps/usr ]]; then
  for f in .deps/*.deb; do dpkg -x "$f" /tmp/deps; done
fi
source scripts/gpu_env.sh
NGPU=$(nvidia-smi -L | wc -l)
TEST_NPROC=$(( NGPU < 2 ? NGPU : 2 ))

cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$DEPS/usr;$TORCH_CMAKE" -DNCCL_ROOT="$NCCL_ROOT" \
  -DCMAKE_CUDA_ARCHITECTURES=90 -DSTEPCAST_WITH_CERES=OFF \
  -DSTEPCAST_GPU_TEST_NPROC=$TEST_NPROC >/tmp/cmake.log 2>&1 || { tail -40 /tmp/cmake.log; exit 1; }
grep -A14 "Stepcast configuration summary" /tmp/cmake.log
status=0
TARGETS=()
[[ "${1:-}" == "--tools" ]] && TARGETS=(--target train microbench planner calibrate)
if ! cmake --build build-gpu -j "$(nproc)" "${TARGETS[@]}" -- -k 0 >/tmp/build.log 2>&1; then
  status=1
  echo "build errors:"
  grep -E "error|FAILED" -A3 /tmp/build.log | head -80
fi

if [[ "${1:-}" == "--test" ]]; then
  (cd build-gpu && ctest -L gpu --output-on-failure && ctest -R unit --output-on-failure) || status=1
fi
exit $status
