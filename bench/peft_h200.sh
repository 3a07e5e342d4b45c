#!/usr/bin/env bash
# Issue 20's measurements on one H200 (after scripts/gpu_build.sh --tools), written under OUT:
#   1. bench/runlists/peft_1gpu.txt and peft_large.txt through calibrate measure (our backend);
#   2. the torch-ops peer (bench/peers/peer.py --engine torch-peft: Hugging Face transformers model,
#      LoRA / NF4 written from torch's own operations) on two plans, beside our backend on the same
#      plans in the same call; medians printed by bench/peft_peer_table.py;
#   3. planner recommend --model 70b --gpus 1 --peft auto, and its top plan run by train --plan.
# Usage there: bash bench/peft_h200.sh OUT [measure|peer|recommend]...
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/gpu_env.sh
OUT=$1
shift
B=build-gpu
for part in "$@"; do
  case $part in
    measure)
      for list in peft_1gpu peft_large; do
        $B/calibrate/calibrate measure --list bench/runlists/$list.txt --out "$OUT/$list" --no-micro \
          --train $B/backend/train --device cuda 2>&1 | tail -1
      done ;;
    peer)
      for peft in qlora lora; do
        $B/planner/planner explain --model llama-2-7b --gpus 1 --peft $peft --lora-rank 16 --micro-batch 4 --gas 4 \
          --json > "$OUT/plan_$peft.json"
        python3 -m torch.distributed.run --standalone --nproc_per_node 1 bench/peers/peer.py --engine torch-peft \
          --plan "$OUT/plan_$peft.json" --model-card data/models/llama-2-7b.toml --steps 4 --warmup 1 \
          --json-out "$OUT/peer_torch.jsonl" --git-commit "${STEPCAST_GIT_COMMIT:-unknown}" > "$OUT/peer_$peft.log" 2>&1
        tail -2 "$OUT/peer_$peft.log"
        $B/backend/train --model llama-2-7b --plan "$OUT/plan_$peft.json" --device cuda --steps 4 --warmup 1 --quiet \
          --json-out "$OUT/peer_ours.jsonl"
      done
      python3 bench/peft_peer_table.py "$OUT/peer_ours.jsonl" "$OUT/peer_torch.jsonl" ;;
    alloc)
      # The same three plans with the default allocator, then with expandable segments.
      grep -v '^#' bench/runlists/peft_alloc.txt | while read -r model n flags; do
        [[ -z "$model" ]] && continue
        # (the files are named without ':', which the device tool does not bring back)
        for conf in default expandable; do
          if [[ $conf == default ]]; then unset PYTORCH_CUDA_ALLOC_CONF; else export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; fi
          $B/backend/train --model "$model" $flags --device cuda --steps 4 --warmup 1 --quiet \
            --json-out "$OUT/alloc_$conf.jsonl"
        done
        unset PYTORCH_CUDA_ALLOC_CONF
      done
      python3 bench/peft_alloc_table.py "$OUT/alloc_default.jsonl" "$OUT/alloc_expandable.jsonl"
      ;;
    recommend)
      $B/planner/planner recommend --model 70b --gpus 1 --peft auto --global-batch 16 > "$OUT/recommend_70b.txt"
      $B/planner/planner recommend --model 70b --gpus 1 --peft auto --global-batch 16 --json > "$OUT/recommend_70b.json"
      head -40 "$OUT/recommend_70b.txt"
      $B/backend/train --model llama-2-70b --plan "$OUT/recommend_70b.json" --device cuda --steps 4 --warmup 1 \
        --json-out "$OUT/validate_70b.jsonl" | tail -4 ;;
  esac
done
