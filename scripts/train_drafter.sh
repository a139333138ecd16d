#!/usr/bin/env bash
# Rebuild the shipped drafter heads (sampler/drafters/heads_data/smollm2-135m-instruct/): target rollouts
# (cached), an off-policy ce start, then rkl post-training from it — the objective that scored
# best on held-out prompts (docs/experiments/drafter-objectives.md). About 25 min on 2 CPU cores,
# estimated from its parts (rollouts ~8, start ~8, post-training ~4, evaluations ~3).
# Resumable: rerun after an interruption.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
home="${POISSONMARK_HOME:-$HOME/.local/share/poissonmark}"
start="$home/drafters/ce-stage1"
post="$home/drafters/post-rkl-s200-a32"
shipped=sampler/drafters/heads_data/smollm2-135m-instruct
poissonmark distill --objective ce --steps 3000 --anchors 32 --lr 1e-3 --eval-every 500 \
  --out "$start"
poissonmark distill --objective rkl --init "$start" --steps 200 --anchors 32 --lr 5e-4 \
  --warmup 10 --eval-every 100 --out "$post"
mkdir -p "$shipped"
cp "$post/heads.json" "$post/heads.safetensors" "$shipped/"
printf '%s\n' "Parallel heads for SmolLM2-135M-Instruct: off-policy ce start (3000 steps) then \`rkl\` post-training (200 steps, 32 anchors, lr 0.0005); made by \`scripts/train_drafter.sh\`; the choice of objective: docs/experiments/drafter-objectives.md." \
  >"$shipped/README.md"
