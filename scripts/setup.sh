#!/usr/bin/env bash
# Installs every Debian 12 package Stepcast needs, then configures and builds
# (CPU parts always; the LibTorch backend when LibTorch is installed).
# Usage: bash scripts/setup.sh        (as root, or as a user with sudo)
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build pkg-config python3 python3-yaml python3-jsonschema
  libeigen3-dev libceres-dev libtomlplusplus-dev nlohmann-json3-dev libcli11-dev doctest-dev
  libtorch-dev libgloo-dev
)

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j "$(nproc)"
echo "setup: done. Try: build/planner/planner recommend --model 6b --gpus 2"
