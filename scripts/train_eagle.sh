#!/usr/bin/env bash
# Rebuild the shipped eagle head (sampler/eagle_data/smollm2-135m-instruct) and
# bench/results/drafters.*: target rollouts of the train-split prompts with their hidden states
# (bench.eagle_data: ELI5 16 and summarisation 8 per prompt at T = 1, 2 per prompt at T = 0.7,
# top-k 50), the ce head from a fresh one and MDraft post-training from it (bench.train_eagle),
# then the real decoder's AATPS on 20 held-out prompts (bench.drafters). Two torch threads.
# Measured on 2 cores (Intel Xeon with AMX): rollouts ~30 min, ce ~40, mdraft ~15, drafters ~40.
# Copy the head the drafters table chooses into sampler/eagle_data/smollm2-135m-instruct/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
home="${POISSONMARK_HOME:-$HOME/.local/share/poissonmark}"
data="$home/drafters/eagle-rollouts"
out="$home/drafters/eagle"
python -m bench.eagle_data --out "$data" --samples 16 --batch 192 --temperatures 1 \
  --max-new-tokens 160 --prompts 82
python -m bench.eagle_data --out "$data" --samples 8 --batch 96 --temperatures 1 \
  --max-new-tokens 160
python -m bench.eagle_data --out "$data" --samples 2 --batch 96 --temperatures 0.7 \
  --max-new-tokens 160
python -m bench.train_eagle --data "$data" --out "$out" --ce-steps 6000 --batch 256 --lr 2e-3 \
  --checkpoint 500 --mdraft-steps 600 --mdraft-anchors 16 --proposals 4 --mdraft-lr 2e-4
python -m bench.drafters --home "$home" --eagle "eagle-ce=$out/ce" \
  --eagle "eagle-mdraft=$out/mdraft" --prompts 20 --tokens 128 --temperatures 1 0.7
