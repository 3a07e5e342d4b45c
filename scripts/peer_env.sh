#!/usr/bin/env bash
# Sourced from the repository root by scripts/gpu_peers.sh and bench/peer_memory_trace.sh on the
# GPU host: unpacks the build dependencies (.deps, carried), sets the peers' environment and
# brings build-peers (the planner and calibrate; no LibTorch, CUDA, NCCL or Ceres: the peers bring
# their own) up to date with the working tree, incrementally on a warm machine. Returns non-zero
# with the build's errors on stderr when it fails.
[[ -d /tmp/deps/usr ]] || for f in .deps/*.deb; do dpkg -x "$f" /tmp/deps; done
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# DeepSpeed's ops (CPU Adam, fused Adam) compile just in time, once per machine.
export DS_BUILD_OPS=0 TORCH_EXTENSIONS_DIR=/tmp/torch_ext TOKENIZERS_PARALLELISM=false
if [[ ! -f build-peers/build.ninja ]]; then
  cmake -S . -B build-peers -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=/tmp/deps/usr \
    -DSTEPCAST_WITH_TORCH=OFF -DSTEPCAST_WITH_CUDA=OFF -DSTEPCAST_WITH_NCCL=OFF -DSTEPCAST_WITH_CERES=OFF \
    >/tmp/cmake-peers.log 2>&1 || { tail -30 /tmp/cmake-peers.log >&2; return 1; }
fi
cmake --build build-peers -j "$(nproc)" --target planner calibrate >/tmp/build-peers.log 2>&1 ||
  { grep -E "error" -A3 /tmp/build-peers.log | head -40 >&2; return 1; }
