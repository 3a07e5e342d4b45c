#!/usr/bin/env bash
# Host cost of our backend's decoder layers per model family, on the GPU host (after
# scripts/gpu_build.sh --tools), the counterpart of bench/peers/host_profile.py for the peers.
#
# At one sequence of 128 tokens a 7B layer's GEMMs take about 0.25 ms on an H200 (6 x 200 M
# parameters x 128 tokens at 600 TFLOP/s) and its host issues the layer's kernels in 1-3 ms:
# the passes run at the host's pace. Each card is cut to 4 and to 16 decoder layers (the rest of
# the card as it is) and trained at micro-batch 1 x 128 tokens, GAS 8, stage 0, 5 steps (the first
# a warm-up); the difference between the two, per extra layer and micro-batch, is one layer's
# host time in the forward and the backward, without the embedding, the head and the optimizer.
# Records to OUT/stepcast_layers.jsonl; bench/stepcast_host_profile.py prints the table.
# Usage there: bash bench/stepcast_host_profile.sh OUT
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/gpu_env.sh
OUT=$1
B=build-gpu
mkdir -p "$OUT/cards"
for card in llama-2-7b llama-3-8b mistral-7b qwen2.5-7b gpt-j-6b pythia-2.8b; do
  for layers in 4 16; do
    cut="$OUT/cards/${card}_L${layers}.toml"
    sed "s/^num_layers = .*/num_layers = $layers/" "data/models/$card.toml" > "$cut"
    $B/backend/train --model "$cut" --nproc 1 --steps 5 --warmup 1 --quiet --device cuda --stage 0 \
      --optimizer adamw8bit --micro-batch 1 --seq 128 --gas 8 --json-out "$OUT/stepcast_layers.jsonl" \
      >> "$OUT/stepcast_layers.log" 2>&1 || echo "failed: $card L$layers"
  done
done
python3 bench/stepcast_host_profile.py "$OUT/stepcast_layers.jsonl"
