#!/usr/bin/env bash
# Builds .peers/, the ignored folder that carries DeepSpeed to the GPU host, which has torch and
# transformers but no DeepSpeed, no pydantic and no package index (../shared/DEVICE.md's tested way).
#   .peers/deepspeed-0.14.5/  DeepSpeed's source tree at v0.14.5, the last release on pydantic 1
#   .peers/site/              its pure-Python dependencies: hjson, cpuinfo, msgpack (pure fallback),
#                             pydantic 1.10 from Debian's python3-pydantic
# Usage (on this machine, after the mirrors were fetched with the search tool's fetch):
#   bash scripts/peer_deps.sh [MIRROR_ROOT=/work/.mirror]
# Then carry ".peers" to the GPU host; bench/peers/peer.py puts both folders on sys.path itself.
set -euo pipefail
cd "$(dirname "$0")/.."
mirror=${1:-/work/.mirror}
out=.peers
rm -rf "$out.tmp" && mkdir -p "$out.tmp/deepspeed-0.14.5" "$out.tmp/site"
git -C "$mirror/microsoft+DeepSpeed/repo" archive v0.14.5 deepspeed csrc op_builder accelerator version.txt |
  tar -x -C "$out.tmp/deepspeed-0.14.5"
# Symbolic links do not travel to the GPU host: replace each with a copy of its target.
( cd "$out.tmp/deepspeed-0.14.5" && find . -type l | while read -r link; do
    target=$(readlink -f "$link"); rm "$link"; cp -r "$target" "$link"; done )
# v0.14.5's ZeRO-1/2 CPU-offload fault: an inf/NaN gradient norm comes back as the integer -1 and
# torch.norm refuses the Long tensor it is wrapped in; one dtype lets the step continue.
python3 - "$out.tmp/deepspeed-0.14.5/deepspeed/runtime/zero/stage_1_and_2.py" <<'PY'
import sys
path = sys.argv[1]
text = open(path).read()
old = "self.params_in_partition[i]),\n                                    device=self.device)"
assert old in text, "stage_1_and_2.py: the scaled_global_norm line to patch is not where v0.14.5 has it"
open(path, "w").write(text.replace(old, old[:-1] + ", dtype=torch.float)"))
PY
git -C "$mirror/hjson+hjson-py/repo" archive HEAD hjson | tar -x -C "$out.tmp/site"
git -C "$mirror/workhorsy+py-cpuinfo/repo" archive HEAD cpuinfo | tar -x -C "$out.tmp/site"
git -C "$mirror/msgpack+msgpack-python/repo" archive HEAD msgpack | tar -x -C "$out.tmp/site"
( cd "$out.tmp" && apt-get download python3-pydantic >/dev/null && dpkg -x python3-pydantic_*.deb deb &&
  cp -r deb/usr/lib/python3/dist-packages/pydantic site/ && rm -rf deb python3-pydantic_*.deb )
rm -rf "$out" && mv "$out.tmp" "$out"
echo "peer_deps: $(du -sh "$out" | cut -f1) in $out"
