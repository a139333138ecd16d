#!/usr/bin/env bash
# Reproduce the shipped drafter heads (sampler/heads_data/) and bench/results/distill_objectives.*:
# target rollouts (cached), off-policy ce start, then mdraft / rkl / fkl / ce post-training from
# that start, held-out evaluation, real-decoder comparison; the best heads by held-out τ at T = 1
# are copied to sampler/heads_data/. About 60 min on 2 CPU cores (rollouts ~8, start ~8, post-
# training ~16, evaluation ~7, decoding ~12). Resumable: rerun after an interruption.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
home="${POISSONMARK_HOME:-$HOME/.local/share/poissonmark}"
start="$home/drafters/ce-stage1"
poissonmark distill --objective ce --steps 3000 --anchors 32 --lr 1e-3 --eval-every 500 \
  --out "$start"
python -m bench.distill_compare --init "$start" --steps 200 --anchors 32 --lr 5e-4 --prompts 6 \
  --home "$home"
python -m bench.distill_report
